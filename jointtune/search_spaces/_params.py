"""The declarative pieces of a space: params, the conditions under which they exist, constraints.

Params and conditions are plain frozen data, so a space's definition can be hashed into its version
and printed as JSON. Constraints carry code (which can't be hashed), so each also carries the rule as
text; the space's manual `revision` covers changes the text doesn't show.

Example:
    >>> tiles = when(mode=("pull", "push")) | when(mode="ce", ce_consumer="triton")
    >>> p = pow2("BLOCK_M", 16, 256, when=tiles)
    >>> p.choices, tiles.holds({"mode": "ce", "ce_consumer": "triton"})
    ((16, 32, 64, 128, 256), True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jointtune.errors import SpaceError

#: A config value: configs are plain JSON objects of field -> int | str | bool.
Value = int | str | bool
#: What a constraint reads besides the config: the problem's dims and the numbers derived from them
#: and from the device (`W`, `dtype_bytes`, `max_shared_mem`, `num_sms`, plus each space's own).
Context = Mapping[str, int]
#: A constraint's check: None when the config satisfies it, else a message naming fields and values.
Check = Callable[[Mapping[str, Value], Context], str | None]


def format_value(value: Value) -> str:
    """A value as JSON writes it: `"push"`, `128`, `true`."""
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def format_choices(choices: Iterable[Value]) -> str:
    """Choices as a user reads them in an error message: `16, 32, 64` or `"pull", "push"`."""
    return ", ".join(format_value(c) for c in choices)


@dataclass(frozen=True)
class Condition:
    """When a param exists: an OR of clauses, each an AND of `field in values`.

    Build with `when(...)` and combine with `|`. A field that is itself absent (inactive) makes
    its clause false, so conditions nest: `ce_consumer` only under `mode == "ce"`, tiles only
    under `ce_consumer == "triton"`.
    """

    clauses: tuple[tuple[tuple[str, tuple[Value, ...]], ...], ...]

    def holds(self, config: Mapping[str, Value]) -> bool:
        for clause in self.clauses:
            for name, values in clause:
                if name not in config or not _member(config[name], values):
                    break
            else:
                return True
        return False

    @property
    def fields(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for clause in self.clauses:
            for name, _ in clause:
                seen[name] = None
        return tuple(seen)

    def __or__(self, other: Condition) -> Condition:
        return Condition(self.clauses + other.clauses)

    def describe(self) -> str:
        parts = []
        for clause in self.clauses:
            terms = [
                f"{n} == {format_value(v[0])}" if len(v) == 1 else f"{n} in [{format_choices(v)}]" for n, v in clause
            ]
            text = " and ".join(terms)
            parts.append(f"({text})" if len(terms) > 1 and len(self.clauses) > 1 else text)
        return " or ".join(parts)

    def to_json(self) -> list[dict[str, list[Value]]]:
        return [{name: list(values) for name, values in clause} for clause in self.clauses]


def when(**fields: Value | Iterable[Value]) -> Condition:
    """A one-clause condition: every named field must hold one of the given values."""
    if not fields:
        raise SpaceError("when: no fields given; allowed: at least one field=value(s)")
    clause = []
    for name, values in fields.items():
        vals = (values,) if isinstance(values, (str, int, bool)) else tuple(values)
        if not vals:
            raise SpaceError(f"when.{name}: empty values are not allowed; give at least one value")
        clause.append((name, vals))
    return Condition((tuple(clause),))


def _member(value: Value, values: tuple[Value, ...]) -> bool:
    # `True == 1` in Python; a config value only matches a choice of the same type.
    return any(type(v) is type(value) and v == value for v in values)


@dataclass(frozen=True)
class Param:
    """One tunable field: its exact choices (fixed, so Optuna sees one distribution per name)."""

    name: str
    choices: tuple[Value, ...]
    when: Condition | None = None
    kind: str = "choice"  # "pow2" | "choice" | "categorical": how to describe it, not how to sample
    doc: str = ""
    #: the value a config that leaves this param out means (None: it must be given); for a knob added to a space
    #: after configs were written without it, so they keep their meaning
    implied: Value | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise SpaceError(f"param name: {self.name!r} is not allowed; it must be an identifier")
        if not self.choices:
            raise SpaceError(f"{self.name}: no choices given; a param needs at least one")
        for value in self.choices:
            if not isinstance(value, (int, str, bool)):
                raise SpaceError(f"{self.name}: choice {value!r} is not allowed; choices are int, str or bool")
        if len({(type(v), v) for v in self.choices}) != len(self.choices):
            raise SpaceError(f"{self.name}: choices {list(self.choices)!r} repeat a value; they must be distinct")
        if self.implied is not None and not _member(self.implied, self.choices):
            raise SpaceError(f"{self.name}: implied value {self.implied!r} is not one of its choices")

    def canonical(self, value: Any) -> Value | None:
        """The choice equal to `value` (ints written as 64.0 become 64), or None if none is."""
        if isinstance(value, float) and value.is_integer() and not isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, str, bool)) and _member(value, self.choices):
            return value
        return None

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "kind": self.kind,
            "choices": list(self.choices),
            "when": self.when.to_json() if self.when else None,
        }
        if self.implied is not None:
            out["implied"] = self.implied
        return out


def pow2(name: str, lo: int, hi: int, *, when: Condition | None = None, doc: str = "") -> Param:
    """Powers of two from `lo` to `hi` inclusive."""
    if lo < 1 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
        raise SpaceError(f"{name}: pow2 range {lo}..{hi} is not allowed; bounds must be powers of two, lo <= hi")
    return Param(name, tuple(1 << e for e in range(lo.bit_length() - 1, hi.bit_length())), when, "pow2", doc)


def choice(name: str, values: Iterable[Value], *, when: Condition | None = None, doc: str = "") -> Param:
    """An explicit, ordered list of numeric (or other) choices."""
    return Param(name, tuple(values), when, "choice", doc)


def categorical(
    name: str, values: Iterable[Value], *, when: Condition | None = None, doc: str = "", implied: Value | None = None
) -> Param:
    """Unordered named alternatives, such as `mode` (`implied`: what a config without it means)."""
    return Param(name, tuple(values), when, "categorical", doc, implied)


@dataclass(frozen=True)
class Constraint:
    """A rule over some fields, applied only when all of them are present in the config.

    `rule` is the rule as text: it is shown to users and hashed into the space's version.
    """

    name: str
    fields: tuple[str, ...]
    rule: str
    check: Check = field(compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "fields": list(self.fields), "rule": self.rule}


def rule_field(message: str) -> str:
    """The field (or rule, such as "shared memory") a constraint's message names first: "kv_split: 512 is not
    allowed..." -> "kv_split". What the tuner counts refused and moved proposals by."""
    return message.split(":", 1)[0].strip() or message[:40]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
