"""`@joint_autotune`: run-time configs for kernel launchers and Triton kernels, the same on every rank.

On a launcher with a joint space, the decorator supplies `config` (a `JointAutotuned`):

    @joint_autotune(space="ag_gemm", key=lambda a, b, *, world: {...}, on_miss="nearest")
    def ag_gemm(a, b, *, world, config): ...

On a `@triton.jit` kernel it is a drop-in for `triton.autotune` (a `JointAutotuner`).

This module is the thin factory (as `triton.autotune` is Triton's): it checks which form was asked for
and builds the object. How a new key is resolved (local store -> service -> miss policy, the ranks'
agreement, timing policies, CUDA-graph capture, non-deterministic modes) is in `runtime/launcher` and
`runtime/triton_compat`, the rules they share in `runtime/rules`.

Environment, read when a key is first resolved: JOINTTUNE_MODE=off (space default, no lookups),
lookup (never tune: a `tune` miss acts as `nearest`), tune (every miss tunes); JOINTTUNE_SERVER;
JOINTTUNE_DB_URL; JOINTTUNE_TIMING_FALLBACK; JOINTTUNE_PRINT=1 prints each key's config and where it
came from. Every rank must see the same JOINTTUNE_MODE and fallbacks.

Arguments are checked when the decorator is applied: a malformed `server=` URL or a `store_timeout_s`
that is not a finite number > 0 raises `ArgumentError` (a ValueError and a TuningError) there, naming
it. What the environment says must never stop a job: a malformed JOINTTUNE_SERVER, like a service that
is down, costs one warning and the lookups go on without the service. The service's answers are bounded:
a lookup that gets no whole answer within 0.5 s (connect, headers and body together), or an answer
longer than 1 MiB, falls back (local store, then the miss policy) with one warning; publishing a result
tuned on a miss holds the call at most as long, and never raises into it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jointtune.autotune.runtime.launcher import JointAutotuned, KeyResultError
from jointtune.autotune.runtime.lookup import (
    DEFAULT_STORE_TIMEOUT_S,
    ArgumentError,
    check_server,
    check_store_timeout,
)
from jointtune.autotune.runtime.rules import NoConfigError
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import TuneSettings


def joint_autotune(
    configs: Any = None,
    key: Any = None,
    *,
    space: str | None = None,
    on_miss: str | None = None,
    kernel: str | None = None,
    dtype: Callable[..., Any] | None = None,
    db_url: str | None = None,
    server: str | None = None,
    store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
    tune_settings: TuneSettings | None = None,
    timing: str | None = None,
    timing_fallback: Mapping[str, Sequence[str]] | str | None = None,
    allow_nondeterministic: bool = False,
    **triton_options: Any,
) -> Callable[[Any], Any]:
    """Decorate a launcher (`space=...`, `key=` a function -> shape dict; without it, the built-in family's key,
    e.g. `flash_decode`'s) or a `@triton.jit` kernel (`configs=[triton.Config...]`, `key=` argument names, and any
    `triton.autotune` option).

    `allow_nondeterministic` (launchers only): let configs of the space's non-deterministic modes run
    and be tuned (off by default; see the module docstring).

    `server`: the config service's URL (http(s)://HOST[:PORT][/PREFIX]); None: $JOINTTUNE_SERVER, if set.
    `store_timeout_s`: seconds one local-store operation may take (a finite number > 0) before the store
    is skipped for the rest of the process. Both raise `ArgumentError` here when malformed."""
    check_store_timeout(store_timeout_s)
    check_server(server)

    def decorate(fn: Any) -> Any:
        if space is not None:
            if configs is not None or triton_options:
                extra = ", ".join(sorted({*triton_options, *(["configs"] if configs is not None else [])}))
                raise TuningError(f"{extra}: not allowed with space={space!r}; the space defines the configs")
            return JointAutotuned(
                fn, space=space, key=key, on_miss=on_miss or "nearest", kernel=kernel, dtype=dtype,
                db_url=db_url, server=server, store_timeout_s=store_timeout_s, tune_settings=tune_settings,
                timing=timing, timing_fallback=timing_fallback, allow_nondeterministic=allow_nondeterministic,
            )  # fmt: skip
        from jointtune.autotune.runtime.triton_compat import JointAutotuner

        if allow_nondeterministic:
            raise TuningError("allow_nondeterministic: only allowed with space=...; a config list has no modes")
        if not hasattr(fn, "arg_names"):  # a plain function: what it needs is a space, not a config list
            raise TuningError(
                f"fn: {getattr(fn, '__name__', fn)!r} is not a @triton.jit kernel; decorate a kernel (configs=[...]) "
                "or give space=... to tune a launcher"
            )
        return JointAutotuner(
            fn, fn.arg_names, configs, key if key is not None else [], on_miss=on_miss or "benchmark",
            kernel=kernel, db_url=db_url, server=server, store_timeout_s=store_timeout_s, timing=timing,
            timing_fallback=timing_fallback, **triton_options,
        )  # fmt: skip

    return decorate


__all__ = ["ArgumentError", "JointAutotuned", "KeyResultError", "NoConfigError", "joint_autotune"]
