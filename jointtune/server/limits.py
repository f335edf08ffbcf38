"""Limits on what one request may cost: the request body's size, and exports at once.

Body: bodies over `limit` bytes are refused with 413 before any route parses them. The body is read
here (up to the limit) and replayed to the app, so a client that lies in Content-Length or streams
chunks gets the same answer as one that declares a huge body.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from fastapi import HTTPException

#: what a 429 asks the client to wait, in seconds
RETRY_AFTER_S = 1
#: the longest an export page rests after it was built (a page that was slow for other reasons)
MAX_REST_S = 5.0


class BodyLimitMiddleware:
    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        payload = json.dumps({"detail": f"request body: larger than the limit of {self.limit} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class ExportGate:
    """Exports' share of a worker: at most `slots` pages at once, and `share` of the time.

    An export page is the one request whose work grows with the store. Two limits keep lookups
    served while clients pull full exports (bench/export_vs_lookup.py measures them):
    - concurrency: a request beyond `slots` pages in progress is refused at once with 429 and
      Retry-After, instead of queueing on the thread pool;
    - rate: a page holds its slot for `1 / share` times as long as it took to build (the rest is a
      sleep, which uses no CPU and holds no lock), so exports use at most `share` of a worker's time
      however many clients ask. At the default share of 0.1, a page of 1000 records that took 15 ms
      is answered after 150 ms: a 100k-record export takes about 15 s on an idle 2-core machine,
      and lookups' p99 stays within 2x of idle while four clients export at once
      (bench/export_vs_lookup.py; bench/results/export_vs_lookup_2026-11-23.json).
    """

    def __init__(self, slots: int, share: float = 1.0) -> None:
        self.slots, self.share = slots, share
        self._free = threading.BoundedSemaphore(slots)

    @contextlib.contextmanager
    def enter(self) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            raise HTTPException(
                429,
                f"exports: {self.slots} page(s) are being built already; retry after {RETRY_AFTER_S} s",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        began = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - began
            try:
                time.sleep(min(spent * (1 / self.share - 1), MAX_REST_S))
            finally:
                self._free.release()
