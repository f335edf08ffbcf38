"""Enumerating and counting a space's valid configs without building the cross product.

First branch on the structural params (those conditions read, e.g. `mode`, `ce_consumer`); each
branch fixes which other params are active. Those split into components that no constraint links
(e.g. tiles | comm_sms | chunk_m), each solved by backtracking that checks a constraint as soon
as its last field is set. A branch's count is the product of its components' sizes; enumeration
is their product. Components are cached per call, so the tiles are solved once, not per mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from jointtune.search_spaces._params import Constraint, Context, Value

if TYPE_CHECKING:
    from jointtune.search_spaces._space import Space

Partial = dict[str, Value]
#: a structural assignment and its components' valid partial configs (every component non-empty)
Branch = tuple[Partial, list[list[Partial]]]


class _Plan:
    def __init__(self, space: Space, ctx: Context, where: Mapping[str, Value]) -> None:
        self.space, self.ctx, self.where = space, ctx, where
        self.structural = [p for p in space.params if p.name in space.structural]
        self.others = [p for p in space.params if p.name not in space.structural]
        self.order = {p.name: i for i, p in enumerate(space.params)}
        self.cache: dict[tuple, list[Partial]] = {}

    def choices(self, name: str) -> tuple[Value, ...]:
        if name in self.where:
            return (self.where[name],)
        return self.space.param(name).choices

    def branches(self) -> Iterator[tuple[Partial, list[list[Partial]]]]:
        """(structural assignment, its components' valid partial configs) for every branch."""
        for assign in self._assign(0, {}):
            components = self._components(assign)
            if components is not None:
                yield assign, components

    def _assign(self, i: int, assign: Partial) -> Iterator[Partial]:
        if i == len(self.structural):
            if all(self._holds(c, assign) for c in self.space.constraints if set(c.fields) <= set(assign)):
                yield dict(assign)
            return
        p = self.structural[i]
        if p.when is not None and not p.when.holds(assign):
            if p.name not in self.where:  # a filter on an inactive field matches nothing
                yield from self._assign(i + 1, assign)
            return
        for value in self.choices(p.name):
            assign[p.name] = value
            yield from self._assign(i + 1, assign)
            del assign[p.name]

    def _holds(self, c: Constraint, config: Mapping[str, Value]) -> bool:
        return c.check(config, self.ctx) is None

    def _components(self, assign: Partial) -> list[list[Partial]] | None:
        active = [p.name for p in self.others if p.when is None or p.when.holds(assign)]
        if any(name not in assign and name not in active for name in self.where):
            return None
        present = set(assign) | set(active)
        rules = [c for c in self.space.constraints if set(c.fields) <= present and not set(c.fields) <= set(assign)]
        parent = {name: name for name in active}

        def root(name: str) -> str:
            while parent[name] != name:
                name = parent[name]
            return name

        for c in rules:
            linked = [f for f in c.fields if f in parent]
            for f in linked[1:]:
                parent[root(f)] = root(linked[0])
        groups: dict[str, list[str]] = {}
        for name in active:
            groups.setdefault(root(name), []).append(name)
        return [self._solve(names, rules, assign) for names in groups.values()]

    def _solve(self, names: list[str], rules: list[Constraint], assign: Partial) -> list[Partial]:
        mine = [c for c in rules if any(f in names for f in c.fields)]
        fixed = tuple(sorted((f, assign[f]) for c in mine for f in c.fields if f in assign))
        key = (tuple(names), fixed, tuple(c.name for c in mine))
        if key in self.cache:
            return self.cache[key]
        # check each rule right after the last of its component fields is set
        checks: list[list[Constraint]] = [[] for _ in names]
        for c in mine:
            checks[max(names.index(f) for f in c.fields if f in names)].append(c)
        config: Partial = dict(fixed)
        found: list[Partial] = []

        def walk(i: int) -> None:
            if i == len(names):
                found.append({n: config[n] for n in names})
                return
            for value in self.choices(names[i]):
                config[names[i]] = value
                if all(c.check(config, self.ctx) is None for c in checks[i]):
                    walk(i + 1)
            config.pop(names[i], None)

        walk(0)
        self.cache[key] = found
        return found


def count_configs(space: Space, ctx: Context, where: Mapping[str, Value]) -> int:
    total = 0
    for _, components in _Plan(space, ctx, where).branches():
        n = 1
        for parts in components:
            n *= len(parts)
        total += n
    return total


def iter_configs(space: Space, ctx: Context, where: Mapping[str, Value]) -> Iterator[Partial]:
    plan = _Plan(space, ctx, where)
    for assign, components in plan.branches():
        for combo in itertools.product(*components):
            merged = dict(assign)
            for part in combo:
                merged.update(part)
            yield {name: merged[name] for name in sorted(merged, key=plan.order.__getitem__)}


def valid_branches(space: Space, ctx: Context, where: Mapping[str, Value]) -> list[Branch]:
    """The branches that hold valid configs, in enumeration order; cached on the space per (context, `where`), so
    the tuner's many questions about one problem (nearest valid config, the config at an index) solve it once."""
    key = (tuple(sorted(ctx.items())), tuple(sorted(where.items())))
    found = space._plans.get(key)
    if found is None:
        found = [(assign, comps) for assign, comps in _Plan(space, ctx, where).branches() if all(comps)]
        if len(space._plans) > 64:
            space._plans.clear()
        space._plans[key] = found
    return found


def config_at(space: Space, ctx: Context, where: Mapping[str, Value], index: int) -> Partial | None:
    """The config `iter_configs` yields at `index` (None past the end), found without walking to it: the branch
    by its count, then each component's part by mixed radix, the last component varying fastest."""
    order = {p.name: i for i, p in enumerate(space.params)}
    for assign, components in valid_branches(space, ctx, where):
        size = 1
        for parts in components:
            size *= len(parts)
        if index >= size:
            index -= size
            continue
        merged = dict(assign)
        picks = []
        for parts in reversed(components):
            index, at = divmod(index, len(parts))
            picks.append(parts[at])
        for part in reversed(picks):
            merged.update(part)
        return {name: merged[name] for name in sorted(merged, key=order.__getitem__)}
    return None
