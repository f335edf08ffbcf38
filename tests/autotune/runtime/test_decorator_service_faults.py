"""A config service that misbehaves must not hold or break the decorated call, and bad arguments fail early.

The services here are real HTTP servers on loopback (a socket per connection, in threads) that trickle
their answer a byte at a time, stream a body of gigabytes, or never answer. Time bounds are generous
(a deadline of 0.5 s per lookup against a server that goes on for a minute), never tight.
"""

from __future__ import annotations

import contextlib
import math
import resource
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_decorator_helpers import BEST, DEFAULT, World, make_launcher, sleep_record, source_of

from jointtune.autotune.runtime.client import MAX_RESPONSE_BYTES, ConfigClient, ServiceWarning
from jointtune.autotune.runtime.decorator import ArgumentError, KeyResultError, joint_autotune
from jointtune.autotune.runtime.lookup import wait_for_publishes
from jointtune.autotune.tuner.settings import TuneSettings
from jointtune.db import RecordKey, open_store
from jointtune.errors import ServiceError, TuningError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))
from jt_server import WRITE, record

W2 = World(2)
TINY = TuneSettings(trials=3, warmup=0, iters=2, warm_start=0, lookahead=0, seed=3)
#: how long the misbehaving servers go on, and the bound a call must stay far below
TRICKLE_S = 60.0
BOUND_S = 10.0
GIB = 1 << 30


class Misbehaving:
    """A real HTTP/1.1 server on loopback that answers every request in one bad way (`how`):

    - "trickle-headers": a status line, then a header one byte every 0.3 s, for TRICKLE_S
    - "trickle-body": a whole head (Content-Length 100000), then the body one byte every 0.3 s
    - "huge": a 200 without Content-Length (ends when the connection does), then 2 GiB as fast as it goes
    - "huge-declared": the same with "Content-Length: 2147483648"
    - "silent": reads the request and never answers (until closed)
    """

    def __init__(self, how: str) -> None:
        self.how = how
        self.sent = 0  # body bytes handed to the kernel, all connections together
        self.requests = 0
        self.stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, name=f"misbehaving-{how}", daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self._sock.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(TRICKLE_S)
                self._read_request(conn)
                self.requests += 1
                if self.how == "silent":
                    self.stop.wait(TRICKLE_S)
                    return
                for piece in self._pieces():
                    if self.stop.is_set():
                        return
                    conn.sendall(piece)
                    self.sent += len(piece)
            except OSError:  # the client hung up: what it should do
                return

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionResetError
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)

    def _pieces(self) -> Iterator[bytes]:
        steps = int(TRICKLE_S / 0.3)
        if self.how == "trickle-headers":
            yield b"HTTP/1.1 200 OK\r\nX-Slow: "
            for _ in range(steps):
                if self.stop.wait(0.3):
                    return
                yield b"x"
        elif self.how == "trickle-body":
            yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            for _ in range(steps):
                if self.stop.wait(0.3):
                    return
                yield b" "  # JSON whitespace: a parser would wait for more
        elif self.how in ("huge", "huge-declared"):
            length = f"Content-Length: {2 * GIB}\r\n" if self.how == "huge-declared" else ""
            yield f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}Connection: close\r\n\r\n".encode()
            block = b" " * (1 << 20)
            for _ in range(2 * GIB // len(block)):
                yield block
        else:
            raise AssertionError(self.how)


@pytest.fixture
def misbehaving() -> Iterator[type[Misbehaving]]:
    made: list[Misbehaving] = []

    def make(how: str) -> Misbehaving:
        made.append(Misbehaving(how))
        return made[-1]

    yield make  # type: ignore[misc]
    for server in made:
        server.close()


def timed_call(launcher, m: int) -> tuple[dict, torch.Tensor, float]:
    """(config used, result, seconds) of one call of a `make_launcher` launcher."""
    x = torch.arange(m, dtype=torch.float32)
    start = time.monotonic()
    out = launcher(x, world=W2)
    return launcher.seen[-1], out, time.monotonic() - start


def service_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ServiceWarning)]


# ---- a lookup has a total deadline, and a cap on what it reads ---------------------------------------------------


@pytest.mark.parametrize("how", ["trickle-headers", "trickle-body"])
def test_a_trickling_service_costs_one_deadline_and_one_warning(db: str, misbehaving, how: str) -> None:
    open_store(db).upsert_record(sleep_record(32, BEST))
    server = misbehaving(how)
    launch = make_launcher(db, server=server.url, on_miss="default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, out, took = timed_call(launch, 64)
        assert config == DEFAULT and source_of(launch, 64) == "default"
        assert torch.equal(out, torch.arange(64, dtype=torch.float32) * 2)  # the call itself ran, correctly
        assert took < BOUND_S, f"the first call took {took:.1f} s against a service trickling for {TRICKLE_S} s"
        config, _, took = timed_call(launch, 96)  # another key: the service is asked again, as briefly
        assert config == DEFAULT and took < BOUND_S
        config, _, _ = timed_call(launch, 32)
        assert config == BEST and source_of(launch, 32) == "store"  # the local store still answers
    messages = service_warnings(caught)
    assert len(messages) == 1 and "no answer within 0.5s" in messages[0] and "falling back" in messages[0], messages
    assert server.requests >= 2


@pytest.mark.parametrize("how", ["huge", "huge-declared"])
def test_a_huge_answer_is_not_read_into_memory(db: str, misbehaving, how: str) -> None:
    server = misbehaving(how)
    launch = make_launcher(db, server=server.url, on_miss="default")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, out, took = timed_call(launch, 64)
        assert config == DEFAULT and source_of(launch, 64) == "default"
        assert torch.equal(out, torch.arange(64, dtype=torch.float32) * 2)
        assert took < BOUND_S
    messages = service_warnings(caught)
    assert len(messages) == 1 and f"more than {MAX_RESPONSE_BYTES} bytes" in messages[0], messages
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
    assert grown < 512 << 20, f"peak memory grew by {grown >> 20} MiB for a 1 MiB cap"
    time.sleep(0.2)  # the server notices the hang-up
    assert server.sent < 256 << 20, f"the client took {server.sent >> 20} MiB of a {2 * GIB >> 20} MiB answer"


def test_client_publish_and_lookup_deadlines(misbehaving) -> None:
    trickle = misbehaving("trickle-headers")
    client = ConfigClient(trickle.url, timeout=1.0, publish_timeout=1.0, retries=2, backoff=0.01)
    start = time.monotonic()
    with pytest.warns(ServiceWarning, match="no answer within 1s"):
        key = RecordKey(
            kernel="ag_gemm",
            kernel_version=None,
            shape={"M": 1},
            dtype="bfloat16",
            world_size=2,
            hardware_id="h200x2-nvl",
        )
        assert client.lookup(key) is None
    with pytest.raises(ServiceError, match="publish failed after 2 tries; last: no answer within 1s"):
        client.publish(record())
    assert time.monotonic() - start < BOUND_S
    huge = misbehaving("huge")
    with pytest.raises(ServiceError, match=f"publish answered more than {MAX_RESPONSE_BYTES} bytes"):
        ConfigClient(huge.url).publish(record())
    client.close()


# ---- publishing a result tuned on a miss never holds the call ----------------------------------------------------


def test_publishing_to_a_silent_service_does_not_hold_the_call(db: str, misbehaving, monkeypatch) -> None:
    monkeypatch.setenv("JOINTTUNE_TOKEN", WRITE)
    server = misbehaving("silent")
    launch = make_launcher(db, server=server.url, on_miss="tune", tune_settings=TINY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, out, took = timed_call(launch, 32)
        # tuning itself takes a few seconds; publishing used to add 3 tries x 10 s on top
        assert source_of(launch, 32) == "tune" and torch.equal(out, torch.arange(32, dtype=torch.float32) * 2)
        assert took < 25, f"the call took {took:.1f} s"
        (saved,) = open_store(db).list_records(RecordKey.any(kernel="jt_sleep"))  # kept locally all the same
        assert saved.config == config
        server.close()  # the publish still under way fails now, in the background, without raising
        assert wait_for_publishes(60)
    publish = [m for m in (str(w.message) for w in caught) if "publishing to the config service failed" in m]
    assert len(publish) == 1, publish


# ---- arguments that can't work fail when the decorator is applied -------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "1", None])
def test_store_timeout_must_be_a_finite_number_above_zero(bad: object) -> None:
    for form in ({"space": "jt_sleep", "key": lambda x, *, world: {"M": 1}}, {"configs": [], "key": ["n"]}):
        with pytest.raises(ValueError, match=r"store_timeout_s: .* is not allowed; it must be a finite number"):
            joint_autotune(**form, store_timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError):  # also a TuningError, as the decorator's other argument errors
        joint_autotune(space="jt_sleep", store_timeout_s=bad)  # type: ignore[arg-type]
    assert issubclass(ArgumentError, TuningError)


@pytest.mark.parametrize("bad", ["localhost:8000", "ftp://host", "http://", "http://u:p@host", "http://h:99999", 7])
def test_a_malformed_server_argument_fails_at_decoration(bad: object) -> None:
    for form in ({"space": "jt_sleep", "key": lambda x, *, world: {"M": 1}}, {"configs": [], "key": ["n"]}):
        with pytest.raises(ValueError, match=r"server: .* is not allowed; use http://HOST"):
            joint_autotune(**form, server=bad)  # type: ignore[arg-type]


def test_a_malformed_server_env_var_is_an_unreachable_service(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    open_store(db).upsert_record(sleep_record(32, BEST))
    monkeypatch.setenv("JOINTTUNE_SERVER", "localhost:8000")  # no scheme: deployment config, not code
    launch = make_launcher(db, on_miss="default")  # decorating never reads the environment
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert timed_call(launch, 32)[0] == BEST and source_of(launch, 32) == "store"
        config, out, _ = timed_call(launch, 64)
        assert config == DEFAULT and torch.equal(out, torch.arange(64, dtype=torch.float32) * 2)
    messages = service_warnings(caught)
    assert len(messages) == 1, messages
    assert "JOINTTUNE_SERVER: 'localhost:8000' is not allowed; use http://HOST" in messages[0]
    assert "not using the config service" in messages[0]


@pytest.mark.parametrize("returned", [None, [("M", 64)], 64])
def test_a_key_that_returns_no_mapping_is_named(db: str, returned: object) -> None:
    def shape_of(x, *, world):
        return returned

    @joint_autotune(space="jt_sleep", key=shape_of, db_url=db, on_miss="default")
    def launch(x, *, world, config):
        return x

    with pytest.raises(KeyResultError, match=r"key: .*shape_of returned .* it must return the call's shape as a dict"):
        launch(torch.ones(4), world=W2)
    with pytest.raises(TypeError):  # a KeyResultError is a TypeError (and a TuningError)
        launch(torch.ones(4), world=W2)
