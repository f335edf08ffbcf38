"""Which GPU kernels a step runs, and for how long: each step's CUDA graph replayed under torch's profiler.

The breakdown times each op alone; a step's time minus its ops' (`outside_ops_per_layer`) says how much is left over,
not where. This lists it: per step (one graph replay), every kernel name with its count and GPU µs, the kernels' total
busy time and the span from the first kernel's start to the last one's end (span minus busy: the gaps between
kernels, where nothing runs on the GPU). Every rank profiles its own replays; ranks replay together (the steps hold
collectives). Off the GPU it returns nothing: the interpreter's kernels say nothing about a GPU's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch
from timing import _capture, barrier, slowest_rank

#: kernels listed per step, the longest first (the rest are summed into "others")
TOP = 24


def step_kernels(fns: Mapping[str, Callable[[], Any] | None], world: Any, *,
                 replays: int = 3) -> dict[str, Any]:  # fmt: skip
    """Per step name: {"busy_us", "span_us", "kernels": count per step, "top": [[name, count, µs, median µs a call],
    ...]}, this rank's (busy and span also as the slowest rank's, `*_max`). A collective's calls include their waits
    for the other ranks, and the first replay's take the ranks' skew in starting the profiler (seen at TP=4: one
    all-gather call of 259 ms): its median a call is the figure to read, not its total. Every rank passes the same
    names; a step given as None, or one that can't be captured on any rank, is left out on all ("failed")."""
    if world.device.type != "cuda":
        return {}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    for name, fn in fns.items():
        graph = None
        if fn is not None:
            try:
                barrier(world)
                graph = _capture(fn)
            except Exception as exc:
                out[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
        if slowest_rank(world, 0.0 if graph is not None else 1.0) > 0.0:
            out.setdefault(name, "failed on another rank or its check")
            continue
        graph.replay()
        barrier(world)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
        barrier(world)
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name[:120], []).append(e.time_range.end - e.time_range.start)
        busy = sum(sum(v) for v in by_name.values()) / replays
        span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / replays
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
        rows = [[k, round(len(v) / replays, 2), round(sum(v) / replays, 2), round(statistics.median(v), 2)]
                for k, v in top[:TOP]]  # fmt: skip
        rest = top[TOP:]
        if rest:
            rows.append(["others", round(sum(len(v) for _, v in rest) / replays, 2),
                         round(sum(sum(v) for _, v in rest) / replays, 2), None])  # fmt: skip
        out[name] = {"busy_us": round(busy, 2), "span_us": round(span, 2), "kernels": round(len(kernels) / replays, 2),
                     "busy_us_max": round(slowest_rank(world, busy), 2),
                     "span_us_max": round(slowest_rank(world, span), 2), "top": rows,
                     **_timeline(graph, world)}  # fmt: skip
        del graph
    return out


def _timeline(graph: Any, world: Any) -> dict[str, Any]:
    """One more replay, profiled alone: its kernels in start order as [name, stream, start µs from the first kernel,
    µs], and the time no kernel ran on any stream (`idle_us`: the span less the union of the kernels' intervals).
    Sums say how long each kernel took; the order and the idle time say which of them the step waited on."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    barrier(world)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    barrier(world)
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    if not kernels:
        return {}
    t0 = kernels[0].time_range.start
    rows = [[e.name[:80], getattr(e, "device_resource_id", None), round(e.time_range.start - t0, 2),
             round(e.time_range.end - e.time_range.start, 2)] for e in kernels]  # fmt: skip
    covered, reach = 0.0, t0
    for e in kernels:  # the union of [start, end) over every stream, in start order
        start, end = max(e.time_range.start, reach), e.time_range.end
        if end > start:
            covered += end - start
            reach = end
    span = max(e.time_range.end for e in kernels) - t0
    return {"timeline": rows, "timeline_span_us": round(span, 2), "idle_us": round(span - covered, 2)}


__all__ = ["step_kernels"]
