"""What to tune (`Job`) and how (`TuneSettings`): plain frozen values that travel to every rank.

Both round-trip through JSON, because a sweep is registered in the shared storage once and read
back by every worker group, on any node, possibly long after the sweep file is gone.

Example:
    >>> s = TuneSettings(trials=12, time_budget_s=60, strategy="tpe")
    >>> TuneSettings.from_json(s.to_json()) == s
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from jointtune.errors import TuningError
from jointtune.search_spaces import Problem
from jointtune.timings import TIMINGS

#: "tpe": multivariate grouped TPE; "random": the control; "exhaustive": every valid config once.
STRATEGIES = ("tpe", "random", "exhaustive")
#: the longest watchdog or budget any setting may ask for (11.6 days): a timer that can be armed on every
#: platform (faulthandler's overflows near 1e10 s), and still "no limit" for any real trial
MAX_SECONDS = 1e6
#: the largest count any setting may ask for: what a 32-bit column of either database holds
MAX_COUNT = 2**31 - 1
#: trials of history before TPE models it, unless `n_startup` says otherwise (`TuneSettings.startup_trials`)
STARTUP_TRIALS = 10


@dataclass(frozen=True)
class TuneSettings:
    """Budgets, search strategy, benchmark repeat counts and watchdog sizing of one study.

    The watchdog of a trial allows `watchdog_compile_s` for compiling and checking a config it
    hasn't run yet, plus `watchdog_factor` times what the baseline took for the same number of
    runs, plus `watchdog_slack_s`. Until the baseline is measured, `first_trial_timeout_s` holds.
    """

    trials: int = 32
    time_budget_s: float | None = None
    patience: int | None = None
    strategy: str = "tpe"
    seed: int = 0
    warmup: int = 3
    iters: int = 10
    warm_start: int = 3
    n_startup: int | None = None
    lookahead: int = 1
    #: rounds of the final round: once a study has no trial left, its configs within 3% of the fastest are timed
    #: again side by side this many times and the lowest median is the pick (`finalists`; 0: the fastest trial)
    final_rounds: int = 5
    watchdog_compile_s: float = 120.0
    watchdog_factor: float = 20.0
    watchdog_slack_s: float = 10.0
    first_trial_timeout_s: float = 600.0
    max_invalid_streak: int = 100
    max_duplicate_streak: int = 20
    #: params narrowed to some of their choices ({name: values}; see `Space.restrict`): a study of
    #: the sub-space, e.g. a joint space small enough to measure exhaustively
    restrict: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: how trials (and the baseline) are timed: one of TIMINGS; each policy is a study of its own
    timing: str = "gpu"
    #: offer modes whose results may differ in the last bits between identical calls (the space's
    #: `nondeterministic` modes, e.g. gemm_rs's atomic): off by default, and a study of its own
    allow_nondeterministic: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "restrict", _restriction(self.restrict))
        if not isinstance(self.allow_nondeterministic, bool):
            raise TuningError(
                f"allow_nondeterministic: {self.allow_nondeterministic!r} is not allowed; it must be true or false"
            )
        if self.strategy not in STRATEGIES:
            raise TuningError(f"strategy: {self.strategy!r} is not allowed; allowed: {', '.join(STRATEGIES)}")
        if self.timing not in TIMINGS:
            raise TuningError(f"timing: {self.timing!r} is not allowed; allowed: {', '.join(TIMINGS)}")
        positive = ("trials", "iters", "max_invalid_streak", "max_duplicate_streak")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_COUNT:
                raise TuningError(f"{name}: {value!r} is not allowed; it must be an integer in 1..{MAX_COUNT}")
        for name in ("warmup", "warm_start", "lookahead", "final_rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
                raise TuningError(f"{name}: {value!r} is not allowed; it must be an integer in 0..{MAX_COUNT}")
        seed = self.seed  # the samplers' generators take 32 bits
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
            raise TuningError(f"seed: {seed!r} is not allowed; it must be an integer in 0..{2**32 - 1}")
        for name in ("patience", "n_startup"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_COUNT:
                raise TuningError(f"{name}: {value!r} is not allowed; it must be an integer in 1..{MAX_COUNT} or null")
        seconds = ("watchdog_compile_s", "watchdog_slack_s", "first_trial_timeout_s", "watchdog_factor")
        for name in (*seconds, "time_budget_s"):
            value = getattr(self, name)
            if value is None and name == "time_budget_s":
                continue
            # `not 0 < value <= MAX` also refuses NaN and infinity
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
                raise TuningError(f"{name}: {value!r} is not allowed; it must be a number in (0, {MAX_SECONDS:.0f}]")

    @property
    def startup_trials(self) -> int:
        """Trials of history (the start included) before TPE models it: 10 whatever the budget, so a short and a
        long tune of one seed ask the same first configs (a budget-sized random start made a 16-trial and a
        48-trial tune explore differently from their first trial: issue 34)."""
        return self.n_startup if self.n_startup is not None else STARTUP_TRIALS

    def replace(self, **changes: Any) -> TuneSettings:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["restrict"] = {name: list(values) for name, values in self.restrict}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TuningError(f"settings: {unknown[0]!r} is not a setting; allowed: {', '.join(sorted(known))}")
        return cls(**dict(data))


def _restriction(value: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """{name: value or values} (or pairs) as sorted, hashable pairs, so equal settings compare equal."""
    pairs = value.items() if isinstance(value, Mapping) else value
    out = {}
    try:
        for name, values in pairs:
            if not isinstance(name, str):
                raise TypeError
            scalar = isinstance(values, (str, int, float, bool))
            given = (values,) if scalar else tuple(values)
            # one order per set of values: the same sub-space always reads (and hashes) the same
            out[name] = tuple(sorted(dict.fromkeys(given), key=lambda v: (type(v).__name__, v)))
    except (TypeError, ValueError):
        raise TuningError(
            f"restrict: {value!r} is not allowed; it must map param names to a value or a list of values"
        ) from None
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Job:
    """One (kernel, shape, dtype, world size) to tune, with its settings."""

    kernel: str
    shape: tuple[tuple[str, int], ...]
    dtype: str
    world_size: int
    settings: TuneSettings = TuneSettings()

    @classmethod
    def of(cls, kernel: str, problem: Problem, settings: TuneSettings | None = None) -> Job:
        return cls(kernel, problem.shape, problem.dtype, problem.world_size, settings or TuneSettings())

    @property
    def problem(self) -> Problem:
        return Problem.of(dict(self.shape), dtype=self.dtype, world_size=self.world_size)

    @property
    def label(self) -> str:
        dims = ",".join(f"{k}={v}" for k, v in self.shape)
        timing = "" if self.settings.timing == "gpu" else f" ({self.settings.timing})"
        return f"{self.kernel} {dims} {self.dtype} w{self.world_size}{timing}"

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "shape": dict(self.shape), "dtype": self.dtype, "world_size": self.world_size,
                "settings": self.settings.to_json()}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        problem = Problem.of(data["shape"], dtype=data["dtype"], world_size=data["world_size"])
        return cls.of(data["kernel"], problem, TuneSettings.from_json(data.get("settings", {})))
