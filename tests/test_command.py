"""Every command jointtune prints is written so that the shell it ran in can run it: `jointtune` where the PATH
finds this very script, else the script's path (`.venv/bin/jointtune` right after `make sweep`), else
`python -m jointtune.cli`; and the README says how to put `jointtune` on the PATH after set-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jointtune._command import jointtune_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "venv" / "bin" / "jointtune"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_on_the_path_it_is_jointtune(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "sweep"])
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    assert jointtune_command() == "jointtune"


def test_off_the_path_it_is_the_scripts_path(script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["venv/bin/jointtune", "sweep"])  # as `make sweep` starts it
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert jointtune_command() == "venv/bin/jointtune"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "argv", [str(script), "sweep"])
    assert jointtune_command() == str(script)
    other = tmp_path / "other" / "jointtune"  # another installation on the PATH is not this one
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}/usr/bin")
    assert jointtune_command() == str(script)


def test_without_a_script_it_is_python_dash_m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["-c"])
    monkeypatch.setattr(sys, "executable", str(tmp_path / "py" / "python3"))
    assert jointtune_command() == f"{tmp_path / 'py' / 'python3'} -m jointtune.cli"


def test_the_readme_says_how_to_put_jointtune_on_the_path_and_that_works() -> None:
    """The set-up section names the activation command, and in this checkout (where `make test` made .venv) it
    puts a working `jointtune` on the PATH. A fresh clone's check is tests/first_use.sh, outside CI."""
    readme = (ROOT / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## The three ways")]
    assert ". .venv/bin/activate" in setup and ".venv/bin/jointtune" in setup
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv in this checkout (made by `make sweep` / `make test`)")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"  # a fresh shell's PATH: nothing of the venv on it
    done = subprocess.run(
        ["bash", "-c", ". .venv/bin/activate && command -v jointtune && jointtune spaces list"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(r"ag_gemm", done.stdout)
