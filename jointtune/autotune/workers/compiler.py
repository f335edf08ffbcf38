"""Compiling the configs a group will run next, in worker processes, while the ranks time the current one.

Why processes: most of a Triton compile is Python (its front end and the glue between passes), and a thread
compiling beside the rank holds the GIL through it: on 2 CPU cores, 4 AG+GEMM configs for sm_90 took 3.0 s one
after another and 4.9 s on 4 threads (Triton 3.6). Worker processes compile side by side and leave the result in
Triton's on-disk cache, where the rank's first launch of the config finds it (milliseconds instead of a compile).

What a worker compiles: the family's `standin_launches(config, problem, cpu)` (the Triton launches a call makes,
with 1-element stand-in tensors and the call's integers) for the rank's GPU (`CompileTarget`), through Triton's own
JIT (`warmup`) under a driver that only names that target. So the cache key is the one the rank's launch computes,
and a worker never touches CUDA: no context, no GPU memory, whatever GPU the rank drives. Triton also builds C
modules with the system's C compiler the first time a process uses its driver (`cuda_utils`) and, up to Triton 3.6,
at each kernel signature's first launch (its launcher): a pool for a GPU builds those into the cache too
(`warm_driver`), so the rank's first launches only load them.

Failures stay with their config: a config that fails to compile comes back as text (never a pickled exception,
which may not unpickle) and fails its trial ("compile") as an in-process compile would. A worker that dies (the
compiler crashed) breaks the pool: the configs it held are compiled in the rank at their turn, where a crash ends the
group and records the trial as one, as before; a fresh pool takes the configs after.

Example:
    >>> pool = CompilePool(4)                                                              # doctest: +SKIP
    >>> future = pool.submit("ag_gemm", config, problem, CompileTarget("cuda", 90, 32))    # doctest: +SKIP
    >>> future.result()  # None, or why it failed                                          # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import importlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jointtune.autotune.workers import phases
from jointtune.errors import KernelError

#: the most compile processes a rank starts by default: a cold tune's start holds a handful of Triton configs
MAX_DEFAULT_WORKERS = 4


@dataclass(frozen=True)
class CompileTarget:
    """The GPU a rank compiles for, as Triton names it: backend "cuda", arch 90, warp size 32 for an H100."""

    backend: str
    arch: int | str
    warp_size: int

    @classmethod
    def current(cls) -> CompileTarget:
        """The target of this process's current device (a rank on a GPU, after it chose its device). On NVIDIA GPUs
        read from torch as Triton's CUDA driver reads it, without starting that driver (its first use builds a C
        module, which the pool builds meanwhile); elsewhere from Triton's driver."""
        import torch

        if torch.version.hip is None:
            major, minor = torch.cuda.get_device_capability()
            return cls("cuda", major * 10 + minor, 32)
        from triton.runtime import driver

        target = driver.active.get_current_target()
        return cls(target.backend, target.arch, target.warp_size)


class CompileFailed(KernelError):
    """A config's kernels failed to compile in a worker process; the message is the worker's account."""


def default_workers(ranks_here: int) -> int:
    """Compile processes per rank: the CPUs this process may use shared by the node's ranks, one each left to the
    rank, at most 4 (16 CPUs and 2 ranks: 4 each; 8 ranks: 1 each)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_DEFAULT_WORKERS, cpus // max(1, ranks_here) - 1))


class CompilePool:
    """`workers` spawned processes that compile configs ahead of their trials (see the module docstring).

    Every worker starts at once (its imports overlap the rank's own set-up) and imports `imports` first (plug-in
    families). `submit` never raises for a dead pool: it starts a fresh one.
    """

    def __init__(self, workers: int, *, imports: Sequence[str] = (), warm_driver: bool = False) -> None:
        """`warm_driver`: first build Triton's CUDA driver module into the cache (a pool for a CUDA rank)."""
        if workers < 1:
            raise ValueError(f"workers: {workers} is not allowed; a compile pool needs at least 1")
        self.workers = workers
        self.imports = tuple(imports)
        #: how many times a dead worker broke the pool and a fresh one took over (`generation` counts pools)
        self.restarts = 0
        self._pool = self._start()
        if warm_driver:
            self._pool.submit(build_driver_module)

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        pool = concurrent.futures.ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),  # never fork a process that runs CUDA and threads
            initializer=_init_worker,
            initargs=(self.imports,),
        )
        for _ in range(self.workers):  # one task each: the pool spawns a worker per task while none is idle
            pool.submit(os.getpid)
        return pool

    def submit(
        self, family: str, config: Mapping[str, Any], problem: Any, target: CompileTarget | None
    ) -> concurrent.futures.Future[str | None]:
        """Compile `config`'s launches of `family` at `problem` for `target`: a future of None, or why it failed."""
        try:
            return self._pool.submit(compile_config, family, dict(config), problem, target)
        except concurrent.futures.BrokenExecutor:
            self.restart(self.generation)
            return self._pool.submit(compile_config, family, dict(config), problem, target)

    @property
    def generation(self) -> int:
        """Which pool takes work now: a future submitted under one generation breaks with that pool only."""
        return self.restarts

    def restart(self, generation: int) -> bool:
        """Replace the pool of `generation`, broken (a worker died), by a fresh one; False when that happened
        already (every future of a broken pool breaks, and each may ask)."""
        if generation != self.generation:
            return False
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.restarts += 1
        self._pool = self._start()
        return True

    def close(self) -> None:
        """Stop taking work; queued configs are dropped, a worker compiling one exits when it is done."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _init_worker(imports: Sequence[str]) -> None:
    """A compile worker: compiled kernels (not the interpreter), the families imported once, up front."""
    os.environ.pop("TRITON_INTERPRET", None)
    phases.set_who("compile")
    import triton  # noqa: F401  (before jointtune's kernels, which then leave the choice alone)

    from jointtune.kernels import family_names

    for module in imports:
        importlib.import_module(module)
    family_names()
    phases.record_start()


def compile_config(family: str, config: Mapping[str, Any], problem: Any, target: CompileTarget | None) -> str | None:
    """Compile one config's launches for `target` into Triton's cache (in a worker); None, or why it failed.

    Runs in the worker process; `target` None compiles for the driver the worker has, if any."""
    t0 = time.time()
    notes: list[str] = []
    try:
        import torch

        from jointtune.kernels import get_family

        launches = get_family(family).standin_launches(dict(config), problem, torch.device("cpu"))
        if target is not None:
            compile_only_for(target)
        for kernel, args, options in launches:
            compiled = kernel.warmup(grid=(1,), **args, **options)
            if target is not None and target.backend == "cuda":
                notes.extend(build_launcher(compiled))
    except Exception as exc:  # the text crosses back, never the exception
        return _account(exc)
    finally:
        phases.record("compile", t0, family=family, config=dict(config), **({"notes": notes} if notes else {}))
    return None


def build_launcher(compiled: Any) -> list[str]:
    """Build the C launcher Triton 3.6 and earlier compile at a kernel's first launch, into the cache (later
    Tritons launch every kernel through one module: nothing to build). Best effort: a failure here is only a
    launcher built later, in the rank, as without a pool; it comes back as a note for the phases log."""
    try:
        from triton.backends.nvidia import driver as nvidia

        if hasattr(nvidia, "make_launcher"):
            nvidia.CudaLauncher(compiled.src, compiled.metadata)
    except ImportError:  # built and cached, but not loadable here (a CPU machine's stand-in libcuda): fine
        pass
    except Exception as exc:
        return [f"launcher: {_account(exc)}"]
    return []


def build_driver_module() -> str | None:
    """Build Triton's CUDA driver module (`cuda_utils`, compiled from C the first time a process uses the driver)
    into the cache, in a worker; None, or why it could not (the rank then builds it, as without a pool)."""
    t0 = time.time()
    try:
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except ImportError:
        return None
    except Exception as exc:
        return _account(exc)
    finally:
        phases.record("driver-module", t0)
    return None


def _account(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]


class CompileCounter:
    """The Triton compiles of this process, read by phase for the phases log: the kernels compiled here (name,
    seconds) and how many compiles read Triton's cache instead. Installed as Triton's compilation listener."""

    def __init__(self) -> None:
        self._compiled: list[tuple[str, float]] = []
        self._hits = 0

    def __call__(self, *, src: Any, metadata: dict[str, Any], metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if cache_hit:
            self._hits += 1
        else:
            self._compiled.append((str(metadata.get("name", "?")), round(times.total / 1e6, 3)))

    def take(self) -> dict[str, Any]:
        """What happened since the last `take`, as fields of a phase (none when nothing did)."""
        out: dict[str, Any] = {}
        if self._compiled:
            out["compiled_here"] = self._compiled
        if self._hits:
            out["cache_reads"] = self._hits
        self._compiled, self._hits = [], 0
        return out

    @classmethod
    def install(cls) -> CompileCounter | None:
        """Listen to this process's Triton compiles (None where Triton has no listener or one is set already)."""
        from triton import knobs

        if not hasattr(knobs.compilation, "listener") or knobs.compilation.listener is not None:
            return None
        counter = cls()
        knobs.compilation.listener = counter
        return counter


class _OfflineDriver:
    """What Triton's JIT asks of a driver to compile (never to launch): the target, device 0, stream 0."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def get_current_target(self) -> Any:
        return self._target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def compile_only_for(target: CompileTarget) -> None:
    """Make this process compile for `target` without its GPU: Triton's active driver names the target and nothing
    else, so kernels compile (and go to the cache) but can't launch. For processes that only compile."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    driver.set_active(_OfflineDriver(GPUTarget(target.backend, target.arch, target.warp_size)))
