"""Sweep files: which kernels, shapes, dtypes and world sizes to tune, per kind of machine.

```yaml
name: readme                      # the sweep's name in the shared storage (default: file stem)
imports: []                       # modules every rank imports first (out-of-tree families)
tuning: {strategy: tpe, seed: 0}  # defaults for every job (any TuneSettings field, see below)
profiles:
  cpu:                            # used where no GPU is visible (Triton's interpreter)
    tuning: {warmup: 1, iters: 3}
    jobs:
      - kernel: ag_gemm
        shapes: [64x64x64, "M=128,N=64,K=128"]
        dtypes: [bf16]
        world_size: 2             # or a list: [2, 4]
        trials: 10
        time_budget: 60           # seconds of trial time per shape
  gpu:
    jobs:
      - {kernel: ag_gemm, shapes: [8192x4096x12288], dtypes: [bf16], world_size: 2, trials: 64}
      - model: llama-3-70b        # every fused-op shape of a model's layer (as `jointtune tune --model`)
        tp: [2, 4]                # an int or a list
        tokens: [1, 8, 32, 4096]
        kv_lens: [4096, 32768]    # decode attention at these KV lengths (token counts up to decode_max: 256)
        attention: head           # head (the layer's), context (KV split by sequence) or both
        trials: 32
```
Tuning fields: trials, time_budget, patience, strategy (tpe | random | exhaustive), seed, warmup,
iters, warm_start, n_startup, lookahead, final_rounds (0: keep the fastest trial), max_invalid_streak,
max_duplicate_streak, restrict ({param: [values]}: search only that sub-space), timing (gpu | eager | graph, or a list:
each policy is tuned as a job of its own; graph needs the gpu profile), allow_nondeterministic (true |
false, default false: offer modes whose results may differ in the last bits between identical calls,
e.g. gemm_rs's atomic; a study of its own), watchdog: {compile_s, factor, slack_s, first_trial_s}.
A job's fields override its profile's `tuning`, which overrides the file's.
Every error names its line and field:
"sweep.yaml: line 9: profiles.cpu.jobs[0].trials: Input should be greater than or equal to 1 (got 0)";
broken YAML says where it broke: "sweep.yaml:4:12: not valid YAML: mapping values are not allowed here".

Example:
    >>> sweep = load_sweep_file("examples/sweep.yaml")           # doctest: +SKIP
    >>> [job.label for job in sweep.jobs("cpu")]                  # doctest: +SKIP

Longer than 300 lines because the format's documentation above, its models (one per YAML level) and
their expansion into jobs are one thing: every error names a line and a field that the models define.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, ValidationError

from jointtune.autotune.tuner.settings import MAX_COUNT, MAX_SECONDS, Job, TuneSettings
from jointtune.db.schema import NAME_CHARS, NAME_RE
from jointtune.errors import JointtuneError, TuningError
from jointtune.timings import TIMINGS

#: a sweep's name is part of every study name it registers, which the study storage keeps in 512 characters
MAX_SWEEP_NAME = 128


class SweepFileError(TuningError, ValueError):
    """A sweep file that can't be read or names something invalid (the message names the field)."""


class _Strict(BaseModel):
    # strict: YAML already gives typed values, so `true` is no dim and "64" no trial count
    model_config = ConfigDict(extra="forbid", strict=True)


#: seconds (and the watchdog's factor): finite, > 0 and within what a timer can be armed for
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
#: counts: what a 32-bit column holds
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Count0 = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class WatchdogModel(_Strict):
    compile_s: Seconds | None = None
    factor: Seconds | None = None
    slack_s: Seconds | None = None
    first_trial_s: Seconds | None = None


Timing = Literal[TIMINGS]


class TuningModel(_Strict):
    trials: Count | None = None
    time_budget: Seconds | None = None
    patience: Count | None = None
    strategy: Literal["tpe", "random", "exhaustive"] | None = None
    seed: int | None = Field(None, ge=0, lt=2**32)  # the samplers' generators take 32 bits
    warmup: Count0 | None = None
    iters: Count | None = None
    warm_start: Count0 | None = None
    n_startup: Count | None = None
    lookahead: Count0 | None = None
    final_rounds: Count0 | None = None
    max_invalid_streak: Count | None = None
    max_duplicate_streak: Count | None = None
    restrict: dict[str, list[int | str | bool] | int | str | bool] | None = None
    timing: Timing | Annotated[list[Timing], Field(min_length=1)] | None = None
    allow_nondeterministic: StrictBool | None = None
    watchdog: WatchdogModel | None = None

    def timings(self) -> list[str] | None:
        """The timing policies this block asks for (None: inherited)."""
        if self.timing is None:
            return None
        return list(dict.fromkeys([self.timing] if isinstance(self.timing, str) else self.timing))

    def settings_changes(self) -> dict[str, Any]:
        """The fields this block sets, as TuneSettings field names (timing apart: it may be a list)."""
        names = {"time_budget": "time_budget_s"}
        own = set(TuningModel.model_fields) - {"watchdog", "timing"}
        out = {names.get(k, k): v for k, v in self.model_dump(exclude_none=True, include=own).items()}
        if self.watchdog is not None:
            dog = {
                "compile_s": "watchdog_compile_s",
                "factor": "watchdog_factor",
                "slack_s": "watchdog_slack_s",
                "first_trial_s": "first_trial_timeout_s",
            }
            out.update({dog[k]: v for k, v in self.watchdog.model_dump(exclude_none=True).items()})
        return out


class JobModel(TuningModel):
    kernel: str = Field(min_length=1)
    shapes: list[str | dict[str, int]] = Field(min_length=1)
    dtypes: list[str] = Field(default_factory=lambda: ["bfloat16"], min_length=1)
    world_size: int | Annotated[list[int], Field(min_length=1)] = 2


class ModelJobModel(TuningModel):
    """A model's decoder layer: its fused-op shapes at each TP degree (`autotune.workers.sweeps.models`)."""

    model: str = Field(min_length=1)
    tp: int | Annotated[list[int], Field(min_length=1)]  # each checked against the model (ModelConfig.check_tp)
    tokens: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    kv_lens: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    attention: Literal["head", "context", "both"] = "head"
    decode_max: Annotated[int, Field(ge=1)] = 256
    dtypes: list[str] = Field(default_factory=lambda: ["bfloat16"], min_length=1)


def _job_kind(value: Any) -> str:
    return "model" if isinstance(value, dict) and "model" in value else "kernel"


#: a job entry: a kernel's shapes, or a model's (told apart by its `model:` key)
JobEntry = Annotated[
    Annotated[JobModel, Tag("kernel")] | Annotated[ModelJobModel, Tag("model")], Discriminator(_job_kind)
]


class ProfileModel(_Strict):
    tuning: TuningModel = Field(default_factory=TuningModel)
    jobs: list[JobEntry] = Field(min_length=1)


class SweepModel(_Strict):
    name: str | None = None  # checked in parse_sweep: it may also come from the file's stem
    imports: list[str] = Field(default_factory=list)
    tuning: TuningModel = Field(default_factory=TuningModel)
    profiles: dict[Literal["gpu", "cpu"], ProfileModel] = Field(min_length=1)


@dataclass(frozen=True)
class SweepFile:
    """A validated sweep: its name, imports, and the jobs of each profile."""

    name: str
    imports: tuple[str, ...]
    profiles: dict[str, tuple[Job, ...]]
    #: per profile, the model plans (`autotune.workers.sweeps.models.ModelPlan`) its `model:` jobs expanded into
    models: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def jobs(self, profile: str) -> tuple[Job, ...]:
        if profile not in self.profiles:
            have = ", ".join(sorted(self.profiles))
            raise SweepFileError(f"profile: {profile!r} is not in sweep {self.name!r}; it has: {have}")
        return self.profiles[profile]


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


#: where a field is in the file: its line (1-based) for a loc such as ("profiles", "cpu", "jobs", 0)
LineOf = Callable[[tuple[Any, ...]], "int | None"]


class _Problems:
    """Problems found in a sweep, each named by its field and, when known, its line in the file."""

    def __init__(self, line_of: LineOf | None) -> None:
        self.line_of = line_of
        self.items: list[str] = []

    def add(self, loc: tuple[Any, ...], text: str) -> None:
        line = self.line_of(loc) if self.line_of is not None else None
        item = f"line {line}: {text}" if line is not None else text
        if item not in self.items:
            self.items.append(item)


def _pydantic_problems(exc: ValidationError, problems: _Problems) -> None:
    seen: set[tuple[Any, ...]] = set()
    for err in exc.errors():
        # unions report one error per member; the member name in the loc only adds noise, and the
        # first member's message says what is allowed; a job's tag (kernel or model) follows its index
        raw = err["loc"]
        loc = tuple(p for i, p in enumerate(raw) if not (isinstance(p, str) and (p in ("str", "int") or "[" in p))
                    and not (i >= 2 and raw[i - 2] == "jobs" and isinstance(raw[i - 1], int)
                             and p in ("kernel", "model")))  # fmt: skip
        if loc in seen:
            continue
        seen.add(loc)
        got = f" (got {err['input']!r})" if not isinstance(err.get("input"), (dict, list)) else ""
        problems.add(loc, f"{_loc(loc)}: {err['msg']}{got}")


def _jobs(
    loc: tuple[Any, ...], model: JobModel, base: TuneSettings, problems: _Problems, timings: list[str]
) -> list[Job]:
    from jointtune.autotune.tuner.handles import study_space
    from jointtune.autotune.tuner.search import check_study
    from jointtune.kernels import get_family

    where = _loc(loc)
    try:
        family = get_family(model.kernel)
        settings = base.replace(**model.settings_changes())
        space = study_space(family, settings)
    except JointtuneError as exc:
        problems.add(loc, f"{where}: {exc}")
        return []
    sizes = model.world_size if isinstance(model.world_size, list) else [model.world_size]
    jobs = []
    for i, shape in enumerate(model.shapes):
        for dtype in model.dtypes:
            for w in sizes:
                try:
                    problem = family.stored_problem(space.make_problem(shape, dtype=dtype, world_size=w))
                    check_study(space, problem, settings)
                except JointtuneError as exc:
                    problems.add((*loc, "shapes", i), f"{where}.shapes[{i}] ({shape}, {dtype}, world_size {w}): {exc}")
                    continue
                jobs.extend(Job.of(family.name, problem, settings.replace(timing=t)) for t in timings)
    return jobs


def _model_jobs(loc: tuple[Any, ...], model: ModelJobModel, base: TuneSettings, problems: _Problems,
                timings: list[str]) -> tuple[list[Job], list[Any]]:  # fmt: skip
    """A `model:` job's jobs, one plan per TP degree and dtype (`autotune.workers.sweeps.models`)."""
    from jointtune.autotune.workers.sweeps.models import model_plan

    where = _loc(loc)
    try:
        settings = base.replace(**model.settings_changes())
    except JointtuneError as exc:
        problems.add(loc, f"{where}: {exc}")
        return [], []
    jobs, plans = [], []
    for tp in model.tp if isinstance(model.tp, list) else [model.tp]:
        for dtype in model.dtypes:
            try:
                plan = model_plan(model.model, tp=tp, tokens=model.tokens, kv_lens=model.kv_lens, dtype=dtype,
                                  settings=settings, attention=model.attention, decode_max=model.decode_max,
                                  timings=timings)  # fmt: skip
            except JointtuneError as exc:
                problems.add((*loc, "model"), f"{where} ({model.model}, tp {tp}, {dtype}): {exc}")
                continue
            plans.append(plan)
            jobs.extend(plan.jobs)
    return jobs, plans


def parse_sweep(
    data: Any, *, source: str = "sweep", default_name: str = "sweep", line_of: LineOf | None = None
) -> SweepFile:
    """Validate sweep data (parsed YAML); SweepFileError lists every problem with its field (and
    its line, given `line_of`)."""
    problems = _Problems(line_of)
    try:
        model = SweepModel.model_validate(data)
    except ValidationError as exc:
        _pydantic_problems(exc, problems)
        raise SweepFileError(f"{source}: " + "; ".join(problems.items)) from None
    for i, module in enumerate(model.imports):
        try:
            importlib.import_module(module)
        except Exception as exc:  # a bad name (ValueError, TypeError) or a module that fails as it loads
            problems.add(("imports", i), f"imports[{i}]: {module!r} can't be imported ({type(exc).__name__}: {exc})")
            raise SweepFileError(f"{source}: " + "; ".join(problems.items)) from None
    try:
        base = TuneSettings().replace(**model.tuning.settings_changes())
    except JointtuneError as exc:
        problems.add(("tuning",), f"tuning: {exc}")
        raise SweepFileError(f"{source}: " + "; ".join(problems.items)) from None
    profiles: dict[str, tuple[Job, ...]] = {}
    models: dict[str, tuple[Any, ...]] = {}
    for name, profile in model.profiles.items():
        try:
            settings = base.replace(**profile.tuning.settings_changes())
        except JointtuneError as exc:
            problems.add(("profiles", name, "tuning"), f"profiles.{name}.tuning: {exc}")
            continue
        jobs: list[Job] = []
        plans: list[Any] = []
        for j, job in enumerate(profile.jobs):
            loc = ("profiles", name, "jobs", j)
            timings = job.timings() or profile.tuning.timings() or model.tuning.timings() or [settings.timing]
            if name == "cpu" and "graph" in timings:
                where = loc if job.timing is not None else ("profiles", name) if profile.tuning.timing else ("tuning",)
                problems.add((*where, "timing"),
                             f"{_loc(loc)}.timing: 'graph' is not allowed in the cpu profile (no CUDA graphs in "
                             "the interpreter); allowed there: gpu, eager")  # fmt: skip
                continue
            if isinstance(job, ModelJobModel):
                expanded, job_plans = _model_jobs(loc, job, settings, problems, timings)
                jobs.extend(expanded)
                plans.extend(job_plans)
            else:
                jobs.extend(_jobs(loc, job, settings, problems, timings))
        profiles[name] = tuple(dict.fromkeys(jobs))
        if plans:
            models[name] = tuple(plans)
    name = model.name if model.name is not None else default_name
    if not (len(name) <= MAX_SWEEP_NAME and re.fullmatch(NAME_RE, name)):
        from_stem = "" if model.name is not None else " (the file's stem, the default: set name:)"
        allowed = f"use 1 to {MAX_SWEEP_NAME} of {NAME_CHARS}"
        problems.add(("name",), f"name: {name[:80]!r}{from_stem} is not allowed; {allowed}")
    if problems.items:
        raise SweepFileError(f"{source}: " + "; ".join(problems.items))
    return SweepFile(name, tuple(model.imports), profiles, models)


def _line_finder(root: yaml.Node | None) -> LineOf:
    """Where a field is in the file: the line of the deepest node (or key) its loc reaches."""

    def line_of(loc: tuple[Any, ...]) -> int | None:
        node, line = root, None
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            if isinstance(node, yaml.MappingNode):
                pair = next(((k, v) for k, v in node.value if str(getattr(k, "value", "")) == str(part)), None)
                node = pair[1] if pair else None
                line = pair[0].start_mark.line + 1 if pair else line
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
            else:
                node = None
        return node.start_mark.line + 1 if node is not None else line

    return line_of


def load_sweep_file(path: str | Path) -> SweepFile:
    """Read and validate a sweep YAML file; errors name the file, the line and the field."""
    path = Path(path)
    try:
        return _load_sweep_file(path)
    except RecursionError:  # the YAML parser's or the validation's: either way nested past any real sweep
        raise SweepFileError(f"{path}: nested deeper than a sweep file can be (a few levels are all it uses)") from None


def _load_sweep_file(path: Path) -> SweepFile:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SweepFileError(f"sweep file: {str(path)!r} can't be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SweepFileError(
            f"sweep file: {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        context = exc.context
        if context and exc.context_mark is not None and exc.context_mark is not mark:
            context += f" (from line {exc.context_mark.line + 1})"
        what = ": ".join(p for p in (context, exc.problem) if p)
        raise SweepFileError(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise SweepFileError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    duplicate = _duplicate_key(root)
    if duplicate is not None:
        key, first, again = duplicate
        raise SweepFileError(
            f"{path}:{again.start_mark.line + 1}:{again.start_mark.column + 1}: key {key!r} is given twice in one "
            f"mapping (first on line {first.start_mark.line + 1}); YAML would keep only the last, so give it once"
        )
    return parse_sweep(data, source=str(path), default_name=path.stem, line_of=_line_finder(root))


def _duplicate_key(root: yaml.Node | None) -> tuple[str, yaml.Node, yaml.Node] | None:
    """The first key given twice in one mapping (its text, first node, second node), or None: PyYAML keeps
    the last silently, so `{M: 64, M: 32}` would tune a shape the file does not show."""
    stack = [root] if root is not None else []
    seen_nodes: set[int] = set()  # an alias is the node it names: visit each once (`&a [*a]` refers to itself)
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for key, value in node.value:
                text = str(key.value) if isinstance(key, yaml.ScalarNode) else None
                if text is not None and text in seen:
                    return text, seen[text], key
                if text is not None:
                    seen[text] = key
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None
