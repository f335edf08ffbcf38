"""`@joint_autotune`: run-time configs for kernel launchers and Triton kernels, the same on every rank.

On a launcher with a joint space, the decorator supplies `config`:

    @joint_autotune(space="ag_gemm", key=lambda a, b, *, world: {...}, on_miss="nearest")
    def ag_gemm(a, b, *, world, config): ...

On a `@triton.jit` kernel it is a drop-in for `triton.autotune` (see `triton_compat`).

A key seen before costs one dict lookup (the hot path: the key function, a tuple, a dict get; no
I/O, no locks). A new key goes through the chain local store -> service -> miss policy:
`nearest` (closest tuned shape of the same kernel version, hardware, dtype and world size; the
space default when none), `default`, `tune` (a short collective study, saved and published) or
`error`. In a distributed job all ranks decide together (`agreement`), then cache locally.

Environment, read when a key is first resolved: JOINTTUNE_MODE=off (space default, no lookups),
lookup (never tune: a `tune` miss acts as `nearest`), tune (every miss tunes); JOINTTUNE_SERVER;
JOINTTUNE_DB_URL; JOINTTUNE_PRINT=1 prints each key's config and where it came from. Every rank
must see the same JOINTTUNE_MODE.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jointtune.autotune import agreement
from jointtune.autotune.lookup import DEFAULT_STORE_TIMEOUT_S, Found, Identity, Sources, make_client, warn_once
from jointtune.errors import JointtuneError, TuningError

if TYPE_CHECKING:
    from jointtune.autotune.settings import TuneSettings
    from jointtune.search_spaces import Space

ENV_MODE = "JOINTTUNE_MODE"
ENV_PRINT = "JOINTTUNE_PRINT"
MODES = ("off", "lookup", "tune")
ON_MISS = ("nearest", "default", "tune", "error")


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


def _first_dtype(*args: Any, **kwargs: Any) -> Any:
    """The dtype of the first positional argument (or of its first item, for per-rank lists)."""
    first = args[0]
    if isinstance(first, (list, tuple)):
        first = first[0]
    return first.dtype


class JointAutotuned:
    """A launcher whose `config` comes from the lookup chain; `cache` maps key -> config."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        space: str,
        key: Callable[..., Mapping[str, int]],
        on_miss: str = "nearest",
        kernel: str | None = None,
        dtype: Callable[..., Any] | None = None,
        db_url: str | None = None,
        server: str | None = None,
        store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        tune_settings: TuneSettings | None = None,
    ) -> None:
        from jointtune.search_spaces import get_space

        if on_miss not in ON_MISS:
            raise TuningError(f"on_miss: {on_miss!r} is not allowed; allowed: {', '.join(ON_MISS)}")
        if not callable(key):
            raise TuningError(f"key: {key!r} is not allowed; pass a function of the call's arguments -> shape dict")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.space: Space = get_space(space)
        self.kernel = kernel or space
        self.on_miss = on_miss
        self.key = key
        self.dtype_of = dtype or _first_dtype
        self.db_url = db_url
        self.server = server
        self.store_timeout_s = store_timeout_s
        self.tune_settings = tune_settings
        #: (shape items, dtype, world size or 0 for the job's) -> read-only config
        self.cache: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        #: same keys -> where the config came from
        self.sources: dict[tuple[Any, ...], str] = {}
        self._sources: Sources | None = None

    # ---- hot path -----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        world = kwargs.get("world")
        key = (
            tuple(self.key(*args, **kwargs).items()),
            self.dtype_of(*args, **kwargs),
            0 if world is None else world.world_size,
        )
        config = self.cache.get(key)
        if config is None:
            config = self._resolve(key)
        return self.fn(*args, config=config, **kwargs)

    # ---- a new key ----------------------------------------------------------------------------
    def clear_cache(self) -> None:
        """Forget every resolved key (the next call of each resolves it again)."""
        self.cache.clear()
        self.sources.clear()

    def sources_for(self) -> Sources:
        if self._sources is None:
            client = make_client(self.server)
            self._sources = Sources(db_url=self.db_url, client=client, store_timeout_s=self.store_timeout_s)
        return self._sources

    def _kernel_version(self) -> str:
        from jointtune.kernels import get_family

        try:
            return get_family(self.kernel).version
        except JointtuneError:  # a launcher without a registered family: hash its own source
            import hashlib
            import inspect

            return hashlib.sha256(inspect.getsource(self.fn).encode()).hexdigest()[:12]

    def _resolve(self, key: tuple[Any, ...]) -> Mapping[str, Any]:
        from jointtune.autotune.hardware import current_limits, detect
        from jointtune.autotune.keys import triton_version
        from jointtune.search_spaces import normalize_dtype

        shape_items, dtype, ws = key
        problem = self.space.make_problem(
            dict(shape_items), dtype=normalize_dtype(dtype), world_size=ws or agreement.world_size()
        )
        limits = current_limits()
        mode = env_mode()
        if mode == "off":
            found = Found(self.space.default(problem, limits), "default (JOINTTUNE_MODE=off)")
        else:
            ident = Identity(
                kernel=self.kernel,
                kernel_version=self._kernel_version(),
                space_version=self.space.version,
                dtype=problem.dtype,
                world_size=problem.world_size,
                hardware_id=detect().hardware_id,
                triton_version=triton_version(),
            )
            policy = self.on_miss
            if mode == "tune":
                policy = "tune"
            elif mode == "lookup" and policy == "tune":
                policy = "nearest"

            def accept(config: Mapping[str, Any]) -> str | None:
                return "; ".join(self.space.violations(config, problem, limits)) or None

            found = self._find(ident, problem, accept, policy, limits)
        config = MappingProxyType(dict(found.config))
        self.cache[key] = config
        self.sources[key] = found.source
        if print_enabled():
            dims = ",".join(f"{k}={v}" for k, v in shape_items)
            print(f"jointtune: {self.kernel} {dims} {problem.dtype} w{problem.world_size}: {dict(config)} "
                  f"from {found.source}{f' ({found.detail})' if found.detail else ''}", flush=True)  # fmt: skip
        return config

    def _find(self, ident: Identity, problem: Any, accept: Any, policy: str, limits: Any) -> Found:
        sources = self.sources_for()
        shape = problem.dims
        local = candidate(sources, ident, shape, accept, nearest=policy == "nearest")
        found = agreement.agree(local)
        if found is not None:
            return found
        if policy == "error":
            raise NoConfigError(
                f"{self.kernel}: no tuned config for shape {shape}, dtype {ident.dtype}, world_size "
                f"{ident.world_size} on {ident.hardware_id} (on_miss='error'); tune it with `jointtune tune`"
            )
        if policy == "tune":
            tuned = self._tune(ident, problem, accept)
            if tuned is not None:
                return tuned
        elif policy == "nearest":
            warn_once(
                f"nothing-near:{self.kernel}:{ident.dtype}:{ident.world_size}",
                f"{self.kernel}: no tuned shape near {shape} ({ident.dtype}, world_size {ident.world_size}); "
                "using the space default",
            )
        return Found(self.space.default(problem, limits), "default")

    def _tune(self, ident: Identity, problem: Any, accept: Any) -> Found | None:
        from jointtune.autotune.decorator_tune import tune_online
        from jointtune.db import NewRecord, resolve_db_url

        sources = self.sources_for()
        try:
            tune_online(self.kernel, problem, db_url=resolve_db_url(self.db_url), settings=self.tune_settings)
            error = None
        except Exception as exc:  # tuning must not kill the job; fall back to the default
            error = f"{type(exc).__name__}: {exc}"
        local = None
        if error is None:
            sources.retry_store()  # the tuner just wrote it: read it back even after a hiccup
            local = sources.store_exact(ident, problem.dims, accept)
        found = agreement.agree(local)
        if found is None:
            warn_once(
                f"tune-failed:{self.kernel}:{problem.dims}",
                f"{self.kernel}: online tuning of {problem.dims} found no config ({error or 'no result'}); "
                "using the space default",
            )
            return None
        if local is not None and sources.client is not None:
            from jointtune.db import open_store

            record = open_store(self.db_url).best(kernel_version=ident.kernel_version, **ident.query(problem.dims))
            if record is not None:
                sources.publish(NewRecord.from_json(record.to_json()))
        return Found(found.config, "tune", 0.0, found.latency_us)


def candidate(
    sources: Sources, ident: Identity, shape: Mapping[str, int], accept: Any, *, nearest: bool
) -> Found | None:
    """This rank's best answer for a new key: exact store, exact service, then (if asked) nearest."""
    found = sources.store_exact(ident, shape, accept)
    if found is not None:
        return found
    exact, service_near = sources.service(ident, shape, accept)
    if exact is not None or not nearest:
        return exact
    near = [f for f in (sources.store_nearest(ident, shape, accept), service_near) if f is not None]
    return min(near, key=lambda f: f.distance) if near else None


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
    **triton_options: Any,
) -> Callable[[Any], Any]:
    """Decorate a launcher (`space=...`, `key=` a function -> shape dict) or a `@triton.jit` kernel
    (`configs=[triton.Config...]`, `key=` argument names, and any `triton.autotune` option)."""

    def decorate(fn: Any) -> Any:
        if space is not None:
            if configs is not None or triton_options:
                extra = ", ".join(sorted({*triton_options, *(["configs"] if configs is not None else [])}))
                raise TuningError(f"{extra}: not allowed with space={space!r}; the space defines the configs")
            return JointAutotuned(
                fn, space=space, key=key, on_miss=on_miss or "nearest", kernel=kernel, dtype=dtype,
                db_url=db_url, server=server, store_timeout_s=store_timeout_s, tune_settings=tune_settings,
            )  # fmt: skip
        from jointtune.autotune.triton_compat import JointAutotuner

        return JointAutotuner(
            fn, fn.arg_names, configs, key if key is not None else [], on_miss=on_miss or "benchmark",
            kernel=kernel, db_url=db_url, server=server, store_timeout_s=store_timeout_s, **triton_options,
        )  # fmt: skip

    return decorate
