"""The plain values the store takes and returns; callers never see ORM objects or sessions.

`NewRecord` is what a tuner publishes; `Record` is what the store holds (plus id, canonical
`shape_key`, `config_hash`, derived `speedup` and timestamps). All are frozen dataclasses that
round-trip through JSON (`to_json` / `from_json`), which is what the service and bundles send.

Example:
    >>> rec = NewRecord(kernel="ag_gemm", kernel_version="3f2a", space_version="9c1d",
    ...                 shape={"M": 8192, "N": 4096, "K": 12288}, dtype="bfloat16", world_size=2,
    ...                 hardware_id="h200x2-nvl", triton_version="3.6", config={"BLOCK_M": 128},
    ...                 latency_p50_us=610.0, trials=64)
    >>> rec.validate().shape_key
    'K=12288,M=8192,N=4096'
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from typing import Any

from jointtune import __version__
from jointtune.errors import StoreError


class InvalidRecordError(StoreError, ValueError):
    """A record or query argument the store refuses; the message names every bad field."""


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRITON = re.compile(r"^\d+\.\d+$")
_TEXT_LIMITS = {"kernel": 128, "kernel_version": 64, "space_version": 64, "dtype": 32, "hardware_id": 128}


def shape_key(shape: Mapping[str, int]) -> str:
    """Canonical text of a shape, dims sorted by name: {"M": 8192, "K": 4096} -> 'K=4096,M=8192'."""
    return ",".join(f"{name}={shape[name]}" for name in sorted(shape))


def config_hash(config: Mapping[str, Any]) -> str:
    """Stable short hash of a config (canonical JSON), to group records that chose the same config."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_shape(shape: Any, problems: list[str], *, where: str = "shape") -> dict[str, int]:
    """Append what is wrong with a shape to `problems`; return it with sorted dims."""
    if not isinstance(shape, Mapping) or not shape:
        problems.append(f"{where}: {shape!r} is not allowed; it must be a non-empty dict of name -> int")
        return {}
    for name, value in shape.items():
        if not isinstance(name, str) or not _NAME.match(name) or len(name) > 64:
            problems.append(f"{where}: dim name {name!r} is not allowed; use an identifier like 'M'")
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{where}.{name}: {value!r} is not allowed; dims must be integers >= 1")
    return {name: shape[name] for name in sorted(shape, key=str)}


def check_text(name: str, value: Any, problems: list[str]) -> None:
    limit = _TEXT_LIMITS[name]
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        problems.append(f"{name}: {value!r} is not allowed; it must be a non-empty string of <= {limit} chars")


def check_world_size(value: Any, problems: list[str]) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        problems.append(f"world_size: {value!r} is not allowed; it must be an integer >= 1")


def _check_latency(name: str, value: Any, problems: list[str], *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        problems.append(f"{name}: {value!r} is not allowed; it must be a finite number of microseconds > 0")


def raise_problems(what: str, problems: list[str]) -> None:
    if problems:
        raise InvalidRecordError(f"{what}: " + "; ".join(problems))


@dataclass(frozen=True, kw_only=True)
class NewRecord:
    """A tuning result to publish: the key, the winning config and how fast it ran.

    `trials` counts the trials of the study that found this config. `baseline_us` is the unfused
    path's latency; the store derives `speedup = baseline_us / latency_p50_us` from it.
    """

    kernel: str
    kernel_version: str
    space_version: str
    shape: dict[str, int]
    dtype: str
    world_size: int
    hardware_id: str
    triton_version: str
    config: dict[str, Any]
    latency_p50_us: float
    latency_p10_us: float | None = None
    latency_p90_us: float | None = None
    baseline_us: float | None = None
    trials: int = 0
    study_name: str | None = None
    tuner_version: str = __version__

    @property
    def shape_key(self) -> str:
        return shape_key(self.shape)

    def validate(self) -> NewRecord:
        """Return self if every field is allowed, else raise InvalidRecordError naming each bad field."""
        problems: list[str] = []
        for name in _TEXT_LIMITS:
            check_text(name, getattr(self, name), problems)
        check_shape(self.shape, problems)
        check_world_size(self.world_size, problems)
        if not isinstance(self.triton_version, str) or not _TRITON.match(self.triton_version):
            problems.append(f"triton_version: {self.triton_version!r} is not allowed; use major.minor like '3.6'")
        try:
            if not isinstance(self.config, Mapping) or not all(isinstance(k, str) for k in self.config):
                raise TypeError
            config_hash(self.config)
        except (TypeError, ValueError):
            problems.append(f"config: {self.config!r} is not allowed; it must be a JSON object (str keys)")
        _check_latency("latency_p50_us", self.latency_p50_us, problems, optional=False)
        for name in ("latency_p10_us", "latency_p90_us", "baseline_us"):
            _check_latency(name, getattr(self, name), problems, optional=True)
        if not problems:
            p10, p50, p90 = self.latency_p10_us, self.latency_p50_us, self.latency_p90_us
            if (p10 is not None and p10 > p50) or (p90 is not None and p90 < p50):
                problems.append(f"latencies: p10={p10}, p50={p50}, p90={p90} must satisfy p10 <= p50 <= p90")
        if not isinstance(self.trials, int) or isinstance(self.trials, bool) or self.trials < 0:
            problems.append(f"trials: {self.trials!r} is not allowed; it must be an integer >= 0")
        if self.study_name is not None and (not isinstance(self.study_name, str) or len(self.study_name) > 256):
            problems.append(f"study_name: {self.study_name!r} is not allowed; use None or a string <= 256 chars")
        if not isinstance(self.tuner_version, str) or not self.tuner_version or len(self.tuner_version) > 32:
            problems.append(f"tuner_version: {self.tuner_version!r} is not allowed; use a version string")
        raise_problems(f"record for kernel {self.kernel!r}", problems)
        return self

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NewRecord:
        """Build from JSON; fields only a stored Record has (id, timestamps, ...) are ignored."""
        if not isinstance(data, Mapping):
            raise InvalidRecordError(f"record JSON: {type(data).__name__} is not allowed; send an object")
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names - _RECORD_ONLY
        missing = {f.name for f in fields(cls) if f.default is MISSING and f.name not in data}
        problems = [f"{name}: unknown field" for name in sorted(unknown)]
        problems += [f"{name}: missing" for name in sorted(missing)]
        raise_problems("record JSON", problems)
        return cls(**{k: v for k, v in data.items() if k in names})


_RECORD_ONLY = {"id", "shape_key", "config_hash", "speedup", "created_at", "updated_at"}


@dataclass(frozen=True, kw_only=True)
class Record:
    """A stored best config for one key (kernel, kernel_version, shape, dtype, world_size, hardware)."""

    id: int
    kernel: str
    kernel_version: str
    space_version: str
    shape: dict[str, int]
    shape_key: str
    dtype: str
    world_size: int
    hardware_id: str
    triton_version: str
    config: dict[str, Any]
    config_hash: str
    latency_p10_us: float | None
    latency_p50_us: float
    latency_p90_us: float | None
    baseline_us: float | None
    speedup: float | None
    trials: int
    study_name: str | None
    tuner_version: str
    created_at: datetime
    updated_at: datetime

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["created_at"] = self.created_at.isoformat()
        data["updated_at"] = self.updated_at.isoformat()
        return data


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A machine type: `hardware_id` (what records refer to), a readable name, its fingerprint."""

    hardware_id: str
    name: str
    fingerprint: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class KernelInfo:
    """A kernel name at one source version that the store has seen."""

    name: str
    version: str
    created_at: datetime
