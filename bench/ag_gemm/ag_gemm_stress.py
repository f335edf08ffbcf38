"""Repeat AG+GEMM configs that exercise the cross-program handshakes (split-K slots, push flags) many
times on fresh random data and count wrong results: a race shows as an error that comes and goes.

Each config runs twice: one call at a time (a collective between calls), and as a burst of `--reps`
calls issued back to back with no synchronisation, checked afterwards, so a rank running calls ahead of
its peer (the inbox halves' reuse across calls) is exercised too.

Launch: `torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_stress.py --reps 30`
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import device_label, init_cuda_world

from jointtune.errors import SpaceError
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.runtime.plan import resolve_config

TILE = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=6)
CONFIGS = [
    dict(mode="ce", ce_consumer="triton", ce_chunks=4, SPLIT_K=8, **TILE),
    dict(mode="pull", SPLIT_K=4, **TILE),
    dict(mode="push", comm_sms=32, chunk_m=128, SPLIT_K=2, **dict(TILE, BLOCK_K=128, num_warps=4, num_stages=4)),
    dict(mode="push", comm_sms=8, chunk_m=16, SPLIT_K=1, **dict(TILE, BLOCK_K=64, num_stages=4)),
    dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=16, chunk_m=32),
    dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=32),
    dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32),
    dict(mode="push_cublas", push_by="ce", gemm_order="gathered"),
]
SHAPES = [(1024, 2048, 2048), (128, 8192, 8192), (4096, 4096, 4096)]


KNOBS = ("SPLIT_K", "push_by", "gemm_order", "comm_sms", "chunk_m")


def _max_error(out: torch.Tensor, all_a: list[torch.Tensor], b: torch.Tensor) -> float:
    ref = torch.cat(all_a).float() @ b.float()
    err = torch.tensor([((out.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()], device="cuda")
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return err.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default="ag_gemm_stress.json")
    ap.add_argument("--modes", default="", help="comma-separated modes to stress (default: every config's)")
    args = ap.parse_args()
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    report = {"device": device_label(W), "command": " ".join(sys.argv), "runs": []}
    for M, N, K in SHAPES:
        R, N_r = M // W, N // W
        for cfg in [c for c in CONFIGS if not args.modes or c["mode"] in args.modes.split(",")]:
            try:  # the space may refuse a tile at this shape (GROUP_M over too few row tiles): every rank alike
                resolve_config("ag_gemm", cfg, {"M": M, "N": N, "K": K}, "bfloat16", world)
            except SpaceError as exc:
                if rank == 0:
                    print(f"{M}x{N}x{K} {cfg}: skipped, {exc}", flush=True)
                continue
            for burst in (False, True):
                inputs, outs, errors = [], [], []
                for rep in range(args.reps):
                    gen = torch.Generator(device="cuda").manual_seed(rep)
                    all_a = [torch.randn(R, K, device="cuda", generator=gen).bfloat16() for _ in range(W)]
                    b = torch.randn(K, N_r, device="cuda", generator=gen).bfloat16()
                    out = torch.full((M, N_r), float("nan"), dtype=torch.bfloat16, device="cuda")
                    ag_gemm(all_a[rank], b, world=world, config=cfg, out=out)
                    inputs.append((all_a, b))
                    outs.append(out)
                    if not burst:
                        errors.append(_max_error(out, all_a, b))
                        inputs.clear()
                        outs.clear()
                if burst:
                    errors = [_max_error(out, all_a, b) for out, (all_a, b) in zip(outs, inputs)]
                worst, bad = max(errors), sum(e > 2e-2 for e in errors)
                report["runs"].append(
                    dict(shape=[M, N, K], config=cfg, burst=burst, reps=args.reps, worst_rel_error=worst, wrong=bad)
                )
                if rank == 0:
                    label = f"{cfg['mode']} " + ",".join(f"{k}={v}" for k, v in sorted(cfg.items()) if k in KNOBS)
                    print(
                        f"{M}x{N}x{K} {label}{' burst' if burst else ''}: worst {worst:.2e}, wrong {bad}/{args.reps}",
                        flush=True,
                    )
    if rank == 0:
        Path(args.out).write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
