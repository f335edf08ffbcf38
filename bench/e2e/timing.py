"""How the end-to-end benchmark times a step: replays of a CUDA graph of it, the slowest rank's median.

A step is captured once (after warm-up calls on a side stream, as torch's CUDA-graph recipe asks), then replayed
`warmup` times untimed and `iters` times between CUDA events; each rank's median is all-reduced with MAX, since a
tensor-parallel step is as slow as its slowest rank. Without a GPU (`--cpu`, simulated ranks in Triton's
interpreter) the same function times eager calls by wall clock: those numbers only show the script runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def slowest_rank(world: Any, us: float) -> float:
    """MAX over the ranks of this rank's number (the number itself on a local world)."""
    if world.kind == "local" or world.world_size == 1:
        return us
    import torch.distributed as dist

    t = torch.tensor([us], dtype=torch.float64, device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.group)
    return float(t.item())


def barrier(world: Any) -> None:
    if world.kind != "local":
        import torch.distributed as dist

        torch.cuda.synchronize()
        dist.barrier(group=world.group)


def step_us(fn: Callable[[], Any], world: Any, *, iters: int, warmup: int) -> float:
    """Median µs of `fn()` per call: CUDA-graph replays on a GPU, eager wall time on the CPU; slowest rank's."""
    if world.device.type != "cuda":
        for _ in range(max(1, warmup)):
            fn()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        return slowest_rank(world, statistics.median(samples))
    barrier(world)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    barrier(world)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    barrier(world)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    del graph
    return slowest_rank(world, statistics.median(samples))
