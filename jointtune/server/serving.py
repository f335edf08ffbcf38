"""How `jointtune serve` runs the app: uvicorn with the service's connection limits, on a worker per core.

uvicorn bounds the connections a worker serves (`limit_concurrency`: a request arriving beyond it is
answered 503) and how long an idle keep-alive connection stays open (`timeout_keep_alive`), but not how
long a client may take to send a request: 2,000 half-sent requests were held for 40 s and none was
closed (issue 38), each holding a socket and, past the limit, every later client's place.
`TimedH11Protocol` is uvicorn's own h11 protocol with one timer more: a connection must deliver each
request whole, headers and body, within `read_timeout_s` of its opening or of the previous response,
or it is closed. The timer is armed twice per request and only reads h11's state when it fires.

Example:
    >>> config = uvicorn_config(Settings(), host="127.0.0.1", port=8000, workers=default_workers())  # doctest: +SKIP
    >>> uvicorn.Server(config).run()                                                                  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from jointtune.server.settings import Settings

#: the app `serve` runs in every worker (built from the environment there)
APP = "jointtune.server.app:app_from_env"
#: the most workers `serve` starts by itself: beyond this many, one service process per node is rarely the
#: bottleneck, and each worker holds its own pool of database connections
MAX_DEFAULT_WORKERS = 16


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells, as in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(cores: int | None = None) -> int:
    """`serve`'s worker processes when `--workers` is not given: one per available core, at most
    MAX_DEFAULT_WORKERS. A worker answers in one Python thread at a time (the GIL), so a flood of
    requests on one worker queues every lookup behind it while the other cores idle."""
    return max(1, min(cores if cores is not None else available_cores(), MAX_DEFAULT_WORKERS))


class ServiceConfig(uvicorn.Config):
    """uvicorn's Config with the read timeout its protocol (`TimedH11Protocol`) reads."""

    def __init__(self, *args: Any, read_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s


def uvicorn_config(
    settings: Settings, *, host: str, port: int, workers: int, app: Any = APP, log_level: str = "info"
) -> ServiceConfig:
    """The uvicorn config `serve` runs (and the tests of these limits): h11 with the read timeout, and at most
    `settings.max_connections` connections per worker."""
    return ServiceConfig(
        app,
        factory=isinstance(app, str),
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        http=TimedH11Protocol,
        limit_concurrency=settings.max_connections,
        read_timeout_s=settings.read_timeout_s,
    )


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request has not arrived whole in time."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.read_timeout_s: float = config.read_timeout_s
        self._read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._read_timer = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        waiting = self.conn.their_state is h11.IDLE  # no request yet, or its headers are still arriving
        # a body still arriving, unless uvicorn stopped reading because the app has not taken what came
        trickling = self.conn.their_state is h11.SEND_BODY and not self.flow.read_paused
        if waiting or trickling:
            self.transport.close()
