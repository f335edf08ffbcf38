"""Shapes written as text, the way users type them on a command line or in a sweep file.

Two forms: positional dims in the family's order ("8192x4096x12288" for M, N, K) or named dims
in any order ("M=8192,N=4096,K=12288"). Both must name every dim exactly once.

Example:
    >>> parse_shape("8192x4096x12288", ("M", "N", "K"))
    {'M': 8192, 'N': 4096, 'K': 12288}
    >>> parse_shape("K=12288, M=8192, N=4096", ("M", "N", "K"))
    {'M': 8192, 'N': 4096, 'K': 12288}
"""

from __future__ import annotations

from collections.abc import Sequence

from jointtune.canonical import MAX_DIM
from jointtune.errors import SpaceError


def _positive(name: str, text: str, shape: str) -> int:
    text = text.strip()
    # ASCII digits only: str.isdigit also takes '²' (which int() refuses) and full-width digits
    if not (text.isascii() and text.isdigit()) or len(text) > 16 or not 1 <= int(text) <= MAX_DIM:
        raise SpaceError(f"shape.{name}: {text!r} in {shape!r} is not allowed; dims must be integers in 1..{MAX_DIM}")
    return int(text)


def example_shape(ndims: int) -> str:
    """A shape of `ndims` dims to show in messages when a space names no real one of its own."""
    return "x".join(str(2 ** (12 + i)) for i in range(ndims))


def parse_shape(text: str, dims: Sequence[str], *, example: str | None = None) -> dict[str, int]:
    """Dims from `text`, keyed and ordered as `dims`; SpaceError says which part is wrong (showing `example`)."""
    dims = tuple(dims)
    order = "x".join(dims)
    example = example or example_shape(len(dims))
    if not isinstance(text, str) or not text.strip():
        raise SpaceError(f"shape: {text!r} is not allowed; write {order} (e.g. {example}) or name=value pairs")
    text = text.strip()
    if "=" in text:
        found: dict[str, int] = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or not name:
                raise SpaceError(f"shape: {part.strip()!r} in {text!r} is not allowed; write name=value pairs")
            if name not in dims:
                raise SpaceError(f"shape: dim {name!r} in {text!r} is not allowed; allowed dims: {', '.join(dims)}")
            if name in found:
                raise SpaceError(f"shape: dim {name!r} appears twice in {text!r}; give each dim once")
            found[name] = _positive(name, value, text)
        missing = [d for d in dims if d not in found]
        if missing:
            raise SpaceError(f"shape: dim {missing[0]!r} is missing in {text!r}; required dims: {', '.join(dims)}")
        return {d: found[d] for d in dims}
    parts = text.replace("X", "x").split("x")
    if len(parts) != len(dims):
        raise SpaceError(f"shape: {text!r} has {len(parts)} dims; allowed: {len(dims)} dims {order} (e.g. {example})")
    return {d: _positive(d, p, text) for d, p in zip(dims, parts, strict=True)}
