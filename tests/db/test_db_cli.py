"""`jointtune db upgrade | info | list` on real databases, and their one-line errors."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from jointtune.cli import main
from jointtune.db import NewRecord, Store, head_revision


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_upgrade_info_and_list(
    db_url: str, capsys: pytest.CaptureFixture[str], make_record: Callable[..., NewRecord]
) -> None:
    if db_url.startswith("sqlite"):  # reads never create a store: a mistyped path is an error, not a new file
        path = Path(sa.make_url(db_url).database or "")
        for argv in (("db", "info"), ("db", "list"), ("export", "--hardware", "h", "-o", str(path) + ".json")):
            code, _, err = _run(capsys, *argv, "--db", db_url)
            assert code == 2 and err == f"error: --db: {str(path)!r} does not exist; give an existing store " \
                "(`db upgrade`, `tune` and `serve` make one)\n"  # fmt: skip
        assert not path.exists() and not Path(str(path) + ".json").exists()
    else:
        code, out, _ = _run(capsys, "db", "info", "--db", db_url)
        assert code == 0 and "revision: none (empty" in out  # info inspects, it does not migrate
    code, out, _ = _run(capsys, "db", "upgrade", "--db", db_url)
    assert code == 0 and f"upgraded empty -> {head_revision()}" in out
    code, out, _ = _run(capsys, "db", "upgrade", "--db", db_url)
    assert code == 0 and f"already at {head_revision()} (head)" in out
    with Store(db_url) as store:
        store.upsert_record(make_record())
        store.upsert_record(make_record(kernel="gemm_rs", shape={"M": 128, "N": 8192, "K": 8192}))
    code, out, _ = _run(capsys, "db", "info", "--db", db_url)
    assert code == 0 and f"revision: {head_revision()} (head)" in out and "records:  2" in out
    assert f"backend:  {db_url.split(':')[0].split('+')[0]}" in out
    code, out, _ = _run(capsys, "db", "list", "--db", db_url, "--kernel", "gemm_rs")
    assert code == 0 and "1 of 1 records" in out and "ag_gemm" not in out
    assert "M=128,N=8192,K=8192" in out  # the family's dim order, as everywhere else
    row = out.rstrip().splitlines()[-2].rstrip(" │")
    assert row.endswith("mode=pull BLOCK_M=128 BLOCK_N=128")  # the config in its space's order: what `list` is for
    assert " 64 │ mode=pull" in row  # no study on this URL: the record's trial count
    code, _, err = _run(capsys, "db", "list", "--db", db_url, "--kernel", "gemm_r")  # a typo: no empty table
    assert code == 2 and err == "error: --kernel: 'gemm_r' has no records in this store; stored kernels: " \
        "['ag_gemm', 'gemm_rs']\n"  # fmt: skip
    code, _, err = _run(capsys, "export", "--hardware", "h200x2-nvl", "--kernel", "nosuch", "-o", "never.json",
                        "--db", db_url)  # fmt: skip
    assert code == 2 and err == "error: --kernel: 'h200x2-nvl' has no records of 'nosuch'; stored kernels: " \
        "['ag_gemm', 'gemm_rs']\n"  # fmt: skip
    assert not Path("never.json").exists()


def test_info_hides_the_password(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = sa.make_url(pg_url).set(password="s3cret").render_as_string(hide_password=False)
    code, out, _ = _run(capsys, "db", "info", "--db", url)
    assert code == 0 and "url:      postgresql+psycopg://" in out and ":***@" in out and "s3cret" not in out


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("::nonsense::", "error: database URL: '::nonsense::' is malformed"),
        ("mysql://root:pw@localhost/jt", "error: database URL: 'mysql://root:***@localhost/jt' uses the unsupported"),
    ],
)
def test_bad_urls_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], url: str, expected: str) -> None:
    for command in ("upgrade", "info", "list"):
        code, out, err = _run(capsys, "db", command, "--db", url)
        assert code == 2 and out == "" and err.startswith(expected) and err.count("\n") == 1


def test_unreachable_postgres_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = _run(capsys, "db", "info", "--db", f"postgresql://jt:pw@127.0.0.1:{port}/jt")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: database postgresql+psycopg://jt:***@127.0.0.1:{port}/jt: connecting failed:")
