"""ConfigClient: lookups never raise (server down, slow, 5xx, bad JSON); publish retries then raises."""

from __future__ import annotations

import json
import socket
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from jt_server import READ, WRITE, LiveServer, record

from jointtune.autotune.runtime.client import ConfigClient, ServiceWarning
from jointtune.db import LookupOut, RecordKey
from jointtune.errors import ServiceError

SHAPE = {"M": 8192, "N": 4096, "K": 12288}
KEY = RecordKey(
    kernel="ag_gemm", kernel_version=None, shape=SHAPE, dtype="bfloat16", world_size=2, hardware_id="h200x2-nvl"
)


def test_lookup_and_publish_against_the_service(sqlite_server: LiveServer) -> None:
    client = ConfigClient(sqlite_server.url, token=WRITE)
    assert client.lookup(KEY) is None  # a miss is no warning
    assert client.publish(record())["changed"] is True
    found = client.lookup(KEY)
    assert found is not None and found["match"] == "exact" and found["config"]["mode"] == "pull"
    assert client.lookup(KEY.replace(kernel_version="v1"), nearest=False)["distance"] == 0
    stored = client.publish(record())["record"]
    assert client.publish(stored) == {"record": stored, "changed": False}  # a stored record republishes
    with pytest.raises(ServiceError, match="HTTP 403"):
        ConfigClient(sqlite_server.url, token=READ).publish(record())
    with pytest.raises(ServiceError, match="publish not sent: world_size: 0 is not allowed"):
        client.publish(record(world_size=0))  # the store's schema, checked before sending


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_socket() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def _answering(status: int, body: bytes) -> tuple[str, ThreadingHTTPServer]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", httpd


def test_lookup_never_raises_and_warns_once_per_cause(silent_socket: str) -> None:
    down = ConfigClient(f"http://127.0.0.1:{_free_port()}")
    slow = ConfigClient(silent_socket, timeout=0.2)
    url5, s5 = _answering(503, b'{"detail": "down"}')
    urlj, sj = _answering(200, b"<html>not json")
    try:
        for client, cause in (
            (down, "can't be reached"),
            (slow, "no answer within"),
            (ConfigClient(url5), "503"),
            (ConfigClient(urlj), "malformed"),
        ):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert client.lookup(KEY) is None
                assert client.lookup(KEY) is None
            messages = [str(w.message) for w in caught if issubclass(w.category, ServiceWarning)]
            assert len(messages) == 1 and cause in messages[0], messages
    finally:
        s5.shutdown()
        sj.shutdown()


def test_answers_are_read_with_the_stores_model(sqlite_server: LiveServer) -> None:
    with ConfigClient(sqlite_server.url, token=WRITE) as client:
        client.publish(record())
        served, answer = client.lookup(KEY), client.find(KEY)
    assert isinstance(answer, LookupOut) and answer.model_dump(mode="json") == served
    assert answer.provenance.triton_version == served["provenance"]["triton_version"] and answer.match == "exact"
    older = {k: v for k, v in served.items() if k != "timing"} | {"added_later": 1}  # an older or newer service
    bad = [
        {**served, "config": ["not", "an", "object"]},
        {**served, "provenance": None},
        {**served, "world_size": 0},
        {k: v for k, v in served.items() if k != "latency_us"},
        [served],
    ]
    servers = [_answering(200, json.dumps(body).encode()) for body in (older, *bad)]
    try:
        with ConfigClient(servers[0][0]) as other:
            found = other.find(KEY)
            assert found is not None and found.timing == "gpu" and found.config == served["config"]
            assert other.lookup(KEY) == older  # the JSON as the service sent it
        for url, _ in servers[1:]:
            with warnings.catch_warnings(record=True) as caught, ConfigClient(url) as broken:
                warnings.simplefilter("always")
                assert broken.lookup(KEY) is None and broken.find(KEY) is None  # a warned miss, no exception
            warned = [w for w in caught if issubclass(w.category, ServiceWarning)]
            assert len(warned) == 1 and "answered a malformed lookup" in str(warned[0].message), warned
            assert warned[0].filename == __file__  # attributed to the caller
    finally:
        for _, httpd in servers:
            httpd.shutdown()


def test_publish_retries_then_raises(silent_socket: str) -> None:
    url5, s5 = _answering(500, b'{"detail": "boom"}')
    try:
        with pytest.raises(ServiceError, match="after 3 tries; last: answered HTTP 500"):
            ConfigClient(url5, backoff=0.01).publish(record())
        with pytest.raises(ServiceError, match="after 2 tries; last: can't be reached"):
            ConfigClient(f"http://127.0.0.1:{_free_port()}", retries=2, backoff=0.01).publish(record())
    finally:
        s5.shutdown()


@pytest.mark.parametrize("url", ["ftp://host", "localhost:8000", "http://", "http://u:p@host", "http://h:99999", 7])
def test_bad_base_url(url: object) -> None:
    with pytest.raises(ServiceError, match=r"base_url: .* is not allowed; use http://HOST"):
        ConfigClient(url)  # type: ignore[arg-type]


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOINTTUNE_SERVER", raising=False)
    assert ConfigClient.from_env() is None
    monkeypatch.setenv("JOINTTUNE_SERVER", "https://tuning.example:8443/")
    monkeypatch.setenv("JOINTTUNE_TOKEN", "tok-123456")
    client = ConfigClient.from_env()
    assert client is not None and client.base_url == "https://tuning.example:8443"
    assert client._http.headers["authorization"] == "Bearer tok-123456"
