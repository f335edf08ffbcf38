"""The problem a config is tuned for, and the device limits that constrain which configs are valid.

Both are plain frozen values so they hash, compare and round-trip through JSON. Spaces read them in
their constraints; the tuner and the store build keys from them.

Example:
    >>> p = Problem.of({"M": 8192, "N": 4096, "K": 12288}, dtype="bfloat16", world_size=2)
    >>> p.dim("M"), p.dtype_bytes
    (8192, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jointtune.canonical import MAX_DIM
from jointtune.dtypes import DTYPE_ALIASES
from jointtune.errors import SpaceError
from jointtune.search_spaces._collectives import COLLECTIVES

#: dtype name -> element size in bytes. Names follow torch (`torch.bfloat16` -> "bfloat16").
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


def normalize_dtype(dtype: Any) -> str:
    """Accept 'bf16', 'bfloat16' or torch.bfloat16; return the canonical name."""
    name = str(dtype).removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise SpaceError(f"dtype: {dtype!r} is not supported; allowed: {', '.join(DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class Problem:
    """Shape (named integer dims, sorted), dtype and world size of one kernel call."""

    shape: tuple[tuple[str, int], ...]
    dtype: str
    world_size: int

    @classmethod
    def of(cls, shape: Mapping[str, int], *, dtype: Any, world_size: int) -> Problem:
        dims = []
        for name, value in shape.items():
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
                raise SpaceError(f"shape.{name}: {value!r} is not allowed; dims must be integers in 1..{MAX_DIM}")
            dims.append((str(name), int(value)))
        if not isinstance(world_size, int) or world_size < 1:
            raise SpaceError(f"world_size: {world_size!r} is not allowed; it must be an integer >= 1")
        return cls(shape=tuple(sorted(dims)), dtype=normalize_dtype(dtype), world_size=world_size)

    def dim(self, name: str) -> int:
        for key, value in self.shape:
            if key == name:
                return value
        raise SpaceError(f"shape: dim {name!r} is missing; present: {', '.join(k for k, _ in self.shape)}")

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.shape)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.dims, "dtype": self.dtype, "world_size": self.world_size}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Problem:
        return cls.of(data["shape"], dtype=data["dtype"], world_size=data["world_size"])


@dataclass(frozen=True)
class DeviceLimits:
    """What a space's constraints need to know about the device.

    `max_shared_mem` is the opt-in shared memory per block in bytes (227 KiB on Hopper);
    `interpreter` marks the CPU path, where the limits are nominal (a Hopper-like device) so spaces
    count the same configs with and without a GPU. `collectives` are the baseline's collective variants the
    device's build runs (`_collectives.COLLECTIVES`; every one by default: simulated ranks run them all alike).
    """

    max_shared_mem: int
    num_sms: int
    compute_capability: tuple[int, int]
    interpreter: bool = False
    collectives: tuple[str, ...] = COLLECTIVES

    @classmethod
    def nominal_hopper(cls, *, interpreter: bool = True) -> DeviceLimits:
        return cls(max_shared_mem=232448, num_sms=132, compute_capability=(9, 0), interpreter=interpreter)

    @classmethod
    def unbounded(cls) -> DeviceLimits:
        """A device no limit rule rejects: checks a config whose device is known only by an id (every limit
        rule is an upper bound)."""
        return cls(max_shared_mem=1 << 40, num_sms=1 << 20, compute_capability=(99, 0))
