"""How `jointtune serve` runs the app (`jointtune.server.serving`): a connection that does not send its request
whole in time is closed, a worker holds a bounded number of connections (uvicorn answers 503 beyond them), and
the default worker count comes from the cores and is said at start. Real uvicorn on loopback; the waits are
deadlines for something that must happen, never timings."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from jointtune.server import Settings, create_app
from jointtune.server.serving import MAX_DEFAULT_WORKERS, default_workers, uvicorn_config

#: generous: the server must close the connection within this long of its read timeout
DEADLINE_S = 30


@pytest.fixture
def limited(sqlite_url: str) -> Iterator[tuple[uvicorn.Server, int]]:
    """The service under `serve`'s uvicorn config: 3 connections a worker, 0.5 s to send a request."""
    settings = Settings(db_url=sqlite_url, max_connections=3, read_timeout_s=0.5)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(settings, host="127.0.0.1", port=port, workers=1, app=create_app(settings))
    config.log_level, config.lifespan = "warning", "off"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield server, port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server closes `conn` (reads until EOF) within DEADLINE_S."""
    conn.settimeout(DEADLINE_S)
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_request_not_sent_whole_in_time_is_closed(limited: tuple[uvicorn.Server, int]) -> None:
    _, port = limited
    partial = [
        b"",  # connected, nothing sent
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b"POST /v1/configs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    ]
    for sent in partial:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(sent)
            assert _closed_by_server(conn), sent
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200  # whole, in time


def test_connections_beyond_the_limit_are_answered_503(limited: tuple[uvicorn.Server, int]) -> None:
    server, port = limited
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(server.server_state.connections) < 3:  # the server has taken them
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as http:
            assert http.get("/healthz").status_code == 503
    finally:
        for conn in held:
            conn.close()
    deadline = time.monotonic() + DEADLINE_S
    while server.server_state.connections:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", trust_env=False).status_code == 200


def test_default_workers_follow_the_cores() -> None:
    assert [default_workers(cores) for cores in (1, 2, 16, 128)] == [1, 2, 16, MAX_DEFAULT_WORKERS]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_serve_says_its_workers_and_limits_at_start(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    port = _free_port()
    cmd = [sys.executable, "-c", "from jointtune.cli import main; main()", "serve", "--port", str(port)]
    cmd += ["--db", f"sqlite:///{tmp_path / 'w.db'}"]
    one_core = lambda: os.sched_setaffinity(0, {core})
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=one_core)
    try:
        first = proc.stderr.readline() if proc.stderr else ""
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert first.startswith("jointtune serve: 1 worker process(es), one per available core (1, at most 16); "), first
    assert "at most 1000 connections (JOINTTUNE_MAX_CONNECTIONS; beyond them 503)" in first
    assert "10 s to send a request (JOINTTUNE_READ_TIMEOUT_S)" in first


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_workers_app_and_store_are_frozen_out_of_the_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`app_from_env` (each worker's app) freezes the app, and the store once the first request opens it, so the
    collector's full passes no longer walk them while requests wait."""
    from jt_server import start_server

    from jointtune.server import app_from_env

    monkeypatch.setenv("JOINTTUNE_DB_URL", sqlite_url)
    gc.unfreeze()
    try:
        app = app_from_env()
        with_app = gc.get_freeze_count()
        url, stop = start_server(app)
        try:
            assert httpx.get(f"{url}/v1/kernels", trust_env=False).status_code == 200  # opens the store
        finally:
            stop()
            app.state.store.close()
        assert with_app > 0 and gc.get_freeze_count() > with_app
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
