"""Priors: tuned configs the store already holds near a new study's key, as warm starts, never as the answer.

A prior is measured again in the new study like any other trial of its start; only its measurement there can
make it the study's best. Three kinds, each the best record the store has for it (same kernel and dtype, any
kernel version: an older kernel's winner is still a good first guess; the study's own timing policy, else the
first other policy that has any, since a config good under one policy is a fair guess under another):

- `nearest-shape`: the tuned shapes nearest to this one at the same world size on this hardware (the
  store's nearest-shape distance; the exact shape tuned before, by another space version or seed, comes first);
- `other-gpu`: the same shape at the same world size on another GPU of the same architecture (H100 <-> H200,
  `hardware.arch_of`), whose kernels and limits are the same;
- `other-world-size`: the same shape at another world size on this hardware (nearest world size first).

Each prior's `source` (JSON, noted on its trial as `jt_prior` and listed in the study's `jt_priors`) says which
kind, the record it came from (id, shape, world size, hardware, latency) and, where the space refused it here and
`search.initial_configs` moved it to the nearest valid config, which fields moved (`adapted`).

Example:
    >>> priors = find_priors(store, key, limit=3)                                        # doctest: +SKIP
    >>> [(p.source["kind"], p.source["world_size"]) for p in priors]                     # doctest: +SKIP
    [('nearest-shape', 2), ('other-gpu', 2), ('other-world-size', 4)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jointtune.autotune.tuner.search import Prior

if TYPE_CHECKING:
    from jointtune.autotune.tuner.keys import TuningKey
    from jointtune.db import Store

KINDS = ("nearest-shape", "other-gpu", "other-world-size")
#: other world sizes or GPUs asked at most (each one query of the lookup index)
_MAX_OTHERS = 8


def _source(kind: str, record: Any, distance: float) -> dict[str, Any]:
    return {
        "kind": kind,
        "record": record.id,
        "timing": record.timing,
        "shape": dict(record.shape),
        "world_size": record.world_size,
        "hardware_id": record.hardware_id,
        "kernel_version": record.kernel_version,
        "latency_us": record.latency_p50_us,
        "distance": round(float(distance), 6),
    }


def _policies(key: TuningKey) -> list[str]:
    from jointtune.timings import TIMINGS

    return [key.timing, *(t for t in TIMINGS if t != key.timing)]


def _nearest(store: Store, key: TuningKey, *, world_size: int, hardware_id: str, limit: int) -> list[tuple[Any, float]]:
    """The store's nearest records to the key's shape at `world_size` on `hardware_id`: of the key's timing
    policy, else of the first other policy that has any."""
    for timing in _policies(key):
        asked = key.replace(kernel_version=None, world_size=world_size, hardware_id=hardware_id, timing=timing)
        found = store.nearest(asked, limit=limit)
        if found:
            return found
    return []


def _same_shape(store: Store, key: TuningKey, *, world_size: int, hardware_id: str) -> Prior | None:
    """The best record of exactly this shape at `world_size` on `hardware_id`, as a prior (None if none)."""
    found = _nearest(store, key, world_size=world_size, hardware_id=hardware_id, limit=1)
    if not found or found[0][1] != 0:
        return None
    record, distance = found[0]
    kind = "other-gpu" if hardware_id != key.hardware_id else "other-world-size"
    return Prior(record.config, _source(kind, record, distance))


def _other_gpus(store: Store, key: TuningKey) -> list[str]:
    """Other hardware ids in the store of the same architecture as the key's, by id (at most `_MAX_OTHERS`)."""
    from jointtune.hardware import arch_of

    profiles = {p.hardware_id: p.fingerprint for p in store.list_hardware()}
    mine = arch_of(key.hardware_id, profiles.get(key.hardware_id))
    if mine is None:
        return []
    same = [h for h, fp in sorted(profiles.items()) if h != key.hardware_id and arch_of(h, fp) == mine]
    return same[:_MAX_OTHERS]


def find_priors(store: Store, key: TuningKey, *, limit: int) -> list[Prior]:
    """The priors of `key` in `store` (module docstring), at most `limit` of each kind, in the order of `KINDS`."""
    if limit <= 0:
        return []
    near = _nearest(store, key, world_size=key.world_size, hardware_id=key.hardware_id, limit=limit)
    priors = [Prior(record.config, _source("nearest-shape", record, distance)) for record, distance in near]
    gpus = (_same_shape(store, key, world_size=key.world_size, hardware_id=h) for h in _other_gpus(store, key))
    sizes = (_same_shape(store, key, world_size=w, hardware_id=key.hardware_id) for w in _world_sizes(store, key))
    for candidates in (gpus, sizes):
        priors += [prior for prior in candidates if prior is not None][:limit]
    return priors


def _world_sizes(store: Store, key: TuningKey) -> list[int]:
    """The other world sizes this kernel has records of on this hardware and dtype, nearest to the key's first."""
    rows = store.key_values(["world_size"], key.replace(world_size=None))  # its kernel, hardware and dtype
    sizes = sorted({int(row[0]) for row in rows} - {key.world_size})
    return sorted(sizes, key=lambda w: (abs(w - key.world_size), w))[:_MAX_OTHERS]
