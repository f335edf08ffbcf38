"""The valid config nearest to a wanted one: how a proposal the space would refuse becomes one it takes.

A sampler proposes each param on its own, so its proposal can break a constraint that links params (a tile too
big for shared memory with that many stages) or a rule of the problem (heads_per_program must divide the GQA
group). Instead of refusing it, we move it to the valid config closest to it, mode first:

- the valid configs are the enumeration's branches (`_enumerate._Plan`: one per assignment of the params that
  conditions read, such as `mode`), each a product of independent components of valid partial configs;
- the distance to the wanted config counts a different `mode` as far worse than anything else, another
  sub-mode (`ce_consumer`, `push_by`, ...) as worse than any tile, then per param the steps between the two
  values in its ordered choices (one step for a different categorical value; a wanted number that is not a
  choice, as a narrowed space's, is placed among them); a param the wanted config does not name, or names
  with a value of no use, costs nothing whatever its value;
- ties are broken by a seeded `random.Random`, so the answer is reproducible, and uniform among the tied
  configs (with nothing wanted beyond `mode`, a uniform draw of that mode's valid configs).

Values fixed by the caller (`pinned`) are kept as given (the enumeration's `where`). Branch plans are cached per
(problem, device, pinned values) on the space (`_enumerate.valid_branches`).

Example:
    >>> from jointtune.search_spaces import DeviceLimits, get_space
    >>> space, limits = get_space("flash_decode"), DeviceLimits.nominal_hopper()
    >>> problem = space.make_problem("1x64x8x32768x128", world_size=2)
    >>> wanted = dict(space.default(problem, limits), heads_per_program=7)   # 7 does not divide G = 8
    >>> space.nearest_valid(wanted, problem, limits)["heads_per_program"]
    8
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from jointtune.search_spaces._enumerate import Branch, Partial
from jointtune.search_spaces._params import Param, Value

if TYPE_CHECKING:
    from jointtune.search_spaces._space import Space

#: cost of another `mode` than the wanted one: more than any other difference can add up to
MODE_COST = 1_000_000
#: cost of another value of a param that a condition reads (a sub-mode): more than any tile difference
STRUCTURAL_COST = 1_000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_ordered(p: Param) -> bool:
    """Whether a param's choices are numbers with an order (a step between them means something)."""
    return p.kind != "categorical" and all(_is_int(c) for c in p.choices)


def _steps(choices: Sequence[Value], choice: Value, wanted: Value, ordered: bool) -> int:
    """How far `choice` is from `wanted`: 0 or 1 for unordered values; for ordered ones 1 (if they differ) plus
    the choices strictly between them, which is the distance of their positions when `wanted` is a choice."""
    if type(choice) is type(wanted) and choice == wanted:
        return 0
    if not ordered:
        return 1
    low, high = sorted((int(choice), int(wanted)))
    return 1 + sum(1 for c in choices if low < int(c) < high)


class _Scorer:
    """Per-param cost of each choice against the wanted config."""

    def __init__(self, space: Space, wanted: Mapping[str, Value]) -> None:
        self.costs: dict[str, dict[tuple[type, Value], int]] = {}
        for p in space.params:
            if p.name not in wanted:
                continue
            value = p.canonical(wanted[p.name])
            if value is None and is_ordered(p) and _is_int(wanted[p.name]):
                value = int(wanted[p.name])  # not a choice (a narrowed space's): stay near it all the same
            if value is None:  # nothing to stay near
                continue
            if p.name == "mode":
                weight, ordered = MODE_COST, False
            elif p.name in space.structural:
                weight, ordered = STRUCTURAL_COST, False
            else:
                weight, ordered = 1, is_ordered(p)
            self.costs[p.name] = {(type(c), c): weight * _steps(p.choices, c, value, ordered) for c in p.choices}

    def cost(self, partial: Mapping[str, Value]) -> int:
        total = 0
        for name, value in partial.items():
            table = self.costs.get(name)
            if table is not None:
                total += table[(type(value), value)]
        return total

    def closest(self, partials: Sequence[Partial]) -> tuple[int, list[Partial]]:
        """(lowest cost, the partials that have it) among `partials` (non-empty)."""
        names = [n for n in partials[0] if n in self.costs]
        if not names:
            return 0, list(partials)
        best, tied = None, []
        for partial in partials:
            cost = sum(self.costs[n][(type(partial[n]), partial[n])] for n in names)
            if best is None or cost < best:
                best, tied = cost, [partial]
            elif cost == best:
                tied.append(partial)
        assert best is not None
        return best, tied


def nearest(
    space: Space, found: list[Branch], wanted: Mapping[str, Value], rng: random.Random
) -> dict[str, Value] | None:
    """The valid config of `found` nearest to `wanted` (module docstring), or None when there is none."""
    if not found:
        return None
    scorer = _Scorer(space, wanted)
    scored = []
    for assign, components in found:
        picks = [scorer.closest(parts) for parts in components]
        scored.append((scorer.cost(assign) + sum(cost for cost, _ in picks), assign, picks))
    low = min(cost for cost, _, _ in scored)
    _, assign, picks = rng.choice([entry for entry in scored if entry[0] == low])
    merged: dict[str, Value] = dict(assign)
    for _, tied in picks:
        merged.update(rng.choice(tied))
    order = {p.name: i for i, p in enumerate(space.params)}
    return {name: merged[name] for name in sorted(merged, key=order.__getitem__)}
