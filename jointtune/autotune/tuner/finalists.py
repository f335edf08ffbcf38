"""A study's final round: its closest configs timed again side by side, so noise between trials doesn't pick.

A study times each config once, at its own moment; two configs within a few percent of each other can swap places
between two fresh tunes by noise alone (clocks, the neighbours on the node, a drift over the study). Measured on
4x H100: AG+GEMM 256x14336x4096 at W=2, two fresh tunes with the same seed stored push_cublas and the baseline at
46.5 µs each, and re-timed side by side the two took 45.3 and 47.4 µs. So once a study has no trial left, its
finalists (the configs within `MARGIN` of its fastest, at most `COUNT`) are timed again in `ROUNDS` rounds, each
round every finalist once in a rotated order, so a drift hits every one alike; the pick is the lowest median. The
round is noted on the study (`STUDY_FINAL`) and holds as long as the study's trial count does, so a resumed study
with a larger budget judges again (`studies.StudyState`, which reads the round back).

Example:
    >>> chosen = state.finalists(margin=MARGIN, count=COUNT)                      # doctest: +SKIP
    >>> final = FinalRound.run(chosen, measure, counted=state.trial_count)        # doctest: +SKIP
    >>> study.set_user_attr(STUDY_FINAL, final.to_json())                         # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COUNT", "MARGIN", "ROUNDS", "FinalRound"]

#: a config joins the final round within this fraction of the study's fastest (3%: the tuner's target tolerance)
MARGIN = 0.03
#: at most this many finalists, fastest first
COUNT = 4
#: rounds of the final, each timing every finalist once
ROUNDS = 5

#: what the final round times one config with: (p10, p50, p90) in µs, or None when the config failed this time
Measure = Callable[[dict[str, Any]], "tuple[float, float, float] | None"]


@dataclass
class FinalRound:
    """The finalists' timings, round by round, and the pick (a canonical config JSON, as trials note it)."""

    counted: int
    configs: list[str]
    p50: dict[str, list[float]] = field(default_factory=dict)
    p10: dict[str, list[float]] = field(default_factory=dict)
    p90: dict[str, list[float]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    pick: str | None = None

    @classmethod
    def run(cls, chosen: Sequence[str], measure: Measure, *, counted: int, rounds: int = ROUNDS) -> FinalRound | None:
        """Time the finalists `chosen` (canonical config JSON, fastest trial first: `StudyState.finalists`) of a study
        with `counted` trials in rotated rounds; None with fewer than two. A finalist that fails in the round (it ran
        in its trial) leaves the round, and its failure is noted."""
        chosen = list(chosen)
        if len(chosen) < 2:
            return None
        final = cls(counted=counted, configs=chosen)
        for r in range(rounds):
            for i in range(len(chosen)):
                key = chosen[(i + r) % len(chosen)]
                if key in final.failed:
                    continue
                result = measure(json.loads(key))
                if result is None:
                    final.failed.append(key)
                    continue
                for name, value in zip(("p10", "p50", "p90"), result, strict=True):
                    getattr(final, name).setdefault(key, []).append(float(value))
        final.pick = final._decide()
        return final

    def _decide(self) -> str | None:
        timed = [k for k in self.configs if k not in self.failed and self.p50.get(k)]
        return min(timed, key=lambda k: (self.median(k), self.configs.index(k))) if timed else None

    def median(self, key: str, name: str = "p50") -> float:
        return statistics.median(getattr(self, name)[key])

    def to_json(self) -> dict[str, Any]:
        return {"counted": self.counted, "configs": self.configs, "p10": self.p10, "p50": self.p50, "p90": self.p90,
                "failed": self.failed, "pick": self.pick}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FinalRound | None:
        """The round a study noted, or None for anything else (an attr written by hand, an older form)."""
        try:
            final = cls(
                counted=int(data["counted"]),
                configs=[str(k) for k in data["configs"]],
                p10={str(k): [float(x) for x in v] for k, v in data["p10"].items()},
                p50={str(k): [float(x) for x in v] for k, v in data["p50"].items()},
                p90={str(k): [float(x) for x in v] for k, v in data["p90"].items()},
                failed=[str(k) for k in data.get("failed", [])],
                pick=data.get("pick"),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return final if final.pick in final.p50 else None

    def summary(self) -> str:
        """The round in one clause for a tune's summary line, e.g. `re-timed 3 finalists side by side in 5 rounds:
        pick 45.3 µs (next 47.4 µs)`."""
        assert self.pick is not None
        others = sorted(self.median(k) for k in self.p50 if k != self.pick)
        n = len(self.configs)
        rounds = max(len(v) for v in self.p50.values())
        text = f"re-timed {n} finalists side by side in {rounds} rounds: pick {self.median(self.pick):,.1f} µs"
        return text + (f" (next {others[0]:,.1f} µs)" if others else "")
