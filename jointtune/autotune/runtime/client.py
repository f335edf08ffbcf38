"""`ConfigClient`: the decorator's view of the config service; a lookup never breaks a training job.

`lookup` answers None whenever the service can't help (down, slow, 5xx, bad JSON, an answer too large, a
miss) and warns once per cause, so a flaky service costs one warning, not a log flood or a crash. An answer
is read with the store's own model of it (`jointtune.db.LookupOut`, built from the record schema): one
that doesn't fit is malformed, a warned miss. `find` returns that model, `lookup` the JSON it checked.
`publish` retries connection errors, timeouts and 5xx with exponential backoff, then raises ServiceError.

Every request has a total deadline (`timeout` for a lookup, `publish_timeout` for each publish attempt)
covering the connection, sending, the status line and headers and the whole body: a service that
trickles bytes can't hold a call longer than that (httpx's own timeouts apply to each read, not to the
request). Only the name lookup of the host (DNS) is outside it. A body is read as a stream and at most
`MAX_RESPONSE_BYTES` of it are kept: a record is a few KiB, so anything longer is refused, not buffered.

Example:
    >>> client = ConfigClient("http://tuning.internal:8000", token="...")      # doctest: +SKIP
    >>> key = RecordKey(kernel="ag_gemm", kernel_version=None, shape={"M": 8192, "N": 4096},  # doctest: +SKIP
    ...                 dtype="bfloat16", world_size=2, hardware_id="h200x2-nvl")
    >>> client.lookup(key)                                                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpcore
import httpx

from jointtune._warnings import warn
from jointtune.errors import ServiceError

if TYPE_CHECKING:
    from jointtune.db import LookupOut, RecordKey

ENV_SERVER = "JOINTTUNE_SERVER"
ENV_TOKEN = "JOINTTUNE_TOKEN"
_ALLOWED = "http://HOST[:PORT][/PREFIX] or https://HOST[:PORT][/PREFIX] (no query, fragment or credentials)"

#: the most of a response body the client reads (after content decoding); a record is a few KiB, the
#: service's largest config 64 KiB, so a longer answer is broken or hostile and is refused
MAX_RESPONSE_BYTES = 1024 * 1024


class ServiceWarning(UserWarning):
    """The config service could not answer a lookup; the caller falls back (local store, default)."""


class _TooLarge(Exception):
    """The service's answer was longer than `MAX_RESPONSE_BYTES`; it was not read to the end."""


# ---- the total deadline of a request --------------------------------------------------------------
# httpx's timeouts bound each socket operation, so a server sending a byte now and then holds a request
# forever. The client's transport runs on a network backend that bounds every connect, read and write by
# what is left of the deadline of the request this thread is making (set by `_deadline`); past it the
# operation raises httpcore's timeout, which httpx reports as its own (`httpx.TimeoutException`).

_CURRENT = threading.local()


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Every network operation of this thread's requests ends by `seconds` from now."""
    previous = getattr(_CURRENT, "deadline", None)
    _CURRENT.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _CURRENT.deadline = previous


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """`timeout` cut to what is left of the current deadline; `expired` is raised once nothing is left."""
    deadline = getattr(_CURRENT, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the request's total deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        tls = self._stream.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:  # fmt: skip
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


#: httpcore's errors as httpx's (the most specific first), what httpx's own transport does
_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        if hasattr(self._stream, "close"):
            self._stream.close()


class _DeadlineTransport(httpx.BaseTransport):
    """httpx's plain HTTP/1.1 transport (no proxies, as the client never read them) over `_DeadlineBackend`."""

    def __init__(self) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_DeadlineBackend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            response = self._pool.handle_request(core)
        return httpx.Response(
            status_code=response.status, headers=response.headers, stream=_Body(response.stream),
            extensions=response.extensions,
        )  # fmt: skip

    def close(self) -> None:
        self._pool.close()


def _read_capped(response: httpx.Response) -> bytes:
    """The (decoded) body, read as it arrives; _TooLarge as soon as it passes MAX_RESPONSE_BYTES."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _TooLarge(f"announced {int(declared)} bytes, more than {MAX_RESPONSE_BYTES} bytes (the most it reads)")
    parts: list[bytes] = []
    size = 0
    for part in response.iter_bytes():
        size += len(part)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge(f"answered more than {MAX_RESPONSE_BYTES} bytes (the most it reads)")
        parts.append(part)
    return b"".join(parts)


def _seconds(name: str, value: Any, *, zero_ok: bool = False) -> float:
    low_ok = isinstance(value, numbers.Real) and (value >= 0 if zero_ok else value > 0)
    if isinstance(value, bool) or not low_ok or not value < math.inf:
        low = ">= 0" if zero_ok else "> 0"
        raise ServiceError(f"{name}: {value!r} is not allowed; use seconds: a finite number {low}")
    return float(value)


def check_base_url(base_url: Any) -> str:
    """`base_url` without trailing slashes; ServiceError naming what is allowed unless it is a service URL."""
    if not isinstance(base_url, str) or not all(c.isprintable() and not c.isspace() for c in base_url.strip()):
        raise ServiceError(f"base_url: {base_url!r} is not allowed; use {_ALLOWED}")
    try:
        parts = urlsplit(base_url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
        httpx.URL(base_url.strip())  # what httpx would refuse when the client is made
    except (ValueError, httpx.InvalidURL):
        raise ServiceError(f"base_url: {base_url!r} is not allowed; use {_ALLOWED}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or parts.username
        or parts.password
    ):
        raise ServiceError(f"base_url: {base_url!r} is not allowed; use {_ALLOWED}")
    return base_url.strip().rstrip("/")


class ConfigClient(contextlib.AbstractContextManager):
    """Talks to one config service over HTTP (httpx), with short total deadlines for lookups.

    `timeout`: seconds a lookup may take in all (connect, send, headers, body); `publish_timeout`: the same
    for each publish attempt, of `retries` at most, `backoff` seconds apart (doubling).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 0.5,
        publish_timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
    ) -> None:
        self.base_url = check_base_url(base_url)
        self.timeout = _seconds("timeout", timeout)
        self.publish_timeout = _seconds("publish_timeout", publish_timeout)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
            raise ServiceError(f"retries: {retries!r} is not allowed; use an integer >= 1")
        self.backoff = _seconds("backoff", backoff, zero_ok=True)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, trust_env=False, transport=_DeadlineTransport()
        )
        self._warned: set[str] = set()

    @classmethod
    def from_env(cls, **kwargs: Any) -> ConfigClient | None:
        """A client for $JOINTTUNE_SERVER with $JOINTTUNE_TOKEN, or None when no server is configured.

        A malformed $JOINTTUNE_SERVER raises ServiceError (the decorator turns that into a warning)."""
        url = os.environ.get(ENV_SERVER, "").strip()
        if not url:
            return None
        return cls(url, token=os.environ.get(ENV_TOKEN) or None, **kwargs)

    def __repr__(self) -> str:
        return f"ConfigClient({self.base_url!r})"

    def __exit__(self, *exc: object) -> None:  # `with ConfigClient(url) as client:` closes it at the end
        self.close()

    def close(self) -> None:
        self._http.close()

    def _warn(self, cause: str, message: str) -> None:
        if cause not in self._warned:
            self._warned.add(cause)
            warn(f"config service {self.base_url}: {message}; falling back", ServiceWarning)

    def _exchange(
        self, method: str, path: str, seconds: float, *, body_of: Any = None, **kwargs: Any
    ) -> tuple[int, bytes]:
        """(status, body) of one request that ends within `seconds` in all (httpx.TimeoutException past
        that), its body read up to MAX_RESPONSE_BYTES (_TooLarge past that); `body_of(status)` False: not
        read at all."""
        with _deadline(seconds), self._http.stream(method, path, timeout=seconds, **kwargs) as response:
            if body_of is not None and not body_of(response.status_code):
                return response.status_code, b""
            return response.status_code, _read_capped(response)

    def lookup(self, key: RecordKey, *, nearest: bool = True) -> dict[str, Any] | None:
        """The service's answer for this key (`jointtune.db.RecordKey`; kernel_version None: any version) and its
        timing policy (`match` says exact or nearest), as the JSON object it sent once `LookupOut` has accepted
        it, or None. Never raises; takes at most `timeout` seconds (but for resolving the host's name)."""
        answer = self._answer(key, nearest)
        return None if answer is None else answer[0]

    def find(self, key: RecordKey, *, nearest: bool = True) -> LookupOut | None:
        """`lookup`'s answer as a `jointtune.db.LookupOut` (typed fields), or None. Never raises."""
        answer = self._answer(key, nearest)
        return None if answer is None else answer[1]

    def _answer(self, key: RecordKey, nearest: bool) -> tuple[dict[str, Any], LookupOut] | None:
        """(the answer's JSON, the answer) or None, with one warning per cause when the service can't help."""
        try:
            from pydantic import ValidationError

            from jointtune.db import LookupOut
            from jointtune.db.schema import describe

            params: dict[str, Any] = {"dtype": key.dtype, "world_size": key.world_size, "hardware_id": key.hardware_id}
            if key.timing != "gpu":  # gpu is the service's default; a server older than policies takes no `timing`
                params["timing"] = key.timing
            if key.kernel_version is not None:
                params["kernel_version"] = key.kernel_version
            if not nearest:
                params["nearest"] = "false"
            params.update({str(k): int(v) for k, v in key.shape.items()})
            path = f"/v1/configs/{quote(str(key.kernel), safe='')}"
            # a 404 (a miss) and a 5xx say all in their status: their bodies are not read
            status, body = self._exchange(
                "GET", path, self.timeout, params=params, body_of=lambda code: code != 404 and code < 500
            )
        except httpx.TimeoutException:
            self._warn("timeout", f"no answer within {self.timeout:g}s")
            return None
        except _TooLarge as exc:
            self._warn("too-large", str(exc))
            return None
        except httpx.HTTPError as exc:
            self._warn("unreachable", f"can't be reached ({type(exc).__name__})")
            return None
        except Exception as exc:  # a lookup must never break the caller (bad shape values, ...)
            self._warn("request", f"lookup could not be sent ({type(exc).__name__}: {exc})")
            return None
        if status == 404:
            return None
        if status >= 500:
            self._warn("server-error", f"answered HTTP {status}")
            return None
        if status != 200:
            self._warn(f"http-{status}", f"refused the lookup (HTTP {status}: {_detail(body)})")
            return None
        try:
            data = json.loads(body)
        except Exception:  # not JSON (or nested past the parser's recursion limit)
            self._warn("malformed", "answered with malformed JSON")
            return None
        try:  # the store's own model of the answer: one that doesn't fit is a miss, never an exception
            return data, LookupOut.model_validate(data)
        except Exception as exc:
            why = describe(exc, limit=3) if isinstance(exc, ValidationError) else type(exc).__name__
            self._warn("malformed", f"answered a malformed lookup ({why})")
            return None

    def publish(self, record: dict[str, Any]) -> dict[str, Any]:
        """Publish a record (the service keeps the better one); returns {"record": ..., "changed": bool}.

        The record is checked against the store's schema first: one the service would refuse raises
        ServiceError naming the bad fields, without a request. Each attempt ends within `publish_timeout`
        seconds in all; connection errors, timeouts and 5xx are retried with exponential backoff; a 4xx
        is the record's or the token's fault and raises ServiceError at once with the service's
        explanation, as does an answer that is not JSON or longer than MAX_RESPONSE_BYTES.
        """
        from pydantic import ValidationError

        from jointtune.db import STORE_SET, RecordIn
        from jointtune.db.schema import describe

        body = {k: v for k, v in record.items() if k not in STORE_SET}  # a Record's JSON publishes as-is
        try:  # the store's own schema: a record it would refuse is not sent (nor retried)
            RecordIn.model_validate(body)
        except ValidationError as exc:
            raise ServiceError(f"config service {self.base_url}: publish not sent: {describe(exc)}") from None
        last = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, answer = self._exchange(
                    "POST", "/v1/configs", self.publish_timeout, json=body, body_of=lambda code: code < 500
                )
            except httpx.TimeoutException:
                last = f"no answer within {self.publish_timeout:g}s"
                continue
            except _TooLarge as exc:
                raise ServiceError(f"config service {self.base_url}: publish {exc}") from None
            except httpx.HTTPError as exc:
                last = f"can't be reached ({type(exc).__name__})"
                continue
            if status >= 500:
                last = f"answered HTTP {status}"
                continue
            if status != 200:
                raise ServiceError(
                    f"config service {self.base_url}: publish refused with HTTP {status}: {_detail(answer)}"
                )
            try:
                return json.loads(answer)
            except ValueError:
                raise ServiceError(f"config service {self.base_url}: publish answered malformed JSON") from None
        raise ServiceError(f"config service {self.base_url}: publish failed after {self.retries} tries; last: {last}")


def _detail(body: bytes) -> str:
    """The `detail` of an error answer (FastAPI's), else the start of its body."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError, RecursionError):
        detail = None
    return str(detail if detail is not None else body[:200].decode("utf-8", "replace"))
