"""Which timing policy a call looks up, what it may fall back to, and the rule for CUDA-graph capture.

A config tuned for one way of running an op can be wrong for another (pytorch#179236: eager timings
misranked kernels that ran in graphs), so records carry the policy they were measured under and the
decorator asks for the policy of the call: `graph` while the current stream is being captured into a
CUDA graph, else `eager`. When no record of that policy exists it may use one of another policy, but
only along an explicit chain (`fallbacks`), and says so (`JOINTTUNE_PRINT=1`, and the source it reports).

During capture nothing may run but the op itself: no store, no service, no tuning (a database read or
an HTTP call inside `torch.cuda.graph` breaks the capture, as tuning inside it does: triton#10596).
A key first seen there raises `CaptureMissError` before anything is queued.

In Triton's CPU interpreter every measurement is `interp` (`jointtune.timings.measured_as`): a call there
looks for an interp record first, then for one of its own policy and that policy's fallbacks.

Example:
    >>> fallbacks("eager:gpu;graph:gpu,eager")
    {'gpu': (), 'eager': ('gpu',), 'graph': ('gpu', 'eager'), 'interp': ()}
    >>> chain("eager", hardware_id="cpu-interpreter-x1-none-1a2b3c4d")
    ('interp', 'eager', 'gpu')
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence

from jointtune.errors import TuningError
from jointtune.timings import INTERP, TIMINGS, measured_as

ENV_FALLBACK = "JOINTTUNE_TIMING_FALLBACK"
#: what each policy may use when it has no record of its own, in order
DEFAULT_FALLBACKS: dict[str, tuple[str, ...]] = {"gpu": (), "eager": ("gpu",), "graph": ("gpu", "eager"), "interp": ()}


class CaptureMissError(TuningError):
    """A key first seen during CUDA-graph capture: its config can't be looked up or tuned there."""


@functools.cache
def _cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return torch.cuda.is_available()


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (never without a GPU)."""
    if not _cuda():
        return False
    import torch

    return torch.cuda.is_current_stream_capturing()


def call_timing(forced: str | None) -> str:
    """The policy of this call: `forced` (then capture is not probed), else graph under capture, else eager."""
    return forced or ("graph" if capturing() else "eager")


def chain(
    timing: str, setting: Mapping[str, Sequence[str]] | str | None = None, *, hardware_id: str = ""
) -> tuple[str, ...]:
    """`timing` and the policies it may fall back to, in the order they are tried; on the CPU interpreter's
    `hardware_id`, interp (what every measurement there is) before them."""
    own = (timing, *fallbacks(setting)[timing])
    measured = measured_as(timing, hardware_id)
    return own if measured == timing else (measured, *(t for t in own if t != INTERP))


def check_timing(timing: str | None, setting: Mapping[str, Sequence[str]] | str | None) -> None:
    """A decorator's `timing=` and `timing_fallback=`, refused at decoration rather than at the first call."""
    if timing is not None and timing not in TIMINGS:
        raise TuningError(f"timing: {timing!r} is not allowed; allowed: {', '.join(TIMINGS)}, or None (by call)")
    if setting is not None:
        fallbacks(setting)


def fallbacks(setting: Mapping[str, Sequence[str]] | str | None = None) -> dict[str, tuple[str, ...]]:
    """The fallback chain per policy: `setting`, else $JOINTTUNE_TIMING_FALLBACK, else DEFAULT_FALLBACKS.

    Text form: "eager:gpu;graph:gpu,eager"; "none" turns every fallback off. Policies not named keep
    no fallback once a setting is given (the setting says everything that is allowed).
    """
    where = "timing_fallback"
    if setting is None:
        setting, where = os.environ.get(ENV_FALLBACK, "").strip() or None, ENV_FALLBACK
    if setting is None:
        return dict(DEFAULT_FALLBACKS)
    chains = _parse(setting, where) if isinstance(setting, str) else dict(setting)
    out: dict[str, tuple[str, ...]] = {t: () for t in TIMINGS}
    for policy, chain in chains.items():
        chain = (chain,) if isinstance(chain, str) else tuple(chain)
        for name in (policy, *chain):
            if name not in TIMINGS:
                raise TuningError(f"{where}: {name!r} is not a timing policy; allowed: {', '.join(TIMINGS)}")
        if policy in chain:
            raise TuningError(f"{where}: {policy!r} falls back to itself; list other policies only")
        out[policy] = tuple(dict.fromkeys(chain))
    return out


def _parse(text: str, where: str) -> dict[str, tuple[str, ...]]:
    if text.strip().lower() == "none":
        return {}
    chains: dict[str, tuple[str, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        policy, sep, rest = part.partition(":")
        if not sep or not policy.strip():
            raise TuningError(
                f"{where}: {part!r} is not allowed; write policy:fallback[,fallback] separated by ';' "
                "(e.g. 'eager:gpu;graph:gpu,eager'), or 'none'"
            )
        chains[policy.strip()] = tuple(filter(None, (t.strip() for t in rest.split(","))))
    return chains


def capture_miss(kernel: str, what: str) -> CaptureMissError:
    return CaptureMissError(
        f"{kernel}: {what} is first seen during CUDA graph capture, where its config can't be looked up or "
        "tuned (no store, service or benchmark may run inside a capture). Resolve it before capturing: call "
        "the op once with the same shapes outside the capture (the usual warm-up), or call .warm(...) with "
        "the same arguments; then capture"
    )
