"""Anchor problems: realistic shapes every space is sized against (LLM layers at tensor parallel 2).

The GEMM shapes are MLP and attention projections of 8B–70B models at a long prefill (M = 8192
tokens), a medium batch (1024) and a small one (128); the decode shapes span batch 1–64 and KV
lengths 8K–128K. `jointtune spaces count --anchors` prints how many valid configs each one has.

Example:
    >>> [(space.name, problem.dims) for space, problem in anchor_problems()][0]
    ('ag_gemm', {'K': 12288, 'M': 8192, 'N': 4096})
"""

from __future__ import annotations

from jointtune.search_spaces._problem import Problem
from jointtune.search_spaces._registry import get_space
from jointtune.search_spaces._space import Space

ANCHOR_DTYPE = "bfloat16"
ANCHOR_WORLD_SIZE = 2

_GEMM = [(8192, 4096, 12288), (8192, 8192, 28672), (8192, 3584, 14336), (1024, 8192, 8192), (128, 8192, 8192)]
_DECODE = [
    (1, 32, 8, 8192, 128),
    (16, 32, 8, 32768, 128),
    (64, 32, 8, 8192, 128),
    (1, 64, 8, 131072, 128),
    (16, 64, 8, 131072, 128),
    (64, 64, 8, 32768, 128),
]

#: space name -> anchor shapes as dicts of its dims
ANCHORS: dict[str, list[dict[str, int]]] = {
    "ag_gemm": [dict(zip(("M", "N", "K"), s, strict=True)) for s in _GEMM],
    "gemm_rs": [dict(zip(("M", "N", "K"), s, strict=True)) for s in _GEMM],
    "flash_decode": [dict(zip(("B", "H", "H_KV", "S", "D"), s, strict=True)) for s in _DECODE],
}


def anchor_problems(names: list[str] | None = None) -> list[tuple[Space, Problem]]:
    """(space, problem) for every anchor of the named spaces (all anchored spaces by default)."""
    out = []
    for name in names if names is not None else list(ANCHORS):
        space = get_space(name)
        for shape in ANCHORS.get(name, []):
            out.append((space, space.make_problem(shape, dtype=ANCHOR_DTYPE, world_size=ANCHOR_WORLD_SIZE)))
    return out
