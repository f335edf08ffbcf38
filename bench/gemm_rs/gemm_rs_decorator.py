"""One decorator lookup of a tuned GEMM+RS config on 2 GPUs, as users call it: `@joint_autotune(space="gemm_rs")`
over `gemm_rs`, reading the store a sweep wrote; the result checked against a float32 reference.

Launch: `torchrun --nproc-per-node=2 bench/gemm_rs/gemm_rs_decorator.py --db URL --out decorator.json`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import init_cuda_world

from jointtune import joint_autotune
from jointtune.kernels.gemm_rs import gemm_rs, reference


def shape_of(a, b, *, world):
    """The call's global dims: A_r is [M, K / W] and B_r [K / W, N]."""
    return {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1] * world.world_size}


@joint_autotune(space="gemm_rs", key=shape_of, on_miss="default", timing="gpu")
def row_parallel(a, b, *, world, config):
    return gemm_rs(a, b, world=world, config=config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", default="gemm_rs_decorator.json")
    ap.add_argument("--shapes", default="64x8192x8192,1024x8192x8192,8192x4096x12288,96x4096x4096")
    args = ap.parse_args()
    os.environ["JOINTTUNE_DB_URL"] = args.db
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    rows = []
    for text in args.shapes.split(","):
        M, N, K = (int(x) for x in text.split("x"))
        gen = torch.Generator(device="cuda").manual_seed(M + N + K)
        a_all = [torch.randn(M, K // W, device="cuda", generator=gen).div(K**0.25).bfloat16() for _ in range(W)]
        b_all = [torch.randn(K // W, N, device="cuda", generator=gen).div(K**0.25).bfloat16() for _ in range(W)]
        t0 = time.perf_counter()
        out = row_parallel(a_all[rank], b_all[rank], world=world)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            row_parallel(a_all[rank], b_all[rank], world=world)
        torch.cuda.synchronize()
        repeat_us = (time.perf_counter() - t0) / 20 * 1e6
        ref = reference(a_all, b_all)[rank]
        err = ((out.float() - ref).norm() / ref.norm()).item()
        key = next(k for k in row_parallel.cache if dict(k[0]) == {"M": M, "N": N, "K": K})
        rows.append({"shape": text, "config": dict(row_parallel.cache[key]), "source": row_parallel.sources[key],
                     "error": err, "first_call_s": first_s, "repeat_call_us": repeat_us})  # fmt: skip
        if rank == 0:
            print(rows[-1], flush=True)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"world_size": W, "db": args.db, "calls": rows}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
