"""What one AG+GEMM call costs the host (Python issuing work), per mode, and where that time goes.

Launch: `torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_host.py --shape 128x8192x8192 --out host.json`

For each config: the host's time to issue one call (median over 200 calls issued back to back, max
over ranks), and the steady-state time per call of those 200 calls (the larger of host and GPU time
per call: what an eager caller that does nothing else sees), and how many of the plan's prepared launches
issue through the compiled launcher (the fast path) rather than Triton's dispatcher. Then the parts: one
Triton launch of a tiny kernel, one torch.mm, one tensor slice. Then a cProfile of 200 calls of one config (rank 0).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import device_label, init_cuda_world

from jointtune.kernels import get_family
from jointtune.kernels.ag_gemm import ag_gemm, prepare
from jointtune.kernels.runtime.launch import Launch
from jointtune.kernels.runtime.signals import wait_chunks_kernel

PC = dict(mode="push_cublas")
TILES = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4, SPLIT_K=1)
CONFIGS = [
    dict(mode="baseline"),
    dict(mode="ce", ce_consumer="cublas", ce_chunks=1),
    dict(PC, push_by="sm", gemm_order="gathered", comm_sms=32),
    dict(PC, push_by="ce", gemm_order="gathered"),
    dict(PC, push_by="ce", gemm_order="local_first", chunk_m=64),
    dict(PC, push_by="sm", gemm_order="local_first", comm_sms=16, chunk_m=64),
    dict(mode="push", comm_sms=32, chunk_m=64, **TILES),
    dict(mode="pull", **TILES),
    dict(mode="ce", ce_consumer="triton", ce_chunks=1, **TILES),
]


def _launches(obj: object) -> list[Launch]:
    """Every prepared launch a plan holds (in its attributes, lists, tuples and dicts)."""
    found, stack = [], [vars(obj)]
    while stack:
        item = stack.pop()
        if isinstance(item, Launch):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def _fast_path(world, a, b, c, cfg) -> str:
    """'taken/all' prepared launches of the config's plan that issue through the compiled launcher."""
    launches = _launches(prepare(a, b, world=world, config=cfg, out=c).plan)
    return f"{sum(launch.direct for launch in launches)}/{len(launches)}"


def _host_us(fn, calls: int = 200) -> tuple[float, float]:
    """(median host µs to issue one call, steady-state µs per call), both max over ranks."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    host = []
    start = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - start) * 1e6 / calls
    out = torch.tensor([statistics.median(host), per_call], device="cuda")
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out[0].item(), out[1].item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="128x8192x8192")
    ap.add_argument("--out", default="ag_gemm_host.json")
    args = ap.parse_args()
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    M, N, K = (int(x) for x in args.shape.split("x"))
    R, N_r = M // W, N // W
    (a,) = world.empty((R, K), torch.bfloat16)
    a.copy_(torch.randn(R, K, device="cuda").div_(K**0.25))
    b = torch.randn(K, N_r, device="cuda").div_(K**0.25).bfloat16()
    c = torch.empty(M, N_r, device="cuda", dtype=torch.bfloat16)
    import datetime
    import platform

    import triton

    result = {
        "device": device_label(W),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "python": platform.python_version(),
        },
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_host.py " + " ".join(sys.argv[1:]),
        "shape": [M, N, K],
        "calls": {},
        "parts_us": {},
    }
    for cfg in CONFIGS:
        host, per_call = _host_us(lambda cfg=cfg: ag_gemm(a, b, world=world, config=cfg, out=c))
        fast = _fast_path(world, a, b, c, cfg)
        result["calls"][json.dumps(cfg, sort_keys=True)] = {"host_us": host, "per_call_us": per_call,
                                                            "fast_path_launches": fast}  # fmt: skip
        if rank == 0:
            print(f"[host {args.shape}] {cfg}: issue {host:.1f} µs, per call {per_call:.1f} µs, "
                  f"fast-path launches {fast}", flush=True)  # fmt: skip
    flag = torch.zeros(W * 16, dtype=torch.int64, device="cuda")  # epoch 0: the wait returns at once
    gathered = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
    pc = CONFIGS[2]
    prepared = prepare(a, b, world=world, config=pc, out=c)
    plan = prepared.plan
    op = get_family("ag_gemm").op  # the family's op: what a call does before it finds its plan
    launch = getattr(plan, "push_launch", [None])[0]

    def anchor() -> None:
        dist.all_gather_into_tensor(gathered, a)
        torch.mm(gathered, b, out=c)

    parts = {
        "anchor_nccl_cublas": anchor,
        "nccl_all_gather_alone": lambda: dist.all_gather_into_tensor(gathered, a),
        "push_cublas_prepared_run": prepared.run,
        "push_cublas_plan_call": lambda: plan([a], [b], [c]),
        "push_cublas_plan_key": lambda: op.plan_key(world, [[a], [b]], pc),
        "push_launch_alone": (lambda: launch(a)) if launch is not None else (lambda: None),
        "triton_launch_tiny_kernel": lambda: wait_chunks_kernel[(1,)](flag, flag, rank, 1, 0, W - 1, 0, 0),
        "torch_mm": lambda: torch.mm(a, b, out=c[:R]),
        "tensor_slice_and_view": lambda: c[R:M].view(-1),
        "torch_empty_c": lambda: torch.empty(M, N_r, device="cuda", dtype=torch.bfloat16),
    }
    for name, fn in parts.items():
        result["parts_us"][name] = _host_us(fn)[0]
        if rank == 0:
            print(f"[host {args.shape}] {name}: {result['parts_us'][name]:.1f} µs", flush=True)
    profiled = CONFIGS[2]
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        ag_gemm(a, b, world=world, config=profiled, out=c)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    if rank == 0:
        print("\n".join(text.getvalue().splitlines()[:40]), flush=True)
        result["profile_config"] = profiled
        result["profile_top"] = text.getvalue().splitlines()[:60]
        Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
