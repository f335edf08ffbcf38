"""Request dependencies: the store, opened once per app on first use (so /healthz works without it)."""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import Depends, Request

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
    return store


StoreDep = Annotated[Store, Depends(get_store)]
