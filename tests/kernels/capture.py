"""A CUDA graph's capture and replay, for the CPU interpreter.

A CUDA graph holds the launches of one call with their arguments frozen: the same kernels, grids,
pointers and integers, issued again on every replay, whatever the host would compute now. `capture()`
records exactly that on the CPU: every Triton launch (kernel, grid, arguments) and every torch (aten)
op with its arguments and output tensors, while running the call once. `Recording.replay()` issues
them again in order; an op's fresh output is copied into the tensor it produced at capture, as a graph
writes into the memory it captured. Host reads (`.item()`) during capture are refused, as capture
refuses a synchronisation.

If a launch depends on host state that changes from call to call (a Python epoch counter, an inbox
half picked on the host), a replay issues stale values, exactly as a graph replay on a GPU would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from triton.runtime.interpreter import InterpretedFunction

_SKIP = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class CaptureError(AssertionError):
    """The call did something a CUDA graph capture refuses."""


class Recording:
    def __init__(self) -> None:
        self.ops: list[tuple[str, Any, tuple, dict, Any]] = []

    def replay(self) -> None:
        for kind, fn, args, kwargs, outs in self.ops:
            if kind == "triton":
                _RUN(fn, *args, **kwargs)
                continue
            result = fn(*args, **kwargs)
            fresh, _ = tree_flatten(result)
            for new, old in zip(fresh, outs):
                if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and new.data_ptr() != old.data_ptr():
                    old.copy_(new)

    @property
    def triton_launches(self) -> int:
        return sum(kind == "triton" for kind, *_ in self.ops)


_RUN = InterpretedFunction.run


class _Recorder(TorchDispatchMode):
    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and not self.paused:
            raise CaptureError(f"{func}: a host read of a device value during capture")
        out = func(*args, **kwargs)
        if not self.paused and func not in _SKIP:
            outs, _ = tree_flatten(out)
            self.recording.ops.append(("aten", func, args, kwargs, outs))
        return out


@contextlib.contextmanager
def capture() -> Iterator[Recording]:
    """Record every launch inside the block (run once, as capture does); replay with `.replay()`."""
    recording = Recording()
    recorder = _Recorder(recording)

    def run(self, *args, **kwargs):
        recording.ops.append(("triton", self, args, dict(kwargs), None))
        recorder.paused += 1  # the interpreter's own tensor work is part of the launch, not separate ops
        try:
            return _RUN(self, *args, **kwargs)
        finally:
            recorder.paused -= 1

    InterpretedFunction.run = run
    try:
        with recorder:
            yield recording
    finally:
        InterpretedFunction.run = _RUN
