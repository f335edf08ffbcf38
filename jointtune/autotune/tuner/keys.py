"""Tuning keys: what a tuned config belongs to, and the Optuna study name derived from it.

A key is the key of the record a study publishes (`jointtune.db.RecordKey`): kernel name + kernel source
version, the problem (shape, dtype, world size), the hardware id and the timing policy. Every process that tunes
or looks up the same key derives the same study name, so groups on many nodes meet in one shared study without a
coordinator.

Example:
    >>> from jointtune.search_spaces import Problem
    >>> p = Problem.of({"M": 64, "N": 64, "K": 128}, dtype="bf16", world_size=2)
    >>> key = TuningKey.of("ag_gemm", "3f2a9c1d0e4b", p, "cpu-interpreter-x1-none-1a2b3c4d")
    >>> key.study_name(space_version="9c1d2e3f4a5b")
    'jointtune:ag_gemm@3f2a9c1d0e4b:K=128,M=64,N=64:bfloat16:w2:cpu-interpreter-x1-none-1a2b3c4d:s9c1d2e3f4a5b'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jointtune.canonical import shape_key
from jointtune.db import RecordKey
from jointtune.search_spaces import Problem
from jointtune.timings import measured_as

#: Prefix of every study this tuner creates (the sweep registry uses its own prefix).
STUDY_PREFIX = "jointtune:"


def shape_text(shape: Mapping[str, int]) -> str:
    """Dims sorted by name, as the store keys them (`jointtune.canonical.shape_key`): 'K=128,M=64,N=64'."""
    return shape_key(shape)


class TuningKey(RecordKey):
    """The identity of one tuning problem: the key of the record it publishes (`jointtune.db.RecordKey`, its fields
    and JSON), with the study name derived from it; plain and JSON-round-trippable."""

    @classmethod
    def of(cls, kernel: str, kernel_version: str, problem: Problem, hardware_id: str, timing: str = "gpu") -> TuningKey:
        """The key of tuning `problem` under `timing` on `hardware_id`: on the CPU interpreter its policy is what
        the interpreter measures, interp (`jointtune.timings.measured_as`), whatever was asked."""
        timing = measured_as(timing, hardware_id)
        return cls(kernel=kernel, kernel_version=kernel_version, shape=dict(problem.shape), dtype=problem.dtype,
                   world_size=problem.world_size, hardware_id=hardware_id, timing=timing)  # fmt: skip

    @property
    def problem(self) -> Problem:
        return Problem.of(dict(self.shape), dtype=self.dtype, world_size=self.world_size)

    @property
    def shape_dict(self) -> dict[str, int]:
        return dict(self.shape)

    def study_name(self, *, space_version: str, exhaustive: bool = False) -> str:
        """One study per key, timing policy and space version; exhaustive runs (ground truth) get their
        own. GPU-timed studies keep the names they had before policies existed, so they resume, and so do the
        interpreter's (interp since its records say so; the hardware id in the name tells it apart)."""
        name = (
            f"{STUDY_PREFIX}{self.kernel}@{self.kernel_version}:{shape_text(self.shape_dict)}:"
            f"{self.dtype}:w{self.world_size}:{self.hardware_id}:s{space_version}"
        )
        kept = ("gpu", measured_as("gpu", self.hardware_id))  # gpu; and interp, on the interpreter's hardware only
        timing = "" if self.timing in kept else f":t{self.timing}"
        return name + timing + (":exhaustive" if exhaustive else "")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuningKey:
        problem = Problem.of(data["shape"], dtype=data["dtype"], world_size=data["world_size"])
        return cls.of(data["kernel"], data["kernel_version"], problem, data["hardware_id"], data.get("timing", "gpu"))


def triton_version() -> str:
    """Major.minor of the installed Triton ("3.6"), as records carry it; "0.0" without Triton."""
    try:
        import triton
    except ImportError:  # pragma: no cover - triton is a hard dependency
        return "0.0"
    return ".".join(triton.__version__.split(".")[:2])
