"""URL resolution: the default per-user file, the environment, backend mapping and clear errors."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from jointtune.db import ENV_DB_URL, Store, default_sqlite_path, redact_url, resolve_db_url
from jointtune.errors import DatabaseURLError, StoreError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_DB_URL, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


def test_default_is_a_sqlite_file_under_xdg_data_home(tmp_path: Path) -> None:
    expected = tmp_path / "xdg" / "jointtune" / "jointtune.db"
    assert default_sqlite_path() == expected
    assert resolve_db_url() == f"sqlite:///{expected}"
    assert expected.parent.is_dir()  # created so SQLite can create the file


def test_relative_or_unset_xdg_falls_back_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in ("relative/dir", ""):
        monkeypatch.setenv("XDG_DATA_HOME", value)
        assert default_sqlite_path() == tmp_path / "home" / ".local/share/jointtune/jointtune.db"


def test_explicit_argument_beats_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_DB_URL, f"sqlite:///{tmp_path / 'env.db'}")
    assert resolve_db_url() == f"sqlite:///{tmp_path / 'env.db'}"
    assert resolve_db_url(f"sqlite:///{tmp_path / 'arg.db'}") == f"sqlite:///{tmp_path / 'arg.db'}"
    monkeypatch.setenv(ENV_DB_URL, "  ")
    assert resolve_db_url() == f"sqlite:///{default_sqlite_path()}"


def test_relative_sqlite_paths_become_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_db_url("sqlite:///rel/x.db") == f"sqlite:///{tmp_path / 'rel' / 'x.db'}"
    assert resolve_db_url("sqlite+pysqlite:///x.db") == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_db_url("sqlite://") == "sqlite://"


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ("postgresql://u:p@h:5433/db", "postgresql+psycopg://u:p@h:5433/db"),
        ("postgres://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_postgres_urls_use_psycopg(given: str, resolved: str) -> None:
    assert resolve_db_url(given) == resolved


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("not a url", "database URL: 'not a url' is malformed; expected sqlite:///PATH or postgresql"),
        ("postgresql://u:hunter2@h:notaport/db", "database URL: 'postgresql://u:\\*\\*\\*@h:notaport/db' is malformed"),
        ("mysql://u:hunter2@h/db", "database URL: 'mysql://u:\\*\\*\\*@h/db' uses the unsupported backend 'mysql'"),
        ("postgresql+asyncpg://h/db", "unsupported backend 'postgresql\\+asyncpg'"),
    ],
)
def test_bad_urls_raise_one_clear_line(given: str, message: str) -> None:
    with pytest.raises(DatabaseURLError, match=message) as info:
        resolve_db_url(given)
    assert "hunter2" not in str(info.value) and "\n" not in str(info.value)


def test_bad_url_from_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DB_URL, "oracle://x/y")
    with pytest.raises(DatabaseURLError, match=f"^{ENV_DB_URL}: 'oracle://x/y' uses the unsupported backend"):
        resolve_db_url()


def test_redact_hides_only_the_password() -> None:
    assert redact_url("postgresql+psycopg://tuner:s3cr3t@db:5432/jt") == "postgresql+psycopg://tuner:***@db:5432/jt"
    assert redact_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_missing_sqlite_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"directory {tmp_path / 'nope'} does not exist"):
        Store(f"sqlite:///{tmp_path / 'nope' / 'x.db'}")


def test_in_memory_sqlite_store_works() -> None:
    with Store("sqlite://") as store:
        assert store.revision() == store.head_revision() and store.count_records() == 0


def test_unreachable_postgres_fails_fast_with_the_url() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(StoreError) as info:
        Store(f"postgresql://tuner:hunter2@127.0.0.1:{port}/jt")
    message = str(info.value)
    assert message.startswith(f"database postgresql+psycopg://tuner:***@127.0.0.1:{port}/jt: connecting failed:")
    assert "refused" in message and "hunter2" not in message and "\n" not in message
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_silent_postgres_times_out_after_the_connect_timeout() -> None:
    with socket.socket() as server:  # accepts TCP connections but never answers the handshake
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}/jt: connecting failed: .*timeout"):
            Store(f"postgresql://tuner@127.0.0.1:{port}/jt")
        assert 4 < time.monotonic() - start < 15
