"""Limits on what one request may cost: the request body's size, the reads that grow with the store, and the
ids a message lists.

Body: bodies over `limit` bytes are refused with 413 before any route parses them. The body is read
here (up to the limit) and replayed to the app, so a client that lies in Content-Length or streams
chunks gets the same answer as one that declares a huge body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import HTTPException

#: the most ids (hardware, kernels) a message lists: a 404 of an unknown one, `jointtune export`
MAX_LISTED_IDS = 50
#: what a 429 asks the client to wait, in seconds
RETRY_AFTER_S = 1
#: the longest a gated request rests after it was answered (one that was slow for other reasons)
MAX_REST_S = 5.0
#: how long a refused request waits for its 429 on the event loop (no thread, no CPU)
REFUSAL_PAUSE_S = 0.25


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


class CostGate:
    """One kind of read's share of a worker: at most `slots` requests at once, and `share` of the time.

    For the reads whose work grows with the store (export pages, the dashboard, record listings), so
    that lookups stay served while anonymous clients ask for them as fast as they can:
    - concurrency: a request beyond `slots` in progress is refused at once with 429 and Retry-After,
      instead of queueing on the thread pool;
    - refusals: a 429 on the event loop is answered after REFUSAL_PAUSE_S, so a client that ignores
      Retry-After and asks again at once asks 4 times a second, not hundreds (each refusal still
      costs a worker a request's parsing and routing);
    - rate: a request holds its slot for `1 / share` times as long as it took (the rest is a sleep,
      which uses no CPU and holds no lock), so each slot spends at most `share` of a worker's time on
      them however many clients ask (`slots * share` in all). At the export's share of 0.1, a page of
      1000 records that took 15 ms is answered after 150 ms: a 100k-record export takes about 15 s on
      an idle 2-core machine, and lookups' p99 stays within 2x of idle while four clients export at
      once (bench/service/export_vs_lookup.py; bench/results/export_vs_lookup_2026-11-23.json).

    Example:
        >>> gate = CostGate("exports", "JOINTTUNE_EXPORT_CONCURRENCY", slots=1, share=0.1)
        >>> with gate.enter():
        ...     pass  # build the page
    """

    def __init__(self, what: str, setting: str, slots: int, share: float = 1.0) -> None:
        self.what, self.setting, self.slots, self.share = what, setting, slots, share
        self._free = threading.BoundedSemaphore(slots)

    @contextlib.contextmanager
    def enter(self) -> Iterator[None]:
        """Hold a slot from a thread (429 at once when none is free); the rest is a sleep in that thread."""
        began = self._admit()
        try:
            yield
        finally:
            try:
                time.sleep(self._rest(began))
            finally:
                self._free.release()

    @contextlib.asynccontextmanager
    async def enter_async(self) -> AsyncIterator[None]:
        """`enter` for a route on the event loop: a refusal costs no thread hop and is answered after a pause, and
        the rest is awaited."""
        try:
            began = self._admit()
        except HTTPException:
            await asyncio.sleep(REFUSAL_PAUSE_S)
            raise
        try:
            yield
        finally:
            try:
                await asyncio.sleep(self._rest(began))
            finally:
                self._free.release()

    def _admit(self) -> float:
        if not self._free.acquire(blocking=False):
            raise HTTPException(
                429,
                f"{self.what}: this worker is answering {self.slots} such request(s) already ({self.setting}); "
                f"retry after {RETRY_AFTER_S} s",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return time.monotonic()

    def _rest(self, began: float) -> float:
        return min((time.monotonic() - began) * (1 / self.share - 1), MAX_REST_S)


def listed(ids: list[str], total: int) -> str:
    """The first ids a message shows (at most MAX_LISTED_IDS of `total`), and how many more there are."""
    shown = ids[:MAX_LISTED_IDS]
    return f"{shown}" + (f" and {total - len(shown)} more" if total > len(shown) else "")
