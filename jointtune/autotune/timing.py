"""Timing one config: identical warm-up and timed iteration counts on every rank.

On CUDA each timed run sits between two device events, after an L2 flush (a write over a buffer
larger than any L2), so a config can't win by finding its operands still cached. On the local
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


def measure(run: Callable[[], Any], world: World, *, warmup: int, iters: int) -> list[float]:
    """Microseconds of `iters` timed runs of `run`, after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    world.synchronize()
    if world.device.type == "cuda":
        return _measure_cuda(run, world, iters)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        world.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def _measure_cuda(run: Callable[[], Any], world: World, iters: int) -> list[float]:
    import torch

    flush = _flush_buffer(world.device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        run()
        end.record()
    world.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]


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
