"""`JointAutotuner`: Triton's own `Autotuner`, with persistence, the service and rank agreement.

Subclassing keeps Triton's behaviour by construction: key building, pruning, hooks,
reset_to_zero/restore_value, `.cache`, `.best_config`, `.configs_timings`, the listener and
TRITON_PRINT_AUTOTUNING are Triton's code. We only hook into the tuner's cache:

- asking the cache for a key it lacks (Triton does this once per new key, inside `run`) first
  tries the local store and the service (and the nearest tuned shape with `on_miss="nearest"`);
  every rank agrees on the answer. A hit fills the cache, so Triton runs it without benchmarking.
- a key Triton benchmarked is written to the cache; there all ranks adopt rank 0's winner (ranks
  time differently, a fused kernel must not run different configs), and the result is saved to
  the local store (and published by rank 0).

Kernels are keyed as `triton:<module>.<name>` (other characters than the store's name charset
become `_`), versioned by a hash of their source; integer key arguments >= 1 become the shape's
dims, the tensors' dtypes (and any other key value) the dtype text, hashed ("sha:...") when the
store's dtype grammar doesn't take it as it is. In the interpreter (no CUDA) benchmarks use a
wall-clock timer. Only API present in both Triton 3.6 and 3.9 is used.

Timing policies as in `@joint_autotune` (`policies`): the cache holds a config per (key, policy), the
call's policy being `graph` under CUDA-graph capture and `eager` otherwise (or `timing=`); a new key is
benchmarked the way its policy runs (`eager`: wall time of calls back to back; `graph`: Triton's
`do_bench_cudagraph`; `gpu`: Triton's event timer) unless a `do_bench` was given, and saved under that
policy. A key first seen during capture raises `CaptureMissError` before Triton would benchmark inside
the capture (triton#10596).

The lookup rules it shares with the launcher decorator (`candidate`, `env_mode`, `NoConfigError`) are in
`rules`. Longer than 300 lines because it is one subclass of Triton's `Autotuner` (as Triton keeps its
tuner in one file): the cache hooks, the save after a benchmark and the key's identity read the same
per-call state, and the timers it benchmarks with sit beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
import time
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from triton.runtime.autotuner import Autotuner

from jointtune.autotune.runtime import agreement, policies
from jointtune.autotune.runtime.lookup import DEFAULT_STORE_TIMEOUT_S, Identity, Sources, make_client
from jointtune.autotune.runtime.rules import NoConfigError, candidate, env_mode, print_enabled
from jointtune.db.schema import is_dtype
from jointtune.errors import TuningError
from jointtune.timings import EAGER_CALLS, INTERP, measured_as

TRITON_ON_MISS = ("benchmark", "nearest", "error")


def store_name(text: str) -> str:
    """`text` in the store's name charset (a nested kernel's `<locals>` -> `_locals_`), <= 128 chars."""
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", text)[:128]


_MAX_DTYPE = 32


def _triton_backend() -> bool:
    """Whether Triton found a backend of its own (one torch does not call CUDA, e.g. Intel's XPU)."""
    try:
        from triton.runtime import driver

        driver.active.get_current_device()
    except Exception:  # no backend: "0 active drivers"
        return False
    return True


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def wall_clock_bench(kernel_call: Any, quantiles: Any = None, reps: int = 5, calls: int = 1) -> Any:
    """Milliseconds per call by wall clock, `calls` calls back to back per sample, the device synchronised
    around each sample: the eager policy, and the interpreter's timer (it has no CUDA events)."""
    sync = _synchronize()
    kernel_call()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            kernel_call()
        sync()
        times.append((time.perf_counter() - start) * 1e3 / calls)
    times.sort()
    if quantiles is None:
        return times[len(times) // 2]
    return [times[min(len(times) - 1, int(q * len(times)))] for q in quantiles]


def _synchronize() -> Any:
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() and not interpreting() else (lambda: None)


def eager_bench(kernel_call: Any, quantiles: Any = None) -> Any:
    """The eager policy's timer: wall time per call of EAGER_CALLS calls back to back, 10 samples."""
    return wall_clock_bench(kernel_call, quantiles, reps=10, calls=EAGER_CALLS)


class _Cache(dict):
    """Triton's key -> Config dict, held per (key, timing policy of the call); a miss inside `run` asks
    our lookup chain first (and raises during CUDA-graph capture, before anything is benchmarked)."""

    def __init__(self, owner: JointAutotuner) -> None:
        super().__init__()
        self.owner = owner

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, (key, self.owner._policy())):
            return True
        return self.owner._lookup(key)

    def __getitem__(self, key: Any) -> Any:
        return dict.__getitem__(self, (key, self.owner._policy()))

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.get(self, (key, self.owner._policy()), default)

    # Triton's view of the cache: the keys and configs of the call's policy (as `triton.autotune` has them)
    def __iter__(self) -> Any:
        policy = self.owner._policy()
        return iter([key for key, p in dict.keys(self) if p == policy])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> Any:  # type: ignore[override]
        return list(self)

    def values(self) -> Any:  # type: ignore[override]
        return [self[key] for key in self]

    def items(self) -> Any:  # type: ignore[override]
        return [(key, self[key]) for key in self]

    def __setitem__(self, key: Any, config: Any) -> None:
        chosen = self.owner._decided(key, config)
        dict.__setitem__(self, (key, self.owner._policy()), chosen)
        self.owner._prepare_graph(key, chosen)


class JointAutotuner(Autotuner):
    """A `triton.autotune` tuner whose results persist in the store and agree across ranks."""

    def __init__(
        self,
        fn: Any,
        arg_names: list[str],
        configs: Any,
        key: list[str],
        reset_to_zero: Any = None,
        restore_value: Any = None,
        *,
        on_miss: str = "benchmark",
        kernel: str | None = None,
        db_url: str | None = None,
        server: str | None = None,
        store_timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        timing: str | None = None,
        timing_fallback: Any = None,
        **options: Any,
    ) -> None:
        if on_miss not in TRITON_ON_MISS:
            raise TuningError(f"on_miss: {on_miss!r} is not allowed for a Triton kernel; allowed: "
                              f"{', '.join(TRITON_ON_MISS)}")  # fmt: skip
        policies.check_timing(timing, timing_fallback)
        self.timing, self.timing_fallback = timing, timing_fallback
        super().__init__(fn, arg_names, configs, key, reset_to_zero, restore_value, **options)
        self.cache = _Cache(self)
        self.on_miss = on_miss
        self.kernel = kernel or store_name(f"triton:{self.base_fn.__module__}.{self.base_fn.__qualname__}")
        self.kernel_version = hashlib.sha256(inspect.getsource(self.base_fn).encode()).hexdigest()[:12]
        self.space_version = hashlib.sha256("|".join(str(c) for c in self.configs).encode()).hexdigest()[:12]
        self.sources_by_key: dict[Any, str] = {}
        self.db_url, self.server, self.store_timeout_s = db_url, server, store_timeout_s
        self._sources: Sources | None = None
        self._call: tuple[Any, Any] | None = None
        #: the policy of the call `run` is serving (capture can't begin or end within one call)
        self._run_policy: str | None = None
        self._to_save: list[tuple[Any, Identity, dict[str, int]]] = []
        self._backend_checked = False

    @property
    def do_bench(self) -> Any:
        """The benchmark of the call's policy (a `do_bench` given by the user wins)."""
        if self._do_bench is not None:
            return self._do_bench
        if interpreting():
            return wall_clock_bench
        policy = self._policy()
        if policy == "eager":
            return eager_bench
        if policy == "graph":
            from triton.testing import do_bench_cudagraph

            return do_bench_cudagraph
        return self._gpu_bench

    @cached_property
    def _gpu_bench(self) -> Any:
        return Autotuner.do_bench.func(self)

    def _policy(self) -> str:
        return self._run_policy or policies.call_timing(self.timing)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if not self._backend_checked:
            self._check_backend()
        self._call = (args, kwargs)
        self._run_policy = policies.call_timing(self.timing)
        try:
            return super().run(*args, **kwargs)
        finally:
            self._call = self._run_policy = None
            if self._to_save:
                self._save_pending()

    def _check_backend(self) -> None:
        """One line instead of Triton's "0 active drivers" traceback when a compiled kernel is called where no GPU
        is: Triton picks interpreted or compiled as `@triton.jit` runs, before this decorator sees the kernel."""
        import torch
        from triton.runtime.interpreter import InterpretedFunction

        fn = self.fn  # the kernel under any heuristics (`base_fn` is the plain Python function beneath)
        while not isinstance(fn, InterpretedFunction) and hasattr(fn, "fn"):
            fn = fn.fn
        if not isinstance(fn, InterpretedFunction) and not torch.cuda.is_available() and not _triton_backend():
            raise TuningError(
                f"{self.kernel}: no GPU here, and the kernel was compiled for one; to run it in Triton's CPU "
                "interpreter, set TRITON_INTERPRET=1 before the module that defines it is imported"
            )
        self._backend_checked = True

    # ---- the hooks ----------------------------------------------------------------------------
    def _active(self) -> bool:
        return self._call is not None and env_mode() != "off"

    def _lookup(self, key: Any) -> bool:
        """A key Triton hasn't seen: True (and cached) when the chain or a peer rank has its config."""
        if policies.capturing():  # nothing but the kernel may run inside a capture: no store, no benchmark
            raise policies.capture_miss(self.kernel, f"Triton key {key!r} (timing {self._policy()})")
        if not self._active():
            return False
        ident, shape = self._identity(key)
        nearest = self.on_miss == "nearest" and env_mode() != "tune"
        chain = policies.chain(ident.timing, self.timing_fallback, hardware_id=ident.hardware_id)
        found = agreement.agree(
            candidate(self._sources_for(), ident, shape, self._accept, nearest=nearest, chain=chain)
        )
        if found is None:
            if self.on_miss == "error" and env_mode() != "tune":
                raise NoConfigError(f"{self.kernel}: no tuned config for key {key!r} (on_miss='error')")
            return False
        config = self._match(found.config)
        assert config is not None  # _accept checked it
        dict.__setitem__(self.cache, (key, ident.timing), config)
        self._prepare_graph(key, config)
        source = found.source_for(ident.timing)
        self.sources_by_key[key] = source
        if print_enabled():
            print(f"jointtune: {self.kernel} key {key!r} timing {ident.timing}: {config} from {source}", flush=True)
        return True

    def _decided(self, key: Any, config: Any) -> Any:
        """Triton chose `config` for a new key: adopt rank 0's choice, and remember to save it."""
        if not self._active():
            return config
        index = next((i for i, c in enumerate(self.configs) if c is config), None)
        if index is None:
            index = next(i for i, c in enumerate(self.configs) if c == config)
        chosen = self.configs[agreement.gather(index)[0]]
        self.sources_by_key[key] = "benchmark"
        self._to_save.append((chosen, *self._identity(key)))
        return chosen

    def _prepare_graph(self, key: Any, config: Any) -> None:
        """A key resolved eagerly where CUDA graphs exist also gets its `graph` entry now, since nothing may
        be looked up (or compiled) during a later capture: a graph record (or one of the graph chain's
        fallbacks), else the eager config if the chain allows eager. A different config is compiled and its
        module loaded here; it is not run (a kernel may accumulate into its outputs)."""
        if (self.timing is not None or self._policy() != "eager" or not self._active() or not policies._cuda()
                or dict.__contains__(self.cache, (key, "graph"))):  # fmt: skip
            return
        ident, shape = self._identity(key)
        graph = dataclasses.replace(ident, timing="graph")
        chain = policies.fallbacks(self.timing_fallback)["graph"]
        stored = ("graph", *(t for t in chain if t != "eager"))
        found = agreement.agree(candidate(self._sources_for(), graph, shape, self._accept, nearest=False, chain=stored))
        if found is not None:
            chosen, source = self._match(found.config), f"{found.source} [{found.timing} record]"
        elif "eager" in chain:
            chosen, source = config, "eager config [fallback for graph]"
        else:
            return  # a capture of this key raises CaptureMissError: nothing of its policy is known
        if chosen is not config and not interpreting():
            args, kwargs = self._call if self._call is not None else ((), {})
            try:
                compiled = self.fn.warmup(*args, grid=(1,), **{**kwargs, **chosen.all_kwargs()})
                compiled._init_handles()
            except Exception:
                return  # it will compile at its first launch; outside capture that is fine, inside it raises
        dict.__setitem__(self.cache, (key, "graph"), chosen)
        self.sources_by_key[(key, "graph")] = source

    def _save_pending(self) -> None:
        from jointtune.autotune.tuner.keys import triton_version
        from jointtune.db import NewRecord

        pending, self._to_save = self._to_save, []
        timings = getattr(self, "configs_timings", None) or {}
        for config, ident, shape in pending:
            timing = timings.get(config)
            if timing is None:
                continue  # a single pruned config: Triton ran nothing to time
            ms = float(timing[0] if isinstance(timing, (list, tuple)) else timing)
            if not 0 < ms < float("inf"):
                continue
            key = ident.key(shape, timing=self._measured_as(ident.timing, ident.hardware_id))
            record = NewRecord.for_key(key, space_version=ident.space_version, triton_version=triton_version(),
                                       config=_as_json(config), latency_p50_us=ms * 1e3, trials=len(timings),
                                       study_name=None)  # fmt: skip
            sources = self._sources_for()
            sources.save(record)
            if not agreement.distributed() or _rank() == 0:
                sources.publish(record)

    def _measured_as(self, policy: str, hardware_id: str) -> str:
        """The policy a benchmark really measured: interp in the CPU interpreter; a `do_bench` of the user's (or
        Triton's `use_cuda_graph`, `warmup`, `rep` options) times with device events or graph replays, never host
        included."""
        if measured_as(policy, hardware_id) == INTERP:
            return INTERP
        if self._do_bench is None:
            return policy
        return "graph" if getattr(self, "use_cuda_graph", False) else "gpu"

    # ---- helpers ------------------------------------------------------------------------------
    def _sources_for(self) -> Sources:
        if self._sources is None:
            client = make_client(self.server)
            self._sources = Sources(db_url=self.db_url, client=client, store_timeout_s=self.store_timeout_s)
        return self._sources

    def _identity(self, key: Any) -> tuple[Identity, dict[str, int]]:
        from jointtune.autotune.tuner.keys import triton_version
        from jointtune.hardware import detect

        names = [k for k in self.keys if k in self._arg_values()]
        dims: dict[str, int] = {}
        extra: list[str] = []
        for name, value in zip(names, key[: len(names)]):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                dims[name] = value
            else:
                extra.append(f"{name}={value!r}")
        dtypes = list(dict.fromkeys(str(d).removeprefix("torch.") for d in key[len(names) :]))
        dtype = "+".join(dtypes) or "none"
        if extra:
            dtype += ";" + ",".join(extra)
        if len(dtype) > _MAX_DTYPE or not is_dtype(dtype):  # the store keys records by dtypes of its grammar
            dtype = "sha:" + hashlib.sha256(dtype.encode()).hexdigest()[: _MAX_DTYPE - 4]
        ident = Identity(
            kernel=self.kernel,
            kernel_version=self.kernel_version,
            space_version=self.space_version,
            dtype=dtype,
            world_size=agreement.world_size(),
            hardware_id=detect().hardware_id,
            triton_version=triton_version(),
            timing=self._policy(),
        )
        return ident, dims or {"_": 1}

    def _arg_values(self) -> dict[str, Any]:
        args, kwargs = self._call if self._call is not None else ((), {})
        return {**dict(zip(self.arg_names, args)), **kwargs}

    def _match(self, stored: Mapping[str, Any]) -> Any:
        wanted = dict(stored)
        return next((c for c in self.configs if _as_json(c) == wanted), None)

    def _accept(self, stored: Mapping[str, Any]) -> str | None:
        if self._match(stored) is None:
            return "it is not one of this kernel's configs"
        return None


def _as_json(config: Any) -> dict[str, Any]:
    return {k: v for k, v in config.all_kwargs().items() if isinstance(v, (int, float, str, bool))}


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


__all__ = ["JointAutotuner", "eager_bench", "interpreting", "wall_clock_bench"]
