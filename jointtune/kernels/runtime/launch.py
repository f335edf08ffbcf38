"""A Triton launch prepared once and issued many times: the cheap repeat call.

`kernel[grid](...)` binds every argument, computes its specialization key and looks up the compiled
kernel on every call: tens of microseconds of Python for our 30-argument kernels, more than their GPU
time at decode sizes. A `Launch` fixes the grid, the constants and every argument but a few per-call
slots (the caller's tensors); the first call compiles through Triton as usual, later calls hand the
argument list straight to the compiled kernel's launcher. Anything that changes between calls of one
plan lives in device memory, so a launch depends on the host only through these fixed values: a CUDA
graph that captured it replays it correctly.

A slot value whose 16-byte alignment differs from the first call's would need another specialization:
such a call takes Triton's own path (which compiles it), so alignment never silently mismatches.
In the interpreter every call takes Triton's path (it has no compiled kernel).

Example:
    >>> args = {"src": x, "dst": y, "n": 1024, "BLOCK": 256}                          # doctest: +SKIP
    >>> launch = Launch(copy_kernel, (4,), args, slots=("src", "dst"))                 # doctest: +SKIP
    >>> launch(x2, y2)                                                               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from jointtune.errors import KernelError
from jointtune.kernels.runtime.device import check_launchable, interpreted

_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _aligned(value: Any) -> tuple[bool, torch.dtype] | None:
    """What a compiled kernel specialised on for a tensor argument: 16-byte alignment, and its dtype."""
    return (value.data_ptr() % 16 == 0, value.dtype) if isinstance(value, torch.Tensor) else None


class Launch:
    """One kernel, one grid, fixed arguments; `launch(*slot_values)` issues it."""

    __slots__ = ("_argv", "_compiled", "_fast", "_index", "_stream_of", "align", "grid", "kernel", "options", "slots")

    def __init__(
        self,
        kernel: Any,
        grid: int | Sequence[int],
        args: Mapping[str, Any] | Any,
        *,
        options: Mapping[str, Any] | None = None,
        slots: Sequence[str] = (),
    ) -> None:
        named, found = split_options(args)
        options = {**(options or {}), **found}
        names = list(kernel.arg_names)
        missing = [n for n in names if n not in named]
        unknown = [n for n in named if n not in names]
        if missing or unknown:
            raise KernelError(
                f"launch of {kernel.fn.__name__}: arguments missing {missing or 'none'}, unknown {unknown or 'none'}"
            )
        for slot in slots:
            if slot not in named:
                raise KernelError(f"launch of {kernel.fn.__name__}: slot {slot!r} is not one of its arguments")
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        if not grid or min(grid) < 1:
            raise KernelError(f"launch of {kernel.fn.__name__}: grid {grid} is empty; every dim must be >= 1")
        for value in named.values():
            if isinstance(value, torch.Tensor):
                check_launchable(kernel.fn.__name__, value.device)
                break
        self.kernel, self.options, self.slots = kernel, options, tuple(slots)
        self.grid = grid + (1,) * (3 - len(grid))
        self._argv = [named[n] for n in names]
        self._index = [names.index(s) for s in self.slots]
        self.align = tuple(_aligned(named[s]) for s in self.slots)
        self._compiled: Any = None
        self._fast = not interpreted()
        self._stream_of: Any = None

    def __call__(self, *values: Any) -> None:
        argv = self._argv
        for i, v in zip(self._index, values):
            argv[i] = v
        compiled = self._compiled
        try:
            if compiled is not None and all(_aligned(v) in (a, None) for v, a in zip(values, self.align)):
                gx, gy, gz = self.grid
                compiled.run(gx, gy, gz, self._stream_of(compiled.device), compiled.function,
                             compiled.packed_metadata, None, None, None, *argv)  # fmt: skip
                return
            kwargs = dict(zip(self.kernel.arg_names, argv))
            result = self.kernel[self.grid](**kwargs, **self.options)
            if self._fast and compiled is None:
                self._compiled = _fast_path(result)
                if self._compiled is not None:
                    self._stream_of = torch._C._cuda_getCurrentRawStream
                    # what this compile specialised on: the call's values, not the build's stand-ins
                    self.align = tuple(_aligned(v) for v in values)
        finally:
            for i in self._index:  # don't keep the caller's tensors alive (or visible to torch's graph trees)
                argv[i] = None

    @property
    def direct(self) -> bool:
        """Whether a call hands its arguments straight to the compiled kernel (the cheap path, taken from the first
        call's compile on), rather than through Triton's own launch path (the interpreter, a profiler's launch hook,
        a slot whose alignment differs): what a benchmark of the host's cost per call reports."""
        return self._compiled is not None

    def named(self) -> dict[str, Any]:
        """The fixed arguments by name (the slots read None between calls)."""
        return dict(zip(self.kernel.arg_names, self._argv))


def split_options(args: Mapping[str, Any] | Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kernel arguments, launch options) of a mapping or dataclass of both, as `kernel[grid](...)` takes them."""
    if isinstance(args, Mapping):
        named = dict(args)
    elif dataclasses.is_dataclass(args):
        named = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    else:
        raise KernelError(f"launch arguments: {type(args).__name__} is neither a mapping nor a dataclass")
    return named, {key: named.pop(key) for key in _OPTIONS if key in named}


class _Compiled:
    """What the fast path needs of Triton's compiled kernel; None from `_fast_path` when this Triton
    has another shape (then every call takes Triton's own path, correct and slower)."""

    __slots__ = ("device", "function", "packed_metadata", "run")

    def __init__(self, kernel: Any, device: int) -> None:
        self.run = kernel.run
        self.function = kernel.function
        self.packed_metadata = kernel.packed_metadata
        self.device = device


def _hooked(hook: Any) -> bool:
    """A launch hook is set (None or an empty HookChain, as Triton 3.5+ keeps them, means none)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _fast_path(kernel: Any) -> _Compiled | None:
    try:
        from triton import knobs

        if _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            return None  # profilers hook launches: keep Triton's path so they see ours
        kernel._init_handles()
        return _Compiled(kernel, torch.cuda.current_device())
    except Exception:
        return None
