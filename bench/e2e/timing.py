"""How the end-to-end benchmark times a step: replays of a CUDA graph of it, the slowest rank's median.

A step is captured once (after warm-up calls on a side stream, as torch's CUDA-graph recipe asks). Steps that are
compared with each other (a cell's paths, an op and its torch counterparts) are timed together (`interleaved_us`):
every graph is captured first, replayed in `warmup` untimed rounds, then `iters` rounds each give every one a burst
(an untimed replay, then `burst` timed ones back to back between CUDA events), in an order that rotates. A card's
clock drifts as it heats and cools, so steps timed one after the other can differ by more than the gains compared; in
the same rounds, the drift falls on every step alike. Each rank's median is all-reduced with MAX, since a
tensor-parallel step is as slow as its slowest rank. Without a GPU (`--cpu`, simulated ranks in Triton's interpreter)
eager calls are timed by wall clock: those numbers only show the script runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: bytes read before each timed call of a cold op: more than any current GPU's L2 (H100 and H200: 50 MB)
L2_FLUSH_BYTES = 256 * 1024 * 1024


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


def _capture(fn: Callable[[], Any]) -> Any:
    """A CUDA graph of `fn()`, after two warm-up calls on a side stream. A capture that fails leaves this thread on
    the stream it started on (torch's graph context does not restore it when the capture's end raises)."""
    stream = torch.cuda.current_stream()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        stream.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph
    finally:
        torch.cuda.set_stream(stream)


def _agree_on_failures(world: Any, failed: list[bool]) -> list[bool]:
    """Every rank's failures OR-ed: a step one rank could not check or capture is dropped on all, so that every rank
    replays the same graphs (each holds collectives) in the same order. Every rank passes the same steps."""
    if world.kind == "local" or world.world_size == 1 or not failed:
        return failed
    import torch.distributed as dist

    t = torch.tensor([float(f) for f in failed], device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.group)
    return [bool(v) for v in t.tolist()]


def _cache_flush(world: Any) -> Callable[[], Any] | None:
    """A read over more memory than any L2 (a sum: the lines it leaves are clean, so the timed call after it pays no
    write-back, as it would after a zero fill); None off the GPU, or where the buffer can't be had."""
    if world.device.type != "cuda":
        return None
    try:
        buf = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=world.device)
    except torch.OutOfMemoryError:
        return None
    return buf.sum


def interleaved_us(fns: Mapping[str, Callable[[], Any] | None], world: Any, *, iters: int, warmup: int,
                   burst: int = 3, cold: bool = False) -> dict[str, float | str]:  # fmt: skip
    """The slowest rank's median µs per call of each step, all timed together: `warmup` untimed rounds, then `iters`
    rounds each giving every step a burst (`_burst_us`), the order rotated by one per round. Every rank passes the
    same names, a step that failed its check here as None. `cold`: the L2 is read over before each timed call (on a
    GPU), as an op in a model's step finds it: its weight evicted by the other layers'. A step that failed its check
    or its capture on any rank is given as "failed: ..." and the others are still timed."""
    names = list(fns)
    flush = _cache_flush(world) if cold else None
    out: dict[str, float | str] = {}
    runners: dict[str, Callable[[], None]] = {}
    graphs: list[Any] = []
    errors: dict[str, str] = {}
    for name in names:
        fn = fns[name]
        if fn is None:
            errors[name] = "failed: its check raised (see the cell's errors)"
            continue
        try:
            if world.device.type == "cuda":
                barrier(world)
                graph = _capture(fn)
                graphs.append(graph)
                runners[name] = graph.replay
            else:
                fn()  # as a capture runs it: a step that fails here fails before the rounds
                runners[name] = fn
        except Exception as exc:
            errors[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
    dropped = _agree_on_failures(world, [n not in runners for n in names])
    live = [n for n, gone in zip(names, dropped) if not gone]
    for n in names:
        if n not in live:
            out[n] = errors.get(n, "failed on another rank")
    barrier(world)
    for _ in range(warmup):
        for n in live:
            runners[n]()
    if world.device.type == "cuda":
        torch.cuda.synchronize()
    samples: dict[str, list[float]] = {n: [] for n in live}
    for i in range(iters if live else 0):
        turn = i % len(live)
        for n in live[turn:] + live[:turn]:
            samples[n] += _burst_us(runners[n], world, burst, flush)
    for n in live:
        out[n] = slowest_rank(world, statistics.median(samples[n])) if samples[n] else "failed: no timed rounds"
    del graphs
    return {n: out[n] for n in names}


def _burst_us(run: Callable[[], Any], world: Any, n: int, flush: Callable[[], Any] | None = None) -> list[float]:
    """µs of each of `n` back-to-back calls after one untimed call: between CUDA events on a GPU (a call is a graph
    replay; one synchronize after the last), by wall clock elsewhere. The untimed call takes the ranks' skew: a step
    with a collective waits there for the last rank to arrive, and ranks reach a step at different times after the
    host synchronizes (seen at TP=4 on 4x H100: the torch layer's all-reduce timed 26-30 µs in bursts, 70-81 in
    rounds of one replay per step). `flush` runs before each timed call, outside its events."""
    run()
    if world.device.type != "cuda":
        out = []
        for _ in range(n):
            if flush is not None:
                flush()
            start = time.perf_counter()
            run()
            out.append((time.perf_counter() - start) * 1e6)
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        if flush is not None:
            flush()
        start.record()
        run()
        end.record()
    events[-1][1].synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]
