"""Configs as values: canonical JSON text and a short hash, the same whatever the key order.

Configs are plain dicts of field -> int | str | bool. The store keys records by `config_hash` and
ranks exchange configs as `canonical_json`, so both must not depend on how a dict was built. The text
and the hash are `jointtune.canonical`'s, the store's own: a space only first checks that a config is
one of its flat dicts of scalars (SpaceError naming the field otherwise).

Example:
    >>> canonical_json({"mode": "push", "BLOCK_M": 128}) == canonical_json({"BLOCK_M": 128, "mode": "push"})
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jointtune import canonical
from jointtune.errors import SpaceError
from jointtune.search_spaces._params import Value


def _plain(config: Any) -> dict[str, Value]:
    if not isinstance(config, Mapping):
        raise SpaceError(f"config: {config!r} is not allowed; it must be a JSON object of field -> value")
    out: dict[str, Value] = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise SpaceError(f"config: field name {key!r} is not allowed; field names are strings")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, (int, str, bool)):
            raise SpaceError(f"{key}: {value!r} is not allowed; config values are int, str or bool")
        out[key] = value
    return out


def canonical_json(config: Mapping[str, Value]) -> str:
    """Sorted keys, no spaces: equal configs give equal text, whatever their key order."""
    return canonical.canonical_json(_plain(config))


def config_hash(config: Mapping[str, Value]) -> str:
    """A short stable id of a config (sha256 of its canonical JSON): the store's `config_hash`."""
    return canonical.config_hash(_plain(config))
