"""Eager calls of small fused ops, replayed from a CUDA graph of the call itself.

A fused mode issues a dozen launches, copies, events and barriers per call, and from Python each one costs the host
5-15 us. At decode sizes the host, not the GPU, then sets an eager call's time: the ce modes spent 113 us of host
work per call against 39 us for NCCL + cuBLAS (2x H200, bench/results/ag_gemm_host_2xH200_2026-11-23.json).

So the second eager call of a call site (plan key, the addresses of what it reads in place, the layout of what it
copies; the first call compiled and allocated everything) captures the plan's call into a CUDA graph over static
copies of its per-call inputs and outputs. Every later call of that site copies its inputs in, replays, and copies
the output out: a few torch calls, whatever the mode. The graph is the plan's own launches, which read their epochs
from device memory (`signals`), so replays mix freely with direct calls, with other graphs, and with other ranks'
direct calls; a rank that runs a call directly stays in step with one that replays it.

A call replays only where that pays and is safe:
- for plans that issue many host calls (`replay_eagerly`: the ce modes, push_cublas but its one-launch form). A replay
  costs GPU time (its copies, a graph launch: 4-11 us per call at 128x8192x8192 on an H100), so plans of one or two
  launches, which are GPU-bound already, stay direct;
- on a CUDA world, outside any capture (the caller's own graph then holds the direct launches), and not through the
  torch ops (`direct_only`: torch.compile's CUDA graphs manage memory of their own);
- when the bytes copied in and out are at most `MAX_COPY_BYTES` (at large shapes the copies cost more GPU time than
  the host time saved), and while a world holds fewer than `MAX_GRAPHS` graphs and `MAX_STATIC_BYTES` of copies: a
  call site past those runs directly for good, so nothing is captured twice.

Each layer's weight is its own call site, so every layer of a model gets its graph. A capture that fails (an op that
can't be captured) leaves its call site direct, with a warning. JOINTTUNE_EAGER_GRAPH=0 turns replays off.

Example (on a GPU; `world.eager` is each world's `EagerGraphs`):
    >>> ran = world.eager.call(key, lambda ins, outs: plan(ins, [b], outs), [a], [b], [c])  # doctest: +SKIP
    >>> ran  # False: the caller runs the plan itself (first call, big copies, a full world...)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from jointtune._warnings import warn
from jointtune.errors import KernelError
from jointtune.kernels.runtime.device import capturing

#: at most this many bytes copied in and out per replayed call (8 MiB: about 5 us of copies on an H100 or H200)
MAX_COPY_BYTES = 8 << 20
#: call sites with a graph per world, and their static copies' bytes; later call sites run directly
MAX_GRAPHS = 256
MAX_STATIC_BYTES = 1 << 30

#: `run(inputs, outputs)`: one direct call of a plan on the given per-call tensors
Run = Callable[[list[Any], list[torch.Tensor]], Any]
#: `capture(run, inputs, outputs)`: records one call and returns what re-issues it
Capture = Callable[[Run, list[Any], list[torch.Tensor]], Callable[[], Any]]

_DIRECT_ONLY: ContextVar[bool] = ContextVar("jointtune_eager_direct_only", default=False)
_ON, _OFF = ("1", "true", "yes", "on", "y", ""), ("0", "false", "no", "off", "n")


def enabled() -> bool:
    """JOINTTUNE_EAGER_GRAPH (default on); a value that is neither on nor off is an error, not a silent default."""
    value = os.environ.get("JOINTTUNE_EAGER_GRAPH", "1").strip().lower()
    if value not in _ON + _OFF:
        raise KernelError(
            f"JOINTTUNE_EAGER_GRAPH: {value!r} is not allowed; use 1 (replay repeat eager calls, the default) or 0"
        )
    return value in _ON


@contextlib.contextmanager
def direct_only() -> Iterator[None]:
    """Calls inside run their plans directly (the torch ops: torch.compile's CUDA graphs warm up and capture through
    them with memory pools of their own, which a capture of ours must not enter)."""
    token = _DIRECT_ONLY.set(True)
    try:
        yield
    finally:
        _DIRECT_ONLY.reset(token)


def cuda_capture(run: Run, inputs: list[Any], outputs: list[torch.Tensor]) -> Callable[[], Any]:
    """One call captured into a CUDA graph on a side stream. Unlike `torch.cuda.graph` this neither synchronises the
    device nor empties the allocator's cache: it runs in the middle of the caller's eager work."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream()
    stream = torch.cuda.Stream(device=current.device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            run(inputs, outputs)
        finally:
            graph.capture_end()
    current.wait_stream(stream)
    return graph.replay


@dataclass
class _Replay:
    replay: Callable[[], Any]
    inputs: list[torch.Tensor | None]
    outputs: list[torch.Tensor]


def _site(key: Any, inputs: Sequence[torch.Tensor | None], in_place: Sequence[torch.Tensor | None]) -> tuple[Any, ...]:
    """A call site: the plan key, where each in-place tensor is (address and strides), each copied input's layout."""
    return (
        key,
        tuple(() if t is None else (t.data_ptr(), *t.stride()) for t in in_place),
        tuple(None if t is None else (t.shape, t.dtype, t.stride()) for t in inputs),
    )


def _static(t: torch.Tensor) -> torch.Tensor:
    """A tensor laid out as `t` (a plan may bake strides in), for the graph to read or write."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def _bytes(tensors: Sequence[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class EagerGraphs:
    """One world's replayable eager calls, by call site.

    `capture` records a call (default: a CUDA graph on CUDA devices, and no replays elsewhere; the CPU tests pass one
    that re-issues the recorded call, as prepared launches stand in for graph replays there). `on_failed_capture`
    puts the world's host state back after a capture that raised part way."""

    def __init__(
        self,
        device: torch.device,
        *,
        capture: Capture | None = None,
        on_failed_capture: Callable[[], Any] = lambda: None,
    ) -> None:
        self.device = device
        self._capture_call = capture or (cuda_capture if device.type == "cuda" else None)
        self._on_failed_capture = on_failed_capture
        self._on = self._capture_call is not None and enabled()
        self._replays: dict[tuple[Any, ...], _Replay] = {}
        self._seen: set[tuple[Any, ...]] = set()
        self._direct: set[tuple[Any, ...]] = set()  # call sites that run directly for good
        #: eager calls replayed so far (a count to check against, as `bench/ops/gpu_smoke.py` does)
        self.replays = 0

    def call(
        self,
        key: Any,
        run: Run,
        inputs: Sequence[torch.Tensor | None],
        in_place: Sequence[torch.Tensor | None],
        outputs: Sequence[torch.Tensor],
    ) -> bool:
        """Issue `run(inputs, outputs)` as a replay of its call site's graph and return True; False where the caller
        must run it directly. `inputs` are copied in and `outputs` out on each replay; `run` reads `in_place` (and
        anything else it closes over) where they were when captured."""
        if not self._on or _DIRECT_ONLY.get() or capturing(self.device):
            return False
        site = _site(key, inputs, in_place)
        replay = self._replays.get(site)
        if replay is None:
            if site in self._direct:
                return False
            if site not in self._seen:  # the first call builds and compiles: it runs directly
                self._seen.add(site)
                return False
            copies = _bytes(inputs) + _bytes(outputs)
            held = sum(_bytes(r.inputs) + _bytes(r.outputs) for r in self._replays.values())  # at a capture only
            full = len(self._replays) >= MAX_GRAPHS or held + copies > MAX_STATIC_BYTES
            if copies > MAX_COPY_BYTES or full:
                self._direct.add(site)
                return False
            replay = self._capture(site, run, inputs, outputs)
            if replay is None:
                return False
        # inside inference mode, copies into and out of inference and normal tensors alike are allowed, whichever
        # mode the call that captured ran in
        with torch.inference_mode():
            for static, x in zip(replay.inputs, inputs):
                if static is not None:
                    static.copy_(x)
            replay.replay()
            for o, static in zip(outputs, replay.outputs):
                o.copy_(static)
        self.replays += 1
        return True

    def _capture(
        self, site: tuple[Any, ...], run: Run, inputs: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor]
    ) -> _Replay | None:
        try:  # nothing runs during a capture (it only records): after a failure the direct path still works
            with torch.inference_mode():
                statics_in = [None if x is None else _static(x) for x in inputs]
                statics_out = [_static(o) for o in outputs]
                replay = _Replay(self._capture_call(run, statics_in, statics_out), statics_in, statics_out)
        except Exception as exc:
            self._direct.add(site)
            self._on_failed_capture()
            warn(
                f"{site[0][0]}: this call can't be captured for cheap eager repeats ({type(exc).__name__}: {exc}); "
                "it runs directly from now on",
                RuntimeWarning,
            )
            return None
        self._replays[site] = replay
        return replay

    def clear(self) -> None:
        """Drop every graph (after the device is done with them: a replay may still run on another stream)."""
        if self._replays and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._replays.clear()
        self._seen.clear()
        self._direct.clear()
