"""`Space`: one kernel family's joint search space over compute tiles and communication knobs.

A space is data (params with conditions, constraints with their rules as text) plus three small
functions (problem check, derived numbers, default). Everything a tuner, a store or a user needs
goes through it: Optuna suggestions, enumeration and counts, validation with messages that name
the field, canonical JSON and hashes for configs, and a version that changes when the space does.

Example:
    >>> from jointtune.search_spaces import get_space, DeviceLimits
    >>> space = get_space("ag_gemm")
    >>> problem = space.make_problem("8192x4096x12288", dtype="bf16", world_size=2)
    >>> space.validate({"mode": "baseline"}, problem, DeviceLimits.nominal_hopper())
    {'mode': 'baseline', 'collective': 'nccl'}
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jointtune.errors import SpaceError
from jointtune.search_spaces._collectives import collective_mask
from jointtune.search_spaces._config import canonical_json, config_hash
from jointtune.search_spaces._enumerate import config_at, count_configs, iter_configs, valid_branches
from jointtune.search_spaces._nearest import is_ordered, nearest
from jointtune.search_spaces._params import (
    Condition,
    Constraint,
    Context,
    Param,
    Value,
    format_choices,
    format_value,
)
from jointtune.search_spaces._problem import DTYPE_BYTES, DeviceLimits, Problem
from jointtune.search_spaces._shape import example_shape, parse_shape

if TYPE_CHECKING:
    import optuna

    from jointtune.search_spaces._sampler import ValidSampler


def _setting(p: Param, config: Mapping[str, Value]) -> str:
    """The values of the fields `p`'s condition reads, as the config has them: 'mode="push"'."""
    assert p.when is not None
    parts = [f"{f}={format_value(config[f])}" for f in p.when.fields if f in config]
    return ", ".join(parts) or "none of " + ", ".join(p.when.fields)


def _kind_mismatch(value: Any, choices: Sequence[Value]) -> str:
    """ " (of type bool, not int)" where `value` equals a choice of another type (True and 1, numpy's 32 and 32),
    so the message says why a value that reads like a choice is refused; else ""."""
    for choice in choices:
        try:
            equal = bool(choice == value)
        except Exception:  # a value whose == fails or is ambiguous is no choice either
            return ""
        if equal and type(choice) is not type(value):
            return f" (of type {type(value).__name__}, not {type(choice).__name__})"
    return ""


class Space:
    """Params, conditions and constraints of one family; see the module docstring for an example.

    `derive(problem)` adds numbers the constraints read (e.g. rows per rank `R`); `check_problem`
    rejects shapes the family can't run; `default(ctx)` gives a config valid for every problem;
    `seeds(ctx)` names a few configs worth a tuner's first trials in this regime (those the problem
    allows are tried after the default; they change no record's meaning, so not the version); `starts(ctx)`
    one reasonable config per mode, from which `mode_starts` covers every mode the seeds and default miss.
    Bump `revision` whenever constraint code or the default changes meaning.
    """

    def __init__(
        self,
        name: str,
        *,
        dims: Sequence[str],
        params: Sequence[Param],
        constraints: Sequence[Constraint] = (),
        revision: int,
        default: Callable[[Context], dict[str, Value]],
        derive: Callable[[Problem], dict[str, int]] | None = None,
        check_problem: Callable[[Problem], None] | None = None,
        doc: str = "",
        nondeterministic: Sequence[str] = (),
        dtypes: Sequence[str] = tuple(DTYPE_BYTES),
        seeds: Callable[[Context], Sequence[Mapping[str, Value]]] | None = None,
        starts: Callable[[Context], Sequence[Mapping[str, Value]]] | None = None,
        example: Sequence[int] | None = None,
        stored: Callable[[Problem], Problem] | None = None,
    ) -> None:
        self.name = name
        self._stored = stored
        self._example = tuple(example) if example else None
        #: a real shape in `dims` order, as messages show how to write one (default: 4096x8192x...)
        self.example = "x".join(map(str, self._example)) if self._example else example_shape(len(dims))
        self._seeds = seeds
        self._starts = starts
        #: element types the family's kernels run (a problem of another dtype is refused before any trial)
        self.dtypes = tuple(dtypes)
        #: modes whose results may differ in the last bits between identical calls (atomic reductions):
        #: tuners and the decorator offer them only where the caller allows it
        self.nondeterministic = tuple(nondeterministic)
        self.dims = tuple(dims)
        self.params = tuple(params)
        self.constraints = tuple(constraints)
        self.revision = revision
        self.doc = doc
        self._default = default
        self._derive = derive
        self._check_problem = check_problem
        self._by_name: dict[str, Param] = {}
        #: the full space this one narrows (`restrict`), or None
        self.restricted_from: Space | None = None
        #: {param: allowed values} that narrowed the registered space to this one ({} for a full space)
        self.restriction: dict[str, list[Value]] = {}
        self._contexts: dict[tuple[Problem, DeviceLimits], dict[str, int]] = {}
        #: valid branches per (context, pinned values): `_enumerate.valid_branches`, for `nearest_valid`, `config_at`
        self._plans: dict[tuple, list] = {}
        self._check_definition()
        #: params that conditions read: enumeration branches on them before the rest
        self.structural = frozenset(f for p in self.params if p.when for f in p.when.fields)
        blob = json.dumps(self._definition(), sort_keys=True, separators=(",", ":"))
        self.version = hashlib.sha256(blob.encode()).hexdigest()[:12]

    def _check_definition(self) -> None:
        for p in self.params:
            if p.name in self._by_name:
                raise SpaceError(f"{self.name}: param {p.name!r} is defined twice")
            for clause in p.when.clauses if p.when else ():
                for field, values in clause:
                    if field not in self._by_name:
                        raise SpaceError(f"{self.name}.{p.name}: condition reads {field!r}, not an earlier param")
                    bad = [v for v in values if self._by_name[field].canonical(v) is None]
                    if bad:
                        raise SpaceError(f"{self.name}.{p.name}: condition value {bad[0]!r} is not a choice of {field}")
            self._by_name[p.name] = p
        names = set()
        for c in self.constraints:
            unknown = [f for f in c.fields if f not in self._by_name]
            if unknown or c.name in names:
                raise SpaceError(f"{self.name}: constraint {c.name!r} is duplicated or reads unknown {unknown}")
            names.add(c.name)

    def _definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "revision": self.revision,
            "dims": list(self.dims),
            "params": [p.to_json() for p in self.params],
            "constraints": [c.to_json() for c in self.constraints],
        }

    def to_json(self) -> dict[str, Any]:
        """The definition as JSON (what `jointtune spaces show` prints), with docs and version."""
        data = self._definition()
        for entry, p in zip(data["params"], self.params, strict=True):
            entry["doc"] = p.doc
        return {"name": self.name, "version": self.version, "doc": self.doc, "dtypes": list(self.dtypes), **data}

    def __repr__(self) -> str:
        return f"Space({self.name!r}, version={self.version!r}, params={len(self.params)})"

    # ---- params -------------------------------------------------------------------------------
    def param(self, name: str) -> Param:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpaceError(
                f"{name}: unknown field for space {self.name!r}; allowed fields: {', '.join(self._by_name)}"
            ) from None

    @property
    def modes(self) -> tuple[Value, ...]:
        """The choices of `mode` (empty if the space has no `mode` param)."""
        return self._by_name["mode"].choices if "mode" in self._by_name else ()

    # ---- sub-spaces ---------------------------------------------------------------------------
    def restrict(self, choices: Mapping[str, Sequence[Any]]) -> Space:
        """This space with some params narrowed to a subset of their choices (one value pins it).

        Why: ground-truth (exhaustive) studies need a joint space small enough to measure every
        config, and staged tuning pins one group of knobs while searching the other. Values keep
        the param's order; conditions drop values no longer allowed, and a param whose condition
        can no longer hold leaves the space (so do constraints that read it). The result has the
        same name but its own version, so its studies never mix with the full space's.
        """
        if not choices:
            return self
        allowed: dict[str, tuple[Value, ...]] = {}
        for name, values in choices.items():
            if name not in self._by_name:
                raise SpaceError(
                    f"restrict.{name}: unknown field for space {self.name!r}; allowed: {', '.join(self._by_name)}"
                )
            p = self._by_name[name]
            if values is None or isinstance(values, Mapping):
                raise SpaceError(f"restrict.{name}: {values!r} is not allowed; give a value or a list of values")
            given = [values] if isinstance(values, (str, int, bool, float)) else list(values)
            picked = set()
            for value in given:
                canonical = p.canonical(value)
                if canonical is None:
                    raise SpaceError(f"restrict.{name}: {value!r} is not allowed; allowed: {format_choices(p.choices)}")
                picked.add((type(canonical), canonical))
            if not picked:
                raise SpaceError(f"restrict.{name}: no values given; allowed: {format_choices(p.choices)}")
            allowed[name] = tuple(c for c in p.choices if (type(c), c) in picked)
        params: list[Param] = []
        kept: dict[str, tuple[Value, ...]] = {}
        for p in self.params:
            when = _narrow(p.when, kept) if p.when else None
            if p.when is not None and when is None:
                continue  # its condition can never hold any more
            kept[p.name] = allowed.get(p.name, p.choices)
            implied = p.implied if p.implied is not None and p.implied in kept[p.name] else None
            params.append(Param(p.name, kept[p.name], when, p.kind, p.doc, implied))
        gone = [name for name in allowed if name not in kept]
        if gone:
            p = self._by_name[gone[0]]
            assert p.when is not None
            raise SpaceError(
                f"restrict.{gone[0]}: it only exists when {p.when.describe()}, which the restriction excludes; "
                f"drop it or allow those values"
            )
        sub = Space(
            self.name,
            dims=self.dims,
            params=params,
            constraints=[c for c in self.constraints if set(c.fields) <= set(kept)],
            revision=self.revision,
            default=self._default,
            derive=self._derive,
            check_problem=self._check_problem,
            doc=self.doc,
            nondeterministic=[m for m in self.nondeterministic if m in kept.get("mode", ())],
            dtypes=self.dtypes,
            seeds=self._seeds,
            starts=self._starts,
            example=self._example,
            stored=self._stored,
        )
        sub.restricted_from = self
        sub.restriction = {**self.restriction, **{name: list(values) for name, values in allowed.items()}}
        return sub

    # ---- problems -----------------------------------------------------------------------------
    def validate_problem(self, problem: Problem) -> None:
        """Raise SpaceError if this family can't run `problem` (wrong dims, indivisible shapes...)."""
        names = [name for name, _ in problem.shape]
        for dim in self.dims:
            if dim not in names:
                raise SpaceError(
                    f"shape: dim {dim!r} is missing for space {self.name!r}; required dims: {', '.join(self.dims)}"
                )
        for dim in names:
            if dim not in self.dims:
                raise SpaceError(
                    f"shape: dim {dim!r} is not allowed for space {self.name!r}; allowed: {', '.join(self.dims)}"
                )
        if problem.dtype not in self.dtypes:
            raise SpaceError(
                f"dtype: {problem.dtype!r} is not supported by {self.name}; allowed: {', '.join(self.dtypes)}"
            )
        if self._check_problem:
            self._check_problem(problem)

    def make_problem(self, shape: Mapping[str, int] | str, *, dtype: Any = "bfloat16", world_size: int = 1) -> Problem:
        """A checked Problem from a dict or text ("8192x4096x12288" or "M=8192,N=4096,K=12288")."""
        dims = parse_shape(shape, self.dims, example=self.example) if isinstance(shape, str) else dict(shape)
        problem = Problem.of(dims, dtype=dtype, world_size=world_size)
        self.validate_problem(problem)
        return problem

    def context(self, problem: Problem, limits: DeviceLimits) -> dict[str, int]:
        """The numbers constraints read: dims, W, dtype_bytes, device limits, and derived values."""
        key = (problem, limits)
        ctx = self._contexts.get(key)
        if ctx is None:
            self.validate_problem(problem)
            ctx = {
                **problem.dims,
                "W": problem.world_size,
                "dtype_bytes": problem.dtype_bytes,
                "max_shared_mem": limits.max_shared_mem,
                "num_sms": limits.num_sms,
                "collectives": collective_mask(limits.collectives),
            }
            if self._derive:
                ctx.update(self._derive(problem))
            if len(self._contexts) > 256:
                self._contexts.clear()
            self._contexts[key] = ctx
        return ctx

    # ---- configs ------------------------------------------------------------------------------
    def suggest(self, trial: optuna.trial.BaseTrial, problem: Problem, limits: DeviceLimits) -> dict[str, Value]:
        """Ask an Optuna trial for one config: only the params active under earlier answers.

        Every param always uses the same categorical distribution (its full choices), which Optuna
        requires across trials; the result may still break a constraint, so check `violations`.
        """
        self.context(problem, limits)
        config: dict[str, Value] = {}
        for p in self.params:
            if p.when is None or p.when.holds(config):
                config[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        return config

    def sampler(
        self, base: optuna.samplers.BaseSampler, problem: Problem, limits: DeviceLimits, *, seed: int = 0
    ) -> ValidSampler:
        """`base` made to propose only configs this space takes for `problem` on this device (`_sampler`): a
        proposal that breaks a rule is moved to the nearest valid config instead of being refused."""
        from jointtune.search_spaces._sampler import ValidSampler

        return ValidSampler(base, self, problem, limits, seed=seed)

    def distributions(self) -> dict[str, optuna.distributions.CategoricalDistribution]:
        """Each param's Optuna distribution, for `optuna.trial.create_trial` when importing results."""
        from optuna.distributions import CategoricalDistribution

        return {p.name: CategoricalDistribution(list(p.choices)) for p in self.params}

    def _check(self, config: Any, ctx: Context) -> tuple[dict[str, Value], list[str]]:
        if not isinstance(config, Mapping):
            return {}, [f"config: {config!r} is not allowed; it must be a JSON object of field -> value"]
        errors = [
            f"{key}: unknown field for space {self.name!r}; allowed fields: {', '.join(self._by_name)}"
            for key in config
            if key not in self._by_name
        ]
        canonical: dict[str, Value] = {}
        broken: set[str] = set()  # fields in error: params conditioned on them can't be judged
        for p in self.params:
            if p.when and broken.intersection(p.when.fields):
                broken.add(p.name)
                continue
            active = p.when is None or p.when.holds(canonical)
            if active and p.name not in config and p.implied is not None:
                canonical[p.name] = p.implied
            elif active and p.name not in config:
                cond = f" (required with {_setting(p, canonical)})" if p.when else ""
                errors.append(f"{p.name}: missing{cond}; allowed: {format_choices(p.choices)}")
                broken.add(p.name)
            elif active:
                value = p.canonical(config[p.name])
                if value is None:
                    given, kind = config[p.name], _kind_mismatch(config[p.name], p.choices)
                    errors.append(f"{p.name}: {given!r} is not allowed{kind}; allowed: {format_choices(p.choices)}")
                    broken.add(p.name)
                else:
                    canonical[p.name] = value
            elif p.name in config:
                assert p.when is not None
                errors.append(
                    f"{p.name}: {config[p.name]!r} is not allowed with {_setting(p, canonical)}; "
                    f"{p.name} only exists when {p.when.describe()}"
                )
        if not errors:
            for c in self.constraints:
                if all(f in canonical for f in c.fields):
                    message = c.check(canonical, ctx)
                    if message:
                        errors.append(message)
        return canonical, errors

    def violations(self, config: Mapping[str, Any], problem: Problem, limits: DeviceLimits) -> list[str]:
        """Everything wrong with `config` for this problem and device; empty means valid."""
        return self._check(config, self.context(problem, limits))[1]

    def validate(self, config: Mapping[str, Any], problem: Problem, limits: DeviceLimits) -> dict[str, Value]:
        """The canonical config (params in definition order), or SpaceError listing every fault."""
        canonical, errors = self._check(config, self.context(problem, limits))
        if errors:
            raise SpaceError(f"{self.name} config: " + "; ".join(errors))
        return canonical

    @property
    def buckets(self) -> bool:
        """Whether records are keyed by buckets of some dim (`stored_problem` is not the identity)."""
        return self._stored is not None

    def stored_problem(self, problem: Problem) -> Problem:
        """The problem records of `problem` are keyed by: itself, unless the family buckets a dim (flash_decode's S),
        in which case one record serves every problem of its bucket and lookups bucket their shape first."""
        return self._stored(problem) if self._stored is not None else problem

    def check_record(self, config: Mapping[str, Any], problem: Problem) -> None:
        """SpaceError unless some device could run `config` for `problem`: every field, choice and rule but the
        device's limits (a store knows a record's device only by its id). The store checks what it is given, so a
        record this space refuses can't shadow a valid one. A record at a shape that is not a bucket (`stored_problem`;
        published before lookups bucketed, or by a client of its own) is kept as given: lookups find it as the
        nearest, and bundles holding one still import."""
        self.validate(config, problem, DeviceLimits.unbounded())  # validates the problem too (`context`)

    def default(self, problem: Problem, limits: DeviceLimits) -> dict[str, Value]:
        """A config valid for every problem the family accepts (the fallback before tuning).

        A restricted space whose choices exclude the family default falls back to the valid config
        nearest to it (most fields equal), or SpaceError when the restriction leaves none.
        """
        wanted = self._default(self.context(problem, limits))
        if self.restricted_from is None or not self.violations(wanted, problem, limits):
            return self.validate(wanted, problem, limits)
        best, score = None, -1
        for config in self.enumerate(problem, limits):
            same = sum(1 for k, v in config.items() if k in wanted and wanted[k] == v)
            if same > score:
                best, score = config, same
        if best is None:
            raise SpaceError(
                f"restrict: leaves {self.name} no valid config for shape {problem.dims}, {problem.dtype}, "
                f"world size {problem.world_size}; allow more values"
            )
        return best

    def nearest_valid(
        self,
        config: Mapping[str, Any],
        problem: Problem,
        limits: DeviceLimits,
        *,
        pinned: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> dict[str, Value] | None:
        """The valid config nearest to `config` (same mode where that mode has one; `_nearest` says how near is
        measured), keeping `pinned` values as given; None when no valid config has them. Ties are broken by
        `seed`, so the same call always answers the same."""
        found = valid_branches(self, self.context(problem, limits), self._where(pinned))
        return nearest(self, found, dict(config), random.Random(seed))

    def neighbours(
        self, config: Mapping[str, Any], problem: Problem, limits: DeviceLimits
    ) -> Iterator[dict[str, Value]]:
        """Valid configs one step from `config`, in a fixed order: each of its params set to each of that param's
        other choices (for ordered numbers the nearest first), the other params moved only as far as the rules need
        (`nearest_valid` with the new value pinned; another `mode` takes that mode's nearest config). Where a local
        search looks once a sampler keeps proposing what it has measured; each config is yielded once."""
        seen = {canonical_json(config)}
        for p in self.params:
            current = p.canonical(config.get(p.name))
            if current is None:
                continue
            others = [c for c in p.choices if c != current or type(c) is not type(current)]
            if is_ordered(p):
                at = p.choices.index(current)
                others.sort(key=lambda c: abs(p.choices.index(c) - at))
            for value in others:
                wanted = {**config, p.name: value}
                near = None if p.name in self.structural or self.violations(wanted, problem, limits) else wanted
                if near is None:  # the rules (or the knobs of another mode) move other params too
                    near = self.nearest_valid(wanted, problem, limits, pinned={p.name: value})
                if near is None:
                    continue
                near = self.validate(near, problem, limits)
                key = canonical_json(near)
                if key not in seen:
                    seen.add(key)
                    yield near

    def mode_starts(self, problem: Problem, limits: DeviceLimits) -> list[dict[str, Value]]:
        """One valid config for every mode this problem allows, in the order of `modes`: the first of the seeds,
        the default, the baseline and the family's starts (`starts`) of that mode that the problem takes, else the
        valid config of that mode nearest to the first of them. A tuner's start covers every mode with these
        (issue 34: a short tune that never tried the copy engine missed most of the gain). Empty without `mode`."""
        if not self.modes:
            return []
        ctx = self.context(problem, limits)
        candidates = [*(self._seeds(ctx) if self._seeds else ()), self._default(ctx), self.baseline(problem, limits)]
        candidates += self._starts(ctx) if self._starts else ()
        out = []
        for mode in self.modes:
            if not self.count(problem, limits, where={"mode": mode}):
                continue
            mine = [c for c in candidates if c.get("mode") == mode]
            valid = [canonical for canonical, errors in (self._check(c, ctx) for c in mine) if not errors]
            if valid:
                out.append(valid[0])
                continue
            near = self.nearest_valid(mine[0] if mine else {"mode": mode}, problem, limits, pinned={"mode": mode})
            if near is not None:
                out.append(near)
        return out

    def seeds(self, problem: Problem, limits: DeviceLimits) -> list[dict[str, Value]]:
        """The space's seed configs this problem and device allow (canonical), for a tuner's first trials."""
        if self._seeds is None:
            return []
        ctx = self.context(problem, limits)
        checked = [self._check(config, ctx) for config in self._seeds(ctx)]
        return [canonical for canonical, errors in checked if not errors]

    def baseline(self, problem: Problem, limits: DeviceLimits) -> dict[str, Value]:
        """The unfused path (`mode: baseline`), or the default for a space without that mode. Knobs that exist in
        every mode (flash_decode's decode tiles: its baseline runs our decode kernel) take the default's values, so
        the baseline a tuned config is compared with is the one a user gets without tuning."""
        default = self.default(problem, limits)
        if "baseline" not in self.modes or default.get("mode") == "baseline":
            return default
        shared = {p.name: default[p.name] for p in self.params if p.when is None and p.name in default}
        return self.validate({**shared, "mode": "baseline"}, problem, limits)

    def _where(self, where: Mapping[str, Any] | None) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for name, value in (where or {}).items():
            canonical = self.param(name).canonical(value)
            if canonical is None:
                allowed = format_choices(self._by_name[name].choices)
                raise SpaceError(f"{name}: {value!r} is not allowed; allowed: {allowed}")
            out[name] = canonical
        return out

    def enumerate(
        self, problem: Problem, limits: DeviceLimits, *, where: Mapping[str, Any] | None = None
    ) -> Iterator[dict[str, Value]]:
        """Every valid config (optionally only those with the given field values), in a fixed order."""
        return iter_configs(self, self.context(problem, limits), self._where(where))

    def config_at(
        self, index: int, problem: Problem, limits: DeviceLimits, *, where: Mapping[str, Any] | None = None
    ) -> dict[str, Value] | None:
        """The config `enumerate` yields at `index` (None past its end), without walking to it: a uniform draw of
        the valid configs is `config_at(rng.randrange(count(...)))`."""
        return config_at(self, self.context(problem, limits), self._where(where), index)

    def count(self, problem: Problem, limits: DeviceLimits, *, where: Mapping[str, Any] | None = None) -> int:
        """How many configs `enumerate` yields, without building them."""
        return count_configs(self, self.context(problem, limits), self._where(where))

    def count_by_mode(self, problem: Problem, limits: DeviceLimits) -> dict[str, int]:
        """Valid configs per `mode` choice (what `jointtune spaces count` prints)."""
        return {str(m): self.count(problem, limits, where={"mode": m}) for m in self.modes}

    @staticmethod
    def canonical_json(config: Mapping[str, Value]) -> str:
        return canonical_json(config)

    @staticmethod
    def config_hash(config: Mapping[str, Value]) -> str:
        return config_hash(config)


def _narrow(condition: Condition, kept: Mapping[str, tuple[Value, ...]]) -> Condition | None:
    """`condition` over the narrowed choices in `kept`; None when no clause can hold any more."""
    clauses = []
    for clause in condition.clauses:
        narrowed = []
        for field, values in clause:
            live = tuple(v for v in values if field in kept and any(type(v) is type(c) and v == c for c in kept[field]))
            if not live:
                break
            narrowed.append((field, live))
        else:
            clauses.append(tuple(narrowed))
    return Condition(tuple(clauses)) if clauses else None
