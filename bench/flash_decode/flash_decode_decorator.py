"""Decorator lookups of tuned Flash-Decode configs on 2 GPUs, as users call it: `@joint_autotune(space="flash_decode")`
over `flash_decode` with the family's key (the KV capacity bucketed to a power of two per rank), reading the store a
sweep wrote; a capacity inside a tuned bucket and an untuned shape too; results checked against a float32 reference.

Launch: `torchrun --nproc-per-node=2 bench/flash_decode/flash_decode_decorator.py --db URL --out decorator.json`
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
from common.measure import max_over_ranks, run_header

from flash_decode.flash_decode_modes import FdRig
from jointtune import joint_autotune
from jointtune.kernels.flash_decode import flash_decode


@joint_autotune(space="flash_decode", on_miss="default", timing="graph")
def decode_attention(q, k, v, kv_lens, *, world, config):
    return flash_decode(q, k, v, kv_lens, world=world, config=config)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", default="flash_decode_decorator.json")
    # the tuned shapes, a capacity inside the first one's bucket (24K: per rank 12K -> 16K), an untuned shape
    ap.add_argument("--shapes", default="1x64x8x32768x128,8x64x8x131072x128,1x64x8x24576x128,4x32x8x10000x128")
    args = ap.parse_args()
    os.environ["JOINTTUNE_DB_URL"] = args.db
    world = init_cuda_world()
    rows = []
    for text in args.shapes.split(","):
        B, H, H_KV, S, D = (int(x) for x in text.split("x"))
        rig = FdRig(world, B, H, H_KV, S, D, seed=B + S, ragged=True)
        t0 = time.perf_counter()
        out = decode_attention(rig.q, rig.k, rig.v, rig.lens, world=world)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        rig.out.copy_(out)
        err = rig.error_on_device().item()
        # both ranks start the repeat calls together: a rank still compiling its first call would otherwise stall
        # the other's collective or flag waits, and that wait would read as the repeat calls' cost
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            decode_attention(rig.q, rig.k, rig.v, rig.lens, world=world)
        torch.cuda.synchronize()
        repeat_us = max_over_ranks([(time.perf_counter() - t0) / 20 * 1e6])[0]
        key = next(iter(k for k in decode_attention.cache if dict(k[0])["B"] == B and dict(k[0])["H"] == H
                        and dict(k[0])["S"] >= S))  # fmt: skip
        rows.append({"shape": text, "key": dict(key[0]), "config": dict(decode_attention.cache[key]),
                     "source": decode_attention.sources[key], "error": err, "first_call_s": first_s,
                     "repeat_call_us": repeat_us})  # fmt: skip
        if world.rank == 0:
            print(rows[-1], flush=True)
    if world.rank == 0:
        header = run_header(world, "bench/flash_decode/flash_decode_decorator.py")
        del header["shapes"], header["calls_per_graph"], header["dtype"]
        result = {**header, "world_size": world.world_size, "db": args.db, "calls": rows}
        Path(args.out).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
