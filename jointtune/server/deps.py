"""Request dependencies: the store, opened once per app on first use (so /healthz works without it)."""

from __future__ import annotations

import gc
import threading
from typing import Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from jointtune.db import Store, open_store

_LOCK = threading.Lock()


def get_store(request: Request) -> Store:
    """The app's Store; opening it applies migrations. StoreError -> 503 via the app's handler."""
    state = request.app.state
    store = getattr(state, "store", None)
    if store is None:
        with _LOCK:
            store = getattr(state, "store", None)
            if store is None:
                store = open_store(state.settings.db_url)
                state.store = store
                if getattr(state, "freeze_gc", False):  # a worker's app (`app_from_env`): the store lives as long
                    gc.freeze()
    return store


async def store_dependency(request: Request) -> Store:
    """`StoreDep`: the open store straight from the event loop (a plain function would cost a thread
    hop on every request); the first request opens it in the thread pool, as connecting and
    migrating block."""
    store = getattr(request.app.state, "store", None)
    return store if store is not None else await run_in_threadpool(get_store, request)


StoreDep = Annotated[Store, Depends(store_dependency)]


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def declared_query_only(request: Request) -> None:
    """A query parameter the route doesn't declare is a 422: a misspelt filter (`?kernal=ag_gemm`) would
    otherwise be ignored and answer every record. A coroutine: a few set lookups, not worth a thread hop."""
    route = request.scope.get("route")
    if route is None:
        return
    known = _query_names(route.dependant)
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        allowed = ", ".join(sorted(known))
        raise RequestValidationError(
            [{"type": "extra_forbidden", "loc": ("query", name), "msg": f"unknown query parameter; allowed: {allowed}",
              "input": request.query_params[name]} for name in dict.fromkeys(unknown)]
        )  # fmt: skip
