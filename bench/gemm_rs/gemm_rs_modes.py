"""GEMM+RS as serving engines meet it: every mode at its best candidate, against GEMM + NCCL reduce-scatter,
PyTorch's fused op, and the ideal bound (GEMM alone, reduce-scatter alone), in one run; graph-replay
correctness and a mixed stress run of eager calls and replays.

Launch: `torchrun --nproc-per-node=2 bench/gemm_rs/gemm_rs_modes.py --out gemm_rs.json [--shapes MxNxK,...]`

The method is `ag_gemm_modes.py`'s (imported from there): gpu time after a device-side hold and barrier,
eager wall time of back-to-back calls, graph replays of CALLS calls; max over ranks; every candidate
checked against a float32 reference eagerly (NaN-poisoned output) and after replays with fresh data.
K is split across ranks: rank r holds A_r [M, K/W] and B_r [K/W, N] and gets [M/W, N].
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common import checkout  # noqa: F401  (first: `--tree` picks the jointtune every import below gets)

# isort: split

from common.cuda import Bench, init_cuda_world, spin_up
from common.measure import (
    TOL,
    guarded_measure,
    measure_only,
    modes_arguments,
    run_header,
    run_shapes,
    save_result,
    shapes_to_time,
    time_candidates,
)
from common.measure import stress as modes_stress

from jointtune.kernels.gemm_rs import gemm_rs
from jointtune.search_spaces import row_tile

SHAPES = [(64, 8192, 8192), (128, 8192, 8192), (1024, 8192, 8192), (8192, 4096, 12288), (8192, 3584, 14336),
          (8192, 8192, 28672)]  # fmt: skip
BIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, SPLIT_K=1)


def _small(R: int, **kw) -> dict:
    bm = max(16, min(64, 1 << (R - 1).bit_length()))
    return dict(dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4, SPLIT_K=1), **kw)


def candidates(M: int, K: int, W: int) -> dict[str, list[dict]]:
    """A short list per mode (the tuner searches the whole space; this is the benchmark's fixed grid)."""
    R = M // W
    fused = []
    if R >= 2048:
        for mode in ("push", "pull", "atomic"):
            for chunk, red in ((256, 16), (1024, 32)):
                fused.append(dict(mode=mode, chunk_m=chunk, reduce_sms=red, tile_order="peers_first", **BIG))
            if mode != "atomic":  # every SM on the GEMM, the own rows summed in their tiles' epilogue
                fused.append(dict(mode=mode, chunk_m=256, reduce_by="epilogue", **BIG))
    else:
        tiles = BIG if R >= 512 else _small(R)
        split = 1 if R >= 512 else 4
        chunk = min(256, 1 << (R - 1).bit_length())
        for mode in ("push", "pull", "atomic"):
            for red in (8, 32):
                fused.append(dict(mode=mode, chunk_m=chunk, reduce_sms=red, tile_order="peers_first",
                                  **dict(tiles, SPLIT_K=split)))  # fmt: skip
            if mode != "atomic":
                fused.append(dict(mode=mode, chunk_m=chunk, reduce_by="epilogue", **dict(tiles, SPLIT_K=split)))
        if R < 512:
            fused.append(dict(mode="push", chunk_m=chunk, reduce_sms=16, tile_order="peers_first",
                              **_small(R, BLOCK_N=128, SPLIT_K=2)))  # fmt: skip
            # tiles over every rank's rows, B read once: the tile GEMM's best at 32-128 rows on one H200
            # (results/tile_gemm_small_m_1xH200_2026-11-24.json: 64 columns, 128-deep steps, no split-K)
            for mode in ("push", "pull"):
                fused.append(dict(mode=mode, reduce_by="tile", **row_tile(M)))
    for cfg in fused:
        if cfg["mode"] != "atomic":
            cfg.setdefault("reduce_by", "programs")
    out: dict[str, list[dict]] = {"baseline": [dict(mode="baseline")]}
    for cfg in fused:  # push_epilogue, pull_tile, ...: push and pull by who sums the own rows (programs: no suffix)
        by = cfg.get("reduce_by", "programs")
        out.setdefault(cfg["mode"] + ("" if by == "programs" else f"_{by}"), []).append(cfg)
    out["pull_cublas"] = [dict(mode="pull_cublas", reduce_sms=r) for r in (32, 64, 128)]
    out["ce_cublas"] = [
        dict(mode="ce", ce_consumer="cublas", ce_chunks=c, reduce_sms=r) for c, r in ((1, 64), (1, 128), (2, 128))
    ]
    if R >= 512:
        out["ce_cublas"].append(dict(mode="ce", ce_consumer="cublas", ce_chunks=4, reduce_sms=128))
    # the same copy-engine path with our tile GEMM instead of cuBLAS: the two differ only in the GEMM
    out["ce_triton"] = [dict(mode="ce", ce_consumer="triton", ce_chunks=1, reduce_sms=128,
                             **(BIG if R >= 512 else _small(R, SPLIT_K=2)))]  # fmt: skip
    return out


class RsRig:
    """One shape's tensors on this rank: A_r, B_r, a static out, the float32 reference of this rank's rows."""

    def __init__(self, world, M: int, N: int, K: int, seed: int = 1234, symmetric: bool = True) -> None:
        self.world, self.M, self.N, self.K = world, M, N, K
        W = world.world_size
        self.R, self.K_r = M // W, K // W
        if symmetric:
            (self.a,) = world.empty((M, self.K_r), torch.bfloat16)
        else:
            self.a = torch.empty(M, self.K_r, dtype=torch.bfloat16, device="cuda")
        self.b = torch.empty(self.K_r, N, dtype=torch.bfloat16, device="cuda")
        self.out = torch.empty(self.R, N, dtype=torch.bfloat16, device="cuda")
        self.ref = torch.empty(self.R, N, dtype=torch.float32, device="cuda")
        self.seed = seed
        self.refill()

    def refill(self, seed: int | None = None) -> None:
        """New A and B on every rank (all ranks' drawn from one seed, for the reference), the reference, out
        poisoned; on the stream only (no host sync)."""
        self.seed = self.seed + 1 if seed is None else seed
        W, rank, R = self.world.world_size, self.world.rank, self.R
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        self.ref.zero_()
        for p in range(W):
            a = torch.randn(self.M, self.K_r, device="cuda", generator=gen).div_(self.K**0.25).bfloat16()
            b = torch.randn(self.K_r, self.N, device="cuda", generator=gen).div_(self.K**0.25).bfloat16()
            self.ref.addmm_(a[rank * R : (rank + 1) * R].float(), b.float())
            if p == rank:
                self.a.copy_(a)
                self.b.copy_(b)
        self.out.fill_(float("nan"))

    def error_on_device(self) -> torch.Tensor:
        return ((self.out.float() - self.ref).norm() / self.ref.norm()).nan_to_num(float("inf")).reshape(1)

    def call(self, config: dict):
        return lambda: gemm_rs(self.a, self.b, world=self.world, config=config, out=self.out)


def torch_fused_op(group_name: str):
    """PyTorch's fused matmul + reduce-scatter, wherever this build keeps it (or None)."""
    op = getattr(getattr(torch.ops, "symm_mem", None), "fused_matmul_reduce_scatter", None)
    if op is not None:
        return lambda a, b: op(a, b, "sum", 0, group_name)
    try:
        from torch.distributed._symmetric_memory import _fused_matmul_reduce_scatter_impl as impl
    except ImportError:
        return None
    return lambda a, b: impl(a, b, "sum", 0, group_name)


def bench_shape(M: int, N: int, K: int, world, bench: Bench, group_name: str, modes: str = "",
                partial_save=lambda entry: None) -> dict:  # fmt: skip
    t0 = time.time()
    rig = RsRig(world, M, N, K)
    big = M * N * K >= 8192 * 4096 * 12288
    eager_calls, replays = (20, 10) if big else (100, 50)
    entry: dict = {"M": M, "N": N, "K": K, "world_size": world.world_size, "anchors": {}, "modes": {}}

    run = guarded_measure(rig, bench, eager_calls=eager_calls, replays=replays, watchdog_s=120)

    partial = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")

    def gemm_nccl():
        torch.mm(rig.a, rig.b, out=partial)
        dist.reduce_scatter_tensor(rig.out, partial)

    run("gemm_nccl_rs", gemm_nccl, entry["anchors"])
    fused = torch_fused_op(group_name)
    if fused is not None and rig.R >= 2048:  # seen with torch 2.11 on 2x H200: never returns at 8192x4096x12288
        entry["anchors"]["torch_fused"] = {"error": "not timed: hung (no return in 120 s) at 8192x4096x12288"}
    elif fused is not None:
        run("torch_fused", lambda: rig.out.copy_(fused(rig.a, rig.b)), entry["anchors"], graphable=rig.R < 2048)
    else:
        entry["anchors"]["torch_fused"] = {"error": "no fused_matmul_reduce_scatter in this torch build"}
    entry["anchors"]["gemm_alone"] = measure_only(rig, lambda: torch.mm(rig.a, rig.b, out=partial), bench,
                                                  eager_calls, replays)  # fmt: skip
    entry["anchors"]["nccl_rs_alone"] = measure_only(rig, lambda: dist.reduce_scatter_tensor(rig.out, partial), bench,
                                                     eager_calls, replays)  # fmt: skip
    time_candidates(entry, candidates(M, K, world.world_size), run, rig, f"{M}x{N}x{K}", modes, partial_save)
    base, anchors = entry["anchors"]["gemm_nccl_rs"], entry["anchors"]
    summary = {}
    for regime in ("median_ms", "eager_ms", "graph_ms"):
        per_mode = {}
        for mode, results in entry["modes"].items():
            ok = [r for r in results if r.get("eager_error", 1) < TOL and r.get("graph_error", 1) < TOL and regime in r]
            if ok:
                best = min(ok, key=lambda r: r[regime])
                per_mode[mode] = {"ms": best[regime], "config": best["config"], "host_us": best.get("host_us")}
        best_mode = min(per_mode, key=lambda m: per_mode[m]["ms"]) if per_mode else None
        bound = max(anchors["gemm_alone"].get(regime, 0), anchors["nccl_rs_alone"].get(regime, 0))
        ours = per_mode[best_mode]["ms"] if best_mode else None
        hideable = (base.get(regime, 0) - bound) if regime in base else None
        summary[regime] = {
            "per_mode": per_mode, "best_mode": best_mode, "gemm_nccl_rs_ms": base.get(regime),
            "torch_fused_ms": anchors.get("torch_fused", {}).get(regime), "bound_ms": bound,
            "speedup_vs_gemm_nccl_rs": base[regime] / ours if ours and regime in base else None,
            "of_bound": ours / bound if ours and bound else None,
            "hidden_share": (base[regime] - ours) / hideable if ours and hideable and hideable > 0 else None,
        }  # fmt: skip
    entry["best"] = summary
    entry["seconds"] = time.time() - t0
    if world.rank == 0:
        line = {r: (s["best_mode"], round(s["per_mode"][s["best_mode"]]["ms"], 4) if s["best_mode"] else None,
                    round(s["gemm_nccl_rs_ms"] or 0, 4), round(s["speedup_vs_gemm_nccl_rs"] or 0, 3),
                    round(s["bound_ms"] or 0, 4)) for r, s in summary.items()}  # fmt: skip
        print(
            f"[{M}x{N}x{K}] {entry['seconds']:.0f}s {line} per mode gpu "
            f"{ {m: round(v['ms'], 4) for m, v in summary['median_ms']['per_mode'].items()} }",
            flush=True,
        )
    return entry


STRESS = [
    (
        (128, 8192, 8192),
        dict(
            mode="push",
            chunk_m=64,
            reduce_by="programs",
            reduce_sms=16,
            tile_order="peers_first",
            **_small(64, SPLIT_K=4),
        ),
    ),
    ((128, 8192, 8192), dict(mode="push", chunk_m=64, reduce_by="epilogue", **_small(64, SPLIT_K=4))),
    (
        (64, 8192, 8192),
        dict(
            mode="pull",
            chunk_m=32,
            reduce_by="programs",
            reduce_sms=32,
            tile_order="own_first",
            **_small(32, SPLIT_K=2),
        ),
    ),
    ((256, 4096, 4096), dict(mode="atomic", chunk_m=64, reduce_sms=8, tile_order="peers_first", **_small(128))),
    # 8-warp atomic tiles: the ones its read/zero race hit in every call before the fix
    ((1024, 4096, 8192), dict(mode="atomic", chunk_m=128, reduce_sms=16, tile_order="own_first", **BIG)),
    (
        (1024, 4096, 8192),
        dict(mode="push", chunk_m=128, reduce_by="programs", reduce_sms=16, tile_order="peers_first", **BIG),
    ),
    ((1024, 4096, 8192), dict(mode="pull", chunk_m=128, reduce_by="epilogue", **BIG)),
    (
        (1000, 3000, 2000),
        dict(mode="pull", chunk_m=64, reduce_by="programs", reduce_sms=8, tile_order="peers_first", **_small(500)),
    ),
    ((1000, 3000, 2000), dict(mode="push", chunk_m=64, reduce_by="epilogue", **_small(500))),
    ((64, 8192, 8192), dict(mode="push", reduce_by="tile", **row_tile(64))),
    ((200, 3000, 2000), dict(mode="pull", reduce_by="tile", **dict(row_tile(200), SPLIT_K=2))),
    ((1024, 4096, 8192), dict(mode="ce", ce_consumer="cublas", ce_chunks=2, reduce_sms=16)),
    ((64, 8192, 8192), dict(mode="pull_cublas", reduce_sms=64)),
    ((1000, 3000, 2000), dict(mode="pull_cublas", reduce_sms=8)),
    ((512, 2048, 4096), dict(mode="ce", ce_consumer="triton", ce_chunks=2, reduce_sms=8, **_small(256))),
    ((128, 8192, 8192), dict(mode="baseline")),
]


def stress(world, iterations: int) -> dict:
    """ag_gemm_modes' stress run over STRESS: A in symmetric memory for every other case, a plain tensor else."""
    return modes_stress(world, iterations, STRESS,
                        lambda k, M, N, K, seed: RsRig(world, M, N, K, seed=seed, symmetric=k % 2 == 0))  # fmt: skip


def main() -> None:
    ap = modes_arguments("gemm_rs_modes.json", "MxNxK,... (default: the issue's six shapes)")
    args = ap.parse_args()
    world = init_cuda_world()
    bench = Bench(args.iters, args.warmup, world)
    shapes = shapes_to_time(args, SHAPES)
    group_name = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(group_name)
    except Exception:
        pass
    result = run_header(world, "bench/gemm_rs/gemm_rs_modes.py")

    def save() -> None:
        save_result(world, result, args.out)

    spin_up(2.0)
    if args.stress:
        result["stress"] = stress(world, args.stress)
        if world.rank == 0:
            print("stress", {k: v for k, v in result["stress"].items() if k != "per_config"}, flush=True)
        save()
    run_shapes(world, result, args.out, shapes,
               lambda s, partial: bench_shape(*s, world, bench, group_name, args.modes, partial))  # fmt: skip


if __name__ == "__main__":
    main()
