"""Where a tuning run's wall time went: the phases log of one `jointtune tune` ($JOINTTUNE_PHASES) added up.

    JOINTTUNE_PHASES=phases.jsonl jointtune tune ...          # every process of the run appends its phases
    python bench/tuner/cold_phases.py phases.jsonl --start S --end E --out phases.json

`--start`/`--end`: the shell's clock (seconds since the epoch) around the command, so the table runs from the
command's start to its end; without them it runs from the CLI process's start to the last phase.

The table follows rank 0, the coordinator, whose work is the run's critical path: the CLI's start (the interpreter and
its imports) and set-up (the store, the hardware, the header), the rank processes' start (spawn, imports), the world's
set-up (process groups, the coordinator's store and study, the family's inputs), then per trial the compile rank 0
waited for, the check (a config's first run: loading its kernels, the reference), the measurement and the store's
share (claims: Optuna's ask under the study lock; finishing: tell, the record), and the end (ranks exit, summary).
What no phase covers is "other". Beside it: what the compile workers did in the background (configs, seconds).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: rank 0's trial phases, in the order a trial runs them, with what each is in words
TRIAL_PHASES = {
    "preview": "store: preview what the claims will run (once, in memory)",
    "claim": "store: claim the next trial (Optuna ask, under the study lock)",
    "compile": "compile: waited for a config's kernels (pool, or in process)",
    "check": "check: first run (load kernels, reference, agree)",
    "measure": "measure: warm-up and timed runs",
    "finish": "store: tell, publish the record",
    "final": "final round: the finalists timed again side by side, the pick published",
}


def load(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        if text.strip():
            lines.append(json.loads(text))
    return lines


def _first(lines: Iterable[dict[str, Any]], who: str, phase: str) -> dict[str, Any] | None:
    return next((line for line in lines if line["who"] == who and line["phase"] == phase), None)


def _sum(lines: Iterable[dict[str, Any]], who: str, phase: str) -> tuple[float, int]:
    spans = [line["t1"] - line["t0"] for line in lines if line["who"] == who and line["phase"] == phase]
    return sum(spans), len(spans)


def summarise(
    lines: Sequence[dict[str, Any]], *, start: float | None = None, end: float | None = None
) -> dict[str, Any]:
    """The run's wall time in consecutive pieces along the CLI's and rank 0's timeline (seconds), plus the compile
    workers' background work."""
    cli_start = _first(lines, "cli", "start")
    begin = start if start is not None else (cli_start["t0"] if cli_start else min(line["t0"] for line in lines))
    finish = end if end is not None else max(line["t1"] for line in lines)
    rows: list[tuple[str, float]] = []
    at = begin

    def step(name: str, until: float | None) -> None:
        nonlocal at
        if until is None:
            return
        rows.append((name, max(0.0, until - at)))
        at = max(at, until)

    if cli_start:
        step("launch: the shell starts the CLI process", cli_start["t0"])
        step("import: the CLI's interpreter and imports", cli_start["t1"])
    prepare = _first(lines, "cli", "prepare")
    step("set-up: the CLI's checks, store, hardware, header", prepare["t1"] if prepare else None)
    laps = [line for line in lines if line["who"] == "cli" and line["phase"].startswith("lap:")]
    if laps and rows:  # the set-up's steps, as the CLI marked them
        steps = ", ".join(f"{line['phase'][4:]} {line['t1'] - line['t0']:.2f}" for line in laps)
        rows[-1] = (f"{rows[-1][0]} ({steps} s)", rows[-1][1])
    rank_start = _first(lines, "rank0", "start")
    step("spawn: the CLI starts the rank processes", rank_start["t0"] if rank_start else None)
    step("import: a rank's interpreter and the tuner's modules", rank_start["t1"] if rank_start else None)
    for phase, words in (("imports", "import: torch and plug-ins in the rank"),
                         ("control", "world set-up: process groups (NCCL/gloo)"),
                         ("coordinator", "world set-up: rank 0's store, storage, hardware"),
                         ("study", "world set-up: open and start the study"),
                         ("inputs", "world set-up: the family, the world, the inputs")):  # fmt: skip
        line = _first(lines, "rank0", phase)
        step(words, line["t1"] if line else None)
    done = _first(lines, "rank0", "done")
    trials_end = done["t1"] if done else None
    if trials_end is not None:
        total = trials_end - at
        counted = 0.0
        for phase, words in TRIAL_PHASES.items():
            seconds, n = _sum([line for line in lines if line["t0"] >= at - 1e-6], "rank0", phase)
            rows.append((f"{words} [{n}x]", seconds))
            counted += seconds
        rows.append(("trials: other (broadcasts, barriers, the loop)", max(0.0, total - counted)))
        at = trials_end
    teardown = _first(lines, "rank0", "teardown")
    step("exit: rank 0 closes its executor and process groups", teardown["t1"] if teardown else None)
    ranks = _first(lines, "cli", "ranks")
    step("exit: the ranks end, the CLI sees it", ranks["t1"] if ranks else None)
    summary = _first(lines, "cli", "summary")
    step("summary: the CLI's table and exit", summary["t1"] if summary else None)
    step("end: the CLI process exits", finish)
    workers = collections.defaultdict(list)
    for line in lines:
        if line["who"] == "compile":
            workers[line["phase"]].append(line)
    compiled = workers.get("compile", [])
    background = {
        "workers": len({line["pid"] for group in workers.values() for line in group}),
        "worker_start_s": [round(line["t1"] - line["t0"], 2) for line in workers.get("start", [])],
        "configs_compiled": len(compiled),
        "compile_s": round(sum(line["t1"] - line["t0"] for line in compiled), 2),
        "notes": [line["notes"] for line in compiled if line.get("notes")],
        "driver_module_s": [round(line["t1"] - line["t0"], 2) for line in workers.get("driver-module", [])],
    }
    # what Triton still compiled inside rank 0 (CompileCounter), by phase: kernels no worker built ahead
    here = collections.defaultdict(list)
    for line in lines:
        if line["who"] == "rank0":
            here[line["phase"]].extend(line.get("compiled_here", []))
    in_rank = {
        phase: {"kernels": len(items), "s": round(sum(s for _, s in items), 2), "names": sorted({n for n, _ in items})}
        for phase, items in here.items()
        if items
    }
    finishes = [line["t1"] for line in lines if line["who"] == "rank0" and line["phase"] in ("finish", "final")]
    return {"wall_s": round(finish - begin, 2), "critical_path": [{"what": n, "s": round(s, 2)} for n, s in rows],
            "record_stored_s": round(max(finishes) - begin, 2) if finishes else None,
            "background": background, "compiled_in_rank0": in_rank}  # fmt: skip


def print_table(result: dict[str, Any], out: Any = sys.stdout) -> None:
    wall = result["wall_s"] or 1.0
    stored = result["record_stored_s"]
    stored_text = "" if stored is None else f" (the record final after {stored:.1f} s: the last trial or final round)"
    print(f"wall {result['wall_s']:.1f} s{stored_text}; rank 0's critical path:", file=out)
    for row in result["critical_path"]:
        print(f"  {row['s']:7.2f} s {100 * row['s'] / wall:5.1f}%  {row['what']}", file=out)
    bg = result["background"]
    text = f"compile workers: {bg['workers']} processes (start {bg['worker_start_s']} s), "
    text += f"{bg['configs_compiled']} configs in {bg['compile_s']} s of worker time"
    if bg["driver_module_s"]:
        text += f", driver module {bg['driver_module_s']} s"
    print(text, file=out)
    for note in bg["notes"]:
        print(f"  note: {note}", file=out)
    for phase, seen in result["compiled_in_rank0"].items():
        names = ", ".join(seen["names"])
        print(f"compiled in rank 0 during {phase}: {seen['kernels']} kernels, {seen['s']} s ({names})", file=out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phases", type=Path, help="the $JOINTTUNE_PHASES file of one run")
    ap.add_argument("--start", type=float, help="the shell's clock at the command's start (epoch seconds)")
    ap.add_argument("--end", type=float, help="the shell's clock at the command's end (epoch seconds)")
    ap.add_argument("--out", type=Path, help="write the summary as JSON here too")
    args = ap.parse_args(argv)
    result = summarise(load(args.phases), start=args.start, end=args.end)
    print_table(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
