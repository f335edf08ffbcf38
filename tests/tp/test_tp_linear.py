"""Column- and row-parallel linears on simulated ranks, both layouts, against one-rank torch; the row-parallel layer's
residual + RMSNorm epilogue (fused GEMM + all-reduce in the standard layout, the same bits on every rank); grad
refused; a shape torch.compile meets first. (The decoder layer's tests compile the linears inside a whole layer.)"""

from __future__ import annotations

import pytest
import torch
from jt_tp import fast_store

from jointtune import create_world
from jointtune.errors import ShapeError
from jointtune.tp import ColumnParallelLinear, RowParallelLinear, Tuning, rel_error


def _data(seed, T, K, N):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, K, generator=gen)).bfloat16()
    w = (torch.randn(N, K, generator=gen) / K**0.5).bfloat16()  # HF layout [out, in]
    b = torch.randn(N, generator=gen).bfloat16()
    return x, w, b


@pytest.mark.parametrize("W", [2, 4])
def test_column_then_row_parallel_in_both_layouts_match_one_rank(W, tmp_path):
    world = create_world("local", world_size=W)
    tuning = Tuning(db_url=fast_store(tmp_path / "jt.db", (W,)))
    T, K, N = 16, 64, 128
    x, w1, b1 = _data(W, T, K, N)
    _, w2, _ = _data(W + 1, T, N, K)
    up = ColumnParallelLinear.from_weight(world, w1, b1, tuning=tuning)
    down = RowParallelLinear.from_weight(world, w2, tuning=tuning)
    h = x.float() @ w1.float().t() + b1.float()
    want = h.bfloat16().float() @ w2.float().t()
    R = T // W
    with torch.no_grad():
        for layout, xs in (("sp", [x[r * R : (r + 1) * R] for r in range(W)]), ("standard", [x] * W)):
            hs = up(xs, layout=layout)  # every rank: all T rows of its N/W columns
            for r, hr in enumerate(hs):
                assert rel_error(hr, h[:, r * N // W : (r + 1) * N // W]) < 2e-2
            out = down(hs, layout=layout)
            for r, o in enumerate(out):
                rows = want[r * R : (r + 1) * R] if layout == "sp" else want
                assert o.shape == rows.shape and rel_error(o, rows) < 2e-2
    sources = {s for op in (up.op, down.op, down.ar_op) for s in op.launcher.sources.values()}
    assert sources == {"nearest-store"}  # the decorator's chain: the nearest tuned shape of the store
    assert {c["mode"] for c in down.ar_op.launcher.cache.values()} == {"one_shot"}  # the fused GEMM + all-reduce


@pytest.mark.parametrize("W", [2, 4])
def test_row_parallel_residual_and_rmsnorm_epilogue_in_both_layouts(W, tmp_path):
    """h = x @ W^T + residual and RMSNorm(h) * weight: fused into GEMM + all-reduce in the standard layout (two-shot
    here: each row's owner normalises it and hands out h and 1/rms), one add + RMSNorm pass after GEMM+RS in sp."""
    world = create_world("local", world_size=W)
    T, K, N, eps = 8, 64, 32, 1e-5
    x, w, _ = _data(W + 7, T, K, N)
    down = RowParallelLinear.from_weight(world, w, tuning=Tuning(db_url=fast_store(tmp_path / "jt.db", (W,))))
    gen = torch.Generator().manual_seed(W)
    res, norm = torch.randn(T, N, generator=gen).bfloat16(), (1 + torch.rand(N, generator=gen)).bfloat16()
    want_h = x.float() @ w.float().t() + res.float()
    want_normed = want_h * torch.rsqrt(want_h.square().mean(-1, keepdim=True) + eps) * norm.float()
    k, R = K // W, T // W
    parts = [x[:, r * k : (r + 1) * k] for r in range(W)]
    with torch.no_grad():
        normed, h = down(parts, layout="standard", residual=[res] * W, norm_weight=[norm] * W, eps=eps)
        plain = down(parts, layout="standard", residual=[res] * W)
        for got, want in ((normed, want_normed), (h, want_h), (plain, want_h)):
            assert all(torch.equal(g, got[0]) for g in got) and rel_error(got[0], want) < 2e-2  # the same bits
        sp_normed, sp_h = down(parts, layout="sp", residual=[res[r * R : (r + 1) * R] for r in range(W)],
                               norm_weight=[norm] * W, eps=eps)  # fmt: skip
        assert rel_error(torch.cat(sp_normed), want_normed) < 2e-2 and rel_error(torch.cat(sp_h), want_h) < 2e-2
    assert {c["mode"] for c in down.ar_norm_op.launcher.cache.values()} == {"two_shot"}
    assert set(down.ar_norm_op.launcher.sources.values()) == {"nearest-store"}


def test_forward_only_grad_is_refused_by_name():
    world = create_world("local", world_size=2)
    _, w, _ = _data(0, 8, 32, 16)
    col = ColumnParallelLinear.from_weight(world, w)
    x = torch.randn(8, 32).bfloat16()
    with pytest.raises(ShapeError, match="ColumnParallelLinear: an input or weight requires grad"):
        col([x.requires_grad_(), x], layout="standard")
    col.weight[0].requires_grad_(True)
    with pytest.raises(ShapeError, match="forward-only"):
        col([x.detach(), x.detach()], layout="standard")
    with torch.no_grad():
        assert col([x.detach(), x.detach()], layout="standard")[0].shape == (8, 8)
        with pytest.raises(ShapeError, match="layout: 'columns' is not allowed; allowed: sp, standard"):
            col([x.detach(), x.detach()], layout="columns")
        with pytest.raises(ShapeError, match=r"x: expected one tensor per local rank \(2\), got 1"):
            col([x.detach()], layout="standard")


def test_a_shape_first_seen_while_tracing_says_to_run_it_eagerly_first(monkeypatch):
    """What torch.compile reports (inside its own error) for a token count no eager call resolved: the decorator's
    lookup can't run in a trace."""
    from jointtune.errors import TuningError

    world = create_world("local", world_size=2)
    _, w, _ = _data(0, 8, 32, 16)
    col = ColumnParallelLinear.from_weight(world, w)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(4, 32).bfloat16()
    with torch.no_grad(), pytest.raises(TuningError, match=r"ag_gemm: no config resolved for .* run the module once"):
        col([x, x], layout="sp")
