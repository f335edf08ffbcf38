"""Sweeps registered in the shared Optuna storage, so worker groups on any node can find them.

A sweep is stored as one study with no trials, named `jointtune-sweep:<name>`, whose user attrs
hold its jobs per profile ("gpu", "cpu") and the modules every rank must import. Nothing is
added to the store's schema or to Optuna's: only study user attrs. A worker reads the sweep,
keeps the profile of its device, and derives each job's study name from its own hardware id,
so a mixed cluster tunes every kind of machine in its own studies.

Example:
    >>> register_sweep(storage, "nightly", {"cpu": [job]})          # doctest: +SKIP
    >>> load_sweep(storage, "nightly").jobs("cpu")                   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from jointtune._command import jointtune_command
from jointtune.autotune.tuner.settings import Job
from jointtune.errors import TuningError

REGISTRY_PREFIX = "jointtune-sweep:"
_ATTR = "jt_sweep"
PROFILES = ("gpu", "cpu")


@dataclass(frozen=True)
class RegisteredSweep:
    name: str
    profiles: dict[str, tuple[Job, ...]]
    imports: tuple[str, ...] = field(default=())

    def jobs(self, profile: str) -> tuple[Job, ...]:
        if profile not in self.profiles:
            have = ", ".join(sorted(self.profiles)) or "none"
            raise TuningError(f"profile: sweep {self.name!r} has no {profile!r} profile; it has: {have}")
        return self.profiles[profile]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "imports": list(self.imports),
            "profiles": {p: [job.to_json() for job in jobs] for p, jobs in self.profiles.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegisteredSweep:
        profiles = {p: tuple(Job.from_json(j) for j in jobs) for p, jobs in data["profiles"].items()}
        return cls(data["name"], profiles, tuple(data.get("imports", ())))


def register_sweep(
    storage: optuna.storages.BaseStorage,
    name: str,
    profiles: Mapping[str, Sequence[Job]],
    *,
    imports: Sequence[str] = (),
) -> RegisteredSweep:
    """Create or replace the sweep `name` in `storage`; returns what was stored."""
    if not name or any(c.isspace() for c in name):
        raise TuningError(f"sweep name: {name!r} is not allowed; use a non-empty name without spaces")
    bad = sorted(set(profiles) - set(PROFILES))
    if bad:
        raise TuningError(f"profile: {bad[0]!r} is not allowed; allowed: {', '.join(PROFILES)}")
    sweep = RegisteredSweep(name, {p: tuple(jobs) for p, jobs in profiles.items()}, tuple(imports))
    study = optuna.create_study(study_name=REGISTRY_PREFIX + name, storage=storage, load_if_exists=True)
    study.set_user_attr(_ATTR, sweep.to_json())
    return sweep


def load_sweep(storage: optuna.storages.BaseStorage, name: str) -> RegisteredSweep:
    """The registered sweep `name`; TuningError naming the known sweeps if there is none."""
    try:
        study = optuna.load_study(study_name=REGISTRY_PREFIX + name, storage=storage)
    except KeyError:
        known = ", ".join(sweep_names(storage)) or "none"
        raise TuningError(f"sweep: {name!r} is not registered in this storage; registered: {known}") from None
    data = study.user_attrs.get(_ATTR)
    if not data:
        raise TuningError(f"sweep: {name!r} has no jobs stored; register it again with `{jointtune_command()} sweep`")
    return RegisteredSweep.from_json(data)


def sweep_names(storage: optuna.storages.BaseStorage) -> list[str]:
    names = [s.study_name for s in storage.get_all_studies()]
    return sorted(n[len(REGISTRY_PREFIX) :] for n in names if n.startswith(REGISTRY_PREFIX))
