"""`ConfigClient`: the decorator's view of the config service; a lookup never breaks a training job.

`lookup` answers None whenever the service can't help (down, slow, 5xx, bad JSON, a miss) and
warns once per cause, so a flaky service costs one warning, not a log flood or a crash. An answer is
read with the store's own model of it (`jointtune.db.LookupOut`, built from the record schema): one
that doesn't fit is malformed, a warned miss. `find` returns that model, `lookup` the JSON it checked.
`publish` retries connection errors and 5xx with exponential backoff, then raises ServiceError.

Example:
    >>> client = ConfigClient("http://tuning.internal:8000", token="...")      # doctest: +SKIP
    >>> client.lookup("ag_gemm", {"M": 8192, "N": 4096, "K": 12288}, "bfloat16", 2, "h200x2-nvl")
"""

from __future__ import annotations

import os
import time
import warnings
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx

from jointtune.errors import ServiceError

if TYPE_CHECKING:
    from jointtune.db import LookupOut

ENV_SERVER = "JOINTTUNE_SERVER"
ENV_TOKEN = "JOINTTUNE_TOKEN"
_ALLOWED = "http://HOST[:PORT][/PREFIX] or https://HOST[:PORT][/PREFIX] (no query, fragment or credentials)"


class ServiceWarning(UserWarning):
    """The config service could not answer a lookup; the caller falls back (local store, default)."""


def _check_base_url(base_url: Any) -> str:
    if not isinstance(base_url, str):
        raise ServiceError(f"base_url: {base_url!r} is not allowed; use {_ALLOWED}")
    try:
        parts = urlsplit(base_url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
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


class ConfigClient:
    """Talks to one config service over HTTP (httpx), with short timeouts for lookups."""

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
        self.base_url = _check_base_url(base_url)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ServiceError(f"timeout: {timeout!r} is not allowed; use seconds > 0")
        if not isinstance(retries, int) or retries < 1:
            raise ServiceError(f"retries: {retries!r} is not allowed; use an integer >= 1")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = float(timeout)
        self.publish_timeout = float(publish_timeout)
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(base_url=self.base_url, headers=headers, trust_env=False)
        self._warned: set[str] = set()

    @classmethod
    def from_env(cls, **kwargs: Any) -> ConfigClient | None:
        """A client for $JOINTTUNE_SERVER with $JOINTTUNE_TOKEN, or None when no server is configured."""
        url = os.environ.get(ENV_SERVER, "").strip()
        if not url:
            return None
        return cls(url, token=os.environ.get(ENV_TOKEN) or None, **kwargs)

    def __repr__(self) -> str:
        return f"ConfigClient({self.base_url!r})"

    def __enter__(self) -> ConfigClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _warn(self, cause: str, message: str) -> None:
        if cause not in self._warned:
            self._warned.add(cause)
            # attributed to the code that called lookup/find (their helper `_answer` calls this)
            warnings.warn(f"config service {self.base_url}: {message}; falling back", ServiceWarning, stacklevel=4)

    def lookup(
        self,
        kernel: str,
        shape: dict[str, int],
        dtype: str,
        world_size: int,
        hardware_id: str,
        kernel_version: str | None = None,
        *,
        nearest: bool = True,
        timing: str = "gpu",
    ) -> dict[str, Any] | None:
        """The service's answer for this key and timing policy (`match` says exact or nearest), as the
        JSON object it sent once `LookupOut` has accepted it, or None. Never raises."""
        answer = self._answer(kernel, shape, dtype, world_size, hardware_id, kernel_version, nearest, timing)
        return None if answer is None else answer[0]

    def find(
        self,
        kernel: str,
        shape: dict[str, int],
        dtype: str,
        world_size: int,
        hardware_id: str,
        kernel_version: str | None = None,
        *,
        nearest: bool = True,
        timing: str = "gpu",
    ) -> LookupOut | None:
        """`lookup`'s answer as a `jointtune.db.LookupOut` (typed fields), or None. Never raises."""
        answer = self._answer(kernel, shape, dtype, world_size, hardware_id, kernel_version, nearest, timing)
        return None if answer is None else answer[1]

    def _answer(
        self,
        kernel: str,
        shape: dict[str, int],
        dtype: str,
        world_size: int,
        hardware_id: str,
        kernel_version: str | None,
        nearest: bool,
        timing: str,
    ) -> tuple[dict[str, Any], LookupOut] | None:
        """(the answer's JSON, the answer) or None, with one warning per cause when the service can't help."""
        try:
            from pydantic import ValidationError

            from jointtune.db import LookupOut
            from jointtune.db.schema import describe

            params: dict[str, Any] = {"dtype": dtype, "world_size": world_size, "hardware_id": hardware_id}
            if timing != "gpu":  # gpu is the service's default; a server older than policies takes no `timing`
                params["timing"] = timing
            if kernel_version is not None:
                params["kernel_version"] = kernel_version
            if not nearest:
                params["nearest"] = "false"
            params.update({str(k): int(v) for k, v in shape.items()})
            path = f"/v1/configs/{quote(str(kernel), safe='')}"
            response = self._http.get(path, params=params, timeout=self.timeout)
        except httpx.TimeoutException:
            self._warn("timeout", f"no answer within {self.timeout}s")
            return None
        except httpx.HTTPError as exc:
            self._warn("unreachable", f"can't be reached ({type(exc).__name__})")
            return None
        except Exception as exc:  # a lookup must never break the caller (bad shape values, ...)
            self._warn("request", f"lookup could not be sent ({type(exc).__name__}: {exc})")
            return None
        if response.status_code == 404:
            return None
        if response.status_code >= 500:
            self._warn("server-error", f"answered HTTP {response.status_code}")
            return None
        if response.status_code != 200:
            self._warn(
                f"http-{response.status_code}", f"refused the lookup (HTTP {response.status_code}: {_detail(response)})"
            )
            return None
        try:
            data = response.json()
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
        ServiceError naming the bad fields, without a request. Retries connection errors, timeouts and
        5xx with exponential backoff; a 4xx is the record's or the token's fault and raises
        ServiceError at once with the service's explanation.
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
                response = self._http.post("/v1/configs", json=body, timeout=self.publish_timeout)
            except httpx.HTTPError as exc:
                last = f"can't be reached ({type(exc).__name__})"
                continue
            if response.status_code >= 500:
                last = f"answered HTTP {response.status_code}"
                continue
            if response.status_code != 200:
                raise ServiceError(
                    f"config service {self.base_url}: publish refused with HTTP {response.status_code}: "
                    f"{_detail(response)}"
                )
            try:
                return response.json()
            except ValueError:
                raise ServiceError(f"config service {self.base_url}: publish answered malformed JSON") from None
        raise ServiceError(f"config service {self.base_url}: publish failed after {self.retries} tries; last: {last}")


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return str(detail if detail is not None else response.text[:200])
