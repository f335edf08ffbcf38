"""Canonical text of configs and shapes: one definition for the store, the tuner and the service.

A leaf of the package (standard library only). The store keys a record's shape by `shape_key` and
groups records by `config_hash`; the tuner names studies by the same shape text and its ranks exchange
configs as `canonical_json`. All of them must give the same text for the same value, whatever the key
order and however a number was spelled:

- keys sorted, no spaces, no NaN or infinity (`json.dumps(sort_keys=True, separators=(",", ":"),
  allow_nan=False)`);
- a float with an integral value is its integer, at any depth (64.0 -> 64): JSON Schema's integer 64
  is 64.0 too, and a config read back from JSON must hash as the one that was tuned.

The hash of a config of ints, strings and bools is the sha256 of exactly the text the store hashed
before this module existed, so stored `config_hash` values keep matching.

Example:
    >>> config_hash({"mode": "push", "BLOCK_M": 128}) == config_hash({"BLOCK_M": 128.0, "mode": "push"})
    True
    >>> shape_key({"M": 8192, "K": 4096})
    'K=4096,M=8192'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: the largest dim a shape may have anywhere (CLI, spaces, store, service): 2**53 is exact in a double
#: (PostgreSQL's nearest-shape arithmetic) and in JavaScript
MAX_DIM = 2**53


def plain(value: Any) -> Any:
    """`value` with every integral float made its integer, in objects and arrays at any depth."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, integral floats as integers: equal values give equal text.
    Raises ValueError for NaN or infinity, TypeError for what JSON can't hold."""
    return json.dumps(plain(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, Any]) -> str:
    """A short stable id of a config: the first 16 hex digits of the sha256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def shape_key(shape: Mapping[str, int]) -> str:
    """Canonical text of a shape, dims sorted by name: {"M": 8192, "K": 4096} -> 'K=4096,M=8192'."""
    return ",".join(f"{name}={shape[name]}" for name in sorted(shape))


__all__ = ["canonical_json", "config_hash", "plain", "shape_key"]
