"""A model as tuning jobs: every fused-op shape of its decoder layer (`jointtune.tp.shapes`) as a `Job`.

`jointtune tune --model CONFIG --tp W --tokens ... --kv-lens ...` and a sweep file's `model:` jobs both expand
here, so the two tune the same studies (a sweep resumes what `tune --model` started, and the other way round).
Ops of one shape (two layers' GEMMs that happen to match) are one job. The plan keeps the op list beside the jobs,
so the end of a run can print the model's per-layer table (`layer_rows`).

Example:
    >>> plan = model_plan("llama-3-8b", tp=2, tokens=[8, 4096], kv_lens=[4096])
    >>> len(plan.ops), len(plan.jobs), job_label(plan.jobs[0])
    (19, 15, 'ag_gemm M=8,N=6144,K=4096 bfloat16 w2')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jointtune.autotune.tuner.results import job_label as job_label  # the jobs' names, as progress shows them
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.errors import SpaceError, TuningError


@dataclass(frozen=True)
class ModelPlan:
    """A model's ops at one TP degree and the jobs that tune them (`job_of[i]`: ops[i]'s job, or None)."""

    name: str
    tp: int
    ops: tuple[Any, ...]
    jobs: tuple[Job, ...]
    job_of: tuple[Job | None, ...]


def parse_counts(option: str, text: str) -> list[int]:
    """`"1,8,32,4096"` as integers >= 1; TuningError naming the option otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() and int(p) >= 1 for p in parts):
        raise TuningError(f"{option}: {text!r} is not allowed; give comma-separated integers >= 1, e.g. 1,8,32,4096")
    return [int(p) for p in parts]


def model_plan(model: str, *, tp: int, tokens: Sequence[int], kv_lens: Sequence[int], dtype: str = "bfloat16",
               settings: TuneSettings | None = None, attention: str = "head", decode_max: int | None = None,
               timings: Sequence[str] | None = None) -> ModelPlan:  # fmt: skip
    """The ops of `model` (a shipped config name or a config.json path) and one job per distinct tunable shape and
    timing policy (default: the settings' own); ModelConfigError or SpaceError naming what doesn't fit."""
    from jointtune.autotune.tuner.handles import study_space
    from jointtune.autotune.tuner.search import check_study
    from jointtune.kernels import get_family
    from jointtune.tp.model_config import load_model_config
    from jointtune.tp.shapes import DECODE_MAX, model_op_shapes

    settings = settings or TuneSettings()
    if settings.restrict:
        raise TuningError("restrict: not allowed with a model; its ops are of several families with other params")
    config = load_model_config(model)
    ops = model_op_shapes(config, tp=tp, tokens=tokens, kv_lens=kv_lens, attention=attention,
                          decode_max=DECODE_MAX if decode_max is None else decode_max)  # fmt: skip
    jobs: dict[Job, None] = {}
    job_of: list[Job | None] = []
    kept = []
    for op in ops:
        if op.kernel is None:
            job_of.append(None)
            kept.append(op)
            continue
        family = get_family(op.kernel)
        space = study_space(family, settings)
        try:
            problem = family.stored_problem(space.make_problem(op.shape, dtype=dtype, world_size=op.world_size))
        except SpaceError as exc:  # e.g. a head dim the decode kernel has no variant for: the layer uses SDPA there
            job_of.append(None)
            kept.append(dataclasses.replace(op, kernel=None, note=f"{op.kernel} can't run it: {exc}"))
            continue
        check_study(space, problem, settings)
        kept.append(op)
        first = None
        for timing in timings or [settings.timing]:
            job = Job.of(family.name, problem, settings.replace(timing=timing))
            jobs.setdefault(job, None)
            first = first or job
        job_of.append(first)
    return ModelPlan(config.name, tp, tuple(kept), tuple(jobs), tuple(job_of))


#: ops that are an alternative form of another op of the layer (a stack's last down projection), not in its total
_NOT_IN_TOTAL = {"down_last"}


def layer_rows(plan: ModelPlan, results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per op of the plan: tokens, op, layout, kernel, shape, W, mode, best and baseline µs, speedup (best
    unfused path / best), or the op's note where nothing was tuned; then per token count and layout the layer's
    tuned ops together (`op` = "layer (sp)": its four fused GEMMs; "layer (standard)": o_proj and down with their
    epilogues, as every layer of a stack but the last runs them)."""
    by_job = {r.job: r for r in results}
    rows: list[dict[str, Any]] = []
    totals: dict[tuple[int, str], list[float]] = {}
    tuned: dict[tuple[int, str], int] = {}  # ops with a job, per (tokens, layout), that a total counts
    for op, job in zip(plan.ops, plan.job_of):
        in_total = op.layout in ("sp", "standard") and op.op not in _NOT_IN_TOTAL and job is not None
        if in_total:
            tuned[(op.tokens, op.layout)] = tuned.get((op.tokens, op.layout), 0) + 1
        result = by_job.get(job) if job is not None else None
        row = {"tokens": op.tokens, "op": op.op, "layout": op.layout, "kernel": op.kernel or "-", "shape": op.shape,
               "world_size": op.world_size, "kv_len": op.kv_len, "mode": None, "best_us": None, "baseline_us": None,
               "speedup": None, "note": op.note}  # fmt: skip
        if result is not None:
            config = result.best_config or {}
            row.update(mode=config.get("mode"), best_us=result.best_us, baseline_us=result.baseline_us,
                       speedup=result.speedup)  # fmt: skip
            if result.best_us is None:
                row["note"] = "not tuned: no config measured"
            if in_total:
                total = totals.setdefault((op.tokens, op.layout), [0.0, 0.0, 0])
                if result.best_us is not None and result.baseline_us is not None:
                    total[0] += result.best_us
                    total[1] += result.baseline_us
                    total[2] += 1
        rows.append(row)
    for (tokens, layout), (best, base, count) in totals.items():
        n = tuned[(tokens, layout)]
        note = "" if count == n else f"{n - count} of {n} {layout} ops without a result"
        rows.append({"tokens": tokens, "op": f"layer ({layout})", "layout": layout, "kernel": "-", "shape": {},
                     "world_size": plan.tp, "kv_len": None, "mode": None, "best_us": best if count else None,
                     "baseline_us": base if count else None, "speedup": base / best if count and best else None,
                     "note": note})  # fmt: skip
    order = {"qkv": 0, "o_proj": 1, "gate_up": 2, "down": 3, "down_last": 4, "layer (sp)": 5, "layer (standard)": 5,
             "attn": 6}  # fmt: skip
    layouts = {"sp": 0, "standard": 1, "head": 2, "context": 3}
    rows.sort(key=lambda r: (r["tokens"], layouts.get(r["layout"], 9), order.get(r["op"], 9), r["kv_len"] or 0))
    return rows
