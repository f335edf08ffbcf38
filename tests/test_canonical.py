"""One canonical text of configs and shapes, shared by the store, the tuner and the service."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from jointtune import canonical
from jointtune.autotune.tuner.keys import shape_text
from jointtune.db import config_hash, shape_key
from jointtune.search_spaces import canonical_json
from jointtune.search_spaces import config_hash as space_config_hash


def _hash_before(config: dict[str, Any]) -> str:
    """The store's config_hash before the one definition: raw canonical JSON, no number normalisation."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"BLOCK_M": 128, "BLOCK_N": 64, "mode": "pull"},
        {"mode": "push", "BLOCK_M": 128, "x": True, "SPLIT_K": 1, "name": "é"},
        {"nested": {"a": [1, 2, {"b": False}]}, "s": None},
    ],
)
def test_config_hash_of_stored_configs_is_unchanged(config: dict[str, Any]) -> None:
    assert config_hash is canonical.config_hash
    assert config_hash(config) == _hash_before(config)  # existing rows keep matching
    if all(isinstance(v, (int, str, bool)) for v in config.values()):
        assert space_config_hash(config) == config_hash(config)  # the tuner's and the store's agree


def test_a_known_config_keeps_its_stored_hash() -> None:
    # what the store (and the tuner) computed for this config before the one definition
    assert config_hash({"BLOCK_M": 128, "BLOCK_N": 64, "mode": "pull", "x": True}) == "72c255b76e0a5293"


def test_integral_floats_hash_as_their_integers() -> None:
    assert config_hash({"BLOCK": 64.0}) == config_hash({"BLOCK": 64}) == space_config_hash({"BLOCK": 64.0})
    assert config_hash({"a": [2.0, {"b": 3.0}]}) == config_hash({"a": [2, {"b": 3}]})
    assert config_hash({"x": 0.5}) != config_hash({"x": 1})
    with pytest.raises(ValueError):
        config_hash({"x": float("nan")})


def test_the_tuner_exchanges_the_same_text() -> None:
    config = {"mode": "push", "BLOCK_M": 128.0, "x": True}
    assert canonical_json(config) == canonical.canonical_json(config) == '{"BLOCK_M":128,"mode":"push","x":true}'


def test_one_shape_text() -> None:
    shape = {"M": 8192, "N": 4096, "K": 12288}
    assert shape_key(shape) == shape_text(shape) == canonical.shape_key(shape) == "K=12288,M=8192,N=4096"
