"""GEMM+RS atomic mode's correctness by tile and variant, on any number of GPUs: one GPU is enough to ask whether
its fault needs NVLink (with W = 1 every atomic lands in the rank's own accumulator).

Launch: `torchrun --nproc-per-node=1 bench/gemm_rs/gemm_rs_atomic.py --out atomic.json [--any-tile] [--tree DIR]`

Per case: `--calls` eager calls and `--replays` graph replays, each on fresh data with a NaN-poisoned output, each
checked against the float32 reference (`gemm_rs_modes.RsRig`): the relative error and the share of elements off by
more than 2% of the reference's RMS, max over ranks. `--any-tile` lifts the atomic_tile rule (64x128 tiles of 4 warps
at most) that the gemm_rs space had before revision 4, so that a `--tree` from before the fix can run the tiles it got
wrong; this tree's space has no such rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common.checkout import TREE, add_tree_argument  # first: `--tree` picks the jointtune every import below gets

# isort: split

from common.cuda import init_cuda_world, spin_up
from common.measure import capture, max_over_ranks, run_header

from gemm_rs.gemm_rs_modes import RsRig
from jointtune.search_spaces import get_space

SHAPES = [(1024, 8192, 8192), (4096, 4096, 12288), (256, 4096, 4096)]
TILES = [
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
]


def lift_atomic_tile_rule() -> None:
    """Let atomic mode take any tile (the experiment's point); every other rule of the space still applies."""
    for rule in get_space("gemm_rs").constraints:
        if rule.name == "atomic_tile":
            object.__setattr__(rule, "check", lambda cfg, ctx: None)


def wrong_share(rig: RsRig) -> torch.Tensor:
    scale = rig.ref.pow(2).mean().sqrt()
    return ((rig.out.float() - rig.ref).abs() > 0.02 * scale).float().mean().reshape(1)


def diagnose(rig: RsRig, prev_ref: torch.Tensor | None) -> dict:
    """Where a wrong call's wrong elements are and what they hold: zero (a contribution missing), the reference
    plus the previous call's (an accumulator not handed back zeroed), or something else; the rows and columns
    they fall on within 128 x 128 tiles, and how many tiles they touch."""
    out, ref = rig.out.float(), rig.ref
    bad = (out - ref).abs() > 0.02 * ref.pow(2).mean().sqrt()
    idx = bad.nonzero()
    n = max(int(bad.sum()), 1)
    near = lambda x, y: (x - y).abs() <= 0.02 * (y.abs() + 0.05)
    info = {
        "wrong_share": bad.float().mean().item(),
        "zero": (bad & (out == 0)).sum().item() / n,
        "ref_plus_previous": (bad & near(out, ref + prev_ref)).sum().item() / n if prev_ref is not None else None,
        "previous": (bad & near(out, prev_ref)).sum().item() / n if prev_ref is not None else None,
        "tiles_touched": len({(int(r) // 128, int(c) // 128) for r, c in idx[:20000].tolist()}),
        "tiles": (rig.R // 128 or 1) * (rig.N // 128 or 1),
        "rows_in_tile": torch.bincount(idx[:, 0] % 128, minlength=128).tolist() if len(idx) else [],
        "cols_in_tile": torch.bincount(idx[:, 1] % 128, minlength=128).tolist() if len(idx) else [],
    }
    return info


def check(rig: RsRig, fn, calls: int, replays: int) -> dict:
    errors, shares, diagnosis, prev = [], [], None, None
    for _ in range(calls):
        rig.refill()
        fn()
        errors.append(rig.error_on_device())
        shares.append(wrong_share(rig))
        if diagnosis is None and errors[-1].item() > 2e-2:
            diagnosis = diagnose(rig, prev)
            # the per-chunk tile counters must be handed back at zero by the tile that completes each chunk
            done = rig.world.held_scratch("gemm_rs.done", torch.int32)
            diagnosis["chunk_counters_after_call"] = done[0].tolist()[:64] if done else None
            # both halves of the accumulator after the call: the reduce hands the half it read back zeroed, so
            # what is left is atomics that landed after it read (early read) or in the other half (wrong half)
            acc = rig.world.held("gemm_rs.acc", torch.float32)
            if acc is not None:
                from jointtune.kernels.runtime.symm import ALIGN

                flat = acc.tensors[0]
                hs = flat.numel() // 2 // ALIGN * ALIGN
                n = rig.R * rig.N
                halves = [flat[:n].view(rig.R, rig.N), flat[hs : hs + n].view(rig.R, rig.N)]
                bad = (rig.out.float() - rig.ref).abs() > 0.02 * rig.ref.pow(2).mean().sqrt()
                diagnosis["nonzero_left_per_half"] = [int((h != 0).sum()) for h in halves]
                diagnosis["left_where_wrong_per_half"] = [int(((h != 0) & bad).sum()) for h in halves]
                diagnosis["left_equals_ref_where_wrong_per_half"] = [
                    int((((h - rig.ref).abs() <= 0.02 * (rig.ref.abs() + 0.05)) & bad).sum()) for h in halves
                ]
                diagnosis["wrong_elements"] = int(bad.sum())
                diagnosis["nonzero_anywhere_in_buffer"] = int((flat != 0).sum())
                # the wrong rows and columns of the first touched tiles (128 x 128), as runs
                per_tile = {}
                for r, c in bad.nonzero()[:200000].tolist():
                    per_tile.setdefault((r // 128, c // 128), []).append((r % 128, c % 128))
                sample = {}
                for key in sorted(per_tile)[:4]:
                    cells = per_tile[key]
                    sample[str(key)] = {"cells": len(cells), "rows": sorted({r for r, _ in cells}),
                                        "cols": sorted({c for _, c in cells})}  # fmt: skip
                diagnosis["tiles_sample"] = sample
        prev = rig.ref.clone()
    fn()
    graph = capture(fn)
    for _ in range(replays):
        rig.refill()
        graph.replay()
        errors.append(rig.error_on_device())
        shares.append(wrong_share(rig))
    torch.cuda.synchronize()
    e = max_over_ranks(torch.cat(errors).tolist())
    s = max_over_ranks(torch.cat(shares).tolist())
    return {"max_error": max(e), "wrong_calls": sum(x > 2e-2 for x in e), "calls": len(e), "max_wrong_share": max(s),
            "errors": [round(x, 5) for x in e], "first_wrong_eager_call": diagnosis}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gemm_rs_atomic.json")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--any-tile", action="store_true", help="lift the atomic_tile rule (a --tree before revision 4)")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: SHAPES)")
    ap.add_argument("--tiles", default="", help="indices into TILES, comma-separated (default: all)")
    ap.add_argument("--modes", default="atomic,push")
    add_tree_argument(ap)
    args = ap.parse_args()
    world = init_cuda_world()
    if args.any_tile:
        lift_atomic_tile_rule()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    result = run_header(world, "bench/gemm_rs/gemm_rs_atomic.py")
    result["tree"] = str(TREE)
    result["cases"] = []
    spin_up(1.0)
    for M, N, K in shapes:
        rig = RsRig(world, M, N, K)
        for tile in [TILES[int(i)] for i in args.tiles.split(",") if i] or TILES:
            for mode in args.modes.split(","):  # push: the same tiles, counts and flags with stores
                R = M // world.world_size
                cfg = dict(mode=mode, chunk_m=min(256, R), reduce_sms=8, tile_order="peers_first", GROUP_M=1,
                           SPLIT_K=1, **tile)  # fmt: skip
                if mode != "atomic":
                    cfg["reduce_by"] = "programs"
                case = {"shape": [M, N, K], "config": cfg}
                try:
                    case.update(check(rig, rig.call(cfg), args.calls, args.replays))
                except Exception as exc:  # a refused or failing config is a result
                    case["failure"] = f"{type(exc).__name__}: {exc}"[:300]
                    torch.cuda.synchronize()
                result["cases"].append(case)
                if world.rank == 0:
                    print(f"{M}x{N}x{K} {mode} {tile['BLOCK_M']}x{tile['BLOCK_N']} w{tile['num_warps']}: "
                          f"max err {case.get('max_error')} wrong {case.get('wrong_calls')}/{case.get('calls')} "
                          f"share {case.get('max_wrong_share')} {case.get('failure', '')}", flush=True)  # fmt: skip
                    d = case.get("first_wrong_eager_call")
                    if d:
                        print("   ", {k: v for k, v in d.items() if k not in ("rows_in_tile", "cols_in_tile")},
                              "rows", d["rows_in_tile"], "cols", d["cols_in_tile"], flush=True)  # fmt: skip
                    Path(args.out).write_text(json.dumps(result, indent=1))
        del rig
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
