"""The kernel runtime: prepared launches, plans built once per key, the capture guard, one interpreted flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from jointtune.errors import KernelError
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.runtime import device as _runtime
from jointtune.kernels.runtime.launch import Launch
from jointtune.kernels.runtime.world import create_world


@triton.jit
def _scale_kernel(src_ptr, dst_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) * factor, mask=mask)


def _launch(n=40):
    src, dst = torch.randn(n), torch.empty(n)
    return Launch(_scale_kernel, (2,), {"src_ptr": src, "dst_ptr": dst, "n": n, "factor": 3.0, "BLOCK": 32},
                  slots=("src_ptr", "dst_ptr"))  # fmt: skip


def test_a_launch_binds_its_slots_per_call_and_keeps_everything_else():
    launch = _launch()
    for _ in range(2):
        src, dst = torch.randn(40), torch.full((40,), float("nan"))
        launch(src, dst)
        assert torch.allclose(dst, src * 3)
    assert launch.named()["n"] == 40 and launch.named()["factor"] == 3.0
    assert launch.named()["src_ptr"] is None  # the caller's tensors are not kept between calls


def test_launch_arguments_are_checked_when_prepared():
    src = torch.empty(4)
    with pytest.raises(KernelError, match=r"arguments missing \['factor'\]"):
        Launch(_scale_kernel, (1,), {"src_ptr": src, "dst_ptr": src, "n": 4, "BLOCK": 4})
    with pytest.raises(KernelError, match=r"unknown \['bogus'\]"):
        Launch(_scale_kernel, (1,), {"src_ptr": src, "dst_ptr": src, "n": 4, "factor": 1.0, "BLOCK": 4, "bogus": 1})
    with pytest.raises(KernelError, match="slot 'out'"):
        Launch(_scale_kernel, (1,), {"src_ptr": src, "dst_ptr": src, "n": 4, "factor": 1.0, "BLOCK": 4}, slots=("out",))
    with pytest.raises(KernelError, match="grid"):
        Launch(_scale_kernel, (0,), {"src_ptr": src, "dst_ptr": src, "n": 4, "factor": 1.0, "BLOCK": 4})


class _Compiled:
    """Stands in for Triton's compiled kernel (there is none on the CPU): records what it is handed."""

    device, function, packed_metadata = 0, "fn", "meta"

    def __init__(self):
        self.calls = []

    def run(self, *argv):
        self.calls.append(argv)


def test_the_compiled_path_hands_every_argument_in_order_and_falls_back_on_other_alignment():
    launch = _launch()
    compiled = _Compiled()
    launch._compiled, launch._stream_of = compiled, lambda device: 7
    src, dst = torch.randn(40), torch.empty(40)
    launch(src, dst)
    (argv,) = compiled.calls
    assert argv[:9] == (2, 1, 1, 7, "fn", "meta", None, None, None)  # grid, stream, kernel, no hooks
    assert argv[9] is src and argv[10] is dst and argv[11:] == (40, 3.0, 32)  # every parameter, in order
    # a slot misaligned against the compiled specialisation (or of another dtype) takes Triton's own path
    big = torch.randn(41)
    launch(big[1:], dst)
    assert len(compiled.calls) == 1 and torch.allclose(dst, big[1:] * 3)
    doubles = torch.randn(40, dtype=torch.float64)
    launch(doubles, dst)
    assert len(compiled.calls) == 1 and torch.allclose(dst, (doubles * 3).float())


def test_plans_are_built_once_per_key_and_reused():
    world = create_world("local", world_size=2)
    cfg = dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=2)
    a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    b = [torch.randn(32, 16).bfloat16() for _ in range(2)]
    ag_gemm(a, b, world=world, config=cfg)
    plans = dict(world.plans)
    for _ in range(3):
        ag_gemm([x.clone() for x in a], b, world=world, config=dict(cfg))
    assert world.plans == plans, "a repeat call with another (equal) config dict built nothing"
    ag_gemm([x.half() for x in a], [x.half() for x in b], world=world, config=cfg)
    assert len(world.plans) == len(plans) + 1


def test_a_first_call_during_capture_is_refused_before_anything_is_queued(monkeypatch):
    world = create_world("local", world_size=2)
    cfg = dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=16)
    a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    b = [torch.randn(32, 16).bfloat16() for _ in range(2)]
    monkeypatch.setattr(_runtime, "capturing", lambda device: True)
    with pytest.raises(KernelError, match=r"during CUDA graph capture.*call it once before capturing"):
        ag_gemm(a, b, world=world, config=cfg)
    assert not world.plans
    monkeypatch.setattr(_runtime, "capturing", lambda device: False)
    ag_gemm(a, b, world=world, config=cfg)  # the warm-up call, outside capture
    monkeypatch.setattr(_runtime, "capturing", lambda device: True)
    ag_gemm(a, b, world=world, config=cfg)  # warmed: nothing to allocate, so "capture" goes through


def test_only_the_runtime_reads_triton_interpret():
    kernels = Path(_runtime.__file__).parent.parent
    readers = [str(p.relative_to(kernels)) for p in kernels.rglob("*.py") if "TRITON_INTERPRET" in p.read_text()]
    assert sorted(readers) in (["runtime/device.py"], ["__init__.py", "runtime/device.py"]), readers


def test_a_registered_launch_hook_keeps_tritons_own_path():
    """Profilers hook Triton's launches; with a hook set a launch is never sent past them."""
    from triton import knobs

    from jointtune.kernels.runtime.launch import _hooked

    chain = knobs.runtime.launch_enter_hook
    assert not _hooked(chain) and not _hooked(None)  # Triton keeps an empty chain when nothing is hooked

    def hook(metadata):
        return None

    chain.add(hook)
    try:
        assert _hooked(chain)
    finally:
        chain.remove(hook)


def test_a_callers_odd_arguments_are_named_before_anything_runs():
    from jointtune.errors import ShapeError, SpaceError
    from jointtune.kernels import get_family

    for size in (0, -1, True, 2.0, "2"):
        with pytest.raises(KernelError, match=f"world_size: {size!r} is not allowed; give an integer >= 1"):
            create_world("local", world_size=size)
    assert create_world("local").world_size == 2 and create_world("local", world_size=1).world_size == 1
    world = create_world("local", world_size=2)
    a = [torch.randn(32, 16, dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(16, 8, dtype=torch.bfloat16) for _ in range(2)]
    with pytest.raises(SpaceError, match=r"config: .* it must be a mapping of field -> number or text"):
        ag_gemm(a, b, world=world, config=[("mode", "baseline")])
    # a launcher's key reads dims before the op checks its arguments: it names the argument too
    for family, args, name in (("ag_gemm", (a[0][0], b), "a"), ("gemm_rs", (a, b[0][0]), "b"),
                               ("ag_gemm", ([], b), "a"), ("flash_decode", (a[0], a[0], a[0]), "q"),
                               ("gemm_ar", (a, b[0][0]), "b"), ("gemm_ar_rmsnorm", (a[0][0], b), "a")):  # fmt: skip
        with pytest.raises(ShapeError, match=f"{name}: expected a [234]-D tensor, or a list of one per simulated rank"):
            get_family(family).key(*args, world=world)
