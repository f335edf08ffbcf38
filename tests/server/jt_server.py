"""Helpers of the service tests: a real uvicorn server on loopback in a thread, record bodies, tokens."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from jointtune.db import Store
from jointtune.server import Settings, create_app

READ, WRITE, ADMIN = "read-token-1234", "write-token-1234", "admin-token-1234"
TOKENS = f"read:{READ},write:{WRITE},admin:{ADMIN}"


@dataclass
class LiveServer:
    url: str
    db_url: str
    app: Any

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10.0, trust_env=False)


def start_server(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve `app` on a free loopback port; returns its URL and a function that stops it."""
    # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets; without it every keep-alive
    # response waits ~40 ms for the client's delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    return f"http://127.0.0.1:{port}", stop


def serve(db_url: str, **settings: Any) -> Iterator[LiveServer]:
    app = create_app(Settings(db_url=db_url, tokens=TOKENS, **settings))
    url, stop = start_server(app)
    # the first request opens (and migrates) the store; pay that here, so clients with sub-second
    # timeouts in the tests meet a warm service on a loaded machine
    httpx.get(f"{url}/readyz", timeout=60)
    try:
        yield LiveServer(url=url, db_url=db_url, app=app)
    finally:
        stop()
        store = getattr(app.state, "store", None)
        if store is not None:
            store.close()  # before the PostgreSQL database is dropped


def record(**overrides: Any) -> dict[str, Any]:
    """A valid record body for POST /v1/configs, any field overridden by keyword."""
    body: dict[str, Any] = {
        "kernel": "ag_gemm",
        "kernel_version": "v1",
        "space_version": "s1",
        "shape": {"M": 8192, "N": 4096, "K": 12288},
        "dtype": "bfloat16",
        "world_size": 2,
        "hardware_id": "h200x2-nvl",
        "triton_version": "3.6",
        "config": {"BLOCK_M": 128, "BLOCK_N": 128, "mode": "pull"},
        "latency_p10_us": 590.0,
        "latency_p50_us": 600.0,
        "latency_p90_us": 620.0,
        "baseline_us": 940.0,
        "trials": 64,
        "study_name": "ag_gemm-8192",
    }
    body.update(overrides)
    if "latency_p50_us" in overrides and not {"latency_p10_us", "latency_p90_us"} & set(overrides):
        body["latency_p10_us"] = body["latency_p90_us"] = None
    return body


def count(db_url: str) -> int:
    with Store(db_url) as store:
        return store.count_records()


LOOKUP = {"dtype": "bfloat16", "world_size": 2, "hardware_id": "h200x2-nvl"}
