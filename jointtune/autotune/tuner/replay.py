"""Replaying recorded latencies to compare search strategies on a CPU.

An exhaustive study on a GPU measures every valid config of one problem once; its table
(`{canonical config JSON: p50 µs, or null for a config that failed}`) is the ground truth. A
replay serves those latencies to the tuner's own search code (the same `Searcher`: invalid
suggestions, repeats, warm start), so strategies can be compared over many seeds in seconds:

- "random": the baseline, then uniform random configs;
- "tpe": the baseline, then joint multivariate TPE over every knob at once;
- "tpe-warm": what the tuner does: baseline, space default and warm configs, then TPE;
- "two-stage": the usual practice: TPE over the compute knobs (tiles, warps, stages) with the
  communication knobs fixed at defaults for half the budget, then TPE over the communication
  knobs with the best tiles fixed for the rest; the same total budget as the others.

`compare` runs N seeds of each and reports how many measured trials each needed to come within
`tolerance` (3%) of the table's best. `replay_pick` is what a whole tune keeps (its search, then its
final round) when every latency is read through `noisy`: two fresh tunes of one seed, each with noise
of its own, replayed (issue 34's agreement, `bench/tuner/tuner_experiments.py agreement`).

Example:
    >>> table = ReplayTable.load("bench/results/ag_gemm_8192x4096x12288.json")   # doctest: +SKIP
    >>> stats = compare(table, ["tpe", "two-stage", "random"], seeds=20, trials=64)  # doctest: +SKIP
    >>> print(format_comparison(stats))                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from jointtune.autotune.tuner.finalists import COUNT as FINAL_COUNT
from jointtune.autotune.tuner.finalists import MARGIN as FINAL_MARGIN
from jointtune.autotune.tuner.finalists import ROUNDS as FINAL_ROUNDS
from jointtune.autotune.tuner.finalists import FinalRound
from jointtune.autotune.tuner.search import Proposal, Searcher, baseline_config, enqueue, initial_configs
from jointtune.autotune.tuner.settings import TuneSettings
from jointtune.autotune.tuner.studies import ATTR_REASON, StudyState, quiet_optuna, trial_config, trial_kind
from jointtune.errors import JointtuneError, TuningError
from jointtune.search_spaces import DeviceLimits, Problem, Space, canonical_json, get_space

STRATEGIES = ("random", "tpe", "tpe-warm", "two-stage")
#: knobs of the GEMM itself; every other knob of a joint space is a communication knob
COMPUTE_PARAMS = frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"})


@dataclass
class ReplayTable:
    """Recorded latencies (µs) of one problem's configs; None marks a config that failed."""

    space: Space
    problem: Problem
    latencies: dict[str, float | None]
    limits: DeviceLimits = field(default_factory=lambda: DeviceLimits.nominal_hopper(interpreter=False))

    @property
    def best_us(self) -> float:
        values = [v for v in self.latencies.values() if v is not None]
        if not values:
            raise TuningError("replay table: no config has a latency; nothing to compare against")
        return min(values)

    def latency(self, config: Mapping[str, Any]) -> float | None:
        """The recorded latency; a config the table lacks counts as failed."""
        return self.latencies.get(canonical_json(config))

    def to_json(self) -> dict[str, Any]:
        return {
            "space": self.space.name,
            "restrict": self.space.restriction,
            **self.problem.to_json(),
            "limits": {"max_shared_mem": self.limits.max_shared_mem, "num_sms": self.limits.num_sms},
            "latencies": self.latencies,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayTable:
        for name in ("space", "shape", "dtype", "world_size", "latencies"):
            if name not in data:
                raise TuningError(f"replay table: field {name!r} is missing; it needs space, shape, dtype, "
                                  "world_size and latencies ({config json: µs or null})")  # fmt: skip
        configs = [json.loads(k) for k in data["latencies"]]
        try:
            full = get_space(data["space"])
            restrict = dict(data.get("restrict") or {})
            # a knob added after the table was measured (an `implied` param no config names) stays at what the
            # table's configs meant, so the replayed space is the one that was measured
            for p in full.params:
                if p.implied is not None and p.name not in restrict and not any(p.name in c for c in configs):
                    restrict[p.name] = [p.implied]
            space = full.restrict(restrict)
            problem = space.make_problem(dict(data["shape"]), dtype=data["dtype"], world_size=data["world_size"])
        except JointtuneError as exc:
            raise TuningError(f"replay table: {exc}") from None
        limits = DeviceLimits.nominal_hopper(interpreter=False)
        if "limits" in data:
            limits = DeviceLimits(
                max_shared_mem=int(data["limits"]["max_shared_mem"]),
                num_sms=int(data["limits"]["num_sms"]),
                compute_capability=limits.compute_capability,
            )
        latencies = {
            canonical_json(_as_today(space, c, problem, limits)): (None if v is None else float(v))
            for c, v in zip(configs, data["latencies"].values())
        }
        return cls(space, problem, latencies, limits)

    @classmethod
    def load(cls, path: str | Path) -> ReplayTable:
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def from_study(cls, study: optuna.Study, space: Space, problem: Problem, limits: DeviceLimits) -> ReplayTable:
        """The table of an (exhaustive) tuning study: each config's first measured result."""
        latencies: dict[str, float | None] = {}
        for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
            kind = trial_kind(trial)
            if kind in ("ok", "failed"):
                latencies.setdefault(canonical_json(trial_config(trial)), trial.value if kind == "ok" else None)
        return cls(space, problem, latencies, limits)


def _as_today(space: Space, config: dict[str, Any], problem: Problem, limits: DeviceLimits) -> dict[str, Any]:
    """A recorded config as today's space writes it (implied knobs filled in), or as recorded if it refuses it."""
    try:
        return space.validate(config, problem, limits)
    except JointtuneError:
        return config


#: what a replay reads a config's latency from: the table's own (`ReplayTable.latency`) or a noisy reading of it
Latency = Callable[[Mapping[str, Any]], "float | None"]


def _measure(study: optuna.Study, proposal: Proposal, latency: Latency, curve: list[float | None]) -> None:
    value = latency(proposal.config)
    proposal.trial.set_user_attr("jt_config", canonical_json(proposal.config))
    if value is None:
        proposal.trial.set_user_attr(ATTR_REASON, "error")
        study.tell(proposal.trial, state=TrialState.PRUNED)
    else:
        study.tell(proposal.trial, value)
    curve.append(value)


def _run(study: optuna.Study, searcher: Searcher, latency: Latency, budget: int, curve: list[float | None]) -> None:
    while len(curve) < budget:
        proposal = searcher.propose(study)
        if not isinstance(proposal, Proposal):
            return
        _measure(study, proposal, latency, curve)


def default_comm(table: ReplayTable, compute: frozenset[str] = COMPUTE_PARAMS) -> dict[str, Any]:
    """Communication knobs at the space default; if that leaves no compute knob to tune (say the
    default is copy engine + cuBLAS), those of the first valid config that has tiles."""
    default = table.space.default(table.problem, table.limits)
    if any(name in compute for name in default):
        return {k: v for k, v in default.items() if k not in compute}
    for config in table.space.enumerate(table.problem, table.limits):
        if any(name in compute for name in config):
            return {k: v for k, v in config.items() if k not in compute}
    return {k: v for k, v in default.items() if k not in compute}


def replay(
    table: ReplayTable,
    strategy: str,
    *,
    trials: int,
    seed: int = 0,
    warm: Sequence[Mapping[str, Any]] = (),
    compute: frozenset[str] = COMPUTE_PARAMS,
) -> list[float | None]:
    """Latency (None = failed) of every config a strategy measures, in order, up to `trials`."""
    return _replay(table, strategy, trials=trials, seed=seed, warm=warm, compute=compute, latency=table.latency)[1]


def noisy(table: ReplayTable, sigma: float, rng: random.Random) -> Latency:
    """The table's latencies as a GPU reads them: each reading off by a normal relative error of `sigma`."""

    def latency(config: Mapping[str, Any]) -> float | None:
        value = table.latency(config)
        return None if value is None else value * (1.0 + rng.gauss(0.0, sigma))

    return latency


def replay_pick(
    table: ReplayTable, *, trials: int, seed: int, latency: Latency, final_rounds: int = FINAL_ROUNDS
) -> str | None:
    """The config (canonical JSON) a tune keeps when `latency` times it: the tuner's start and search ("tpe-warm"),
    then its final round (`finalists`; none with `final_rounds` 0) timed with the same `latency`. None when no
    config ran. What two fresh tunes of one seed pick under noise: the agreement check, replayed."""
    study, _ = _replay(table, "tpe-warm", trials=trials, seed=seed, warm=(), compute=COMPUTE_PARAMS, latency=latency)
    state = StudyState.of(study.get_trials(deepcopy=False))
    if final_rounds:
        chosen = state.finalists(margin=FINAL_MARGIN, count=FINAL_COUNT)
        final = FinalRound.run(chosen, lambda c: _three(latency(c)), counted=state.trial_count, rounds=final_rounds)
        if final is not None and final.pick is not None:
            return final.pick
    return None if state.best is None else canonical_json(trial_config(state.best))


def _three(value: float | None) -> tuple[float, float, float] | None:
    return None if value is None else (value, value, value)


def _replay(
    table: ReplayTable,
    strategy: str,
    *,
    trials: int,
    seed: int,
    warm: Sequence[Mapping[str, Any]],
    compute: frozenset[str],
    latency: Latency,
) -> tuple[optuna.Study, list[float | None]]:
    if strategy not in STRATEGIES:
        raise TuningError(f"strategy: {strategy!r} is not allowed for replay; allowed: {', '.join(STRATEGIES)}")
    settings = TuneSettings(trials=trials, seed=seed, strategy="random" if strategy == "random" else "tpe")
    curve: list[float | None] = []
    with quiet_optuna():
        study = optuna.create_study(direction="minimize")
    space, problem, limits = table.space, table.problem, table.limits
    if strategy == "tpe-warm":
        enqueue(study, initial_configs(space, problem, limits, warm=warm))
    else:
        enqueue(study, [("baseline", baseline_config(space, problem, limits))])
    if strategy != "two-stage":
        _run(study, Searcher(space, problem, limits, settings), latency, trials, curve)
        return study, curve
    comm = default_comm(table, compute)
    _run(study, Searcher(space, problem, limits, settings), latency, 1, curve)  # the baseline
    stage1 = Searcher(space, problem, limits, settings, fixed=comm)
    _run(study, stage1, latency, 1 + (trials - 1) // 2, curve)
    best = min(
        (t for t in study.get_trials(deepcopy=False) if trial_kind(t) == "ok" and t.value is not None),
        key=lambda t: t.value,  # type: ignore[arg-type, return-value]
        default=None,
    )
    tiles = {k: v for k, v in trial_config(best).items() if k in compute} if best is not None else {}
    stage2 = Searcher(space, problem, limits, settings, fixed=tiles)
    _run(study, stage2, latency, trials, curve)
    return study, curve


def trials_to_target(curve: Sequence[float | None], target_us: float) -> int | None:
    """1-based index of the first measured trial at or below `target_us` (None if never)."""
    for i, value in enumerate(curve, start=1):
        if value is not None and value <= target_us:
            return i
    return None


@dataclass(frozen=True)
class StrategyStats:
    """How one strategy did over seeds: trials needed per seed (None = missed the target)."""

    strategy: str
    needed: tuple[int | None, ...]
    final_gap: tuple[float, ...]

    @property
    def success_rate(self) -> float:
        return sum(n is not None for n in self.needed) / len(self.needed)

    @property
    def median_needed(self) -> float | None:
        """Median over seeds, a miss counting as infinitely many (None when the median is a miss)."""
        median = statistics.median(n if n is not None else float("inf") for n in self.needed)
        return None if median == float("inf") else median

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "needed": list(self.needed),
            "success_rate": self.success_rate,
            "median_needed": self.median_needed,
            "mean_final_gap": statistics.fmean(self.final_gap),
        }


def compare(
    table: ReplayTable,
    strategies: Sequence[str] = STRATEGIES,
    *,
    seeds: int = 10,
    trials: int = 64,
    tolerance: float = 0.03,
    warm: Sequence[Mapping[str, Any]] = (),
    compute: frozenset[str] = COMPUTE_PARAMS,
) -> dict[str, StrategyStats]:
    """Run `seeds` replays of each strategy with `trials` each; trials needed to get within
    `tolerance` of the table's best, and the final gap to it."""
    best = table.best_us
    target = best * (1 + tolerance)
    out = {}
    for strategy in strategies:
        needed, gaps = [], []
        for seed in range(seeds):
            curve = replay(table, strategy, trials=trials, seed=seed, warm=warm, compute=compute)
            needed.append(trials_to_target(curve, target))
            found = min((v for v in curve if v is not None), default=float("inf"))
            gaps.append(found / best - 1)
        out[strategy] = StrategyStats(strategy, tuple(needed), tuple(gaps))
    return out


def format_comparison(stats: Mapping[str, StrategyStats]) -> str:
    """A plain-text table (strategy, hit rate, median trials to target, mean final gap)."""
    lines = [f"{'strategy':<10} {'hit rate':>8} {'median trials':>13} {'mean gap':>9}"]
    for s in stats.values():
        median = "-" if s.median_needed is None else f"{s.median_needed:g}"
        gap = statistics.fmean(s.final_gap)
        lines.append(f"{s.strategy:<10} {s.success_rate:>8.0%} {median:>13} {gap:>9.1%}")
    return "\n".join(lines)
