"""Run a script that lowers kernels for Hopper (sm_90) without a GPU, under this Triton or the GPU image's (3.6),
which `make test` installs beside the venv; and run a child process whose ranks may wait on each other, in a session
of its own (`run_in_session`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GPU_TRITON = Path(os.environ.get("JOINTTUNE_GPU_TRITON_DIR", ROOT / ".venv" / "gpu-triton"))


def run_sm90(script: str, configs: list[dict], triton_dir: Path | None = None) -> subprocess.CompletedProcess:
    """`script` (in tests/kernels) on `configs`, compiled rather than interpreted; `triton_dir` first on the path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (triton_dir, ROOT) if p)
    cmd = [sys.executable, str(HERE / script), json.dumps(configs)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def child_env(*first: str, **extra: str) -> dict[str, str]:
    """This environment without TRITON_INTERPRET, `first` then the repository on PYTHONPATH, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (*first, str(ROOT)) if p), **extra)
    return env


def run_in_session(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    """Run `cmd` in a session of its own; its stdout, or a failure. On a timeout the whole session is killed (the
    ranks it forked too): a wait that never ends fails the test instead of hanging it or leaving a process behind."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{cmd[2:]} did not finish in {timeout} s (a wait that never ends)")
    assert proc.returncode == 0, f"{cmd[2:]} exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    return out


def gpu_image_triton() -> Path:
    """The GPU image's Triton; skips the test where it is not installed (fails under JOINTTUNE_REQUIRE_GPU_TRITON)."""
    if not (GPU_TRITON / "triton").is_dir():
        if os.environ.get("JOINTTUNE_REQUIRE_GPU_TRITON"):
            pytest.fail(f"{GPU_TRITON} has no Triton; `make test` installs the GPU image's Triton there")
        pytest.skip(f"no GPU-image Triton at {GPU_TRITON} (`make test` installs it)")
    return GPU_TRITON
