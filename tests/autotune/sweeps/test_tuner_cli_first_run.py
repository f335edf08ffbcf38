"""A newcomer's first runs: bad options refused before any work, a sweep that shows where it stands and
says what to do next (in a log and on a terminal), a re-run that knows what is tuned, `db list` and
`spaces` that tell the truth."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jointtune.autotune.tuner.results import JobResult
from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.autotune.tuner.studies import StudyState
from jointtune.autotune.workers.sweeps.eta import fmt_duration, job_eta_s, sweep_eta_s
from jointtune.cli import main
from jointtune.db import RecordKey, open_store
from jointtune.search_spaces import Problem

JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]
SWEEP = """
name: first-run
imports: [jt_families]
profiles:
  cpu:
    tuning: {warmup: 0, iters: 2, seed: 1}
    jobs:
      - {kernel: jt_sleep, shapes: [SHAPES], dtypes: [fp32], world_size: 2, trials: 6}
"""


def _sweep_file(tmp_path: Path, shapes: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.replace("SHAPES", shapes))
    return path


def _refused(capsys, args: list[str]) -> str:
    """Runs the CLI in this process; the command must exit 2 with one line on stderr."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_options_are_refused_before_any_work(families, capsys, tmp_path):
    db = tmp_path / "jt.db"
    sweep = _sweep_file(tmp_path, "'64'")
    readme = tmp_path / "README.md"
    readme.write_text("# not a directory\n")
    base = ["sweep", str(sweep), "--db", f"sqlite:///{db}", "--profile", "cpu"]
    err = _refused(capsys, [*base, "--report", str(readme)])
    assert f"--report: '{readme}' is an existing file; allowed: a directory" in err
    err = _refused(capsys, [*base, "--report", str(readme / "out")])
    assert f"--report: '{readme / 'out'}' can't be created (Not a directory)" in err
    err = _refused(capsys, [*base, "--groups", "0"])
    assert "Invalid value for '--groups': Input should be greater than or equal to 1" in err
    assert "(see 'jointtune sweep --help')" in err
    err = _refused(capsys, [*base[:-1], "tpu"])
    assert "--profile: 'tpu' is not allowed; allowed: auto, gpu, cpu" in err
    err = _refused(capsys, [*base[:-1], "gpu"])
    assert "--profile: 'gpu' is not allowed on this machine" in err
    tune = ["tune", "--kernel", "jt_sleep", "--shape", "64", "--dtype", "fp32", "--db", f"sqlite:///{db}"]
    err = _refused(capsys, [*tune, "--import", "jt_families", "--report", str(readme)])
    assert "is an existing file" in err
    err = _refused(capsys, [*tune, "--world-size", "0"])
    assert "Invalid value for '--world-size'" in err
    err = _refused(capsys, [*tune, "--time-budget", "1e7"])  # the option's name, not the setting's
    assert "error: --time-budget: 10000000.0 is not allowed; it must be a number in (0, 1000000]" in err
    # a worker joins a sweep registered in a store: a mistyped path is refused, not made into a new store
    worker = ["worker", "--storage", f"sqlite:///{db}", "--sweep", "first-run", "--profile", "cpu"]
    err = _refused(capsys, worker)
    assert f"--storage: {str(db)!r} does not exist; give an existing store" in err
    err = _refused(capsys, [*worker, "--heartbeat", "0"])  # 0 is refused, not read as "the default"
    assert "heartbeat/grace: 0/" in err and "need heartbeat >= 1" in err
    assert readme.read_text() == "# not a directory\n"  # nothing overwritten
    assert not db.exists()  # refused before the store was even created


def test_broken_sweep_files_name_the_line(families, capsys, tmp_path):
    path = tmp_path / "broken.yaml"
    args = ["sweep", str(path), "--db", f"sqlite:///{tmp_path / 'jt.db'}", "--profile", "cpu"]
    path.write_text("name: x\nprofiles:\n  cpu:\n    jobs:\n      - kernel: jt_sleep\n        shapes: ['64'\n")
    err = _refused(capsys, args)
    assert f"error: {path}:7:1: not valid YAML: while parsing a flow sequence (from line 6)" in err
    path.write_text("name: x\nprofiles: {cpu: {jobs: [{kernel: jt_sleep, shapes: ['64']}]}}\nkey: : value\n")
    assert f"{path}:3:6: not valid YAML" in _refused(capsys, args)
    path.write_text(
        "profiles:\n  cpu:\n    jobs:\n      - kernel: jt_sleep\n        shapes: ['64']\n        trials: 0\n"
    )
    err = _refused(capsys, args)
    assert f"{path}: line 6: profiles.cpu.jobs[0].trials: Input should be greater than or equal to 1" in err
    # an alias of itself (the duplicate-key scan visits each node once) and aliases of aliases are refused at once
    path.write_text("name: x\nprofiles: &a [*a]\n" + "".join(f"k{i}: &k{i} [{', '.join([f'*k{i - 1}'] * 10)}]\n"
                                                           for i in range(1, 9)).replace("*k0", "1"))  # fmt: skip
    assert "profiles: Input should be a valid dictionary" in _refused(capsys, args)
    # PyYAML keeps the last of two equal keys: the file would tune a shape it does not show
    path.write_text("profiles:\n  cpu:\n    jobs:\n      - kernel: jt_sleep\n        shapes: [{M: 64, M: 32}]\n")
    err = _refused(capsys, args)
    assert f"{path}:5:26: key 'M' is given twice in one mapping (first on line 5)" in err
    path.write_text(
        "tuning: {watchdog: {factor: .inf, first_trial_s: 1.0e+300}}\n"
        "profiles: {cpu: {jobs: [{kernel: jt_sleep, shapes: ['64'], trials: 99999999999999999999}]}}\n"
    )
    err = _refused(capsys, args)
    assert "line 1: tuning.watchdog.factor: Input should be a finite number (got inf)" in err
    assert "line 1: tuning.watchdog.first_trial_s: Input should be less than or equal to 1000000 (got 1e+300)" in err
    assert "line 2: profiles.cpu.jobs[0].trials: Input should be less than or equal to 2147483647" in err
    assert not (tmp_path / "jt.db").exists()


def _sweep(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*JOINTTUNE, *args], env=env, capture_output=True, text=True, timeout=180)


def test_a_sweep_log_shows_progress_and_says_what_next_and_a_rerun_knows_what_is_tuned(
    families, tmp_path, subprocess_env
):
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    sweep = _sweep_file(tmp_path, "'320'")
    first = _sweep(["sweep", str(sweep), "--db", url, "--profile", "cpu"], subprocess_env)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    # the header: what runs, where, on what
    assert out.startswith("jointtune sweep first-run · profile cpu · 1 shape · 1 group\n")
    assert f"  database: {url}\n" in out and "  hardware: cpu-interpreter-" in out
    # a line per trial with the elapsed time and an ETA; the done reason is printed, not eaten as markup
    lines = [line for line in out.splitlines() if "jt_sleep M=320 float32 w2: " in line]
    assert re.match(r"^\[\d+:\d\d\] jt_sleep M=320 float32 w2: \d/6 trials, best [\d,.]+ µs, baseline", lines[0])
    assert all(", ETA " in line for line in lines[:-1])
    assert lines[-1].endswith("6/6 trials, best 5,000 µs, baseline 44,581 µs, speedup 8.92x, failures -, done: trials")
    # the summary says why each shape stopped and what the space refused (every proposal is one it takes)
    assert "jt_sleep M=320 float32 w2 — used its budget of 6 trials; refused 0 proposals (no trial spent)" in out
    assert "jointtune sweep first-run: 1/1 shapes done, 6/6 trials" in out
    # the summary: where the results are and what to run next
    assert "1 shape tuned now (6 trials); a fused mode beat the baseline on 1 of 1" in out
    assert f"results: the store at {url}" in out
    assert f"jointtune db list --db {url}" in out and f"jointtune serve --db {url}" in out
    assert "dashboard at http://127.0.0.1:8000/dashboard" in out
    assert f"jointtune sweep {sweep} --db {url} --report DIR" in out
    assert "CPU: the fused modes ran in Triton's interpreter" in out
    # each next command runs as printed, in the shell that ran the sweep (`jointtune` or the path of this script)
    nexts = out[out.index("\nnext:\n") + 7 :].splitlines()
    commands = [line.split("  # ")[0].strip() for line in nexts if line.startswith("  ") and "  # " in line]
    listing = next(c for c in commands if " db list " in c)  # run as printed at the end, when there is more to list
    assert all(c.startswith(listing.split(" db list ")[0] + " ") for c in commands), commands

    # the same sweep again: nothing to tune, nothing started, said so
    again = _sweep(
        ["sweep", str(sweep), "--db", url, "--profile", "cpu", "--report", str(tmp_path / "rep")], subprocess_env
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to tune: every shape is already tuned in this database (1 used their trial budget)" in again.stdout
    assert "0 shapes tuned now (0 trials), 1 already tuned" in again.stdout
    assert f"report:  2 files in {tmp_path / 'rep'}/" in again.stdout and "--report DIR" not in again.stdout
    (row,) = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert row["trials"] == 6 and row["status"] == "trials"

    # one more shape: the tuned one is named as such and skipped, the new one runs
    sweep = _sweep_file(tmp_path, "'320', '640'")
    more = _sweep(["sweep", str(sweep), "--db", url, "--profile", "cpu"], subprocess_env)
    assert more.returncode == 0, more.stdout + more.stderr
    assert "already tuned: 1 of 2 shapes (1 used their trial budget); the others run now" in more.stdout
    assert "jt_sleep M=320 float32 w2: " not in more.stdout  # no progress lines for it
    assert "1 shape tuned now (6 trials), 1 already tuned" in more.stdout

    # db list: each record's trial count is its study's, not the count when its best was found
    records = {r.shape["M"]: r for r in open_store(url).list_records(RecordKey.any(kernel="jt_sleep"))}
    assert set(records) == {320, 640}
    listed = subprocess.run(["bash", "-c", listing], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    header = next([c.strip() for c in line.strip(" │┃").split("┃")] for line in lines if "trials" in line)
    rows = [[c.strip() for c in line.strip(" │").split("│")] for line in lines if "jt_sleep" in line]
    assert len(rows) == 2 and all(row[header.index("trials")] == "6" for row in rows), listed.stdout
    assert [r.trials for r in records.values()] == [6, 6]  # the record itself, so REST, bundles and the dashboard


def _run_in_a_terminal(args: list[str], env: dict[str, str], timeout: float = 120.0) -> tuple[int, str]:
    """Runs the CLI with a pseudo-terminal as stdout and stderr: what a person at a terminal sees."""
    leader, follower = os.openpty()
    env = {**env, "COLUMNS": "150", "LINES": "50", "TERM": "xterm-256color"}
    proc = subprocess.Popen([*JOINTTUNE, *args], env=env, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    return proc.wait(timeout=10), b"".join(chunks).decode(errors="replace")


def test_on_a_terminal_the_sweep_draws_live_bars_with_an_eta(families, tmp_path, subprocess_env):
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    sweep = _sweep_file(tmp_path, "'320', '640'")
    code, screen = _run_in_a_terminal(["sweep", str(sweep), "--db", url, "--profile", "cpu"], subprocess_env)
    assert code == 0, screen
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    assert "jointtune sweep first-run · jt_sleep" in plain  # the live table's title
    for column in ("shape", "progress", "trials", "best µs", "baseline µs", "speedup", "ETA", "status"):
        assert column in plain
    assert "━" in plain and re.search(r"\d/2 shapes · \d+/12 trials · elapsed \d+:\d\d", plain)
    assert "done: trials" in plain and "tuned configs" in plain and "next:" in plain
    assert "\x1b[" in screen  # drawn in place, with colours


def test_etas_come_from_trial_times_and_respect_time_budgets():
    assert [fmt_duration(s) for s in (0, 59.6, 61, 3600 * 2 + 5, None)] == ["0:00", "1:00", "1:01", "2:00:05", "?"]

    def result(trials: int, counted: int, elapsed: float, budget: float | None = None) -> JobResult:
        job = Job.of("jt_sleep", Problem.of({"M": 64}, dtype="float32", world_size=2),
                     TuneSettings(trials=trials, time_budget_s=budget))  # fmt: skip
        state = StudyState(counted=[object()] * counted, elapsed_s=elapsed)  # type: ignore[list-item]
        return JobResult(job, f"s{trials}-{counted}-{budget}", trials=[object()] * counted, state=state)  # type: ignore[list-item]

    assert job_eta_s(result(10, 4, 8.0)) == pytest.approx(12.0)  # 6 left x 2 s
    assert job_eta_s(result(10, 4, 8.0), overhead_s=1.0) == pytest.approx(18.0)  # plus 1 s between trials
    assert job_eta_s(result(10, 4, 8.0, budget=10.0)) == pytest.approx(2.0)  # the time budget ends it first
    assert job_eta_s(result(10, 0, 0.0)) is None and job_eta_s(result(10, 0, 0.0), fallback_trial_s=3.0) == 30.0
    assert job_eta_s(result(4, 4, 8.0)) == 0.0
    # not started, with a time budget: the mean trial time of its kernel's started jobs, capped by the budget; with
    # none of its kernel started, the budget (and the time between trials it implies), not other kernels' trial times
    assert job_eta_s(result(16, 0, 0.0, budget=45.0), kernel_trial_s=1.0) == pytest.approx(16.0)
    assert job_eta_s(result(16, 0, 0.0, budget=45.0), kernel_trial_s=5.0) == pytest.approx(45.0)
    assert job_eta_s(result(16, 0, 0.0, budget=45.0), fallback_trial_s=1.0) == pytest.approx(45.0)
    assert job_eta_s(result(16, 0, 0.0, budget=45.0), fallback_trial_s=1.0, overhead_s=0.5) == pytest.approx(67.5)
    assert job_eta_s(result(16, 0, 0.0, budget=45.0)) == pytest.approx(45.0)  # nothing timed yet: still bounded
    assert sweep_eta_s([result(10, 4, 8.0), result(10, 0, 0.0)], parallel=2) == pytest.approx(
        (12 + 10 * 2) / 2
    )  # the unstarted job: the mean trial time
