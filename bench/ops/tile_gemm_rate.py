"""How fast can a tile GEMM read the weight at decode rows? The fused GEMM families' K loop against two candidates for
it and cuBLAS, on one GPU, with the weight warm in L2 (the same B every call, as the modes benchmarks time it) and
cold (calls cycle over copies of B that together hold three L2s, as a model's layers meet theirs).

Launch: `torchrun --nproc-per-node=1 bench/ops/tile_gemm_rate.py --out r.json [--shapes MxNxK,...] [--tree DIR]`

MxNxK is one rank's GEMM: A [M, K] @ B [K, N] (B row-major, as the families take it). Loops compared, each over a
grid of tiles (one row tile over M), split-K 1-8 and warp / stage pairs:
- `today`: the families' `split_product` (pointer loads masked on M, N and K; split-K partials meet through fp32
  atomics in a workspace);
- `ordered`: the same K loop (`tiles.tile_dot`), split-K partials stored to a slot per split and summed in split order
  by the last to arrive (no atomics on data: the same bits every call);
- `tma`: A and B tiles through host-made tensor descriptors (Hopper's bulk tensor copies; the copy zero-fills past
  the edges, so no masks), split-K as `ordered`.
Every config is checked against the float32 product (NaN-poisoned output) before it is timed: graph replays of
back-to-back launches, per-launch time, min of three runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.checkout import add_tree_argument  # first: `--tree` picks the jointtune every import below gets

# isort: split

import torch
import triton
import triton.language as tl
from common.cuda import init_cuda_world, spin_up
from common.measure import copy_bandwidth, launch_us, run_header
from triton.tools.tensor_descriptor import TensorDescriptor

from jointtune.kernels.runtime.tiles import split_product, tile_dot

SHAPES = [(8, 8192, 2048), (64, 8192, 2048), (128, 8192, 2048), (64, 8192, 4096), (128, 8192, 4096),
          (64, 2048, 8192), (128, 2048, 8192), (64, 4096, 8192), (256, 8192, 4096)]  # fmt: skip
LOOPS = ("today", "ordered", "tma")


@triton.jit
def _merge_ordered(acc, ws_ptr, counts_ptr, tile, split, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):  # fmt: skip
    # each split stores its partial in its own slot; the last to arrive sums the slots in split order
    in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(base + split * (BLOCK_M * BLOCK_N) + in_tile, acc)
    tl.debug_barrier()
    arrived = tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel")
    last = arrived == SPLIT_K - 1
    if last:
        tl.debug_barrier()
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(base + s * (BLOCK_M * BLOCK_N) + in_tile, cache_modifier=".cg")
        tl.store(counts_ptr + tile, 0)
    return acc, last


@triton.jit
def loop_kernel(a_ptr, b_ptr, a_desc, b_desc, c_ptr, ws_ptr, counts_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                LOOP: tl.constexpr):  # fmt: skip
    work = tl.program_id(0)
    tile = work // SPLIT_K
    split = work % SPLIT_K
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = tile // tiles_n
    pid_n = tile % tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    if LOOP == 0:
        a_rows = a_ptr + offs_m.to(tl.int64) * stride_am
        acc, last = split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, split, ws_ptr, counts_ptr, tile, stride_bk,
                                  1, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, False)  # fmt: skip
    else:
        k_blocks = tl.cdiv(K, BLOCK_K)
        per = tl.cdiv(k_blocks, SPLIT_K)
        kb_lo = split * per
        kb_hi = tl.minimum(kb_lo + per, k_blocks)
        if LOOP == 2:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kb in range(kb_lo, kb_hi):
                a = a_desc.load([pid_m * BLOCK_M, kb * BLOCK_K])
                b = b_desc.load([kb * BLOCK_K, pid_n * BLOCK_N])
                acc = tl.dot(a, b, acc)
        else:  # the families' K loop, only the merge differs
            a_rows = a_ptr + offs_m.to(tl.int64) * stride_am
            acc = tile_dot(a_rows, mmask, b_ptr, offs_n, nmask, K, kb_lo, kb_hi, stride_bk, 1, BLOCK_M, BLOCK_N,
                           BLOCK_K, False)  # fmt: skip
        last = True
        if SPLIT_K > 1:
            acc, last = _merge_ordered(acc, ws_ptr, counts_ptr, tile, split, SPLIT_K, BLOCK_M, BLOCK_N)
    if last:
        c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


class TileLoop:
    """One loop and config over A, copies of B (one launch per copy, in turn) and C."""

    def __init__(self, loop: str, cfg: dict, a: torch.Tensor, bs: list[torch.Tensor], c: torch.Tensor) -> None:
        M, K = a.shape
        N = bs[0].shape[1]
        bm, bn, bk, sk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        self.grid = (tiles * sk,)
        per_tile = bm * bn * (sk if loop != "today" else 1)
        ws = torch.zeros(max(1, tiles * per_tile), dtype=torch.float32, device=a.device)
        counts = torch.zeros(tiles, dtype=torch.int32, device=a.device)
        a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
        self.args = []
        for b in bs:
            b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
            self.args.append(dict(a_ptr=a, b_ptr=b, a_desc=a_desc, b_desc=b_desc, c_ptr=c, ws_ptr=ws,
                                  counts_ptr=counts, M=M, N=N, K=K, stride_am=a.stride(0), stride_bk=b.stride(0),
                                  stride_cm=c.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk,
                                  LOOP=LOOPS.index(loop), num_warps=cfg["num_warps"],
                                  num_stages=cfg["num_stages"]))  # fmt: skip
        self.turn = 0

    def compile(self) -> None:
        loop_kernel.warmup(grid=self.grid, **self.args[0])

    def __call__(self) -> None:
        loop_kernel[self.grid](**self.args[self.turn])
        self.turn = (self.turn + 1) % len(self.args)


def grid(M: int, K: int) -> list[dict]:
    """One row tile over M (B read once), 64-128 columns, 64-256-deep steps, split-K 1-8 where every split keeps two
    steps, short to deep pipelines."""
    bm = max(16, min(128, 1 << (M - 1).bit_length()))
    out = []
    for bn, bk, sk, (warps, stages) in itertools.product((64, 128), (64, 128, 256), (1, 2, 4, 8),
                                                         ((4, 3), (4, 5), (8, 4))):  # fmt: skip
        if K // (bk * sk) >= 2 and bm * bn <= 128 * 64 * (2 if warps == 8 else 1):
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=stages))
    return out


def _try(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # a config Triton cannot compile (shared memory, say) is a result, not a crash
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def bench_shape(M: int, N: int, K: int, bandwidth: float, l2_bytes: int, loops: list[str]) -> dict:
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=gen).div_(K**0.25).bfloat16()
    b_bytes = K * N * 2
    copies = max(2, -(-3 * l2_bytes // b_bytes))
    bs = [torch.randn(K, N, device="cuda", generator=gen).div_(K**0.25).bfloat16() for _ in range(copies)]
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ bs[0].float()
    calls = copies * max(1, -(-8 // copies))
    configs = [(loop, cfg) for loop in loops for cfg in grid(M, K)]
    warm = [TileLoop(loop, cfg, a, bs[:1], c) for loop, cfg in configs]
    cold = [TileLoop(loop, cfg, a, bs, c) for loop, cfg in configs]
    with ThreadPoolExecutor(16) as pool:
        errors = list(pool.map(lambda t: _try(t.compile), warm))
    compiled_s = time.time() - t0
    turn = iter(itertools.cycle(bs))
    entry = {"M": M, "N": N, "K": K, "copies_cold": copies, "configs": len(configs), "compile_s": compiled_s,
             "read_bound_us": (M * K + K * N + M * N) * 2 / bandwidth * 1e6,
             "cublas_warm_us": launch_us(lambda: torch.mm(a, bs[0], out=c), calls),
             "cublas_cold_us": launch_us(lambda: torch.mm(a, next(turn), out=c), calls), "results": []}  # fmt: skip
    for (loop, cfg), w, cl, err in zip(configs, warm, cold, errors):
        row = {"loop": loop, "config": cfg}
        if not err:
            c.fill_(float("nan"))
            err = _try(w)  # a config past the shared memory fails at its first launch, not at warm-up
            torch.cuda.synchronize()
        if err:
            row["error"] = err
        else:
            row["error_rel"] = ((c.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()
            if row["error_rel"] < 2e-2:
                row["warm_us"] = launch_us(w, calls)
                row["cold_us"] = launch_us(cl, calls)
        entry["results"].append(row)
    entry["best"] = {}
    line = []
    for loop in loops:
        rows = [r for r in entry["results"] if r["loop"] == loop and "warm_us" in r]
        best = {reg: min(rows, key=lambda r: r[f"{reg}_us"]) if rows else None for reg in ("warm", "cold")}
        entry["best"][loop] = best
        line.append(
            f"{loop} "
            + " / ".join(f"{best[reg][f'{reg}_us']:.1f}" if best[reg] else "-" for reg in ("warm", "cold"))
            + (f" (cold best {_short(best['cold']['config'])})" if best["cold"] else "")
        )
    entry["wrong"] = sum(1 for r in entry["results"] if r.get("error_rel", 0) >= 2e-2)
    entry["failed"] = sum(1 for r in entry["results"] if "error" in r)
    entry["seconds"] = time.time() - t0
    print(f"[{M}x{N}x{K}] warm / cold us: cuBLAS {entry['cublas_warm_us']:.1f} / {entry['cublas_cold_us']:.1f}, "
          f"read bound {entry['read_bound_us']:.1f}; " + "; ".join(line)
          + f"; wrong {entry['wrong']}, failed {entry['failed']}, {entry['seconds']:.0f} s", flush=True)  # fmt: skip
    return entry


def _short(cfg: dict) -> str:
    return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} sk{SPLIT_K} w{num_warps} s{num_stages}".format(**cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tile_gemm_rate.json")
    ap.add_argument("--shapes", default="", help="MxNxK,... of one rank's GEMM (default: decode rows of 8192 layers)")
    ap.add_argument("--loops", default=",".join(LOOPS), help=f"comma-separated, of {', '.join(LOOPS)}")
    add_tree_argument(ap)
    args = ap.parse_args()
    loops = [x for x in args.loops.split(",") if x]
    if not loops or set(loops) - set(LOOPS):
        ap.error(f"--loops: comma-separated names of {', '.join(LOOPS)}, got {args.loops!r}")
    world = init_cuda_world()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    result = run_header(world, "bench/ops/tile_gemm_rate.py")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    bandwidth = copy_bandwidth()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    result.update(copy_bandwidth_bytes_per_s=bandwidth, l2_bytes=l2, shapes=[])
    spin_up(2.0)
    for shape in shapes:
        result["shapes"].append(bench_shape(*shape, bandwidth, l2, loops))
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
