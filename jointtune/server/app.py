"""`create_app(settings)`: the FastAPI service over the tuning store.

The service is stateless over the store: any number of workers or replicas can share one
database. Errors never carry stack traces: bad input is 4xx naming the field, store outages are
503, anything unexpected is a generic 500 (logged server-side). Every 4xx and 503 a route can
answer is in the OpenAPI document with its body; `_openapi` adds the bearer-token security the
routes' dependencies enforce.

Example:
    >>> app = create_app(Settings(db_url="sqlite:///tuning.db", tokens="write:s3cret-token"))  # doctest: +SKIP
    >>> uvicorn.run(app)                                                                        # doctest: +SKIP
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from jointtune._version import __version__
from jointtune.db import InvalidRecordError
from jointtune.db.schema import NAME_CHARS, error_loc, printable
from jointtune.errors import StoreError
from jointtune.server.auth import TokenSet
from jointtune.server.limits import BodyLimitMiddleware, CostGate
from jointtune.server.metrics import Metrics, MetricsMiddleware
from jointtune.server.routes import ROUTERS
from jointtune.server.routing import role_needed, service_routes
from jointtune.server.settings import Settings

log = logging.getLogger("jointtune.server")

DESCRIPTION = f"""Best fused-kernel configs per (kernel, shape, dtype, world size, hardware).

Names (kernel, kernel_version, space_version, hardware_id) use {NAME_CHARS}. Writes need a bearer
token of role write (deletes: admin); reads need none unless the service requires read tokens.
Errors: 422 lists every refused field (`detail`: [{{loc, msg, type}}]); every other error is
`{{"detail": "..."}}`. A method a path does not take is 405 with `Allow` naming the path's methods.
Request bodies are limited in size (413) and must be UTF-8 JSON. Exports come a page at a time
(`next_after`), each page fits a request body and imports as it is. Reads that grow with the store
(export pages, record listings, dashboard pages) pass a gate: a worker answers a limited number at once
and 429 with `Retry-After` beyond them. Rules across fields, which JSON Schema can't state, are stated
in the schema of the object they bind as `x-jointtune-ordered` (these properties, where given, never
decrease in this order) and `x-jointtune-equal` (the values at these JSON pointers, `*` for every array
item, are equal).
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the store is opened (and migrated) on the first request that needs it."""
    settings = settings or Settings()
    # /docs and /redoc from files in the package (fastapi-offline), not a CDN: GPU clusters are often air-gapped
    app = FastAPIOffline(title="jointtune config service", version=__version__, description=DESCRIPTION)
    app.state.settings = settings
    app.state.tokens = TokenSet.load(settings.tokens, settings.tokens_file)
    app.state.metrics = Metrics()
    app.state.export_gate = CostGate(
        "exports", "JOINTTUNE_EXPORT_CONCURRENCY", settings.export_concurrency, settings.export_share
    )
    app.state.list_gate = CostGate(
        "listings (GET /v1/configs, /dashboard)",
        "JOINTTUNE_LIST_CONCURRENCY",
        settings.list_concurrency,
        settings.list_share,
    )
    for router in ROUTERS:
        app.include_router(router)
    app.state.routes = service_routes(ROUTERS)
    _add_handlers(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(BodyLimitMiddleware, limit=settings.body_limit_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (and `jointtune serve`): settings from the environment, one app per worker
    process. The app, and the store once it is opened (`deps.get_store`), live as long as the worker: they are
    frozen out of the cyclic garbage collector (`gc.freeze`), whose full collections of them (68 ms on a
    busy 2-core machine, 0.2 ms without them) paused every request in flight."""
    app = create_app(Settings())
    app.state.freeze_gc = True
    gc.freeze()
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the bearer security each route enforces: writes always, reads only
    when `read_token_required` (else a token is optional: `[{}, {bearer: []}]`); errors as JSON."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    required: list[dict[str, list[str]]] = [{"bearer": []}]
    read = required if app.state.settings.read_token_required else [{}, *required]
    for route in app.state.routes:
        if not route.include_in_schema:
            continue
        role = role_needed(route.dependant)
        for method in route.methods if role is not None else ():
            operation = schema["paths"][route.path_format].get(method.lower())
            if operation is not None:
                operation["security"] = read if role == "read" else required
    for item in schema["paths"].values():
        for operation in item.values():
            _errors_as_json(operation)
    app.openapi_schema = schema
    return schema


def _errors_as_json(operation: dict[str, Any]) -> None:
    """Errors are JSON on every route (`{"detail": ...}`); FastAPI files them under the route's own media type,
    text/html for the dashboard and text/plain for /metrics."""
    for code, response in operation.get("responses", {}).items():
        content = response.get("content")
        if code[:1] in ("4", "5") and content and list(content) != ["application/json"]:
            response["content"] = {"application/json": next(iter(content.values()))}


def _problem(loc: Any, msg: Any, kind: Any) -> dict[str, Any]:
    # Valid Unicode, bounded: a refused key or value may itself be a lone surrogate or megabytes long.
    return {"loc": error_loc(loc), "msg": printable(str(msg), 500), "type": printable(str(kind), 64)}


def _add_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # pydantic's own errors name the field in `loc`; drop `input`/`ctx` (may echo huge or odd values)
        errors = [_problem(e.get("loc", ()), e.get("msg", ""), e.get("type", "")) for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(InvalidRecordError)
    async def _invalid_record(request: Request, exc: InvalidRecordError) -> JSONResponse:
        # the store's checks of what a route passed on: query parameters, or the body of a write
        where = "query" if request.method in ("GET", "HEAD", "DELETE") else "body"
        errors = [_problem([where, *p["loc"]], p["msg"], p["type"]) for p in exc.problems]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(StoreError)
    async def _store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": "the tuning store is unavailable; try again later"}, status_code=503)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal server error"}, status_code=500)
