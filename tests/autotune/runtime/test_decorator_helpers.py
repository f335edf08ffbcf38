"""Helpers of the decorator tests (no tests here): a decorated cheap launcher over `jt_sleep`, records."""

from __future__ import annotations

from typing import Any

import jt_families  # noqa: F401 - registers the jt_sleep space and family
import torch

from jointtune.autotune.runtime.decorator import joint_autotune
from jointtune.autotune.tuner.keys import triton_version
from jointtune.db import NewRecord
from jointtune.hardware import detect
from jointtune.kernels import get_family
from jointtune.search_spaces import get_space

BEST = {"mode": "fast", "tile": 4, "chunk": 2}
OTHER = {"mode": "fast", "tile": 2, "chunk": 4}
DEFAULT = {"mode": "fast", "tile": 1, "chunk": 1}


class World:
    """The launcher's `world` argument: only its size matters to the decorator."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size


def make_launcher(db_url: str | None, **options: Any) -> Any:
    """A launcher of the jt_sleep family that records the configs it was given."""
    seen: list[dict[str, Any]] = []

    @joint_autotune(space="jt_sleep", key=lambda x, *, world: {"M": x.shape[0]}, db_url=db_url, **options)
    def launch(x: torch.Tensor, *, world: World, config: Any) -> torch.Tensor:
        seen.append(dict(config))
        return x * 2

    launch.seen = seen  # type: ignore[attr-defined]
    return launch


def sleep_record(m: int = 64, config: dict[str, Any] | None = None, **overrides: Any) -> NewRecord:
    fields: dict[str, Any] = {
        "kernel": "jt_sleep",
        "kernel_version": get_family("jt_sleep").version,
        "space_version": get_space("jt_sleep").version,
        "shape": {"M": m},
        "dtype": "float32",
        "world_size": 2,
        "hardware_id": detect().hardware_id,
        "triton_version": triton_version(),
        "config": dict(config or BEST),
        "latency_p50_us": 100.0,
        "trials": 4,
        "timing": "eager",  # what a call outside CUDA-graph capture asks for (no fallback involved)
    }
    fields.update(overrides)
    return NewRecord(**fields)


def source_of(launcher: Any, m: int, world_size: int = 2, timing: str = "eager") -> str:
    return launcher.sources[((("M", m),), torch.float32, world_size, timing)]
