"""Our tile GEMM at decode sizes on one GPU: how close the fused GEMM kernels' K loop and split-K merge come to cuBLAS
when A has few rows, over a grid of tiles. At 128 rows every fused GEMM+RS mode ran 3.4-7x cuBLAS on one H200
(`results/gemm_rs_epilogue_w1_1xH200_2026-11-24.json`); this separates the tile GEMM from the fusion around it.

Launch: `torchrun --nproc-per-node=1 bench/gemm_rs/tile_gemm_small_m.py --out t.json [--shapes MxNxK,...] [--anatomy]
[--tree DIR]`

Each config is `gemm_rs_kernel` with the plain-store epilogue over all M rows as one segment (what the copy-engine
mode's Triton consumer launches), compiled ahead on a thread pool, checked against the float32 product (NaN-poisoned
output), then timed as graph replays of CALLS back-to-back launches (min of three runs' per-launch time), beside
torch.mm (cuBLAS) on the same tensors and the bound of reading A and B once at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
import inspect
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
from common.cuda import init_cuda_world, spin_up
from common.measure import copy_bandwidth, launch_us, run_header

from jointtune.kernels.gemm_rs.args import EPI_STORE, GemmRsConfig, RsShape, kernel_args, tile_work
from jointtune.kernels.gemm_rs.kernel import gemm_rs_kernel
from jointtune.kernels.runtime.device import device_limits
from jointtune.kernels.runtime.launch import split_options
from jointtune.search_spaces import get_space

SHAPES = [(128, 8192, 4096), (64, 8192, 4096), (32, 8192, 4096)]
CALLS = 20
SPLITS = (1, 2, 4, 8)


def grid(M: int, N: int, K: int) -> list[dict]:
    """Tiles the gemm_rs space allows here: one row tile over M (B read once) or 64 rows, 64-256 columns, 64-256
    deep K steps, split-K 1-8, short to deep pipelines."""
    space, limits = get_space("gemm_rs"), device_limits(torch.device("cuda"))
    problem = space.make_problem({"M": M, "N": N, "K": K}, dtype="bf16", world_size=1)
    rows = sorted({min(128, max(16, 1 << (M - 1).bit_length())), min(64, max(16, 1 << (M - 1).bit_length()))})
    out = []
    for bm, bn, bk, split, (warps, stages) in itertools.product(
        rows, (64, 128, 256), (64, 128, 256), SPLITS, ((4, 3), (4, 4), (4, 6), (8, 3), (8, 4))
    ):
        cfg = dict(mode="ce", ce_consumer="triton", ce_chunks=1, reduce_sms=1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                   GROUP_M=1, num_warps=warps, num_stages=stages, SPLIT_K=split)  # fmt: skip
        if not space.violations(cfg, problem, limits):
            out.append(cfg)
    return out


class TileGemm:
    """One config's launch over fixed A, B, C (and its split-K workspace). `span` makes it the launch of
    `reduce_by=tile` at world size 1 (every row its own: no sends, no waits); `epoch` is the launch's EPOCH: 1 opens
    the call (reads the counter, arrives, the last publishes), 2 only reads the counter, 0 has no call epoch, to tell
    what each part costs (2 and 0 are right only at world size 1). With `--tree` on a checkout whose kernels still
    fenced per thread, the span launch gets its fence scratch."""

    def __init__(self, cfg: dict, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, span: bool = False,
                 epoch: int = 1) -> None:  # fmt: skip
        M, K = a.shape
        N = b.shape[1]
        self.cfg = GemmRsConfig.of(cfg)
        s = RsShape(1, M, K, N, a.dtype, tuple(b.stride()))
        self.work = tile_work(self.cfg, M, M, N)
        tiles = self.work // self.cfg.SPLIT_K
        dev = a.device
        ws = counts = None
        if self.cfg.SPLIT_K > 1:
            ws = torch.zeros(tiles * self.cfg.BLOCK_M * self.cfg.BLOCK_N, dtype=torch.float32, device=dev)
            counts = torch.zeros(tiles, dtype=torch.int32, device=dev)
        dummy = torch.zeros(1, dtype=torch.int64, device=dev)
        if span:
            self.work = min(self.work, torch.cuda.get_device_properties(dev).multi_processor_count)
            state = torch.zeros(2, dtype=torch.int64, device=dev)
            fenced = "fence" in inspect.signature(kernel_args).parameters
            extra = {"fence": torch.zeros(self.work * 32 * self.cfg.num_warps, dtype=torch.int32, device=dev)}
            args = kernel_args(self.cfg, s, a=a, b=b, out=c, dummy=dummy, rank=0, rows=M, seg_rows=M, epi=EPI_STORE,
                               gemm=False, reduce=False, dest=c, dest_deltas=dummy, src=c, src_deltas=dummy,
                               flags_local=dummy, flag_ptrs=dummy, state=state, ws=ws, counts=counts,
                               n_chunks=tiles, gemm_programs=self.work, num_programs=self.work, stride_dm=N,
                               epoch=epoch, span=True, **(extra if fenced else {}))  # fmt: skip
        else:
            args = kernel_args(self.cfg, s, a=a, b=b, out=c, dummy=dummy, rank=0, rows=M, seg_rows=M, epi=EPI_STORE,
                               gemm=True, reduce=False, dest=c, dest_deltas=dummy, ws=ws, counts=counts,
                               gemm_programs=self.work, num_programs=self.work, stride_dm=N)  # fmt: skip
        self.named, self.options = split_options(args)

    def compile(self) -> None:
        gemm_rs_kernel.warmup(grid=(1,), **self.named, **self.options)

    def __call__(self) -> None:
        gemm_rs_kernel[(self.work,)](**self.named, **self.options)


def bench_shape(M: int, N: int, K: int, bandwidth: float) -> dict:
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=gen).div_(K**0.25).bfloat16()
    b = torch.randn(K, N, device="cuda", generator=gen).div_(K**0.25).bfloat16()
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    configs = grid(M, N, K)
    launches = [TileGemm(cfg, a, b, c) for cfg in configs]
    with ThreadPoolExecutor(16) as pool:
        errors = list(pool.map(lambda t: _try(t.compile), launches))
    compiled_s = time.time() - t0
    entry = {"M": M, "N": N, "K": K, "configs": len(configs), "compile_s": compiled_s,
             "bound_us": (M * K + K * N + M * N) * 2 / bandwidth * 1e6,
             "cublas_us": launch_us(lambda: torch.mm(a, b, out=c), CALLS), "results": []}  # fmt: skip
    for cfg, launch, err in zip(configs, launches, errors):
        row = {"config": cfg}
        if err:
            row["error"] = err
        else:
            c.fill_(float("nan"))
            launch()
            torch.cuda.synchronize()
            row["error_rel"] = ((c.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()
            if row["error_rel"] < 2e-2:
                row["us"] = launch_us(launch, CALLS)
        entry["results"].append(row)
    timed = sorted((r for r in entry["results"] if "us" in r), key=lambda r: r["us"])
    entry["best"] = timed[:5]
    entry["seconds"] = time.time() - t0
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
    short = {k: timed[0]["config"][k] for k in keys} if timed else None
    by_split = {s: round(min((r["us"] for r in timed if r["config"]["SPLIT_K"] == s), default=0), 1) for s in SPLITS}
    print(f"[{M}x{N}x{K}] {entry['seconds']:.0f}s ({compiled_s:.0f}s compiling {len(configs)}) cublas "
          f"{entry['cublas_us']:.1f} us, bound {entry['bound_us']:.1f}, ours best "
          f"{timed[0]['us'] if timed else float('nan'):.1f} {short}, best per SPLIT_K {by_split}, "
          f"wrong {sum(1 for r in entry['results'] if r.get('error_rel', 0) >= 2e-2)}, "
          f"failed {sum(1 for r in entry['results'] if 'error' in r)}", flush=True)  # fmt: skip
    return entry


def anatomy(M: int, N: int, K: int) -> dict:
    """The tile GEMM alone against the `reduce_by=tile` launch at world size 1 on the same tile (one row tile over
    M, 64 columns, 128-deep steps, no split-K): opening the call, only reading its epoch, no epoch."""
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", generator=gen).div_(K**0.25).bfloat16()
    b = torch.randn(K, N, device="cuda", generator=gen).div_(K**0.25).bfloat16()
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    bm = max(16, min(128, 1 << (M - 1).bit_length()))
    cfg = dict(mode="pull", reduce_by="tile", BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=1,
               num_warps=8 if bm >= 128 else 4, num_stages=4, SPLIT_K=1)  # fmt: skip
    variants = {
        "tile_gemm": TileGemm(cfg, a, b, c),
        "span": TileGemm(cfg, a, b, c, span=True),
        "span_epoch_read_only": TileGemm(cfg, a, b, c, span=True, epoch=2),
        "span_no_epoch": TileGemm(cfg, a, b, c, span=True, epoch=0),
    }
    entry = {"M": M, "N": N, "K": K, "config": cfg, "cublas_us": launch_us(lambda: torch.mm(a, b, out=c), CALLS)}
    for name, launch in variants.items():
        c.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        err = ((c.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()
        entry[name] = {"error_rel": err, "us": launch_us(launch, CALLS) if err < 2e-2 else None}
    print(
        f"[anatomy {M}x{N}x{K}] cublas {entry['cublas_us']:.1f} us, "
        + ", ".join(f"{n} {entry[n]['us'] or float('nan'):.1f}" for n in variants),
        flush=True,
    )
    return entry


def _try(fn) -> str | None:
    try:
        fn()
    except Exception as exc:  # a config Triton cannot compile is a result, not a crash
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tile_gemm_small_m.json")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: decode rows 32-256 of 8192-wide layers)")
    ap.add_argument("--anatomy", action="store_true", help="only what the reduce_by=tile launch adds to the tile GEMM")
    add_tree_argument(ap)
    args = ap.parse_args()
    world = init_cuda_world()
    result = run_header(world, "bench/gemm_rs/tile_gemm_small_m.py")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    bandwidth = copy_bandwidth()
    result["copy_bandwidth_bytes_per_s"] = bandwidth
    spin_up(2.0)
    result["shapes"] = []
    for shape in shapes:
        result["shapes"].append(anatomy(*shape) if args.anatomy else bench_shape(*shape, bandwidth))
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
