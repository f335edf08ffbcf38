"""`JointAutotuned`: a kernel launcher whose `config` comes from the lookup chain, the same on every rank.

`@joint_autotune(space=...)` builds one (see `jointtune.autotune.runtime.decorator`):

    @joint_autotune(space="ag_gemm", key=lambda a, b, *, world: {...}, on_miss="nearest")
    def ag_gemm(a, b, *, world, config): ...

A key seen before costs one dict lookup (the hot path: the key function, a tuple, a dict get; no
I/O, no locks). A new key goes through the chain local store -> service -> miss policy:
`nearest` (closest tuned shape of the same kernel version, hardware, dtype and world size; the
space default when none), `default`, `tune` (a short collective study, saved and published) or
`error`. In a distributed job all ranks decide together (`agreement`), then cache locally.

Non-deterministic modes (`Space.nondeterministic`, e.g. gemm_rs's atomic: results that may differ in
the last bits between identical calls) are used only with `allow_nondeterministic=True`. Without it a
record (store, service, nearest shape, online tuning) of such a mode counts as a miss of its source, with
one warning, and online tuning leaves those modes out. The check runs when a key is resolved, never on
the hot path.

Timing policies (`policies`): a call asks for records measured the way it runs, `graph` while a CUDA
graph is being captured and `eager` otherwise (or `timing=` fixed), falling back to other policies only
along an explicit chain (`timing_fallback=`, $JOINTTUNE_TIMING_FALLBACK). A key first seen outside capture
is resolved for both, and the graph config's op is run once there, so a later capture finds everything
built; a key first seen during capture raises `CaptureMissError` (no store, service or tuning inside one).

The environment variables it reads are listed in `jointtune.autotune.runtime.decorator`.

Longer than 300 lines because it is one class: the hot path, the warm-up for CUDA graphs and the
resolution of a new key share its caches (`cache`, `sources`, the graph misses) and its options.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jointtune._command import jointtune_command
from jointtune.autotune.runtime import agreement, policies
from jointtune.autotune.runtime.lookup import DEFAULT_STORE_TIMEOUT_S, Found, Identity, Sources, make_client, warn_once
from jointtune.autotune.runtime.rules import NoConfigError, candidate, env_mode, print_enabled
from jointtune.errors import JointtuneError, TuningError
from jointtune.timings import TIMINGS, measured_as

if TYPE_CHECKING:
    from jointtune.autotune.tuner.settings import TuneSettings
    from jointtune.search_spaces import Space

ON_MISS = ("nearest", "default", "tune", "error")


def _first_dtype(*args: Any, **kwargs: Any) -> Any:
    """The dtype of the first positional argument (or of its first item, for per-rank lists)."""
    first = args[0]
    if isinstance(first, (list, tuple)):
        first = first[0]
    return first.dtype


def _family_key(name: str) -> Callable[..., Mapping[str, int]] | None:
    """The key function of the built-in kernel family `name` (its launcher's arguments -> the shape it is tuned
    under, e.g. flash_decode's bucketed KV capacity), or None where there is no such family."""
    from jointtune.errors import UnknownNameError
    from jointtune.kernels import Family, get_family

    try:
        family = get_family(name)
    except UnknownNameError:
        return None
    return family.key if type(family).key is not Family.key else None


class KeyResultError(TuningError, TypeError):
    """A launcher's `key=` function returned something other than a shape dict."""


class JointAutotuned:
    """A launcher whose `config` comes from the lookup chain; `cache` maps key -> config."""

    def __init__(
        self, fn: Callable[..., Any], *, space: str, key: Callable[..., Mapping[str, int]] | None = None,
        on_miss: str = "nearest", kernel: str | None = None, dtype: Callable[..., Any] | None = None,
        db_url: str | None = None, server: str | None = None, store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        tune_settings: TuneSettings | None = None, timing: str | None = None,
        timing_fallback: Mapping[str, Sequence[str]] | str | None = None, allow_nondeterministic: bool = False,
    ) -> None:  # fmt: skip
        from jointtune.search_spaces import get_space

        policies.check_timing(timing, timing_fallback)
        if not isinstance(allow_nondeterministic, bool):
            raise TuningError(
                f"allow_nondeterministic: {allow_nondeterministic!r} is not allowed; it must be True or False"
            )
        if tune_settings is not None and tune_settings.allow_nondeterministic and not allow_nondeterministic:
            raise TuningError(
                "tune_settings.allow_nondeterministic: True is not allowed with allow_nondeterministic=False; "
                "pass allow_nondeterministic=True to joint_autotune (it decides which configs a call may run)"
            )
        if on_miss not in ON_MISS:
            raise TuningError(f"on_miss: {on_miss!r} is not allowed; allowed: {', '.join(ON_MISS)}")
        space_of_calls = get_space(space)  # an unknown space is the first thing to say, before what key it lacks
        if key is None:
            key = _family_key(kernel or space)
        if not callable(key):
            raise TuningError(f"key: {key!r} is not allowed; pass a function of the call's arguments -> shape dict")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.space: Space = space_of_calls
        self.kernel = kernel or space
        self.on_miss = on_miss
        self.key = key
        self.dtype_of = dtype or _first_dtype
        self.db_url = db_url
        self.server = server
        self.store_timeout_s = store_timeout_s
        self.tune_settings = tune_settings
        self.timing = timing
        self.timing_fallback = timing_fallback
        #: whether configs of the space's non-deterministic modes may run (checked when a key is resolved)
        self.allow_nondeterministic = allow_nondeterministic
        #: (shape items, dtype, world size or 0 for the job's, timing policy) -> read-only config
        self.cache: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        #: same keys -> where the config came from
        self.sources: dict[tuple[Any, ...], str] = {}
        #: graph keys whose lookup found nothing at warm-up (on_miss="error") -> the error a capture raises
        self._graph_misses: dict[tuple[Any, ...], str] = {}
        #: the bucket's key (a dim the space buckets, from a caller's key= of raw lengths) -> (config, source)
        self._buckets: dict[tuple[Any, ...], tuple[Mapping[str, Any], str]] = {}
        self._sources: Sources | None = None

    # ---- hot path -----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        world = kwargs.get("world")
        try:
            shape = tuple(self.key(*args, **kwargs).items())
        except AttributeError:  # free unless raised: a key that returned no mapping is named, not a bare error
            shape = self._shape(args, kwargs)
        key = (
            shape,
            self.dtype_of(*args, **kwargs),
            0 if world is None else world.world_size,
            policies.call_timing(self.timing),
        )
        config = self.cache.get(key)
        if config is None:
            if policies.capturing():  # before anything is queued: the capture stays whole for torch to end
                if key in self._graph_misses:
                    raise NoConfigError(self._graph_misses[key])
                raise policies.capture_miss(self.kernel, self._describe(key))
            config = self._resolve(key)
            self._warm_graph(key, config, args, kwargs)
        return self.fn(*args, config=config, **kwargs)

    def warm(self, *args: Any, **kwargs: Any) -> dict[str, Mapping[str, Any]]:
        """Resolve this call's key for every policy a call may ask (eager, and graph where CUDA graphs
        exist) and run the op once per distinct config, outside capture; returns {policy: config}."""
        if policies.capturing():
            raise TuningError(f"{self.kernel}: warm() was called during CUDA graph capture; call it before")
        world = kwargs.get("world")
        base = (self._shape(args, kwargs), self.dtype_of(*args, **kwargs),
                0 if world is None else world.world_size)  # fmt: skip
        seen = (*base, "eager") in self.cache
        self(*args, **kwargs)  # a new key resolves its graph config here
        if seen:  # resolved before: its graph config may have missed then (or a fallback setting changed since)
            self._warm_graph((*base, "eager"), self.cache[(*base, "eager")], args, kwargs)
        return {t: self.cache[(*base, t)] for t in TIMINGS if (*base, t) in self.cache}

    def _shape(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[str, int], ...]:
        """The call's shape items from `key`; KeyResultError naming it when it returns anything but a mapping."""
        shape = self.key(*args, **kwargs)
        if not isinstance(shape, Mapping):
            name = getattr(self.key, "__qualname__", None) or repr(self.key)
            raise KeyResultError(
                f"key: {name} returned {reprlib.repr(shape)} ({type(shape).__name__}); it must return the call's "
                "shape as a dict of dim name -> int, e.g. {'M': 8192, 'N': 4096, 'K': 12288}"
            )
        return tuple(shape.items())

    # ---- a new key ----------------------------------------------------------------------------
    def clear_cache(self) -> None:
        """Forget every resolved key (the next call of each resolves it again)."""
        self.cache.clear()
        self.sources.clear()
        self._graph_misses.clear()
        self._buckets.clear()

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

    def _describe(self, key: tuple[Any, ...]) -> str:
        shape_items, dtype, ws, timing = key
        dims = ",".join(f"{k}={v}" for k, v in shape_items)
        return f"key {dims} {dtype} world_size {ws or agreement.world_size()} (timing {timing})"

    def _warm_graph(self, key: tuple[Any, ...], config: Mapping[str, Any], args: tuple, kwargs: dict) -> None:
        """A key first seen eagerly also resolves the config a captured call will ask for (lookup only,
        never tuned) and runs the op once with it when it differs, so its launch plan exists before any
        capture. Skipped for a fixed `timing=` and where no CUDA graph can be captured."""
        if self.timing is not None or not policies._cuda():
            return
        graph_key = (*key[:3], "graph")
        if graph_key in self.cache:
            return
        try:  # the eager call must go on whatever this finds; a miss shows when a capture asks for it
            graph_config = self._resolve(graph_key, allow_tune=False)
        except NoConfigError as exc:
            self._graph_misses[graph_key] = f"{exc} (looked up when the key was first seen, outside capture)"
            return
        self._graph_misses.pop(graph_key, None)
        if graph_config != config:
            self.fn(*args, config=graph_config, **kwargs)

    def _resolve(self, key: tuple[Any, ...], *, allow_tune: bool = True) -> Mapping[str, Any]:
        from jointtune.autotune.tuner.keys import triton_version
        from jointtune.hardware import current_limits, detect
        from jointtune.search_spaces import normalize_dtype

        shape_items, dtype, ws, timing = key
        asked = self.space.make_problem(
            dict(shape_items), dtype=normalize_dtype(dtype), world_size=ws or agreement.world_size()
        )
        # where the space buckets a dim (flash_decode's S), a key= of the caller's own that returns the raw
        # length finds, and tunes, the bucket's record, as the family's key would
        problem = self.space.stored_problem(asked)
        bucket = None
        if problem != asked:  # another length of this bucket resolved it already: no second lookup or study
            bucket = (tuple((name, problem.dim(name)) for name, _ in shape_items), dtype, ws, timing)
            if bucket in self._buckets:
                self.cache[key], self.sources[key] = self._buckets[bucket]
                return self.cache[key]
        limits = current_limits()
        mode = env_mode()
        if mode == "off":
            found = Found(self._default(problem, limits), "default (JOINTTUNE_MODE=off)")
        else:
            ident = Identity(
                kernel=self.kernel,
                kernel_version=self._kernel_version(),
                space_version=self.space.version,
                dtype=problem.dtype,
                world_size=problem.world_size,
                hardware_id=detect().hardware_id,
                triton_version=triton_version(),
                timing=timing,
            )
            policy = self.on_miss
            if mode == "tune":
                policy = "tune"
            elif mode == "lookup" and policy == "tune":
                policy = "nearest"
            if policy == "tune" and not allow_tune:
                policy = "nearest"

            def accept(config: Mapping[str, Any]) -> str | None:
                refused = self._refused_mode(config)
                return refused or "; ".join(self.space.violations(config, problem, limits)) or None

            found = self._find(ident, problem, accept, policy, limits)
        config = MappingProxyType(dict(found.config))
        source = found.source_for(timing)
        self.cache[key] = config
        self.sources[key] = source
        if bucket is not None:
            self._buckets[bucket] = (config, source)
        if print_enabled():
            dims = ",".join(f"{k}={v}" for k, v in shape_items)
            detail = f" ({found.detail})" if found.detail else ""
            print(f"jointtune: {self.kernel} {dims} {problem.dtype} w{problem.world_size} timing {timing}: "
                  f"{dict(config)} from {source}{detail}", flush=True)  # fmt: skip
        return config

    def _refused_mode(self, config: Mapping[str, Any]) -> str | None:
        """Why `config` may not run here: a non-deterministic mode the caller did not allow (else None)."""
        mode = config.get("mode")
        if self.allow_nondeterministic or not isinstance(mode, str) or mode not in self.space.nondeterministic:
            return None
        return (
            f"mode: {mode!r} is non-deterministic (results may differ in the last bits between identical calls) "
            "and is not allowed without joint_autotune(..., allow_nondeterministic=True)"
        )

    def _find(self, ident: Identity, problem: Any, accept: Any, policy: str, limits: Any) -> Found:
        sources = self.sources_for()
        shape = problem.dims
        chain = policies.chain(ident.timing, self.timing_fallback, hardware_id=ident.hardware_id)
        local = candidate(sources, ident, shape, accept, nearest=policy == "nearest", chain=chain)
        found = agreement.agree(local)
        if found is not None:
            return found
        if policy == "error":
            raise NoConfigError(
                f"{self.kernel}: no tuned config for shape {shape}, dtype {ident.dtype}, world_size "
                f"{ident.world_size} on {ident.hardware_id}, timing {' or '.join(chain)} (on_miss='error'); "
                f"tune it with `{jointtune_command()} tune --timing {measured_as(ident.timing, ident.hardware_id)}`"
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
        return Found(self._default(problem, limits), "default")

    def _default(self, problem: Any, limits: Any) -> dict[str, Any]:
        """The space default; where that is a mode the caller did not allow, the nearest allowed config."""
        config = self.space.default(problem, limits)
        if self._refused_mode(config) is None:
            return config
        allowed = [m for m in self.space.modes if m not in self.space.nondeterministic]
        return self.space.restrict({"mode": allowed}).default(problem, limits)

    def _tune(self, ident: Identity, problem: Any, accept: Any) -> Found | None:
        from jointtune.autotune.runtime.online import ONLINE_SETTINGS, tune_online
        from jointtune.db import NewRecord, resolve_db_url

        sources = self.sources_for()
        settings = (self.tune_settings or ONLINE_SETTINGS).replace(
            timing=ident.timing, allow_nondeterministic=self.allow_nondeterministic
        )
        try:
            tune_online(self.kernel, problem, db_url=resolve_db_url(self.db_url), settings=settings)
            error = None
        except Exception as exc:  # tuning must not kill the job; fall back to the default
            error = f"{type(exc).__name__}: {exc}"
        local, asked = None, ident.timing
        # what the tuner stored it as: interp in the CPU interpreter, whatever the call asked for
        ident = dataclasses.replace(ident, timing=measured_as(asked, ident.hardware_id))
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
            record = sources.store_record(ident, problem.dims)  # within store_timeout_s, never raising
            if record is not None:
                sources.publish(NewRecord.from_json(record.to_json()))
        return Found(found.config, "tune", 0.0, found.latency_us, timing=asked)
