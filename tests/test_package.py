"""The package root: the public names users import, imported lazily so `import jointtune` and the
`jointtune` command stay fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import jointtune


def _python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_jointtune_loads_no_torch_triton_or_optuna() -> None:
    loaded = json.loads(_python("import sys, json, jointtune; print(json.dumps(sorted(sys.modules)))"))
    assert not {"torch", "triton", "optuna", "sqlalchemy"} & set(loaded)


def test_public_names_come_from_the_root_as_triton_autotune_users_expect() -> None:
    from jointtune.autotune.runtime.decorator import joint_autotune
    from jointtune.kernels.ag_gemm import ag_gemm
    from jointtune.kernels.runtime.world import create_world

    assert jointtune.joint_autotune is joint_autotune
    assert jointtune.ag_gemm is ag_gemm and jointtune.create_world is create_world
    assert set(jointtune.__all__) <= set(dir(jointtune))
    assert all(getattr(jointtune, name) is not None for name in jointtune.__all__)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        jointtune.nope  # noqa: B018


@pytest.mark.skipif(
    __import__("jointtune.hardware", fromlist=["x"]).gpu_device_present(), reason="this machine has a GPU"
)
def test_a_kernel_op_from_the_root_chooses_the_interpreter_without_a_gpu() -> None:
    out = _python("import os; from jointtune import ag_gemm; print(os.environ.get('TRITON_INTERPRET'))")
    assert out.strip() == "1"
    # a choice the user made is kept
    assert (
        _python(
            "import os; from jointtune import ag_gemm; print(os.environ['TRITON_INTERPRET'])", TRITON_INTERPRET="0"
        ).strip()
        == "0"
    )


_PULL = (
    "import torch\n"
    "from jointtune import ag_gemm, create_world\n"
    "w = create_world('local', world_size=2)\n"
    "a = [torch.randn(32, 64).bfloat16() for _ in range(2)]\n"
    "b = [torch.randn(64, 32).bfloat16() for _ in range(2)]\n"
    "cfg = dict(mode='pull', BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, SPLIT_K=1)\n"
    "want = torch.cat(a).float() @ b[0].float()\n"
)


@pytest.mark.skipif(
    __import__("jointtune.hardware", fromlist=["x"]).gpu_device_present(), reason="this machine has a GPU"
)
def test_kernels_imported_directly_or_after_triton_run_or_say_what_to_do() -> None:
    # a kernel module imported by its path chooses the interpreter too (the package does, before Triton loads)
    direct = "from jointtune.kernels.ag_gemm import ag_gemm\n" + _PULL
    got = "got = ag_gemm(a, b, world=w, config=cfg)[0].float()\n"
    out = _python(direct + got + "print(float((got - want).abs().max() / want.abs().max()))")
    assert float(out) < 1e-2  # bf16 output
    # Triton imported first has fixed its mode: the torch-only modes run, a Triton one says what to do
    late = (
        "import triton\n"
        + _PULL
        + (
            "assert ag_gemm(a, b, world=w, config={'mode': 'baseline'})[0].shape == (64, 32)\n"
            "from jointtune.errors import KernelError\n"
            "try:\n    ag_gemm(a, b, world=w, config=cfg)\nexcept KernelError as exc:\n    print(exc)\n"
        )
    )
    message = _python(late).strip()
    assert message.startswith("ag_gemm_kernel: Triton kernels can't run on cpu: there is no GPU, and Triton was")
    assert "set TRITON_INTERPRET=1 in the environment" in message


def _modules() -> list[str]:
    import pkgutil

    def fail(name: str) -> None:  # a package that can't be imported must not drop out of the list unseen
        raise ImportError(f"{name} can't be imported")

    return [m.name for m in pkgutil.walk_packages(jointtune.__path__, "jointtune.", onerror=fail)
            if ".migrations." not in m.name and not m.name.endswith("__main__")]  # fmt: skip


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run_as_written(name: str) -> None:
    """Every example a docstring shows runs and prints what it says (sketches that need a GPU, a server, a store
    of the user's own, or act on the process, like the watchdog's timer, are marked `# doctest: +SKIP`)."""
    import doctest
    import importlib

    import torch

    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": torch}, report=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples fail (python -m doctest -v)"
