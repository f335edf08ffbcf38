"""The CUDA side every GPU benchmark shares: this torchrun rank's GPU and world (`init_cuda_world`), a warm GPU
(`spin_up`), what a result file calls the device (`device_label`), and the GPU-time measurement with its
correctness check (`Bench`).

Timing (`Bench.time`): identical warm-up and iteration counts on every rank, a barrier before each iteration, then
the same device-side sleep on every rank, long enough to cover the host's issue time measured in warm-up (so
Python's launch work queues behind it and is not timed as GPU idle time), a device-side barrier (both GPUs start
together), CUDA events around the call, median per rank, max across ranks. The host's issue time per call is
reported beside it (`host_us`): it is what an eager caller pays when the GPU work of a call is shorter.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from jointtune.kernels import create_world


class Bench:
    def __init__(self, iters: int, warmup: int, world) -> None:
        self.iters, self.warmup, self.world = iters, warmup, world
        self.sleep_cycles = 400_000  # about 0.2 ms at H200 clocks (scaled per candidate, see time())
        self.rank, self.W = dist.get_rank(), dist.get_world_size()

    def time(self, fn) -> dict:
        warm = []
        for _ in range(self.warmup):
            t0 = time.perf_counter()
            fn()
            warm.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        # The hold covers the host's issue time (twice the warm-up median, at least 0.2 ms, the same
        # on every rank), so the events time the GPU; the host's own time is reported beside it.
        hold = torch.tensor([max(200e-6, 2 * statistics.median(warm))], device="cuda")
        dist.all_reduce(hold, op=dist.ReduceOp.MAX)
        hold_s = min(hold.item(), 5e-3)
        cycles = int(self.sleep_cycles * hold_s / 200e-6)
        times, host = [], []
        for _ in range(self.iters):
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # the same device-side sleep on every rank, so the host's launch work is queued behind
            # it and the events time the GPU, not Python; then a device-side barrier, so both GPUs
            # start within an NVLink round trip of each other (after the host barrier alone, the
            # ranks' host jitter, 15-35 µs, showed up in every op that waits on a peer)
            torch.cuda._sleep(cycles)
            self.world.barrier()
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        over = sum(h > hold_s for h in host)
        med = torch.tensor([statistics.median(times), statistics.median(host) * 1e6, over], device="cuda")
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        # host_us: Python's time to issue one call (max over ranks); an eager caller whose GPU work per
        # call is shorter than that waits on the host. host_over_hold: iterations whose issue outlasted
        # the hold (their GPU idle time is in median_ms).
        return {
            "median_ms": med[0].item(),
            "rank_median_ms": statistics.median(times),
            "host_us": med[1].item(),
            "hold_us": hold_s * 1e6,
            "host_over_hold": int(med[2].item()),
        }

    def error(self, out: torch.Tensor, ref: torch.Tensor) -> float:
        err = ((out.float() - ref).norm() / ref.norm()).item()
        e = torch.tensor([err if err == err else float("inf")], device="cuda")
        dist.all_reduce(e, op=dist.ReduceOp.MAX)
        return e.item()


def spin_up(seconds: float) -> None:
    """Keep the GPU busy for a while before timing anything: an idle GPU starts at low clocks, and
    the first shape measured (anchors included) would otherwise run slower than the rest."""
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(10):
            x @ x
        torch.cuda.synchronize()
    dist.barrier()


def device_label(ranks: int) -> str:
    """What a result file's "device" says: "2x NVIDIA H200", or "2 ranks sharing 1x NVIDIA H100 (gloo, CUDA IPC)"
    when `ranks` outnumber the GPUs (`init_cuda_world`), so no one reads those timings as a 2-GPU run's."""
    name, gpus = torch.cuda.get_device_name(), torch.cuda.device_count()
    return f"{ranks}x {name}" if ranks <= gpus else f"{ranks} ranks sharing {gpus}x {name} (gloo, CUDA IPC)"


def init_cuda_world():
    """This torchrun rank's GPU, NCCL and the CUDA world over it (every bench script starts here).

    More ranks than GPUs (`torchrun --nproc-per-node=2` on one GPU): ranks share GPUs over a gloo group, and the
    world maps peers through CUDA IPC. That runs every multi-rank path for checking; its timings mean nothing."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    gpus = torch.cuda.device_count()
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > gpus:
        torch.cuda.set_device(local_rank % gpus)
        dist.init_process_group("gloo")
        if local_rank == 0:
            print(f"init_cuda_world: {os.environ['LOCAL_WORLD_SIZE']} ranks on {gpus} GPU(s), over gloo and CUDA IPC: "
                  "a correctness check; timings mean nothing", flush=True)  # fmt: skip
    else:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    return create_world("cuda")
