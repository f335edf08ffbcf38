"""AG+GEMM as serving engines meet it: every mode at its best config in three regimes, against NCCL+cuBLAS
and PyTorch's fused op, in one run; graph-replay correctness and a mixed replay stress run.

Launch: `torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_modes.py --out modes.json [--shapes MxNxK,...]`

Regimes: gpu, eager and graph, as `common/measure.py` measures them (each the max over ranks; the baseline and
torch's op timed the same way).

Every candidate is checked against a float32 reference before it is timed: eagerly with a NaN-poisoned
output, and under graph replay with fresh random A and B written into the captured tensors between
replays. The stress run replays graphs of mixed modes and shapes back to back with fresh data each time
and eager calls in between, checking every output on the device.
"""

from __future__ import annotations

import json
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
    compiled_call_check,
    guarded_measure,
    measure_only,
    modes_arguments,
    run_header,
    run_shapes,
    save_result,
    shapes_to_time,
    stress,
)

from jointtune.kernels.ag_gemm import ag_gemm, config_json
from jointtune.search_spaces import row_tile

ANCHOR_SHAPES = [(8192, 4096, 12288), (8192, 8192, 28672), (8192, 3584, 14336), (1024, 8192, 8192), (128, 8192, 8192)]
DECODE_SHAPES = [(64, 8192, 8192), (256, 8192, 8192), (64, 6144, 4096), (128, 6144, 4096), (256, 6144, 4096)]
BIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, SPLIT_K=1)
SMALL = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4, SPLIT_K=1)


def candidates(M: int, W: int) -> dict[str, list[dict]]:
    """A short list per mode: each mode's best configs of the previous sweeps (bench/results)."""
    R = M // W
    pc = dict(mode="push_cublas")
    if R >= 2048:
        push_cublas = [dict(pc, push_by="ce", gemm_order="local_first", chunk_m=c) for c in (R, R // 2)]
        push_cublas.append(dict(pc, push_by="sm", gemm_order="gathered", comm_sms=32))
        tiles, push_chunk = BIG, 256
    else:
        push_cublas = [dict(pc, push_by="sm", gemm_order="gathered", comm_sms=s) for s in (8, 16, 32)]
        push_cublas.append(dict(pc, push_by="ce", gemm_order="gathered"))
        push_cublas.append(dict(pc, push_by="ce", gemm_order="local_first", chunk_m=1 << (R.bit_length() - 1)))
        tiles, push_chunk = (BIG if R >= 512 else dict(SMALL, BLOCK_N=64)), min(1 << (R.bit_length() - 1), 256)
    out = {
        "baseline": [dict(mode="baseline")],
        "push_cublas": push_cublas,
        "ce_cublas": [dict(mode="ce", ce_consumer="cublas", ce_chunks=c) for c in (1, 2)],
        "ce_triton": [dict(mode="ce", ce_consumer="triton", ce_chunks=1, **tiles)],
        "pull": [dict(mode="pull", **(BIG if R >= 512 else SMALL))],
        "push": [dict(mode="push", comm_sms=32, chunk_m=push_chunk, **tiles)],
    }
    if M <= 128:  # one row tile over all M rows (B read once): the tile GEMM's best at 32-128 rows on one H200
        one = row_tile(M)
        out["pull"].append(dict(mode="pull", **one))
        out["push"].append(dict(mode="push", comm_sms=8, chunk_m=max(16, 1 << (R - 1).bit_length()), **one))
    return out


class Rig:
    """One shape's tensors on this rank: A in symmetric memory, B, a static C, and fresh-data refills."""

    def __init__(self, world, M: int, N: int, K: int, seed: int = 1234) -> None:
        self.world, self.M, self.N, self.K = world, M, N, K
        W = world.world_size
        self.R, self.N_r = M // W, N // W
        (self.a,) = world.empty((self.R, K), torch.bfloat16)
        self.b = torch.empty(K, self.N_r, dtype=torch.bfloat16, device="cuda")
        self.out = torch.empty(M, self.N_r, dtype=torch.bfloat16, device="cuda")
        self.ref = torch.empty(M, self.N_r, dtype=torch.float32, device="cuda")
        self.seed = seed
        self.refill()

    def refill(self, seed: int | None = None) -> None:
        """New A shards (all ranks', from one seed), a new B per rank, the reference; C poisoned. On the
        stream only (no host sync), so it can run between back-to-back replays."""
        self.seed = self.seed + 1 if seed is None else seed
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        W, rank = self.world.world_size, self.world.rank
        all_a = torch.randn(W * self.R, self.K, device="cuda", generator=gen).div_(self.K**0.25).bfloat16()
        gen_b = torch.Generator(device="cuda").manual_seed(self.seed * 7919 + rank)
        self.b.copy_(torch.randn(self.K, self.N_r, device="cuda", generator=gen_b).div_(self.K**0.25))
        self.a.copy_(all_a[rank * self.R : (rank + 1) * self.R])
        torch.mm(all_a.float(), self.b.float(), out=self.ref)
        self.out.fill_(float("nan"))

    def error_on_device(self) -> torch.Tensor:
        return ((self.out.float() - self.ref).norm() / self.ref.norm()).nan_to_num(float("inf")).reshape(1)

    def call(self, config: dict):
        return lambda: ag_gemm(self.a, self.b, world=self.world, config=config, out=self.out)


def bench_shape(M: int, N: int, K: int, world, bench: Bench, group_name: str, modes: str = "") -> dict:
    t0 = time.time()
    rig = Rig(world, M, N, K)
    big = M * N * K >= 8192 * 4096 * 12288
    eager_calls, replays = (20, 10) if big else (100, 50)
    entry: dict = {"M": M, "N": N, "K": K, "world_size": world.world_size, "anchors": {}, "modes": {}}

    run = guarded_measure(rig, bench, eager_calls=eager_calls, replays=replays)

    gathered = torch.empty(M, K, dtype=torch.bfloat16, device="cuda")

    def nccl_cublas():
        dist.all_gather_into_tensor(gathered, rig.a)
        torch.mm(gathered, rig.b, out=rig.out)

    run("nccl_cublas", nccl_cublas, entry["anchors"])

    def torch_fused():
        _, (c,) = torch.ops.symm_mem.fused_all_gather_matmul(rig.a, [rig.b], 0, group_name)
        rig.out.copy_(c)

    # torch's op hangs under graph capture from the large shapes on (seen with torch 2.11): time it eagerly there
    run("torch_fused", torch_fused, entry["anchors"], graphable=rig.R < 2048)
    dist.all_gather_into_tensor(gathered, rig.a)
    entry["anchors"]["cublas_alone"] = measure_only(
        rig, lambda: torch.mm(gathered, rig.b, out=rig.out), bench, eager_calls, replays
    )
    entry["anchors"]["nccl_all_gather_alone"] = measure_only(
        rig, lambda: dist.all_gather_into_tensor(gathered, rig.a), bench, eager_calls, replays
    )
    for mode, cands in candidates(M, world.world_size).items():
        if modes and mode not in modes.split(","):
            continue
        results = []
        for cfg in cands:
            res = run(json.dumps(cfg, sort_keys=True), rig.call(cfg), {})
            results.append(dict(config=cfg, **res))
        entry["modes"][mode] = results
    # best per regime, per mode and overall (only candidates that were right eagerly and under replay)
    base = entry["anchors"]["nccl_cublas"]
    summary = {}
    for regime in ("median_ms", "eager_ms", "graph_ms"):
        per_mode = {}
        for mode, results in entry["modes"].items():
            ok = [r for r in results if r.get("eager_error", 1) < TOL and r.get("graph_error", 1) < TOL and regime in r]
            if ok:
                best = min(ok, key=lambda r: r[regime])
                per_mode[mode] = {"ms": best[regime], "config": best["config"], "host_us": best.get("host_us")}
        best_mode = min(per_mode, key=lambda m: per_mode[m]["ms"]) if per_mode else None
        summary[regime] = {
            "per_mode": per_mode,
            "best_mode": best_mode,
            "nccl_cublas_ms": base.get(regime),
            "torch_fused_ms": entry["anchors"]["torch_fused"].get(regime),
            "speedup_vs_nccl_cublas": (base[regime] / per_mode[best_mode]["ms"])
            if best_mode and regime in base
            else None,
        }
    entry["best"] = summary
    entry["seconds"] = time.time() - t0
    if world.rank == 0:
        line = {r: (s["best_mode"], round(s["per_mode"][s["best_mode"]]["ms"], 4) if s["best_mode"] else None,
                    round(s["nccl_cublas_ms"] or 0, 4), round(s["speedup_vs_nccl_cublas"] or 0, 3))
                for r, s in summary.items()}  # fmt: skip
        host = {m: round(v.get("host_us") or 0) for m, v in summary["median_ms"]["per_mode"].items()}
        print(f"[{M}x{N}x{K}] {entry['seconds']:.0f}s {line} host_us {host} (nccl_cublas "
              f"{round(base.get('host_us', 0))})", flush=True)  # fmt: skip
    return entry


STRESS = [
    ((128, 8192, 8192), dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32)),
    ((64, 6144, 4096), dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=8)),
    ((256, 6144, 4096), dict(mode="push_cublas", push_by="ce", gemm_order="gathered")),
    ((1024, 8192, 8192), dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=256)),
    ((1024, 2048, 2048), dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=16, chunk_m=128)),
    ((1024, 2048, 2048), dict(mode="push", comm_sms=16, chunk_m=128, **dict(SMALL, SPLIT_K=2))),
    ((128, 8192, 8192), dict(mode="push", comm_sms=32, chunk_m=64, **dict(SMALL, BLOCK_N=64))),
    ((256, 2048, 4096), dict(mode="ce", ce_consumer="cublas", ce_chunks=2)),
    ((256, 2048, 4096), dict(mode="pull", **SMALL)),
    ((512, 2048, 4096), dict(mode="ce", ce_consumer="triton", ce_chunks=2, **SMALL)),
    ((128, 8192, 8192), dict(mode="baseline")),
]


def compiled_module_check(world) -> dict:
    """torch.compile(fullgraph=True) of a module calling torch.ops.jointtune.ag_gemm, then CUDA-graph capture
    of the compiled module; every replay checked against the reference."""
    cfg = config_json(dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32))
    rig = Rig(world, 128, 8192, 8192, seed=4242)

    class Layer(torch.nn.Module):
        def forward(self, a, b):
            (c,) = torch.ops.jointtune.ag_gemm([a], [b], world.name, cfg)
            return c * 1.0

    compiled = torch.compile(Layer(), fullgraph=True)
    return compiled_call_check(rig, lambda: rig.out.copy_(compiled(rig.a, rig.b)))


def main() -> None:
    ap = modes_arguments("ag_gemm_modes.json", "MxNxK,... (default: the anchor shapes and the decode shapes)")
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    world = init_cuda_world()
    bench = Bench(args.iters, args.warmup, world)
    shapes = shapes_to_time(args, DECODE_SHAPES + ANCHOR_SHAPES)
    group_name = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(group_name)
    except Exception:
        pass
    result = run_header(world, "bench/ag_gemm/ag_gemm_modes.py")

    def save() -> None:
        save_result(world, result, args.out)

    spin_up(2.0)
    if args.stress:
        result["stress"] = stress(world, args.stress, STRESS, lambda k, M, N, K, seed: Rig(world, M, N, K, seed=seed))
        if world.rank == 0:
            print("stress", {k: v for k, v in result["stress"].items() if k != "per_config"}, flush=True)
        save()
    if not args.skip_compile:
        try:
            result["compiled_module"] = compiled_module_check(world)
        except Exception as exc:
            result["compiled_module"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if world.rank == 0:
            print("compiled module", result["compiled_module"], flush=True)
        save()
    run_shapes(world, result, args.out, shapes, lambda s, _: bench_shape(*s, world, bench, group_name, args.modes))


if __name__ == "__main__":
    main()
