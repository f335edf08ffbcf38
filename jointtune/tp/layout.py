"""Which tensor-parallel layout a step runs in, chosen per token count from measurements.

The two layouts (`linear.py`) move different bytes: per layer, the standard layout all-reduces T x hidden twice;
the sequence-parallel one all-gathers and reduce-scatters T x hidden twice each, inside the fused GEMMs. At
decode sizes the all-reduce is cheaper and nothing is left to overlap (4 GPUs, 64 rows: 21.9 against 31.2 us in a
CUDA graph, ANCHORS.md); from about a thousand tokens the fused ops hide their transfer behind the GEMM and the
sequence-parallel layout wins. Where exactly the crossover lies depends on the GPUs, the model and the tuned
configs, so the rule is data:

- `LayoutRule.from_measurements({T: {"sp": us, "standard": us}})`: for a token count, the layout that was faster
  at the nearest measured count (log2 distance, ties to the smaller count). `measure_layouts` produces the
  table by timing whole steps of both layouts on the ranks (the slowest rank's time counts); the end-to-end
  benchmark writes it, and `save`/`load` keep it beside the tuned bundle. Timing the whole step, not the fused
  ops alone, counts what both layouts share (attention, norms) as the same and what differs as it runs.
- Without measurements: `sp` from `sp_from` tokens (1024), `standard` below.
- Always `standard` for a token count that does not divide by the world size (the fused ops split rows evenly;
  padding would cost up to W - 1 rows of every GEMM where the standard layout costs nothing extra), and at one rank.

Example:
    >>> measured = {8: {"sp": 90.0, "standard": 70.0}, 4096: {"sp": 900.0, "standard": 1100.0}}   # µs per step
    >>> rule = LayoutRule.from_measurements(measured)
    >>> [rule.choose(t, 2) for t in (1, 8, 32, 2048, 4096)]
    ['standard', 'standard', 'standard', 'sp', 'sp']
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from jointtune.errors import JointtuneError
from jointtune.tp.linear import SP, STANDARD

DEFAULT_SP_FROM = 1024


class LayoutRuleError(JointtuneError, ValueError):
    """A layout table or rule file that can't be used (names the entry)."""


@dataclass(frozen=True)
class LayoutRule:
    """Token count -> layout (see the module docstring). `measured`: (tokens, sp µs, standard µs), by tokens."""

    sp_from: int = DEFAULT_SP_FROM
    measured: tuple[tuple[int, float, float], ...] = ()

    def choose(self, tokens: int, world_size: int) -> str:
        return self.explain(tokens, world_size)[0]

    def explain(self, tokens: int, world_size: int) -> tuple[str, str]:
        """(layout, why) for a step of `tokens` tokens at `world_size` ranks."""
        if world_size == 1:
            return STANDARD, "one rank: nothing to communicate"
        if tokens % world_size:
            return STANDARD, f"{tokens} tokens do not divide by {world_size} ranks"
        if not self.measured:
            layout = SP if tokens >= self.sp_from else STANDARD
            return layout, f"no measurements: sp from {self.sp_from} tokens"
        near = min(self.measured, key=lambda m: (abs(math.log2(m[0]) - math.log2(tokens)), m[0]))
        layout = SP if near[1] < near[2] else STANDARD
        return layout, f"measured at {near[0]} tokens: sp {near[1]:.1f} us, standard {near[2]:.1f} us"

    @classmethod
    def from_measurements(cls, table: Mapping[int, Mapping[str, float]], *,
                          sp_from: int = DEFAULT_SP_FROM) -> LayoutRule:  # fmt: skip
        """From {tokens: {"sp": µs, "standard": µs}}; entries without both layouts are left out (a token count that
        does not divide by the world size has no sp time, and always runs standard)."""
        rows = []
        for tokens, times in table.items():
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise LayoutRuleError(f"tokens: {tokens!r} is not allowed; give an integer >= 1")
            if not isinstance(times, Mapping):
                raise LayoutRuleError(f"tokens {tokens}: {times!r} is not a mapping of layout -> µs")
            unknown = set(times) - {SP, STANDARD}
            if unknown:
                name = sorted(unknown)[0]
                raise LayoutRuleError(f"tokens {tokens}: layout {name!r} is not allowed; allowed: sp, standard")
            for layout, us in times.items():
                if isinstance(us, bool) or not isinstance(us, (int, float)) or not math.isfinite(us) or us <= 0:
                    raise LayoutRuleError(f"tokens {tokens}: {layout}: {us!r} is not allowed; give a time > 0 in µs")
            if SP in times and STANDARD in times:
                rows.append((tokens, float(times[SP]), float(times[STANDARD])))
        return cls(sp_from=sp_from, measured=tuple(sorted(rows)))

    def to_json(self) -> dict[str, Any]:
        return {"sp_from": self.sp_from,
                "measured": {str(t): {SP: sp, STANDARD: std} for t, sp, std in self.measured}}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayoutRule:
        sp_from = data.get("sp_from", DEFAULT_SP_FROM)
        if isinstance(sp_from, bool) or not isinstance(sp_from, int) or sp_from < 1:
            raise LayoutRuleError(f"sp_from: {sp_from!r} is not allowed; give an integer >= 1")
        table = data.get("measured", {})
        try:
            parsed = {int(t): v for t, v in table.items()}
        except (AttributeError, ValueError):
            raise LayoutRuleError("measured: must map token counts to {sp: µs, standard: µs}") from None
        return cls.from_measurements(parsed, sp_from=sp_from)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LayoutRule:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise LayoutRuleError(f"layout rule: {str(path)!r} can't be read ({exc})") from None


def measure_layouts(step: Callable[[str, int], Any], tokens: Sequence[int], world: Any, *, warmup: int = 2,
                    iters: int = 5) -> dict[int, dict[str, float]]:  # fmt: skip
    """{T: {layout: µs}}: the median time of `step(layout, T)` (one whole step, e.g. a CUDA graph replay of it) per
    token count and layout, the slowest rank's where ranks run apart (every rank must call this alike). A token
    count that does not divide by the world size is timed in the standard layout only."""
    table: dict[int, dict[str, float]] = {}
    for T in tokens:
        layouts = (SP, STANDARD) if T % world.world_size == 0 and world.world_size > 1 else (STANDARD,)
        table[T] = {layout: _time(step, layout, T, world, warmup, iters) for layout in layouts}
    return table


def _time(step: Callable[[str, int], Any], layout: str, T: int, world: Any, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step(layout, T)
    samples = []
    for _ in range(iters):
        world.synchronize()
        start = time.perf_counter()
        step(layout, T)
        world.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    us = statistics.median(samples)
    if world.kind != "local" and world.world_size > 1:
        import torch.distributed as dist

        worst = torch.tensor([us], dtype=torch.float64, device=world.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=world.group)
        us = float(worst.item())
    return us
