"""Where the time of an overlapped AG+GEMM goes, part by part, at one shape on 2+ GPUs.

Launch: `torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_anatomy.py --shape 8192x8192x28672 --out anatomy.json`

The overlapped modes (`ce`, `push_cublas` local-first) run this rank's rows through cuBLAS while the
peers' rows travel, then the peers' rows. Their floor is therefore not cuBLAS on all M rows but the
parts timed here, each alone, with the same method as `ag_gemm_bench.py` (barrier, device-side sleep,
events, median, max over ranks): one GEMM over M rows; the same work as W GEMMs of M/W rows; the peer
copy alone; the W GEMMs with the copy running beside the first (no waits: the cost of sharing the GPU
with the copy engine); a symmetric-memory barrier; and one signal/wait handshake between ranks (both
timed from a device-side barrier, so they show the handshake's latency, not the ranks' skew).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import Bench, device_label, init_cuda_world, spin_up

from jointtune.kernels.runtime.signals import release_chunk_kernel, wait_chunks_kernel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x8192x28672")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="ag_gemm_anatomy.json")
    args = ap.parse_args()
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    M, N, K = (int(x) for x in args.shape.split("x"))
    R, N_r = M // W, N // W
    bench = Bench(args.iters, 5, world)
    spin_up(2.0)
    a = torch.randn(M, K, device="cuda").div_(K**0.25).bfloat16()
    b = torch.randn(K, N_r, device="cuda").div_(K**0.25).bfloat16()
    c = torch.empty(M, N_r, device="cuda", dtype=torch.bfloat16)
    (shard,) = world.empty((R, K), torch.bfloat16)
    shard.copy_(a[:R])
    peer = world.symmetric_of(shard).peers[0][(rank + 1) % W][: R * K].view(R, K)
    landing = torch.empty(R, K, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    flags = world.symmetric("anatomy.flags", (W,), torch.int64, zero=True)
    state = torch.zeros(2, dtype=torch.int64, device="cuda")

    def halves() -> None:
        for p in range(W):
            torch.mm(a[p * R : (p + 1) * R], b, out=c[p * R : (p + 1) * R])

    def halves_beside_copy() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            landing.copy_(peer, non_blocking=True)
        halves()
        torch.cuda.current_stream().wait_stream(side)

    def handshake() -> None:
        state[0] += 1  # the call's epoch, on the device (as every fused call opens one)
        release_chunk_kernel[(1,)](flags.ptrs[0], flags.tensors[0], state, rank, 1, 0, WORLD=W, WAIT_ALL=False,
                                   num_warps=1)  # fmt: skip
        wait_chunks_kernel[(1,)](flags.tensors[0], state, rank, 1, 0, W - 1, 0, 0, num_warps=1)

    parts = {
        "gemm_all_rows": lambda: torch.mm(a, b, out=c),
        "gemm_as_rank_halves": halves,
        "peer_copy_alone": lambda: landing.copy_(peer, non_blocking=True),
        "gemm_halves_beside_peer_copy": halves_beside_copy,
        "symm_barrier": lambda: world.barrier(world.symmetric_of(shard)),
        "signal_wait_handshake": handshake,
    }
    result = {
        "device": device_label(W),
        "versions": {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))},
        "command": "torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_anatomy.py " + " ".join(sys.argv[1:]),
        "shape": [M, N, K],
        "parts_ms": {},
    }
    for name, fn in parts.items():
        result["parts_ms"][name] = bench.time(fn)
        if rank == 0:
            print(f"[anatomy {args.shape}] {name}: {result['parts_ms'][name]['median_ms']:.4f} ms", flush=True)
    if rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
