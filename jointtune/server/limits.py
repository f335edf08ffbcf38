"""Limits on what one request may cost: the request body's size, and exports at once.

Body: bodies over `limit` bytes are refused with 413 before any route parses them. The body is read
here (up to the limit) and replayed to the app, so a client that lies in Content-Length or streams
chunks gets the same answer as one that declares a huge body.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from fastapi import HTTPException

#: what a 429 asks the client to wait, in seconds
RETRY_AFTER_S = 1


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
    """At most `slots` export pages built at once per worker; more is 429 with Retry-After.

    An export page is the one request whose work grows with the store; refusing extra ones at once
    (rather than queueing them on the thread pool) keeps lookups served while several clients pull
    full exports, and tells those clients when to come back.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)

    @contextlib.contextmanager
    def enter(self) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            raise HTTPException(
                429,
                f"exports: {self.slots} page(s) are being built already; retry after {RETRY_AFTER_S} s",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        try:
            yield
        finally:
            self._free.release()
