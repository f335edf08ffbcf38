"""`jointtune serve` in a real subprocess: migrates on start, answers, refuses bad settings in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from jointtune.db import Store


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def testserve_subprocess(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'served.db'}"
    port = _free_port()
    env = {**os.environ, "JOINTTUNE_TOKENS": "write:serve-token-123"}
    cmd = [sys.executable, "-c", "from jointtune.cli import main; main()", "serve", "--port", str(port), "--db", db]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, ready = time.monotonic() + 30, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1, trust_env=False)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ready is not None and ready.json()["status"] == "ready"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    with Store(db, migrate=False) as store:
        assert store.revision() == store.head_revision()
    # it says where it listens, what it serves and from which store, before it starts
    base = f"http://127.0.0.1:{port}"
    assert f"jointtune serve: listening on {base}; writes need a bearer token" in out, out
    assert f"  store:     {db}\n" in out and f"dashboard: {base}/dashboard   API docs: {base}/docs" in out


def testserve_refuses_bad_tokens(tmp_path: Path) -> None:
    assert _serve_error(tmp_path, JOINTTUNE_TOKENS="root:whatever-token") == [
        "error: JOINTTUNE_TOKENS: entry 1 is not allowed; use role:token with role one of read, write, admin "
        "and a token of >= 8 characters"
    ]


def _serve_error(tmp_path: Path, *args: str, **env: str) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        "from jointtune.cli import main; main()",
        "serve",
        "--db",
        f"sqlite:///{tmp_path}/x.db",
    ]
    done = subprocess.run([*cmd, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().splitlines()


def testserve_refuses_bad_settings_and_a_busy_port_in_one_line(tmp_path: Path) -> None:
    (line,) = _serve_error(tmp_path, JOINTTUNE_BODY_LIMIT_BYTES="lots")
    assert line.startswith("error: environment: JOINTTUNE_BODY_LIMIT_BYTES: ") and "integer" in line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for workers in ("1", "2"):
            (line,) = _serve_error(tmp_path, "--port", port, "--workers", workers)
            assert line.startswith(f"error: --host/--port: can't listen on 127.0.0.1:{port}"), line
    (line,) = _serve_error(tmp_path, "--host", "192.0.2.1")  # TEST-NET-1: an address no machine of ours has
    assert line.startswith("error: --host/--port: can't listen on 192.0.2.1:8000"), line
    assert not (tmp_path / "x.db").exists()  # refused before the store was created or migrated
