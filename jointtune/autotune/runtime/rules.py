"""The lookup rules both decorators share: the run-time mode, printing, and what one rank proposes for a new key.

`JointAutotuned` (a launcher with a joint space) and `JointAutotuner` (the `triton.autotune` drop-in) resolve a
key they haven't seen the same way: each rank asks `candidate` for its best answer (an exact record, store
before service, of the first timing policy in the chain that has one; then, if asked, the nearest tuned
shape), and `agreement` makes every rank take the same one. A miss with `on_miss="error"` raises
`NoConfigError`.

Environment, read when a key is first resolved: JOINTTUNE_MODE=off (space default, no lookups), lookup
(never tune: a `tune` miss acts as `nearest`), tune (every miss tunes); JOINTTUNE_PRINT=1 prints each key's
config and where it came from. Every rank must see the same JOINTTUNE_MODE.

Example:
    >>> env_mode() in (None, "off", "lookup", "tune")
    True
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jointtune.autotune.runtime.lookup import Found, Identity, Sources
from jointtune.errors import TuningError

ENV_MODE = "JOINTTUNE_MODE"
ENV_PRINT = "JOINTTUNE_PRINT"
MODES = ("off", "lookup", "tune")


class NoConfigError(TuningError, LookupError):
    """`on_miss="error"` and no rank found a tuned config for the key."""


def env_mode() -> str | None:
    """JOINTTUNE_MODE (None when unset); a value we don't know is an error, not a silent default."""
    mode = os.environ.get(ENV_MODE, "").strip().lower()
    if not mode:
        return None
    if mode not in MODES:
        raise TuningError(f"{ENV_MODE}: {mode!r} is not allowed; allowed: {', '.join(MODES)}")
    return mode


def print_enabled() -> bool:
    return os.environ.get(ENV_PRINT, "").strip() not in ("", "0")


def candidate(
    sources: Sources,
    ident: Identity,
    shape: Mapping[str, int],
    accept: Any,
    *,
    nearest: bool,
    chain: Sequence[str] | None = None,
) -> Found | None:
    """This rank's best answer for a new key: an exact record (store, then service) of the first timing
    policy in `chain` that has one; then, if asked, the nearest shape, the earlier policy first."""
    near: list[Found] = []
    for place, timing in enumerate(chain or (ident.timing,)):
        who = dataclasses.replace(ident, timing=timing)
        found = sources.store_exact(who, shape, accept)
        if found is None:
            found, service_near = sources.service(who, shape, accept)
            if service_near is not None:
                near.append(service_near.of_timing(timing, place))
        if found is not None:
            return found.of_timing(timing, place)
        if nearest:
            store_near = sources.store_nearest(who, shape, accept)
            if store_near is not None:
                near.append(store_near.of_timing(timing, place))
    if not nearest:
        return None
    return min(near, key=lambda f: (f.fallback, f.distance)) if near else None
