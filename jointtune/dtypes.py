"""Dtype names: the one vocabulary the CLI, the spaces, the store and the service accept.

Names follow torch (`torch.bfloat16` -> "bfloat16"); the CLI's short names (`bf16`, `fp16`, `half`,
`fp32`, `float`) are aliases. Kept in a module of its own, free of heavy imports, because both the
search spaces (what a kernel can run) and the store (what a record may be keyed by) read it.

Example:
    >>> canonical_dtype("bf16"), canonical_dtype("torch.float16"), canonical_dtype("bfloat17")
    ('bfloat16', 'float16', None)
"""

from __future__ import annotations

#: the CLI's short names -> torch's names
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}

#: every torch dtype name a tuned kernel may be keyed by (Triton drop-in kernels see any tensor dtype)
TORCH_DTYPES: tuple[str, ...] = (
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
)


def canonical_dtype(name: object) -> str | None:
    """torch's name for a dtype given as 'bf16', 'bfloat16', 'torch.bfloat16' or torch.bfloat16; None if unknown."""
    text = str(name).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    return text if text in TORCH_DTYPES else None
