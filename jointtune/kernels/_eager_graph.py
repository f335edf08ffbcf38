"""Eager calls of small fused ops, replayed from a CUDA graph of the call itself.

A fused mode issues a dozen launches, copies, events and barriers per call, and from Python each one costs the host
5-15 us. At decode sizes the host, not the GPU, then sets an eager call's time: the ce modes spent 113 us of host
work per call against 39 us for NCCL + cuBLAS (2x H200, bench/results/ag_gemm_host_2xH200_2026-11-23.json).

So the second eager call of a plan (the first compiled and allocated everything) captures the plan's call into a
CUDA graph over static copies of its per-call inputs and outputs. Every later eager call copies its inputs in,
replays, and copies the output out: a few torch calls, whatever the mode. The graph is the plan's own launches, which
read their epochs from device memory (`_signals`), so replays mix freely with direct calls, with other graphs, and
with other ranks' direct calls; a rank that falls back to the direct path stays in step with one that replays.

A call replays only where that pays and is safe:
- for plans that issue many host calls (`replay_eagerly`: the ce modes, push_cublas but its one-launch form). A replay
  costs GPU time (its copies, a graph launch: 4-11 us per call at 128x8192x8192 on an H100), so plans of one or two
  launches, which are GPU-bound already, stay direct;
- on a CUDA world, outside the caller's own capture (their graph then holds the direct launches);
- when the bytes copied in and out are at most `MAX_COPY_BYTES`: the copies cost GPU time, which at large shapes
  outweighs the host time saved;
- while the tensors the graph reads in place (weights, KV caches) are at the addresses captured, and the inputs it
  copies have the captured layout; any other call runs directly.

A capture that fails (an op that can't be captured) leaves the key on the direct path for good, with a warning.
JOINTTUNE_EAGER_GRAPH=0 turns replays off.

Example (on a GPU; `world.eager` is each world's `EagerGraphs`):
    >>> ran = world.eager.call(key, lambda ins, outs: plan(ins, [b], outs), [a], [b], [c])  # doctest: +SKIP
    >>> ran  # False: run the plan directly (first call, big copies, b moved...)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import KernelError
from jointtune.kernels._runtime import capturing

#: at most this many bytes copied in and out per replayed call (8 MiB: about 5 us of copies on an H100 or H200)
MAX_COPY_BYTES = 8 << 20
#: graphs kept per world, least recently used dropped first (each holds its static copies and a memory pool)
MAX_GRAPHS = 64

Run = Callable[[list[Any], list[torch.Tensor]], Any]


@dataclass
class _Replay:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor | None]
    layout: tuple[Any, ...]  # the inputs' shapes, dtypes and strides (None where absent), as captured
    in_place: tuple[tuple[int, ...], ...]
    outputs: list[torch.Tensor]


_ON, _OFF = ("1", "true", "yes", "on", "y", ""), ("0", "false", "no", "off", "n")


def enabled() -> bool:
    """JOINTTUNE_EAGER_GRAPH (default on); a value that is neither on nor off is an error, not a silent default."""
    value = os.environ.get("JOINTTUNE_EAGER_GRAPH", "1").strip().lower()
    if value not in _ON + _OFF:
        raise KernelError(
            f"JOINTTUNE_EAGER_GRAPH: {value!r} is not allowed; use 1 (replay repeat eager calls, the default) or 0"
        )
    return value in _ON


def _addresses(tensors: Sequence[torch.Tensor | None]) -> tuple[tuple[int, ...], ...]:
    return tuple(() if t is None else (t.data_ptr(), *t.stride()) for t in tensors)


def _layout(tensors: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    return tuple(None if t is None else (t.shape, t.dtype, t.stride()) for t in tensors)


def _static(t: torch.Tensor) -> torch.Tensor:
    """A tensor laid out as `t` (a plan may bake strides in), for the graph to read or write."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _bytes(tensors: Sequence[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class EagerGraphs:
    """One world's replayable eager calls, by plan key."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._replays: OrderedDict[Any, _Replay] = OrderedDict()
        self._seen: set[Any] = set()
        self._direct: set[Any] = set()  # keys whose capture failed
        self._on = device.type == "cuda" and enabled()
        #: eager calls replayed so far (a count to check against, as `bench/gpu_smoke.py` does)
        self.replays = 0

    def call(
        self,
        key: Any,
        run: Run,
        inputs: Sequence[torch.Tensor | None],
        in_place: Sequence[torch.Tensor | None],
        outputs: Sequence[torch.Tensor],
    ) -> bool:
        """Issue `run(inputs, outputs)` as a replay of its graph and return True; False where the caller must run it
        directly. `inputs` are copied in and `outputs` out on each replay; `run` reads `in_place` (and anything else it
        closes over) at the addresses it had when captured."""
        if not self._on or key in self._direct or capturing(self.device):
            return False
        replay = self._replays.get(key)
        if replay is None:
            if key not in self._seen:  # the first call builds and compiles: it runs directly
                self._seen.add(key)
                return False
            if _bytes(inputs) + _bytes(outputs) > MAX_COPY_BYTES:
                self._direct.add(key)
                return False
            replay = self._capture(key, run, inputs, in_place, outputs)
            if replay is None:
                return False
        elif replay.in_place != _addresses(in_place) or replay.layout != _layout(inputs):
            return False
        self._replays.move_to_end(key)
        for static, x in zip(replay.inputs, inputs):
            if static is not None:
                static.copy_(x)
        replay.graph.replay()
        for o, static in zip(outputs, replay.outputs):
            o.copy_(static)
        self.replays += 1
        return True

    def _capture(
        self,
        key: Any,
        run: Run,
        inputs: Sequence[torch.Tensor | None],
        in_place: Sequence[torch.Tensor | None],
        outputs: Sequence[torch.Tensor],
    ) -> _Replay | None:
        statics_in = [None if x is None else _static(x) for x in inputs]
        statics_out = [_static(o) for o in outputs]
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                run(statics_in, statics_out)
        except Exception as exc:  # nothing ran (a capture only records): the direct path still works
            self._direct.add(key)
            warnings.warn(
                f"{key[0]}: this call can't be captured for cheap eager repeats ({type(exc).__name__}: {exc}); "
                "it runs directly from now on",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        replay = _Replay(graph, statics_in, _layout(inputs), _addresses(in_place), statics_out)
        self._replays[key] = replay
        while len(self._replays) > MAX_GRAPHS:
            self._replays.popitem(last=False)
        return replay

    def clear(self) -> None:
        self._replays.clear()
        self._seen.clear()
        self._direct.clear()
