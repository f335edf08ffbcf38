"""One rank's side of a trial: compile, check once, agree, time, agree.

Every rank of a group runs the same steps in the same order, and the ranks agree (all-reduce MAX
of a failure code) after each step that can fail, so no rank launches a collective kernel that a
peer will never join. Inputs are built once per study (fresh random data, never zeros); the
output of a config is checked against the reference the first time it runs; timings are the
identical warm-up and iteration counts on every rank, and the group's latency is the MAX over
ranks of each rank's percentiles.

Compilation overlaps benchmarking: the configs the coordinator sends ahead compile while the current trial runs, in
a compile pool's worker processes on GPUs or on threads elsewhere (`ahead`); at a config's trial the ranks wait for
it, agree, and (pool) load it before the check. Every phase goes to the phases log (`phases`).

Example:
    >>> ex = RankExecutor(SoloControl(), world_kind="local")               # doctest: +SKIP
    >>> ex.start_study(job)                                                # doctest: +SKIP
    >>> ex.execute(config, deadline_s=30.0).p50                            # doctest: +SKIP
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jointtune.autotune.tuner.settings import Job
from jointtune.autotune.tuner.timing import measure, percentiles
from jointtune.autotune.workers import phases
from jointtune.autotune.workers.ahead import CompileAhead
from jointtune.autotune.workers.compiler import CompileCounter, CompilePool, CompileTarget
from jointtune.autotune.workers.watchdog import Watchdog
from jointtune.errors import KernelError
from jointtune.search_spaces import config_hash

if TYPE_CHECKING:
    from jointtune.autotune.workers.control import Control
    from jointtune.kernels import Family
    from jointtune.kernels.runtime.world import World

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
        self.ahead = CompileAhead(
            control,
            compiler=compiler,
            compile_target=compile_target,
            threads=precompile_workers,
            thread_setup=_same_device(world_kind),
            world_kind=world_kind,
        )
        # which kernels compile in this process, by phase, for the phases log (compiled kernels only)
        self._compiles = CompileCounter.install() if world_kind == "cuda" and phases.enabled() else None
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
        self.ahead.start(self._family, job.problem)  # drops what was sent ahead for the last study
        errors = [e for e in self.control.all_gather(error) if e]
        return errors[0] if errors else None

    def prefetch(self, configs: Sequence[Mapping[str, Any]], queued: Sequence[Mapping[str, Any]] = ()) -> None:
        """Start compiling configs that will run soon: `configs` (claimed), then `queued` (what the claims will run
        as far as it doesn't depend on results). Every rank must send the same configs in the same order."""
        self.ahead.prefetch(configs, queued, skip=self._checked)

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
        self.ahead.trials += 1
        trial = self.ahead.trials
        with phases.phase("compile", trial=trial) as note:
            reason, detail = self._compile(key, config, note)
            reason, detail = self._agree(reason, detail)
            self._note_compiles(note)
        load = self.ahead.loads(key)
        if reason:
            return Outcome(reason, detail)
        if key not in self._checked:
            with phases.phase("check", trial=trial) as note:
                reason, detail = self._check(config, world, load=load)
                reason, detail = self._agree(reason, detail)
                self._note_compiles(note)
            if reason:
                return Outcome(reason, detail)
            self._checked.add(key)
        self.control.barrier()
        stats = [0.0, 0.0, 0.0, 0.0]
        try:
            with phases.phase("measure", trial=trial) as note:
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
        """This rank's part of compiling `config` before its trial (`CompileAhead.wait`), as a failure reason."""
        if key in self._checked:
            note["how"] = "checked before"
            return None, ""
        try:
            self.ahead.wait(key, config, note)
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
        self.ahead.close()
        for world in self._worlds.values():
            world.close()
        self._worlds.clear()
