"""The README's examples, run as a newcomer runs them: each Python block as a script of its own, and
the figures its shell examples state, checked against the code that produces them.

The Python blocks run on the local world (Triton's CPU interpreter, two simulated ranks) in a fresh
process without TRITON_INTERPRET set, so jointtune's own choice of the interpreter is tested too, and
with a private store, so a newcomer's paste never meets anyone's tuned configs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


PYTHON_BLOCKS = _blocks("python")


def test_the_readme_has_python_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_each_python_block_runs_as_written(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(PYTHON_BLOCKS[index])
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "JOINTTUNE_DB_URL", "PYTHONPATH")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # the default store, private to this run
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"README block {index}:\n{PYTHON_BLOCKS[index]}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    # every example prints each simulated rank's result shape: [256, 256] (AG+GEMM: all M rows, N / W columns;
    # GEMM+RS: M / W rows, all N columns), Flash-Decode's [B, H, D] on every rank
    assert "[(256, 256), (256, 256)]" in done.stdout or "[(2, 8, 64), (2, 8, 64)]" in done.stdout


def test_the_exhaustive_restrict_example_counts_what_it_says() -> None:
    from jointtune.autotune.tuner.handles import study_space
    from jointtune.autotune.tuner.settings import TuneSettings
    from jointtune.cli.tune import parse_restrictions
    from jointtune.kernels import get_family
    from jointtune.search_spaces import DeviceLimits

    text = "\n".join(_blocks("bash"))
    command = re.search(r"^jointtune tune [^\n]*--strategy exhaustive.*?\((\d+) here\)", text, flags=re.S | re.M)
    assert command is not None, "the README's exhaustive --restrict example is gone"
    claimed = int(command.group(1))
    args = shlex.split(command.group(0).split("#")[0].replace("\\\n", " "))
    assert args[:2] == ["jointtune", "tune"]
    pairs = list(zip(args[2::2], args[3::2]))
    values = dict(pairs)
    restricts = parse_restrictions([value for option, value in pairs if option == "--restrict"])
    settings = TuneSettings(trials=int(values["--trials"]), strategy="exhaustive", restrict=restricts)
    space = study_space(get_family(values["--kernel"]), settings)
    problem = space.make_problem(values["--shape"], dtype="bf16", world_size=2)
    assert space.count(problem, DeviceLimits.nominal_hopper()) == claimed <= settings.trials
