"""Timing one config: identical warm-up and timed iteration counts on every rank.

On CUDA each timed run sits between two device events, after an L2 flush (a write over a buffer
larger than any L2), so a config can't win by finding its operands still cached; all timed runs are
queued behind a device-side hold first, so the events time the GPU, not the host's launch pace. On the local
world (CPU interpreter) the wall clock brackets `run` plus `world.synchronize()`.

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

if TYPE_CHECKING:
    from jointtune.kernels.world import World

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


def measure(run: Callable[[], Any], world: World, *, warmup: int, iters: int) -> Samples:
    """Microseconds of `iters` timed runs of `run`, after `warmup` untimed ones (on CUDA, two more
    untimed runs: one sizes the hold before the timed runs, one absorbs the ranks' skew after it)."""
    for _ in range(warmup):
        run()
    world.synchronize()
    if world.device.type == "cuda":
        return _measure_cuda(run, world, iters)
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
    import torch

    flush = _flush_buffer(world.device)
    # one extra run first, on every rank: its sample is dropped (below)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    # Hold the stream with a device-side sleep long enough for the host to queue every timed run
    # behind it: the events then time the GPU's work, not the host's launch pace (which a busy
    # host, e.g. one compiling the next configs on other threads, slows down at random). The hold's
    # length is each rank's own estimate, so ranks leave it at slightly different times: the first
    # run absorbs that (a fused kernel waits for its peers) and is not counted.
    host_us = _host_launch_us(run, world)
    gate_us = min(_MAX_GATE_US, 500.0 + 3.0 * (iters + 1) * (host_us + 20.0))
    with torch.cuda.device(world.device):
        torch.cuda._sleep(int(gate_us * _cycles_per_us(world.device)))
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        run()
        end.record()
    world.synchronize()
    samples = Samples(start.elapsed_time(end) * 1e3 for start, end in zip(starts[1:], ends[1:]))
    samples.host_us = host_us
    return samples


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
