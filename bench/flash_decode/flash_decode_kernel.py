"""The per-rank Flash-Decode kernel on one GPU: the split-KV decode of one rank's shard and the merge of its splits
(no exchange), over a grid of tiles, against torch's flash attention on the same shard and against the HBM bound
(KV bytes read / measured copy bandwidth). It is the part of every mode that one GPU can measure, so it runs on a
single-GPU machine, and `--tree` times another checkout's kernel in the same way for before/after comparisons.

Launch: `torchrun --nproc-per-node=1 bench/flash_decode/flash_decode_kernel.py --out k.json
[--grid modes|full|defaults|floors] [--shapes BxHxH_KVxS_rxD,...] [--tree DIR]`

Shapes are B x H x H_KV x S_r x D (S_r: the keys on this rank), bf16. Every config is
checked first (NaN-poisoned output, fresh random data, against the float32 reference of `flash_decode_modes.FdRig`),
then timed as `flash_decode_modes` times the decode kernel alone: GPU time behind a device-side hold (median), and
graph replays of CALLS back-to-back launches (min of three medians' runs, per launch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common.checkout import add_tree_argument, jointtune  # first: `--tree` picks the jointtune every import below gets

# isort: split

import torch
from common.cuda import Bench, init_cuda_world, spin_up
from common.measure import TOL, copy_bandwidth, measure_only, run_header, run_shapes

from flash_decode.flash_decode_modes import (
    FdRig,
    UserPath,
    decode_launch,
    pow2_at_least,
    two_per_sm_split,
)
from flash_decode.read_floor import floors
from jointtune.kernels.runtime.device import device_limits
from jointtune.search_spaces import get_space

#: (B, H, H_KV, S_r, D): a batch, heads, kv heads, keys on this rank, head dim
SHAPES = [(1, 64, 8, 4096, 128), (1, 64, 8, 16384, 128), (1, 64, 8, 65536, 128), (1, 64, 8, 262144, 128),
          (8, 64, 8, 16384, 128)]  # fmt: skip
#: other layers and batches for `--grid defaults`: GQA groups of 8, 7 (one head per program), 5 and 1, head dims
#: 64 and 256, batches 1-32, 1K-64K keys per rank
DEFAULT_SHAPES = [(1, 64, 8, 1024, 128), (1, 64, 8, 4096, 128), (1, 64, 8, 16384, 128), (1, 64, 8, 65536, 128),
                  (2, 64, 8, 16384, 128), (4, 32, 8, 32768, 128), (8, 64, 8, 4096, 128), (8, 64, 8, 65536, 128),
                  (32, 64, 8, 4096, 128), (32, 64, 8, 16384, 128), (1, 28, 4, 16384, 128), (2, 40, 8, 8192, 128),
                  (4, 32, 32, 8192, 64), (1, 16, 2, 32768, 256)]  # fmt: skip
#: `--grid floors`: batch 1 from 1K to 64K keys per rank, and the batches whose gap to the HBM bound is largest
FLOOR_SHAPES = [(1, 64, 8, 1024, 128), (1, 64, 8, 4096, 128), (1, 64, 8, 16384, 128), (1, 64, 8, 65536, 128),
                (2, 64, 8, 16384, 128), (8, 64, 8, 4096, 128)]  # fmt: skip
#: (num_warps, num_stages) pairs of the full grid; BLOCK_N and kv_split are crossed with them
WARPS_STAGES = ((4, 2), (4, 3), (8, 3))


def _hpp(G: int) -> int:
    """A whole GQA group per program: the largest divisor of G up to 16 (the space default's)."""
    return max(h for h in range(1, 17) if G % h == 0)


def _splits_around(k0: int, S_r: int) -> list[int]:
    return sorted({k for k in (k0 // 2, k0, k0 * 2) if 64 <= k <= min(16384, max(64, pow2_at_least(S_r)))})


def _valid(cfg: dict, D: int, smem: int) -> bool:
    bn, k, warps, stages = cfg["BLOCK_N"], cfg["kv_split"], cfg["num_warps"], cfg["num_stages"]
    return bn <= k and warps * 8 <= bn and stages <= k // bn and 2 * bn * D * 2 * stages <= smem


def grid(shape: tuple, sms: int, smem: int, kind: str, default: dict | None = None) -> list[dict]:
    """The configs timed for one shape (whole GQA groups per program).
    modes:    flash_decode_modes' tile (64-key steps, 4 warps, 2 stages) at kv_split for about two programs per SM,
              half and twice that;
    full:     those splits x BLOCK_N 32-128 x the WARPS_STAGES pairs;
    defaults: this checkout's space default, revision 2's rule (the modes tile at two programs per SM), and the
              default's neighbours (kv_split halved and doubled, 64/128-key steps, 3-4 stages);
    floors:   the space default alone (bench_shape adds the read floor, `read_floor.floors`)."""
    B, H, H_KV, S_r, D = shape
    hpp = _hpp(H // H_KV)
    items = B * H // hpp
    base = dict(mode="baseline", heads_per_program=hpp)
    k0 = two_per_sm_split(items, S_r, sms)
    if kind == "modes":
        return [dict(base, kv_split=k, BLOCK_N=64, num_warps=4, num_stages=2) for k in _splits_around(k0, S_r)]
    if kind == "full":
        out = [dict(base, kv_split=k, BLOCK_N=bn, num_warps=w, num_stages=st) for k in _splits_around(k0, S_r)
               for bn in (32, 64, 128) for w, st in WARPS_STAGES]  # fmt: skip
        return [c for c in out if _valid(c, D, smem)]
    assert kind in ("defaults", "floors") and default is not None
    if kind == "floors":
        return [dict(default)]
    # revision 2's default: a power of two of heads per program (the largest dividing G), two programs per SM
    hpp2 = min(H // H_KV & -(H // H_KV), 16)
    k2 = two_per_sm_split(B * H // hpp2, S_r, sms)
    rev2 = dict(base, heads_per_program=hpp2, kv_split=k2, BLOCK_N=min(64, k2), num_warps=4,
                num_stages=min(2, k2 // min(64, k2)))  # fmt: skip
    out = [dict(default), rev2]
    for k in _splits_around(default["kv_split"], S_r):
        for bn in (64, 128):
            for st in (3, 4):
                c = dict(base, kv_split=k, BLOCK_N=bn, num_warps=4, num_stages=st)
                if _valid(c, D, smem) and c not in out:
                    out.append(c)
    return out


def bench_shape(world, bench: Bench, shape: tuple, copy_bw: float, kind: str) -> dict:
    t0 = time.time()
    B, H, H_KV, S_r, D = shape
    label = "x".join(map(str, shape))
    rig = FdRig(world, B, H, H_KV, S_r, D)
    calls, replays = (20, 10) if B * H_KV * S_r >= 64 * 65536 else (100, 50)
    entry: dict = {"B": B, "S_r": S_r, "H": H, "H_KV": H_KV, "D": D, "configs": []}
    limits = device_limits(world.device)
    space = get_space("flash_decode")
    default = space.default(space.make_problem(dict(B=B, H=H, H_KV=H_KV, S=S_r, D=D), world_size=1), limits)
    entry["space_default"] = default
    entry["sdpa_alone"] = measure_only(rig, UserPath(rig).attention, bench, calls, replays)
    kv_bytes = 2 * B * H_KV * S_r * D * 2
    entry["hbm_bound_ms"] = kv_bytes / copy_bw * 1e3
    for cfg in grid(shape, limits.num_sms, limits.max_shared_mem, kind, default):
        row: dict = {"config": cfg}
        try:
            rig.refill()
            rig.call(cfg)()
            torch.cuda.synchronize()
            row["error"] = rig.error_on_device().item()
            row.update(measure_only(rig, decode_launch(world, rig, cfg), bench, calls, replays))
        except Exception as exc:  # a config that fails is a result, not the end of the run
            row["failure"] = f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.synchronize()
        entry["configs"].append(row)
        print(f"  {label} {json.dumps(cfg)} err {row.get('error')} gpu {row.get('median_ms')} graph "
              f"{row.get('graph_ms')} {row.get('failure', '')}", flush=True)  # fmt: skip
    if kind == "floors":
        programs = B * H // default["heads_per_program"] * -(-S_r // default["kv_split"])
        entry["floors"] = floors(rig.k, rig.v, programs, lambda fn: measure_only(rig, fn, bench, calls, replays))
        print(f"  floors: read {json.dumps(entry['floors']['read'])} empty {json.dumps(entry['floors']['empty'])}")
    good = [r for r in entry["configs"] if r.get("error", 1) < TOL and "graph_ms" in r]
    of_default = next((r for r in good if r["config"] == default), None)
    if of_default:
        entry["default_over_best_graph"] = of_default["graph_ms"] / min(r["graph_ms"] for r in good)
    for regime in ("median_ms", "graph_ms"):
        if good:
            best = min(good, key=lambda r: r[regime])
            entry[f"best_{regime}"] = {
                "config": best["config"], "ms": best[regime],
                "vs_hbm_bound": best[regime] / entry["hbm_bound_ms"],
                "vs_sdpa": best[regime] / entry["sdpa_alone"][regime],
            }  # fmt: skip
            if "floors" in entry:
                entry[f"best_{regime}"]["vs_read_floor"] = best[regime] / entry["floors"]["read"][regime]
    entry["seconds"] = time.time() - t0
    print(f"[{label}] {entry['seconds']:.0f}s default/best {entry.get('default_over_best_graph')} "
          f"best gpu {entry.get('best_median_ms')} best graph {entry.get('best_graph_ms')} "
          f"sdpa {entry['sdpa_alone']['median_ms']:.4f}/"
          f"{entry['sdpa_alone']['graph_ms']:.4f} hbm {entry['hbm_bound_ms']:.4f}", flush=True)  # fmt: skip
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flash_decode_kernel.json")
    ap.add_argument("--shapes", default="", help="BxHxH_KVxS_rxD,... (S_r: keys on this rank)")
    add_tree_argument(ap)
    ap.add_argument(
        "--grid", default="modes", choices=("modes", "full", "defaults", "floors"), help="which configs (see grid)"
    )
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. before/after)")
    ap.add_argument(
        "--merge-elements",
        type=int,
        default=0,
        help="floats per step of a chunk's merge (jointtune.kernels.flash_decode.args.MERGE_ELEMENTS)",
    )
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if args.merge_elements:
        from jointtune.kernels.flash_decode import args as _flash_decode_args

        if not hasattr(_flash_decode_args, "MERGE_ELEMENTS"):
            raise SystemExit(f"--merge-elements: the kernel of {args.tree or 'this tree'} has no MERGE_ELEMENTS")
        _flash_decode_args.MERGE_ELEMENTS = args.merge_elements
    world = init_cuda_world()
    if world.world_size != 1:
        raise SystemExit("flash_decode_kernel.py times one rank's kernel: run it with --nproc-per-node=1")
    bench = Bench(args.iters, args.warmup, world)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    shapes = shapes or {"defaults": DEFAULT_SHAPES, "floors": FLOOR_SHAPES}.get(args.grid, SHAPES)
    result = run_header(world, "bench/flash_decode/flash_decode_kernel.py")
    result.update(
        label=args.label,
        tree=str(Path(jointtune.__file__).resolve().parents[1]),
        merge_elements=args.merge_elements or None,
    )
    spin_up(2.0)
    copy_bw = copy_bandwidth()
    result["copy_bandwidth_tb_s"] = copy_bw / 1e12
    run_shapes(world, result, args.out, shapes, lambda s, _: bench_shape(world, bench, s, copy_bw, args.grid))


if __name__ == "__main__":
    main()
