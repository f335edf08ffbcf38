"""What every family's entry point does alike with its arguments: per-rank tensor lists, the dtypes the kernels take,
A made row-major and aligned, and configs carried as JSON text by the torch ops."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from jointtune.errors import ShapeError, SpaceError

#: the input dtypes of the GEMM families, by their names in keys and records
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def as_list(x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor (a CUDA rank's) or one per simulated rank, as a list."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def forward_only(kernel: str, **inputs: list[torch.Tensor]) -> None:
    """ShapeError naming the first input that requires grad while grad mode is on: the kernels have no backward,
    so their output would silently carry no gradient back to it (a weight that never learns)."""
    if not torch.is_grad_enabled():
        return
    for name, tensors in inputs.items():
        if any(getattr(t, "requires_grad", False) for t in tensors):
            raise ShapeError(
                f"{name}: requires grad, and {kernel} is forward-only (no backward); call it under torch.no_grad() "
                "or torch.inference_mode(), or pass detached tensors"
            )


def first_of(name: str, x: Any, ndim: int) -> torch.Tensor:
    """The first rank's tensor of argument `name`, which a key reads its dims from; ShapeError naming it unless it
    is an `ndim`-D tensor (a launcher's key runs before the op checks its arguments; keys call this only once
    reading the arguments failed, so a call that works pays nothing for it)."""
    items = [x] if isinstance(x, torch.Tensor) else list(x) if isinstance(x, (list, tuple)) else []
    if not items or not isinstance(items[0], torch.Tensor) or items[0].dim() != ndim:
        got = f"{type(x).__name__}" if not items else f"{getattr(items[0], 'shape', type(items[0]).__name__)}"
        raise ShapeError(f"{name}: expected a {ndim}-D tensor, or a list of one per simulated rank; got {got}")
    return items[0]


def usable(x: torch.Tensor) -> torch.Tensor:
    """Row-major and 16-byte aligned, as the kernels read A (a copy otherwise)."""
    if x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def config_json(config: Mapping[str, Any]) -> str:
    """The config as the torch ops take it (canonical JSON text: a constant under torch.compile)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


def parse_config(text: str) -> dict[str, Any]:
    """The torch op's config text as a new dict (the parse is cached; the caller may change what it gets)."""
    return dict(_parse_config(text))


@functools.lru_cache(maxsize=1024)
def _parse_config(text: str) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpaceError(f"config: {text[:80]!r} is not JSON ({exc.msg}); pass config_json(config)") from None
    except (ValueError, RecursionError) as exc:  # a number past Python's digit limit; nesting past the stack
        what = type(exc).__name__
        raise SpaceError(f"config: {text[:80]!r} is not a config ({what}); pass config_json(config)") from None
    if not isinstance(config, dict):
        raise SpaceError(f"config: {text[:80]!r} is not a JSON object of field -> value")
    return config
