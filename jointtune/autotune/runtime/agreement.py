"""One decision per new key for all ranks of a job, whatever their local stores and services say.

Push/pull kernels deadlock when ranks run different configs, so a rank never uses what it found
alone: every rank gathers every rank's candidate (a gloo all-gather of small objects) and all
apply the same rule, so no extra broadcast is needed:

    exact record (store or service)  >  nearest shape (smaller distance first)  >  nothing,
    the asked timing policy before its fallbacks, ties going to the lower rank.

Benchmark timings are agreed the same way: the config whose slowest rank is fastest wins. The
gloo group is created on first use (a collective every rank reaches at its first new key); under
a gloo default group that group itself is used.

Example:
    >>> choose([None, Found({"BLOCK": 64}, "store")]).config                   # doctest: +SKIP
    {'BLOCK': 64}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jointtune.autotune.runtime.lookup import Found

_GROUP: list[Any] = []


def distributed() -> bool:
    """True inside a torch.distributed job of more than one rank."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Ranks of the torch.distributed job (1 outside one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def control_group() -> Any:
    """The gloo group decisions travel on (made on first use; the default group when it is gloo)."""
    import torch.distributed as dist

    if not _GROUP:
        _GROUP.append(None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"))
    return _GROUP[0]


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just [obj] outside a distributed job)."""
    if not distributed():
        return [obj]
    import torch.distributed as dist

    group = control_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _rank_of(found: Found) -> tuple[int, int, float]:
    return (0 if found.exact else 1, found.fallback, found.distance)


def choose(candidates: Sequence[Found | None]) -> Found | None:
    """The candidate every rank picks: exact before nearest, the asked timing policy before its fallbacks
    (in chain order), then smaller distance, then lower rank."""
    best: Found | None = None
    for found in candidates:
        if found is not None and (best is None or _rank_of(found) < _rank_of(best)):
            best = found
    return best


def agree(local: Found | None) -> Found | None:
    """The candidate all ranks agree on for one new key (collective in a distributed job)."""
    return choose(gather(local))


def agree_timings(timings: Sequence[float]) -> tuple[int, list[float]]:
    """Index of the config whose slowest rank is fastest, and each config's slowest-rank time."""
    per_rank = gather([float(t) for t in timings])
    worst = [max(rank[i] for rank in per_rank) for i in range(len(timings))]
    order = [i for i in range(len(worst)) if not math.isnan(worst[i])]
    best = min(order, key=lambda i: (worst[i], i)) if order else 0
    return best, worst
