"""`/healthz` (the process answers), `/readyz` (the database answers, at the newest schema), `/metrics`.

The probes answer without a token whatever the settings: orchestrators and load balancers ask them
without one, and they say only whether the service can answer (and the store's backend and schema
revision). `/metrics` is a read like the others.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from jointtune.errors import StoreError
from jointtune.server.auth import ReadAuthDep
from jointtune.server.deps import get_store
from jointtune.server.routing import ServiceRoute
from jointtune.server.schemas import HealthOut, ReadyOut, responses

router = APIRouter(tags=["health"], route_class=ServiceRoute)


@router.get("/healthz", response_model=HealthOut)
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "The store can't be reached, or its schema is not at head"}},
)
def readyz(request: Request) -> Response:
    """503 while the store can't be opened or read, or its schema is not at head."""
    try:
        store = get_store(request)
        revision, head = store.revision(), store.head_revision()
    except StoreError:
        return JSONResponse({"status": "unavailable", "detail": "the tuning store can't be reached"}, status_code=503)
    if revision != head:
        return JSONResponse({"status": "unavailable", "detail": f"schema at {revision}, head is {head}"}, 503)
    return JSONResponse({"status": "ready", "backend": store.backend, "revision": revision})


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"},
        **responses(401),
    },
)
def metrics(request: Request, _role: ReadAuthDep) -> Response:
    """Prometheus metrics: request latency per method, route and status, and lookups by result. A read like
    any other (they tell who uses the service how): a token is needed where the service requires read
    tokens."""
    body, content_type = request.app.state.metrics.render()
    return Response(body, media_type=content_type)
