"""One rank's side of a trial: compile, check once, agree, time, agree.

Every rank of a group runs the same steps in the same order, and the ranks agree (all-reduce MAX
of a failure code) after each step that can fail, so no rank launches a collective kernel that a
peer will never join. Inputs are built once per study (fresh random data, never zeros); the
output of a config is checked against the reference the first time it runs; timings are the
identical warm-up and iteration counts on every rank, and the group's latency is the MAX over
ranks of each rank's percentiles.

Compilation overlaps benchmarking: the coordinator sends the configs it claimed ahead (`upcoming`) and the
study's queued start (`queued`), and they compile while the current trial runs:
- with a `CompilePool` (a tuning group on GPUs, `compiler`): in worker processes, each config once per group, by
  the rank that owns it (the n-th config sent is rank n % W's, the same on every rank). At the config's trial its
  owner waits for it, the ranks agree on the outcome, and each rank loads it (the family's `precompile`, now a
  read of Triton's on-disk cache) before the check; the whole queued start compiles at once;
- else (the interpreter, a job tuning online): the family's `precompile` on a thread pool, for the claimed
  configs, on every rank.
A config nobody sent ahead is compiled in the rank at its trial. Every phase goes to the phases log (`phases`).

Example:
    >>> ex = RankExecutor(SoloControl(), world_kind="local")               # doctest: +SKIP
    >>> ex.start_study(job)                                                # doctest: +SKIP
    >>> ex.execute(config, deadline_s=30.0).p50                            # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.tuner.timing import measure, percentiles
from jointtune.autotune.workers import phases
from jointtune.autotune.workers.compiler import CompileCounter, CompileFailed, CompilePool, CompileTarget
from jointtune.autotune.workers.watchdog import Watchdog
from jointtune.errors import KernelError
from jointtune.search_spaces import config_hash

if TYPE_CHECKING:
    from jointtune.autotune.workers.control import Control
    from jointtune.kernels import Family
    from jointtune.kernels.runtime.world import World

log = logging.getLogger(__name__)

#: Why a trial failed. "invalid" never reaches a rank; the others are results of running a config.
FAIL_REASONS = ("invalid", "compile", "incorrect", "timeout", "crash", "error")
#: Failure codes for the all-reduce: when ranks disagree, the most severe reason wins.
_CODES = {"incorrect": 1, "error": 2, "compile": 3, "timeout": 4, "crash": 5}
_REASONS = {code: reason for reason, code in _CODES.items()}
#: Text of CUDA errors after which the context is unusable: the group must restart.
_CUDA_FATAL = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "device-side assert",
    "an illegal",
)
_COMPILE_ERRORS = ("CompilationError", "OutOfResources", "CompileTimeAssertionFailure", "PTXASError")
#: the most configs a rank has compiling ahead at once (an exhaustive study queues every config of its space)
MAX_AHEAD = 64


@dataclass
class _Ahead:
    """A config sent ahead: which rank compiles it, and this rank's job for it (None where another rank compiles
    it). `load`: compiled in a worker process, so each rank loads it in process before its check; `generation`:
    the compile pool's that took the job."""

    config: dict[str, Any]
    owner: int
    future: concurrent.futures.Future[Any] | None
    load: bool
    generation: int = 0


@dataclass(frozen=True)
class Outcome:
    """A trial's result as every rank agrees on it: latencies in µs, or a failure reason."""

    reason: str | None = None
    detail: str = ""
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    #: host µs to issue one call (max over ranks); None when not measured
    host_us: float | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def fatal(self) -> bool:
        """The group can't go on in this process (poisoned CUDA context)."""
        return self.reason == "crash"


def classify(exc: BaseException, *, compiling: bool = False) -> str:
    """The failure reason of an exception raised by a family's precompile or run."""
    text = f"{type(exc).__name__}: {exc}"
    if any(marker in text for marker in _CUDA_FATAL):
        return "crash"
    names = {cls.__name__ for cls in type(exc).__mro__}
    if compiling or names.intersection(_COMPILE_ERRORS) or isinstance(exc, (KernelError, MemoryError)):
        return "compile"
    if "OutOfMemoryError" in names or "out of resource" in text.lower():
        return "compile"
    return "error"


def _same_device(world_kind: str) -> Callable[[], None] | None:
    """Pool threads start on CUDA device 0; make them compile on this rank's device instead."""
    import torch

    if world_kind != "cuda":
        return None
    device = torch.cuda.current_device()
    return lambda: torch.cuda.set_device(device)


def _lost(future: concurrent.futures.Future[Any]) -> bool:
    """Whether a dead pool took this job's result with it (cancelled, broken, or never to finish)."""
    if not future.done() or future.cancelled():
        return True
    return isinstance(future.exception(), concurrent.futures.BrokenExecutor)


def _detail(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[-2000:]


class RankExecutor:
    """Runs trials for one rank; the same object lives for the whole life of the rank process."""

    def __init__(
        self,
        control: Control,
        *,
        world_kind: str = "local",
        watchdog: Watchdog | None = None,
        precompile_workers: int = 2,
        compiler: CompilePool | None = None,
        compile_target: CompileTarget | None = None,
        follower_grace_s: float = 3.0,
    ) -> None:
        """`compiler`: compile ahead in its worker processes (the caller closes it), for `compile_target` (default:
        this rank's GPU on a CUDA world, none elsewhere); without one, `precompile_workers` threads (0: none)."""
        self.control = control
        self.world_kind = world_kind
        self.watchdog = watchdog or Watchdog()
        self.follower_grace_s = follower_grace_s
        self.compiler = compiler
        self._target = compile_target
        self._threads = (
            concurrent.futures.ThreadPoolExecutor(
                max_workers=precompile_workers,
                thread_name_prefix="jointtune-precompile",
                initializer=_same_device(world_kind),
            )
            if compiler is None and precompile_workers > 0
            else None
        )
        # which kernels compile in this process, by phase, for the phases log (compiled kernels only)
        self._compiles = CompileCounter.install() if world_kind == "cuda" and phases.enabled() else None
        self._ahead: dict[str, _Ahead] = {}
        self._sent = 0  # configs sent ahead in this study: the next one's owner is rank `_sent % size`
        self._load: set[str] = set()  # configs compiled elsewhere that this rank loads before their check
        self._trivial: set[str] = set()  # configs sent to a pool that make no Triton launch: compiled at their trial
        self._trials = 0
        self._worlds: dict[int, World] = {}
        self._job: Job | None = None
        self._family: Family | None = None
        self._inputs: Any = None
        self._reference: Any = None
        self._checked: set[str] = set()

    # ---- per study ----------------------------------------------------------------------------
    def world_for(self, world_size: int) -> World:
        from jointtune.kernels.runtime.world import create_world

        if world_size not in self._worlds:
            if self.world_kind == "cuda":
                self._worlds[world_size] = create_world("cuda", world_size)
            else:
                self._worlds[world_size] = create_world("local", world_size)
        return self._worlds[world_size]

    def start_study(self, job: Job) -> str | None:
        """Build inputs for `job` on every rank; None, or the error text every rank agrees on."""
        from jointtune.kernels import get_family

        self._cancel_precompiles()
        self._job, self._inputs, self._reference = job, None, None
        self._checked = set()
        error = ""
        try:
            with phases.phase("inputs", kernel=job.kernel):
                self._family = get_family(job.kernel)
                world = self.world_for(job.world_size)
                self._inputs = self._family.make_inputs(job.problem, world, seed=job.settings.seed + 1)
        except Exception as exc:
            error = f"rank {self.control.rank}: {_detail(exc)}"
        errors = [e for e in self.control.all_gather(error) if e]
        return errors[0] if errors else None

    def prefetch(self, configs: Sequence[Mapping[str, Any]], queued: Sequence[Mapping[str, Any]] = ()) -> None:
        """Start compiling configs that will run soon: `configs` (claimed), then `queued` (the study's start, which
        only a compile pool takes ahead). Every rank must send the same configs in the same order."""
        hook = getattr(self._family, "precompile", None)
        if hook is None or self._job is None or self._family is None:
            return
        problem = self._job.problem
        for config in [*configs, *(queued if self.compiler is not None else ())]:
            key = config_hash(config)
            if key in self._ahead or key in self._checked or key in self._trivial or len(self._ahead) >= MAX_AHEAD:
                continue
            owner = self._sent % self.control.size
            self._sent += 1
            if self.compiler is not None:
                if not self._has_launches(config):  # nothing for a worker to build: its trial won't wait for one
                    self._trivial.add(key)
                    continue
                ahead = _Ahead(dict(config), owner, None, load=True)
                if owner == self.control.rank:
                    self._submit(ahead)
                self._ahead[key] = ahead
            elif self._threads is not None:
                future = self._threads.submit(hook, dict(config), problem)
                self._ahead[key] = _Ahead(dict(config), self.control.rank, future, load=False)
            else:
                continue
            phases.record("ahead", time.time(), config=dict(config), owner=owner, trial=self._trials)

    def _has_launches(self, config: Mapping[str, Any]) -> bool:
        """Whether `config` makes Triton launches (the baseline and cuBLAS modes make none). A family that can't
        say goes to the pool, whose worker then says what is wrong, as a compile failure of its trial."""
        import torch

        assert self._family is not None and self._job is not None
        try:
            return bool(self._family.standin_launches(dict(config), self._job.problem, torch.device("cpu")))
        except Exception:
            return True

    def _submit(self, ahead: _Ahead) -> None:
        assert self.compiler is not None and self._family is not None and self._job is not None
        ahead.generation = self.compiler.generation
        ahead.future = self.compiler.submit(self._family.name, ahead.config, self._job.problem, self._compile_target())

    def _pool_died(self, generation: int) -> None:
        """A compile worker died and took its pool with it: a fresh pool takes this rank's other configs again."""
        assert self.compiler is not None
        if self.compiler.restart(generation):
            log.warning("a compile worker died; compiling this config here and the others in a fresh pool")
        for ahead in self._ahead.values():
            if ahead.future is not None and ahead.generation == generation and _lost(ahead.future):
                self._submit(ahead)

    def _compile_target(self) -> CompileTarget | None:
        if self._target is None and self.world_kind == "cuda":
            self._target = CompileTarget.current()
        return self._target

    def _cancel_precompiles(self) -> None:
        for ahead in self._ahead.values():
            if ahead.future is not None:
                ahead.future.cancel()
        self._ahead.clear()
        self._load.clear()
        self._trivial.clear()
        self._sent = 0

    # ---- per trial ----------------------------------------------------------------------------
    def execute(
        self, config: Mapping[str, Any], *, deadline_s: float, on_timeout: Callable[[], None] | None = None
    ) -> Outcome:
        """Run one trial on this rank (collectively with the other ranks); never raises for a bad config."""
        assert self._job is not None and self._family is not None
        # Followers end a little after rank 0, so rank 0 records the timeout before the group dies.
        grace = 0.0 if self.control.rank == 0 else self.follower_grace_s
        self.watchdog.arm(deadline_s + grace, on_timeout if self.control.rank == 0 else None)
        try:
            return self._execute(dict(config))
        finally:
            self.watchdog.disarm()

    def _agree(self, reason: str | None, detail: str) -> tuple[str | None, str]:
        code = int(self.control.all_reduce_max([_CODES.get(reason, 0) if reason else 0])[0])
        if code == 0:
            return None, ""
        if self.control.size > 1:
            reports = self.control.all_gather((_CODES.get(reason, 0) if reason else 0, detail))
            rank = max(range(len(reports)), key=lambda r: reports[r][0])
            detail = f"rank {rank}: {reports[rank][1]}"
        return _REASONS[code], detail

    def _execute(self, config: dict[str, Any]) -> Outcome:
        job, family = self._job, self._family
        assert job is not None and family is not None
        world = self.world_for(job.world_size)
        key = config_hash(config)
        self._trials += 1
        with phases.phase("compile", trial=self._trials) as note:
            reason, detail = self._compile(key, config, note)
            reason, detail = self._agree(reason, detail)
            self._note_compiles(note)
        if reason:
            self._load.discard(key)
            return Outcome(reason, detail)
        if key not in self._checked:
            with phases.phase("check", trial=self._trials) as note:
                reason, detail = self._check(config, world, load=key in self._load)
                reason, detail = self._agree(reason, detail)
                self._note_compiles(note)
            self._load.discard(key)
            if reason:
                return Outcome(reason, detail)
            self._checked.add(key)
        self.control.barrier()
        stats = [0.0, 0.0, 0.0, 0.0]
        try:
            with phases.phase("measure", trial=self._trials) as note:
                samples = measure(
                    lambda: family.run(self._inputs, config, world),
                    world,
                    warmup=job.settings.warmup,
                    iters=job.settings.iters,
                    timing=job.settings.timing,
                )
                self._note_compiles(note)
            stats = [*percentiles(samples), samples.host_us]
            reason, detail = None, ""
        except Exception as exc:
            reason, detail = classify(exc), _detail(exc)
        code = _CODES.get(reason, 0) if reason else 0
        merged = self.control.all_reduce_max([code, *stats])
        if merged[0]:
            reason, detail = self._agree(reason, detail)
            return Outcome(reason, detail)
        return Outcome(None, "", merged[1], merged[2], merged[3], merged[4])

    def _note_compiles(self, note: dict[str, Any]) -> None:
        if self._compiles is not None:
            note.update(self._compiles.take())

    def _compile(self, key: str, config: dict[str, Any], note: dict[str, Any]) -> tuple[str | None, str]:
        """This rank's part of compiling `config` before its trial: wait for its job sent ahead (a pool's, when this
        rank owns it; a thread's), or compile it here when nobody took it ahead. The ranks agree after. `note` (the
        phase's fields) says which it was."""
        hook = getattr(self._family, "precompile", None)
        if hook is None or key in self._checked:
            note["how"] = "checked before"
            return None, ""
        ahead = self._ahead.pop(key, None)
        problem = self._job.problem if self._job else None
        try:
            if ahead is None:
                note["how"] = "here"
                hook(config, problem)
                return None, ""
            if ahead.load:
                self._load.add(key)
            if ahead.future is None:
                note["how"] = f"rank {ahead.owner}'s pool"
                return None, ""
            note["how"] = "waited for the pool" if ahead.load else "waited for a thread"
            try:
                failure = ahead.future.result()
            except (concurrent.futures.BrokenExecutor, concurrent.futures.CancelledError):
                # a worker died and took the pool's jobs with it: compile here, as without a pool
                note["how"] = "here (the pool died)"
                if self.compiler is not None:
                    self._pool_died(ahead.generation)
                self._load.discard(key)
                hook(config, problem)
                return None, ""
            if failure:
                raise CompileFailed(failure)
        except Exception as exc:
            return classify(exc, compiling=True), _detail(exc)
        return None, ""

    def _check(self, config: dict[str, Any], world: World, *, load: bool = False) -> tuple[str | None, str]:
        """Run `config` once against the reference; `load` first brings its kernels compiled elsewhere into this
        process (a read of Triton's cache), where a failure is a compile failure."""
        job, family = self._job, self._family
        assert job is not None and family is not None
        if load:
            try:
                family.precompile(config, job.problem)
            except Exception as exc:
                return classify(exc, compiling=True), _detail(exc)
        try:
            out = family.run(self._inputs, config, world)
            world.synchronize()
            if self._reference is None:
                self._reference = family.reference(self._inputs)
            err = float(family.max_error(out, self._reference))
        except Exception as exc:
            return classify(exc), _detail(exc)
        tol = family.tolerance(job.dtype)
        if math.isnan(err) or err > tol:
            return "incorrect", f"max relative error {err:.3g} > tolerance {tol:.3g} for {job.dtype}"
        return None, ""

    def close(self) -> None:
        self._cancel_precompiles()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        for world in self._worlds.values():
            world.close()
        self._worlds.clear()
