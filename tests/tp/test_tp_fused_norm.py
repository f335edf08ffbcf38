"""The sequence-parallel layout's residual add + RMSNorm in one pass (`jointtune.tp.fused_norm`), in Triton's CPU
interpreter, against torch's add and `F.rms_norm`. The interpreter rounds float32 to bfloat16 toward zero where a GPU
rounds to nearest, so in bfloat16 the rounded h may sit one unit in the last place from torch's here (float16 and
float32 round as torch does); on a GPU it is torch's bit for bit (bench/e2e/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jointtune.errors import ShapeError
from jointtune.tp.functional import rms_norm
from jointtune.tp.fused_norm import add_rms_norm

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}


def _data(rows, n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    y, r = (torch.randn(rows, n, generator=gen).to(dtype) for _ in range(2))
    return y, r, (0.5 + torch.rand(n, generator=gen)).to(dtype)


def _check(normed, h, y, r, w):
    want_h = r + y
    if y.dtype == torch.bfloat16:  # within one unit in the last place of torch's rounding (the module doc)
        assert torch.all((h.float() - want_h.float()).abs() <= want_h.float().abs() * ULP[y.dtype] * 1.01)
    else:
        assert torch.equal(h, want_h)
    want = rms_norm(h.float(), w.float(), 1e-5)  # the norm of the h it returned, as `F.rms_norm` takes it
    assert torch.all((normed.float() - want).abs() <= want.abs() * ULP[y.dtype] * 2.01 + 1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,n", [(5, 96), (3, 8192), (2, 33), (0, 64)])
def test_matches_torchs_add_then_rms_norm(dtype, rows, n):
    y, r, w = _data(rows, n, dtype, seed=rows * n)
    normed, h = add_rms_norm(y, r, w, 1e-5)
    assert normed.dtype == h.dtype == dtype and normed.shape == h.shape == (rows, n)
    _check(normed, h, y, r, w)


def test_rows_of_a_wider_tensor_and_one_residual_row_for_all():
    """What the kernel takes beyond contiguous rows: rows strided inside a wider tensor, a residual row broadcast."""
    y, r, w = _data(4, 40, torch.float16, seed=9)
    wide = torch.zeros(4, 72, dtype=torch.float16)
    wide[:, 8:48] = y
    _check(*add_rms_norm(wide[:, 8:48], r, w, 1e-5), y, r, w)
    one = r[:1].expand(4, 40)
    _check(*add_rms_norm(y, one, w, 1e-5), y, one, w)


def test_a_row_of_zeros_and_rows_of_one_value():
    y = torch.zeros(3, 40, dtype=torch.bfloat16)
    r = torch.stack([torch.zeros(40), torch.full((40,), 3.0), torch.full((40,), -0.5)]).bfloat16()
    w = torch.full((40,), 2.0, dtype=torch.bfloat16)
    normed, h = add_rms_norm(y, r, w, 1e-6)
    assert torch.equal(h, r)
    assert torch.equal(normed[0], torch.zeros(40, dtype=torch.bfloat16))  # eps keeps 0 / rms finite
    assert torch.allclose(normed[1:].float(), torch.tensor([[2.0], [-2.0]]).expand(2, 40), rtol=ULP[torch.bfloat16])


def test_what_it_cant_fuse_runs_torchs_two_ops():
    """A weight of another dtype, column-major rows, 3-D input, inputs that need a gradient, meta tensors: torch's add
    and `F.rms_norm`, exactly (and differentiable)."""
    y, r, w = _data(4, 32, torch.bfloat16, seed=3)
    cases = [
        (y, r, w.float()),  # the weight in float32: applied unrounded, returned in float32 (`functional.rms_norm`)
        (y.t().contiguous().t(), r, w),  # column-major y
        (y.view(2, 2, 32), r.view(2, 2, 32), w),
    ]
    for yy, rr, ww in cases:
        normed, h = add_rms_norm(yy, rr, ww, 1e-5)
        assert torch.equal(h, rr + yy)
        assert torch.equal(normed, rms_norm(rr + yy, ww, 1e-5))
    wg = w.clone().requires_grad_()
    normed, h = add_rms_norm(y, r, wg, 1e-5)
    normed.float().sum().backward()
    assert wg.grad is not None and torch.equal(normed, rms_norm(r + y, w, 1e-5))
    normed, h = add_rms_norm(*(t.to("meta") for t in (y, r, w)), 1e-5)
    assert normed.device.type == h.device.type == "meta" and normed.shape == (4, 32)


def test_its_torch_op_refuses_what_it_cant_take_by_name():
    y, r, w = _data(4, 32, torch.bfloat16, seed=4)
    for args, says in (
        ((y.t().contiguous().t(), r, w), "layout"),
        ((y.view(2, 2, 32), r, w), "y: 3 dims"),
        ((y, r[:, :16], w), r"residual: shape \[4, 16\]"),
        ((y, r, w.float()), "dtype"),
    ):
        with pytest.raises(ShapeError, match=says):
            torch.ops.jointtune.add_rms_norm(*args, 1e-5)


def test_a_torch_op_that_compiles_whole():
    y, r, w = _data(4, 64, torch.bfloat16, seed=5)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(lambda a, b, c: add_rms_norm(a, b, c, 1e-5), fullgraph=True, backend=backend)
    for got, want in zip(compiled(y, r, w), add_rms_norm(y, r, w, 1e-5)):
        assert torch.equal(got, want)
    assert any("jointtune.add_rms_norm" in t for t in seen), seen


def test_the_benchmark_refuses_bad_input_by_name_and_a_machine_without_a_gpu(tmp_path):
    bench = Path(__file__).resolve().parents[2] / "bench" / "e2e" / "add_rms_norm.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for args, says in ((["--shapes", "12x"], "--shapes: '12x' is not allowed"), (["--calls", "0"], "--calls: 0"),
                       (["--shapes", "8x64"], "needs a GPU")):  # fmt: skip
        done = subprocess.run([sys.executable, str(bench), *args, "--out", str(tmp_path / "r.json")],
                              capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "r.json").exists()
