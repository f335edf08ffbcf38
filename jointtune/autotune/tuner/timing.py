"""Timing one config under a policy: identical warm-up and timed iteration counts on every rank.

Three policies (`jointtune.timings.TIMINGS`), because users meet an op three ways and the ranking of configs
differs between them (a config with many launches wins on the GPU and loses when called eagerly):

- gpu: each timed run sits between two device events, after an L2 flush (a write over a buffer larger
  than any L2), so a config can't win by finding its operands still cached; all timed runs are queued
  behind a device-side hold first, so the events time the GPU, not the host's launch pace;
- eager: wall time per call of `EAGER_CALLS` calls issued back to back (host included), the device
  synchronised before and after each block;
- graph: replays of a CUDA graph holding `GRAPH_CALLS` calls of the config, each replay between two
  device events after a hold (the host queues every replay first). Needs a GPU world.

On the local world (CPU interpreter) a call is synchronous: gpu, eager and interp are the wall clock around
`run` plus `world.synchronize()`, recorded as interp (`jointtune.timings.measured_as`: the key of a study on the
interpreter says so), and graph is refused (there are no graphs to capture). interp is refused on CUDA.

Repeat counts are fixed by the caller and never adapted per rank: a rank that ran more iterations
than its peers would wait forever in a push/pull kernel whose peers have stopped launching.

Example:
    >>> samples = measure(lambda: None, LocalWorld(world_size=1), warmup=1, iters=5)  # doctest: +SKIP
    >>> p10, p50, p90 = percentiles(samples)                                          # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jointtune.errors import TuningError
from jointtune.timings import EAGER_CALLS, GRAPH_CALLS, INTERP, TIMINGS

if TYPE_CHECKING:
    from jointtune.kernels.runtime.world import World

#: Bytes written before every timed CUDA run; larger than the L2 of any current GPU (H200: 50 MB).
L2_FLUSH_BYTES = 256 * 1024 * 1024

_flush_buffers: dict[Any, Any] = {}


def _flush_buffer(device: Any) -> Any:
    import torch

    buf = _flush_buffers.get(device)
    if buf is None:
        buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
        _flush_buffers[device] = buf
    return buf


class Samples(list):
    """The timed runs' microseconds, plus `host_us`: what the host spent issuing one call.

    The timed runs measure the GPU alone; `host_us` is the other half of what an eager caller pays:
    a config whose launch takes longer than its GPU time is host-bound, whatever its latency says.
    On the local world a call is synchronous, so its host time is its median latency.
    """

    host_us: float = 0.0


def measure(run: Callable[[], Any], world: World, *, warmup: int, iters: int, timing: str = "gpu") -> Samples:
    """Microseconds per call of `iters` timed samples of `run` under `timing`, after `warmup` untimed runs
    (on CUDA, a few more untimed: one sizes the hold, one absorbs the ranks' skew after it)."""
    if timing not in TIMINGS:
        raise TuningError(f"timing: {timing!r} is not allowed; allowed: {', '.join(TIMINGS)}")
    if timing == "graph" and world.device.type != "cuda":
        raise TuningError(
            f"timing: 'graph' needs CUDA graphs, and this world runs on {world.device.type} (the CPU interpreter); "
            "use gpu, eager or interp here (all three time the interpreter's wall time, recorded as interp)"
        )
    if timing == INTERP and world.device.type == "cuda":
        raise TuningError(
            "timing: 'interp' is the wall time of Triton's CPU interpreter, and this world runs on cuda; "
            "use gpu, eager or graph here"
        )
    if world.device.type == "cuda":
        # Every candidate starts from no eager graphs (`kernels/runtime/eager_graph.py`): a world holds a bounded
        # number, and a sweep's later candidates must not find it full and run directly where a user's call replays.
        # The warm-up is then at least two calls: the second captures the graph later calls replay, and no timed call
        # may include a capture.
        world.eager.clear()
    for _ in range(max(warmup, 2) if world.device.type == "cuda" else warmup):
        run()
    world.synchronize()
    if world.device.type == "cuda":
        return {"gpu": _measure_cuda, "eager": _measure_eager, "graph": _measure_graph}[timing](run, world, iters)
    samples = Samples()
    for _ in range(iters):
        start = time.perf_counter()
        run()
        world.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.host_us = percentile(samples, 50)
    return samples


def _host_launch_us(run: Callable[[], Any], world: World) -> float:
    """Microseconds the host spends issuing one call (then waits for the device, untimed)."""
    begin = time.perf_counter()
    run()
    elapsed = (time.perf_counter() - begin) * 1e6
    world.synchronize()
    return elapsed


def _measure_cuda(run: Callable[[], Any], world: World, iters: int) -> Samples:
    flush = _flush_buffer(world.device)
    host_us = _host_launch_us(run, world)
    samples = Samples(_timed_behind_hold(run, host_us, world, iters, before=flush.zero_))
    samples.host_us = host_us
    return samples


def _measure_eager(run: Callable[[], Any], world: World, iters: int) -> Samples:
    """Wall µs per call of EAGER_CALLS calls back to back; one untimed block first absorbs the ranks' skew."""
    host_us = _host_launch_us(run, world)
    samples = Samples()
    for i in range(iters + 1):
        world.synchronize()
        start = time.perf_counter()
        for _ in range(EAGER_CALLS):
            run()
        world.synchronize()
        if i:
            samples.append((time.perf_counter() - start) * 1e6 / EAGER_CALLS)
    samples.host_us = host_us
    return samples


def _measure_graph(run: Callable[[], Any], world: World, iters: int) -> Samples:
    """µs per call of replays of a graph holding GRAPH_CALLS calls, each replay timed like a `gpu` run."""
    import torch

    host_us = _host_launch_us(run, world)
    graph = torch.cuda.CUDAGraph()
    world.synchronize()
    # thread-local: the tuner compiles the next configs on other threads meanwhile, which must not
    # invalidate this capture (and are not captured)
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(GRAPH_CALLS):
            run()
    graph.replay()
    world.synchronize()
    replay_us = _host_launch_us(graph.replay, world)
    samples = Samples(_timed_behind_hold(graph.replay, replay_us, world, iters, per=GRAPH_CALLS))
    samples.host_us = host_us
    del graph
    return samples


def _timed_behind_hold(
    step: Callable[[], Any],
    step_us: float,
    world: World,
    iters: int,
    *,
    before: Callable[[], Any] | None = None,
    per: int = 1,
) -> list[float]:
    """Device µs of `iters` runs of `step` (each `per` calls), timed by events.

    Hold the stream with a device-side sleep long enough for the host to queue every timed run
    behind it (`step_us`: what issuing one costs the host): the events then time the GPU's work,
    not the host's launch pace (which a busy host, e.g. one compiling the next configs on other
    threads, slows down at random). The hold's length is each rank's own estimate, so ranks leave
    it at slightly different times: one extra run first absorbs that (a fused kernel waits for its
    peers) and is not counted. `before` runs untimed ahead of each run (the L2 flush)."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    gate_us = min(_MAX_GATE_US, 500.0 + 3.0 * (iters + 1) * (step_us + 20.0))
    with torch.cuda.device(world.device):
        torch.cuda._sleep(int(gate_us * _cycles_per_us(world.device)))
    for start, end in zip(starts, ends):
        if before is not None:
            before()
        start.record()
        step()
        end.record()
    world.synchronize()
    return [start.elapsed_time(end) * 1e3 / per for start, end in zip(starts[1:], ends[1:])]


#: the longest hold before the timed runs (a host slower than this shows in the timings again)
_MAX_GATE_US = 100_000.0
_cycles: dict[Any, float] = {}


def _cycles_per_us(device: Any) -> float:
    """GPU clock cycles per µs of `torch.cuda._sleep`, measured once per device."""
    import torch

    if device not in _cycles:
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # let clocks settle first
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
        _cycles[device] = 2_000_000 / max(start.elapsed_time(end) * 1e3, 1.0)
    return _cycles[device]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not samples:
        raise ValueError("percentile: no samples given; need at least one")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(p10, p50, p90) of the samples, in their unit."""
    return percentile(samples, 10), percentile(samples, 50), percentile(samples, 90)
