"""The lookup chain of `@joint_autotune` on a launcher: memory, store, service, miss policies, faults."""

from __future__ import annotations

import socket
import sqlite3
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_decorator_helpers import BEST, DEFAULT, OTHER, World, make_launcher, sleep_record, source_of

from jointtune.autotune.runtime.decorator import NoConfigError, joint_autotune
from jointtune.autotune.runtime.lookup import LookupWarning
from jointtune.db import open_store
from jointtune.errors import TuningError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))
from jt_server import serve

W2 = World(2)


def call(launcher, m: int = 64) -> dict:
    launcher(torch.ones(m), world=W2)
    return launcher.seen[-1]


def test_store_hit_then_memory_hit_without_touching_the_store_again(db: str, tmp_path: Path) -> None:
    open_store(db).upsert_record(sleep_record(64, BEST))
    launch = make_launcher(db)
    assert call(launch) == BEST and source_of(launch, 64) == "store"
    open_store(db).close()
    (tmp_path / "local.db").unlink()  # the hot path must not need the store any more
    assert call(launch) == BEST and len(launch.cache) == 1
    with pytest.raises(TypeError):  # the cached config is read-only: a launcher can't corrupt it
        next(iter(launch.cache.values()))["tile"] = 8


def test_service_hit_when_the_local_store_misses(db: str, tmp_path: Path) -> None:
    service_db = f"sqlite:///{tmp_path / 'service.db'}"
    open_store(service_db).upsert_record(sleep_record(64, OTHER))
    for server in serve(service_db):
        launch = make_launcher(db, server=server.url)
        assert call(launch) == OTHER and source_of(launch, 64) == "service"
        # under on_miss="nearest" the service's nearest shape counts too
        assert call(launch, 128) == OTHER and source_of(launch, 128) == "nearest-service"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_service_down_or_silent_falls_back_with_one_warning(db: str, silent_server: str) -> None:
    open_store(db).upsert_record(sleep_record(32, BEST))
    for url, words in ((f"http://127.0.0.1:{_free_port()}", "can't be reached"), (silent_server, "no answer")):
        launch = make_launcher(db, server=url, on_miss="default")
        start = time.monotonic()
        with pytest.warns(UserWarning, match=words):
            assert call(launch, 64) == DEFAULT
        assert time.monotonic() - start < 3
        assert source_of(launch, 64) == "default"
        assert call(launch, 32) == BEST  # the local store still answers


def test_corrupt_store_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database" * 100)
    launch = make_launcher(f"sqlite:///{path}", on_miss="default")
    with pytest.warns(LookupWarning, match="local store"):
        assert call(launch) == DEFAULT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, then the store stays off
        assert call(launch, 128) == DEFAULT


def test_locked_store_times_out_instead_of_stalling(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    open_store(f"sqlite:///{path}").upsert_record(sleep_record(64, BEST))
    open_store(f"sqlite:///{path}").close()
    holder = sqlite3.connect(path)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        launch = make_launcher(f"sqlite:///{path}", on_miss="default", store_timeout_s=0.5)
        start = time.monotonic()
        with pytest.warns(LookupWarning, match="no answer within 0.5 s"):
            assert call(launch) == DEFAULT
        assert time.monotonic() - start < 3
    finally:
        holder.rollback()
        holder.close()


def test_nearest_default_and_error_on_a_miss(db: str) -> None:
    open_store(db).upsert_record(sleep_record(64, OTHER))
    near = make_launcher(db)
    assert call(near, 100) == OTHER and source_of(near, 100) == "nearest-store"
    assert call(make_launcher(db, on_miss="default"), 100) == DEFAULT
    with pytest.raises(NoConfigError, match="no tuned config for shape"):
        call(make_launcher(db, on_miss="error"), 100)
    # nothing near (another world size): nearest falls back to the default, with a warning
    lonely = make_launcher(db)
    with pytest.warns(LookupWarning, match="using the space default"):
        lonely(torch.ones(100), world=World(4))
    assert lonely.seen[-1] == DEFAULT


def test_nearest_skips_configs_invalid_for_the_shape(db: str) -> None:
    # tile*chunk <= 16 holds for every shape; an invalid stored config must never be returned. The store
    # refuses such a record now, so it is written as an older store or another writer could have left it
    open_store(db).upsert_record(sleep_record(64, BEST))
    with sqlite3.connect(db.removeprefix("sqlite:///")) as raw:
        raw.execute("UPDATE jt_records SET config = ?", ('{"chunk":4,"mode":"fast","tile":16}',))
    launch = make_launcher(db, on_miss="nearest")
    with pytest.warns(LookupWarning):
        assert call(launch, 100) == DEFAULT


def test_records_of_another_kernel_or_triton_version_are_not_used_silently(db: str) -> None:
    store = open_store(db)
    store.upsert_record(sleep_record(64, BEST, kernel_version="0ld0ld0ld0ld"))
    store.upsert_record(sleep_record(128, BEST, triton_version="2.1"))
    launch = make_launcher(db, on_miss="default")
    with pytest.warns(LookupWarning, match="kernel_version '0ld0ld0ld0ld'"):
        assert call(launch, 64) == DEFAULT
    with pytest.warns(LookupWarning, match="Triton 2.1"):
        assert call(launch, 128) == DEFAULT


def test_env_mode_off_lookup_and_print(db: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    open_store(db).upsert_record(sleep_record(64, BEST))
    monkeypatch.setenv("JOINTTUNE_MODE", "off")
    assert call(make_launcher(db), 64) == DEFAULT
    monkeypatch.setenv("JOINTTUNE_MODE", "lookup")
    monkeypatch.setenv("JOINTTUNE_PRINT", "1")
    launch = make_launcher(db, on_miss="tune")  # lookup mode never tunes: a miss acts as nearest
    assert call(launch, 64) == BEST and call(launch, 100) == BEST
    out = capsys.readouterr().out
    assert "jt_sleep M=64 float32 w2" in out and "from store" in out and "from nearest-store" in out
    monkeypatch.setenv("JOINTTUNE_MODE", "fast")
    with pytest.raises(TuningError, match="JOINTTUNE_MODE: 'fast' is not allowed"):
        call(make_launcher(db), 64)


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(TuningError, match="on_miss: 'guess' is not allowed"):
        joint_autotune(space="jt_sleep", key=lambda x: {"M": 1}, on_miss="guess")(lambda x, *, config: x)
    with pytest.raises(TuningError, match="configs: not allowed with space"):
        joint_autotune(configs=[], space="jt_sleep", key=lambda x: {"M": 1})(lambda x, *, config: x)
