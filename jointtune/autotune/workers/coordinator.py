"""Rank 0 of a tuning group: picks the next study with work left, claims trials, tells results.

A group serves a list of jobs (from a registered sweep, or one `tune` call). For each job it
opens the study named after the job's tuning key, initialises it once (warm-start queue, under
the study lock), and runs trials until the study has no work left for it: claim (under the lock:
budget check, ask, validate, stamp owner, heartbeat) -> broadcast -> every rank executes ->
tell -> publish a new best to the store. Claims run `lookahead` trials ahead so that ranks can
precompile the next configs while the current one is timed, and every claimed trial runs unless the
study's budget is spent first; the study's queued start (its enqueued configs, known before any
trial runs) and the sampler's random draws after it (`Searcher.preview`) go to the ranks with the
first trial, so a compile pool builds all of them at once.
A search that finds no new config while trials are running (a claim ahead in a small sub-space,
or another group's trials) does not stop the study: one of them may still fail and be enqueued
again, so the study waits for them and stops as "exhausted" only once none is left. When every
study is done or held by running trials of other groups, it recovers dead owners' trials and waits.

Example:
    >>> Coordinator(url=url, jobs=lambda: [job], group=GroupInfo("g0", "local", 1),
    ...             control=SoloControl(), executor=executor).run()          # doctest: +SKIP
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from jointtune.autotune.tuner.finalists import COUNT, MARGIN, FinalRound
from jointtune.autotune.tuner.handles import StudyHandle
from jointtune.autotune.tuner.locks import study_lock
from jointtune.autotune.tuner.search import Proposal
from jointtune.autotune.tuner.settings import MAX_SECONDS, Job
from jointtune.autotune.tuner.studies import (
    ATTR_DEADLINE,
    ATTR_DETAIL,
    ATTR_HOST,
    ATTR_OWNER,
    ATTR_P10,
    ATTR_P50,
    ATTR_P90,
    ATTR_REASON,
    COUNTED_FAILURES,
    STUDY_FINAL,
    STUDY_STOPPED,
    StudyState,
    open_storage,
    retry_interrupted,
)
from jointtune.autotune.workers import phases
from jointtune.autotune.workers.ahead import MAX_AHEAD
from jointtune.autotune.workers.recovery import Heartbeat, Owner, recover_study
from jointtune.errors import TuningError

if TYPE_CHECKING:
    from jointtune.autotune.workers.control import Control
    from jointtune.autotune.workers.executor import Outcome, RankExecutor

log = logging.getLogger(__name__)


class GroupRestart(TuningError):
    """This group must end and be restarted (a rank crashed or its CUDA context is gone)."""


@dataclass(frozen=True)
class GroupInfo:
    """Who this group is: a stable id (kept across its restarts), its world kind and rank count."""

    group_id: str
    world_kind: str
    nprocs: int

    def accepts(self, job: Job) -> bool:
        """One process per rank serves only jobs of its world size; one local process serves any."""
        return (self.nprocs == 1 and self.world_kind == "local") or job.world_size == self.nprocs


@dataclass(frozen=True)
class GroupOptions:
    """Worker-level timing: heartbeats, how long until a silent trial is stale, polling."""

    heartbeat_s: int = 5
    grace_s: int = 30
    poll_s: float = 1.0


class Coordinator:
    """The tuning loop of rank 0; followers run `follow` (module `group`)."""

    def __init__(
        self,
        *,
        url: str,
        jobs: Callable[[], Sequence[Job]],
        group: GroupInfo,
        control: Control,
        executor: RankExecutor,
        options: GroupOptions = GroupOptions(),
    ) -> None:
        from jointtune.db import open_store
        from jointtune.hardware import current_limits, detect

        self.url, self.jobs, self.group, self.options = url, jobs, group, options
        self.control, self.executor = control, executor
        with phases.phase("coordinator"):
            self.store = open_store(url)
            self.storage = open_storage(url, heartbeat_interval=options.heartbeat_s, grace_period=options.grace_s)
            self.fingerprint = detect()
            self.limits = current_limits()
            self.owner = Owner.current(group.group_id)
            self.heartbeat = Heartbeat(self.storage, options.heartbeat_s)
            self._handles: dict[Job, StudyHandle] = {}
            # study name -> its running and waiting trials when a claim last found nothing new (see `drained`)
            self._drained: dict[str, frozenset[int]] = {}
            # set by our supervisor when it restarts this group: when the previous incarnation died
            last_death = os.environ.get("JOINTTUNE_LAST_DEATH")
            self.death_time = float(last_death) if last_death else None
            self.store.upsert_hardware(
                hardware_id=self.fingerprint.hardware_id,
                name=self.fingerprint.name,
                fingerprint=self.fingerprint.to_json(),
            )

    # ---- studies ------------------------------------------------------------------------------
    def handle(self, job: Job) -> StudyHandle:
        """Open (and on first use initialise) the study of `job` for this hardware."""
        if job not in self._handles:
            with phases.phase("study"):
                h = StudyHandle.open(job, url=self.url, storage=self.storage, store=self.store, limits=self.limits,
                                     hardware_id=self.fingerprint.hardware_id)  # fmt: skip
                self._recover(h)
            self._handles[job] = h
        return self._handles[job]

    def _recover(self, h: StudyHandle) -> list[tuple[int, str]]:
        return recover_study(
            h.study, group=self.group.group_id, unowned_after_s=self.options.grace_s, death_time=self.death_time
        )

    def next_study(self) -> StudyHandle | None:
        """The first study (in job order) with a trial to claim; waits while others hold the rest."""
        while True:
            held = False
            for job in self.jobs():
                if not self.group.accepts(job):
                    continue
                h = self.handle(job)
                state = h.state()
                if state.done(job.settings):
                    continue
                if not self._claimable(h, state) and self._recover(h):
                    state = h.state()
                if self._claimable(h, state):
                    return h
                held = held or not state.done(job.settings)
            if not held:
                return None
            time.sleep(self.options.poll_s)

    def _claimable(self, h: StudyHandle, state: StudyState) -> bool:
        return state.available(h.job.settings) > 0 and not self.drained(h)

    def _open_trials(self, h: StudyHandle) -> frozenset[int]:
        trials = h.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
        return frozenset(t._trial_id for t in trials)

    def drained(self, h: StudyHandle) -> bool:
        """Whether the last claim found no new config while trials were running, and none of them has
        ended (nor a trial been enqueued) since: asking again would only find nothing again."""
        seen = self._drained.get(h.name)
        if seen is None:
            return False
        if seen == self._open_trials(h):
            return True
        del self._drained[h.name]
        return False

    # ---- trials -------------------------------------------------------------------------------
    def claim(self, h: StudyHandle) -> Proposal | None:
        """A new trial of the study, stamped as this group's; None when it has none to give now."""
        with phases.phase("claim"), study_lock(self.url, h.name):
            if h.state().available(h.job.settings) <= 0 or self.drained(h):
                return None
            asked: list[int] = []

            def stamp(trial: optuna.Trial) -> None:
                trial.set_user_attr(ATTR_OWNER, self.owner.to_json())
                self.heartbeat.add(trial._trial_id)
                asked.append(trial._trial_id)

            proposal = h.searcher.propose(h.study, on_ask=stamp)
            for trial_id in asked:  # invalid and repeated suggestions are finished already
                if isinstance(proposal, str) or trial_id != proposal.trial._trial_id:
                    self.heartbeat.discard(trial_id)
            if isinstance(proposal, str):
                self._stop(h, proposal)
                return None
            return proposal

    def _stop(self, h: StudyHandle, reason: str) -> None:
        """Stop the study for the searcher's `reason`, unless it is "exhausted" while trials still run.

        Those trials (claimed ahead by this group, or by others) hold the last unmeasured configs: a
        stop now would make their groups give them back unrun, and one that fails as interrupted is
        enqueued again. So the study waits (`drained`) and is asked again when one of them ends.
        """
        running = h.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if reason == "exhausted" and running:
            self._drained[h.name] = self._open_trials(h)
            log.info("study %s: no new config to claim while %d trial(s) run", h.name, len(running))
            return
        # every valid config measured is a normal end; a sampler lost among invalid configs is not
        (log.info if reason == "exhausted" else log.warning)("study %s stops: %s", h.name, reason)
        h.study.set_user_attr(STUDY_STOPPED, reason)

    def _budget_spent(self, h: StudyHandle) -> bool:
        """Whether the study's budget (trials, time, patience) is used up, so trials claimed ahead are not
        needed. A stop is not: what was claimed before it are valid configs without a result, and they run."""
        state = dataclasses.replace(h.state(), stopped=None)
        return state.done(h.job.settings) is not None

    def deadline_s(self, h: StudyHandle) -> float:
        s = h.job.settings
        if h.baseline_us is None:
            return s.first_trial_timeout_s
        runs = s.warmup + s.iters + 1
        deadline = s.watchdog_compile_s + s.watchdog_factor * runs * h.baseline_us / 1e6 + s.watchdog_slack_s
        return min(deadline, MAX_SECONDS)  # each term is bounded, their sum times a count need not be

    def run(self) -> None:
        if not any(self.group.accepts(job) for job in self.jobs()):
            log.warning(
                "group %s (%d ranks) serves no job: every job has another world size",
                self.group.group_id,
                self.group.nprocs,
            )
        try:
            while (h := self.next_study()) is not None:
                self.run_study(h)
        finally:
            self.heartbeat.close()
        self.control.broadcast({"op": "stop"})

    def run_study(self, h: StudyHandle) -> None:
        self.control.broadcast({"op": "study", "job": h.job.to_json()})
        error = self.executor.start_study(h.job)
        if error:
            log.error("study %s can't run: %s", h.name, error)
            h.study.set_user_attr(STUDY_STOPPED, f"inputs: {error}"[:500])
            return
        has_hook = getattr(h.family, "precompile", None) is not None
        depth = 1 + (h.job.settings.lookahead if has_hook else 0)
        pending: collections.deque[Proposal] = collections.deque()
        # what the claims will run as far as it doesn't depend on results (the start, the random draws): sent once
        queued = self._preview(h, depth) if has_hook and self.executor.compiler is not None else []
        h.state()
        while True:
            while len(pending) < depth and (proposal := self.claim(h)) is not None:
                pending.append(proposal)
            if not pending:
                break
            current = pending.popleft()
            if self._budget_spent(h):  # a claimed-ahead trial the study no longer needs
                for proposal in (current, *pending):
                    self.release(h, proposal, retry=False)
                break
            outcome = self._execute(h, current, [p.config for p in pending], queued)
            queued = []
            with phases.phase("finish"):
                self.finish(h, current, outcome)
            if outcome.fatal:
                for proposal in pending:
                    self.release(h, proposal)
                raise GroupRestart(f"trial {current.number} of {h.name} crashed: {outcome.detail}")
        self.final_round(h)

    def final_round(self, h: StudyHandle) -> None:
        """Once the study has no trial left to run, time its finalists again side by side (`finalists`), note the
        round on the study and publish its pick. Skipped while any trial runs or waits (another group's), when a
        round already judged these trials, and with `final_rounds` 0."""
        rounds = h.job.settings.final_rounds
        state = h.state()
        if not rounds or state.done(h.job.settings) is None or state.running or state.waiting:
            return
        if state.final is not None:
            return
        deadline = self.deadline_s(h)

        def measure(config: dict[str, Any]) -> tuple[float, float, float] | None:
            self.control.broadcast({"op": "trial", "config": config, "deadline_s": deadline, "upcoming": []})
            outcome = self.executor.execute(config, deadline_s=deadline)
            if outcome.fatal:
                raise GroupRestart(f"the final round of {h.name} crashed: {outcome.detail}")
            if not outcome.ok:
                log.warning("%s: the final round left out a config that failed: %s", h.name, outcome.reason)
                return None
            return outcome.p10, outcome.p50, outcome.p90  # type: ignore[return-value]

        with phases.phase("final"):
            chosen = state.finalists(margin=MARGIN, count=COUNT)
            final = FinalRound.run(chosen, measure, counted=state.trial_count, rounds=rounds)
            if final is None or final.pick is None:
                return
            h.study.set_user_attr(STUDY_FINAL, final.to_json())
            judged = h.state()
            if judged.final is not None:
                log.info("%s: %s", h.name, final.summary())
                h.publish(judged, store=self.store, limits=self.limits)

    def _preview(self, h: StudyHandle, depth: int) -> list[dict[str, Any]]:
        state = h.state()
        left = state.budget(h.job.settings) - state.trial_count - state.running
        with phases.phase("preview") as note:
            configs = h.searcher.preview(h.study, depth=depth, limit=max(0, min(left, MAX_AHEAD)))
            note["configs"] = len(configs)
        return configs

    def _execute(
        self, h: StudyHandle, current: Proposal, upcoming: list[dict[str, Any]], queued: list[dict[str, Any]]
    ) -> Outcome:
        deadline = self.deadline_s(h)
        current.trial.set_user_attr(ATTR_DEADLINE, time.time() + deadline)
        command = {"op": "trial", "config": current.config, "deadline_s": deadline, "upcoming": upcoming}
        if queued:
            command["queued"] = queued
        self.control.broadcast(command)
        self.executor.prefetch([current.config, *upcoming], queued)

        def on_timeout() -> None:
            self._tell_failure(h, current, "timeout", f"no result within the {deadline:.1f} s watchdog")

        return self.executor.execute(current.config, deadline_s=deadline, on_timeout=on_timeout)

    def _tell_failure(self, h: StudyHandle, p: Proposal, reason: str, detail: str) -> None:
        p.trial.set_user_attr(ATTR_REASON, reason)
        p.trial.set_user_attr(ATTR_DETAIL, detail[:2000])
        h.study.tell(p.trial, state=TrialState.PRUNED)

    def finish(self, h: StudyHandle, p: Proposal, outcome: Outcome) -> None:
        """Tell Optuna the outcome; publish the study's best to the store when this trial is it, else raise the
        trial count of the record the study made."""
        try:
            if outcome.ok:
                p.trial.set_user_attr(ATTR_P10, outcome.p10)
                p.trial.set_user_attr(ATTR_P50, outcome.p50)
                p.trial.set_user_attr(ATTR_P90, outcome.p90)
                if outcome.host_us is not None:
                    p.trial.set_user_attr(ATTR_HOST, outcome.host_us)
                h.study.tell(p.trial, outcome.p50)
            else:
                self._tell_failure(h, p, outcome.reason or "error", outcome.detail)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError, RuntimeError) as exc:
            log.warning("trial %d of %s was already resolved elsewhere: %s", p.number, h.name, exc)
        finally:
            self.heartbeat.discard(p.trial._trial_id)
        result = f"p50 {outcome.p50:,.1f} µs" if outcome.ok else f"failed: {outcome.reason}"
        log.info("%s: trial %d %s: %s", h.name, p.number, p.key, result)
        if outcome.ok or outcome.reason in COUNTED_FAILURES:  # a trial: its record's count moves with it
            state = h.state()
            if state.best is not None and state.best.number == p.number:
                h.publish(state, store=self.store, limits=self.limits)
            elif state.best is not None:
                h.note_trials(state, store=self.store)

    def release(self, h: StudyHandle, p: Proposal, *, retry: bool = True) -> None:
        """Give back a claimed trial that never ran: FAIL it (and enqueue its config again)."""
        try:
            self.storage.set_trial_state_values(p.trial._trial_id, TrialState.FAIL)
            if retry:
                retry_interrupted(h.study, self.storage.get_trial(p.trial._trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
        self.heartbeat.discard(p.trial._trial_id)
