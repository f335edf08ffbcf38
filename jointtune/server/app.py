"""`create_app(settings)`: the FastAPI service over the tuning store.

The service is stateless over the store: any number of workers or replicas can share one
database. Errors never carry stack traces: bad input is 4xx naming the field, store outages are
503, anything unexpected is a generic 500 (logged server-side).

Example:
    >>> app = create_app(Settings(db_url="sqlite:///tuning.db", tokens="write:s3cret-token"))  # doctest: +SKIP
    >>> uvicorn.run(app)                                                                        # doctest: +SKIP
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from jointtune import __version__
from jointtune.db import InvalidRecordError
from jointtune.errors import StoreError
from jointtune.server.auth import TokenSet
from jointtune.server.limits import BodyLimitMiddleware
from jointtune.server.metrics import Metrics, MetricsMiddleware
from jointtune.server.routes import ROUTERS
from jointtune.server.settings import Settings

log = logging.getLogger("jointtune.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the store is opened (and migrated) on the first request that needs it."""
    settings = settings or Settings()
    app = FastAPI(
        title="jointtune config service",
        version=__version__,
        description="Best fused-kernel configs per (kernel, shape, dtype, world size, hardware).",
    )
    app.state.settings = settings
    app.state.tokens = TokenSet.load(settings.tokens, settings.tokens_file)
    app.state.metrics = Metrics()
    for router in ROUTERS:
        app.include_router(router)
    _add_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=settings.body_limit_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (and `jointtune serve --workers N`): settings from the environment."""
    return create_app(Settings())


def _add_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # pydantic's own errors name the field in `loc`; drop `input`/`ctx` (may echo huge or odd values)
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(InvalidRecordError)
    async def _invalid_record(request: Request, exc: InvalidRecordError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(StoreError)
    async def _store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": "the tuning store is unavailable; try again later"}, status_code=503)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal server error"}, status_code=500)
