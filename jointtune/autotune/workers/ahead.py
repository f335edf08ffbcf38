"""A rank's configs compiling ahead of their trials: what was sent, who compiles it, and waiting for it.

The coordinator sends the configs it claimed ahead (`upcoming`) and, once, what the claims will run as far as it
doesn't depend on results (`queued`: the start, the sampler's random draws); they compile while the current trial runs:
- with a `CompilePool` (a tuning group on GPUs): in worker processes, each config once per group, by the rank that owns
  it (the n-th config sent is rank n % W's, the same on every rank, since every rank is sent the same configs). At the
  config's trial its owner waits for it, the ranks agree on the outcome, and each rank loads it (the family's
  `precompile`, now a read of Triton's on-disk cache) before the check. A config without Triton launches (the
  baseline, the cuBLAS modes) never goes to a worker. A worker that dies breaks the pool: that config compiles in
  the rank, and a fresh pool takes this rank's other configs again;
- else (the interpreter, a job tuning online): the family's `precompile` on a thread pool, for the claimed configs,
  on every rank, as before compile pools.
A config nobody sent ahead is compiled in the rank at its trial.

Example:
    >>> ahead = CompileAhead(control, compiler=pool)                 # doctest: +SKIP
    >>> ahead.start(family, problem)                                 # doctest: +SKIP
    >>> ahead.prefetch([config, *upcoming], queued)                  # doctest: +SKIP
    >>> ahead.wait(config_hash(config), config, note={})             # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jointtune.autotune.workers import phases
from jointtune.autotune.workers.compiler import CompileFailed, CompilePool, CompileTarget
from jointtune.search_spaces import config_hash

if TYPE_CHECKING:
    from jointtune.autotune.workers.control import Control
    from jointtune.kernels import Family

log = logging.getLogger(__name__)

#: the most configs a rank has compiling ahead at once (an exhaustive study queues every config of its space)
MAX_AHEAD = 64


@dataclass
class _Job:
    """A config sent ahead: which rank compiles it, and this rank's job for it (None where another rank compiles
    it). `load`: compiled in a worker process, so each rank loads it in process before its check; `generation`:
    the compile pool's that took the job."""

    config: dict[str, Any]
    owner: int
    future: concurrent.futures.Future[Any] | None
    load: bool
    generation: int = 0


def _lost(future: concurrent.futures.Future[Any]) -> bool:
    """Whether a dead pool took this job's result with it (cancelled, broken, or never to finish)."""
    if not future.done() or future.cancelled():
        return True
    return isinstance(future.exception(), concurrent.futures.BrokenExecutor)


class CompileAhead:
    """One rank's compiles ahead of their trials (see the module docstring)."""

    def __init__(
        self,
        control: Control,
        *,
        compiler: CompilePool | None = None,
        compile_target: CompileTarget | None = None,
        threads: int = 2,
        thread_setup: Callable[[], None] | None = None,
        world_kind: str = "local",
    ) -> None:
        """`compiler` (closed by its owner) for `compile_target` (default: this rank's GPU on a CUDA world); without
        one, `threads` threads that start with `thread_setup` (0: none)."""
        self.control, self.compiler, self.world_kind = control, compiler, world_kind
        self._target = compile_target
        self._threads = None
        if compiler is None and threads > 0:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="jointtune-precompile", initializer=thread_setup
            )
        self._family: Family | None = None
        self._problem: Any = None
        self._jobs: dict[str, _Job] = {}
        self._sent = 0  # configs sent ahead in this study: the next one's owner is rank `_sent % size`
        self._load: set[str] = set()  # configs compiled elsewhere that this rank loads before their check
        self._trivial: set[str] = set()  # configs without Triton launches: compiled (if at all) at their trial
        #: trials this rank has run (its executor counts them): when a config went ahead, in the phases log
        self.trials = 0

    def start(self, family: Family | None, problem: Any) -> None:
        """A new study: what was sent for the last one is dropped."""
        for job in self._jobs.values():
            if job.future is not None:
                job.future.cancel()
        self._jobs.clear()
        self._load.clear()
        self._trivial.clear()
        self._sent = 0
        self._family, self._problem = family, problem

    def prefetch(
        self, configs: Sequence[Mapping[str, Any]], queued: Sequence[Mapping[str, Any]] = (), *, skip: set[str]
    ) -> None:
        """Start compiling configs that will run soon: `configs` (claimed), then `queued` (only a compile pool takes
        those ahead); `skip`: configs this rank has run already. Every rank must send the same configs in order."""
        hook = getattr(self._family, "precompile", None)
        if hook is None or self._family is None:
            return
        for config in [*configs, *(queued if self.compiler is not None else ())]:
            key = config_hash(config)
            if key in self._jobs or key in skip or key in self._trivial or len(self._jobs) >= MAX_AHEAD:
                continue
            owner = self._sent % self.control.size
            self._sent += 1
            if self.compiler is not None:
                if not self._has_launches(config):  # nothing for a worker to build: its trial won't wait for one
                    self._trivial.add(key)
                    continue
                job = _Job(dict(config), owner, None, load=True)
                if owner == self.control.rank:
                    self._submit(job)
                self._jobs[key] = job
            elif self._threads is not None:
                future = self._threads.submit(hook, dict(config), self._problem)
                self._jobs[key] = _Job(dict(config), self.control.rank, future, load=False)
            else:
                continue
            phases.record("ahead", time.time(), config=dict(config), owner=owner, trial=self.trials)

    def wait(self, key: str, config: dict[str, Any], note: dict[str, Any]) -> None:
        """This rank's part of compiling `config` before its trial: wait for its job sent ahead (a pool's, when this
        rank owns it; a thread's), or compile it here when nobody took it ahead; raises what failed. `note` (the
        phase's fields) says which it was. The ranks agree after."""
        hook = getattr(self._family, "precompile", None)
        if hook is None:
            return
        job = self._jobs.pop(key, None)
        if job is None:
            note["how"] = "here"
            hook(config, self._problem)
            return
        if job.load:
            self._load.add(key)
        if job.future is None:
            note["how"] = f"rank {job.owner}'s pool"
            return
        note["how"] = "waited for the pool" if job.load else "waited for a thread"
        try:
            failure = job.future.result()
        except (concurrent.futures.BrokenExecutor, concurrent.futures.CancelledError):
            # a worker died and took the pool's jobs with it: compile here, as without a pool
            note["how"] = "here (the pool died)"
            if self.compiler is not None:
                self._pool_died(job.generation)
            self._load.discard(key)
            hook(config, self._problem)
            return
        if failure:
            raise CompileFailed(failure)

    def loads(self, key: str) -> bool:
        """Whether this rank must load `key`'s kernels (compiled by a worker) before its check; asked once."""
        if key in self._load:
            self._load.discard(key)
            return True
        return False

    def close(self) -> None:
        self.start(None, None)
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _has_launches(self, config: Mapping[str, Any]) -> bool:
        """Whether `config` makes Triton launches (the baseline and cuBLAS modes make none). A family that can't
        say goes to the pool, whose worker then says what is wrong, as a compile failure of its trial."""
        import torch

        assert self._family is not None
        try:
            return bool(self._family.standin_launches(dict(config), self._problem, torch.device("cpu")))
        except Exception:
            return True

    def _submit(self, job: _Job) -> None:
        assert self.compiler is not None and self._family is not None
        job.generation = self.compiler.generation
        job.future = self.compiler.submit(self._family.name, job.config, self._problem, self._compile_target())

    def _pool_died(self, generation: int) -> None:
        """A compile worker died and took its pool with it: a fresh pool takes this rank's other configs again."""
        assert self.compiler is not None
        if self.compiler.restart(generation):
            log.warning("a compile worker died; compiling this config here and the others in a fresh pool")
        for job in self._jobs.values():
            if job.future is not None and job.generation == generation and _lost(job.future):
                self._submit(job)

    def _compile_target(self) -> CompileTarget | None:
        if self._target is None and self.world_kind == "cuda":
            self._target = CompileTarget.current()
        return self._target
