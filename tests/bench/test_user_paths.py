"""bench/ops/user_paths.py: the user's unfused context-parallel decode (SDPA partials, one all-gather of output and LSE,
combine) agrees with the family's float32 reference on simulated ranks, for GQA groups 1, 5 and 8; so does the user's
GEMM + all-reduce, with and without the residual add and RMSNorm."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from ops.user_paths import MmAllReduceNorm, SdpaGatherCombine  # noqa: E402

from jointtune.kernels import create_world, get_family  # noqa: E402
from jointtune.search_spaces import get_space  # noqa: E402


@pytest.mark.parametrize(("world_size", "heads", "kv_heads"), [(2, 8, 8), (3, 10, 2), (4, 16, 2)])
def test_sdpa_gather_combine_matches_reference(world_size: int, heads: int, kv_heads: int) -> None:
    fam = get_family("flash_decode")
    world = create_world("local", world_size)
    problem = get_space(fam.space).make_problem(f"2x{heads}x{kv_heads}x{40 * world_size}x64", dtype="bf16",
                                                world_size=world_size)  # fmt: skip
    x = fam.make_inputs(problem, world, seed=3)
    path = SdpaGatherCombine(world, x.q, x.k, x.v, 64**-0.5, "nccl")
    assert fam.max_error(path(), fam.reference(x)) <= fam.tolerance("bfloat16")
    x2 = fam.make_inputs(problem, world, seed=4)  # the same buffers re-used with fresh data, as a replay does
    for dst, src in zip(x.q + x.k + x.v, x2.q + x2.k + x2.v):
        dst.copy_(src)
    assert fam.max_error(path(), fam.reference(x2)) <= fam.tolerance("bfloat16")


def test_odd_payload_refused() -> None:
    world = create_world("local", 2)
    import torch

    q = [torch.zeros(1, 1, 3, dtype=torch.bfloat16)] * 2
    with pytest.raises(ValueError, match="B\\*H\\*D"):
        SdpaGatherCombine(world, q, q, q, 1.0, "nccl")


@pytest.mark.parametrize(
    ("family", "world_size", "shape"), [("gemm_ar", 2, "5x96x64"), ("gemm_ar_rmsnorm", 3, "7x80x96")]
)
def test_mm_all_reduce_norm_matches_reference(family: str, world_size: int, shape: str) -> None:
    fam = get_family(family)
    world = create_world("local", world_size)
    problem = get_space(fam.space).make_problem(shape, dtype="bf16", world_size=world_size)
    x = fam.make_inputs(problem, world, seed=5)
    path = MmAllReduceNorm(world, x.a, x.b, "nccl", x.residual, x.weight, 1e-6)
    outs = path()
    assert len(outs) == world_size * (2 if x.weight else 1)
    assert fam.max_error(outs, fam.reference(x)) <= fam.tolerance("bfloat16")
    x2 = fam.make_inputs(problem, world, seed=6)  # fresh data in the same buffers, as a replay sees it
    for dst, src in zip(x.a + x.b, x2.a + x2.b):
        dst.copy_(src)
    for dst, src in zip((x.residual or []) + (x.weight or []), (x2.residual or []) + (x2.weight or [])):
        dst.copy_(src)
    assert fam.max_error(path(), fam.reference(x2)) <= fam.tolerance("bfloat16")


def test_the_users_own_path_competes_as_the_best_unfused() -> None:
    """fused_ops.summarize: a user's whole unfused path (an `unfused_user:` anchor, checked) is the best unfused path
    where it beats every baseline variant; one that failed its check does not compete."""
    from ops import fused_ops

    def item(what: str, ms: float, error: float = 1e-3) -> dict:
        return {"id": f"8x64x64|{what}", "graph_ms": ms, "eager_error": error, "graph_error": error}

    base = item('{"collective": "nccl", "mode": "baseline"}', 0.020)
    ours = item('{"mode": "one_shot"}', 0.016)
    user = item("anchor:unfused_user:nccl", 0.018)
    best = fused_ops.summarize({"items": [base, ours, user]})["8x64x64"]["best"]["graph_ms"]
    assert best["best_unfused"] == "unfused_user:nccl" and best["speedup_vs_best_unfused"] == pytest.approx(18 / 16)
    wrong = item("anchor:unfused_user:nccl", 0.010, error=0.5)
    best = fused_ops.summarize({"items": [base, ours, wrong]})["8x64x64"]["best"]["graph_ms"]
    assert best["best_unfused"] == "baseline:nccl"


def test_the_cold_weight_regime_is_ranked_on_its_own() -> None:
    """fused_ops.summarize with --cold's `graph_cold_ms`: each regime has its own best path and ratio, so a fused call
    that wins with its weight warm in L2 and loses with it cold is reported both ways; items without the field (a run
    without --cold) leave the regime out."""
    from ops import fused_ops

    def item(what: str, warm: float, cold: float | None) -> dict:
        timed = {"graph_ms": warm} if cold is None else {"graph_ms": warm, "graph_cold_ms": cold}
        return {"id": f"64x64x64|{what}", **timed, "eager_error": 1e-3, "graph_error": 1e-3}

    base = item('{"collective": "nccl", "mode": "baseline"}', 0.022, 0.027)
    ours = item('{"mode": "barrier"}', 0.019, 0.028)
    best = fused_ops.summarize({"items": [base, ours]})["64x64x64"]["best"]
    assert best["graph_ms"]["speedup_vs_best_unfused"] == pytest.approx(22 / 19)
    assert best["graph_cold_ms"]["best_unfused"] == "baseline:nccl"
    assert best["graph_cold_ms"]["speedup_vs_best_unfused"] == pytest.approx(27 / 28)
    warm_only = fused_ops.summarize(
        {
            "items": [
                item('{"mode": "barrier"}', 0.019, None),
                item('{"collective": "nccl", "mode": "baseline"}', 0.022, None),
            ]
        }
    )
    assert "graph_cold_ms" not in warm_only["64x64x64"]["best"]
