"""`jointtune retune`: records under an old kernel or space version are not served, are found, and come back.

One real tune (the jt_matmul family in the interpreter, two simulated ranks) stands for a store made by an older
release: its record is moved to an old kernel version, as an upgrade that changed the kernel would leave it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from jointtune.autotune.tuner.stale import find_stale
from jointtune.db import NewRecord, RecordKey, open_store
from jointtune.kernels import get_family

JOINTTUNE = [sys.executable, "-c", "from jointtune.cli import main; main()"]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*JOINTTUNE, *args], env=env, capture_output=True, text=True, timeout=240)


def _as_published(record, **changes) -> NewRecord:
    names = {f.name for f in dataclasses.fields(NewRecord)}
    return NewRecord(**{**{k: v for k, v in dataclasses.asdict(record).items() if k in names}, **changes})


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory):
    """A store tuned by an older release of the jt_matmul family (its module with one more line of code, so another
    kernel version), plus a record of other hardware; then today's family is the one installed."""
    import os
    from pathlib import Path

    import jt_families
    from jt_procs import subprocess_environment

    tmp = tmp_path_factory.mktemp("retune")
    old = tmp / "old_release"
    old.mkdir()
    source = Path(jt_families.__file__).read_text(encoding="utf-8")
    (old / "jt_families.py").write_text(source + "\n_AN_OLDER_RELEASE = True\n", encoding="utf-8")
    env = subprocess_environment()
    old_env = {**env, "PYTHONPATH": os.pathsep.join((str(old), env["PYTHONPATH"]))}
    url = f"sqlite:///{tmp / 'jt.db'}"
    args = ["tune", "--kernel", "jt_matmul", "--shape", "64x48x32", "--dtype", "fp32", "--world-size", "2"]
    args += ["--trials", "3", "--warmup", "0", "--iters", "2", "--db", url, "--import", "jt_families"]
    done = _run(args, old_env)
    assert done.returncode == 0, done.stdout + done.stderr
    store = open_store(url)
    (tuned,) = store.list_records(RecordKey.any(kernel="jt_matmul"))
    assert tuned.kernel_version != get_family("jt_matmul").version
    store.upsert_hardware(hardware_id="h200x2-other", name="another machine", fingerprint={})
    store.upsert_record(_as_published(tuned, hardware_id="h200x2-other", shape={"M": 128, "N": 48, "K": 32}))
    return url, env, tuned


def test_records_under_an_old_kernel_version_are_not_served(families, upgraded):
    url, _, tuned = upgraded
    store = open_store(url)
    key = {k: getattr(tuned, k) for k in ("kernel", "shape", "dtype", "world_size", "hardware_id", "timing")}
    assert store.best(RecordKey(**key, kernel_version=get_family("jt_matmul").version)) is None
    assert store.nearest(RecordKey(**key, kernel_version=get_family("jt_matmul").version)) == []
    assert store.best(RecordKey(**key, kernel_version=tuned.kernel_version)) is not None


def test_find_stale_names_the_change_and_tunes_only_this_machines_keys(families, upgraded):
    url, _, tuned = upgraded
    store = open_store(url)
    stale, unknown = find_stale(store, url, hardware_id=tuned.hardware_id)
    assert unknown == []
    by_hw = {key.record.hardware_id: key for key in stale}
    assert set(by_hw) == {tuned.hardware_id, "h200x2-other"}
    here, there = by_hw[tuned.hardware_id], by_hw["h200x2-other"]
    assert here.reason == f"kernel {tuned.kernel_version} -> {get_family('jt_matmul').version}"
    assert here.job is not None and here.job.settings.trials == 3  # its study's settings
    assert here.job.settings.iters == 2 and dict(here.job.shape) == tuned.shape
    assert there.job is None and "tuned on h200x2-other" in there.why_not
    (more,) = [k for k in find_stale(store, url, hardware_id=tuned.hardware_id, trials=5)[0] if k.job]
    assert more.job.settings.trials == 5


def test_a_record_of_an_older_space_is_stale_and_one_the_space_refuses_is_marked(families, upgraded, tmp_path):
    _, _, tuned = upgraded
    local = f"sqlite:///{tmp_path / 'space.db'}"
    store = open_store(local)
    store.upsert_hardware(hardware_id=tuned.hardware_id, name="here", fingerprint={})
    current = get_family("jt_matmul").version
    store.upsert_record(_as_published(tuned, kernel_version=current, space_version="feedfeedfeed", study_name=None))
    bad = {**tuned.config, "BLOCK": 3}  # a value no version of the space offers
    store.upsert_record(_as_published(tuned, kernel_version=current, space_version="feedfeedfeed", study_name=None,
                                      shape={"M": 32, "N": 48, "K": 32}, config=bad))  # fmt: skip
    stale, _ = find_stale(store, local, hardware_id=tuned.hardware_id)
    assert sorted((k.record.shape["M"], k.reason.split()[0], k.refused) for k in stale) == [
        (32, "space", True),
        (64, "space", False),
    ]


def test_retune_lists_then_tunes_the_keys_back(families, upgraded):
    url, env, tuned = upgraded
    common = ["--db", url, "--import", "jt_families"]
    listed = _run(["retune", "--list", *common], env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "2 keys left behind" in listed.stdout and "re-tune" in listed.stdout
    assert "tuned on h200x2-other" in listed.stdout and "jointtune retune --db" in listed.stdout
    assert len(open_store(url).list_records(RecordKey.any(kernel="jt_matmul"))) == 2  # --list tunes nothing

    done = _run(["retune", "--trials", "3", *common], env)
    assert done.returncode == 0, done.stdout + done.stderr
    version = get_family("jt_matmul").version
    back = open_store(url).best(RecordKey.of(tuned, kernel_version=version))
    assert back is not None and back.latency_p50_us > 0, done.stdout

    again = _run(["retune", "--list", *common], env)
    assert again.returncode == 0 and "1 keys left behind" in again.stdout  # only the other machine's key
    assert "re-tune" not in again.stdout.replace("retune", "")


def test_retune_refuses_an_unknown_kernel_and_a_missing_store_by_name(families, tmp_path, subprocess_env):
    done = _run(["retune", "--db", f"sqlite:///{tmp_path / 'none.db'}"], subprocess_env)
    assert done.returncode == 2 and "--db" in done.stderr
    url = f"sqlite:///{tmp_path / 'jt.db'}"
    open_store(url)
    done = _run(["retune", "--db", url, "--kernel", "nope"], subprocess_env)
    assert done.returncode == 2 and "'nope' is not a known kernel family" in done.stderr
    done = _run(["retune", "--db", url], subprocess_env)
    assert done.returncode == 0 and "every record is under today's kernel and space versions" in done.stdout
