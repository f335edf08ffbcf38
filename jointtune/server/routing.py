"""`ServiceRoute`: FastAPI's route with the service's order of refusals, and a truthful `Allow`.

FastAPI parses a JSON body before it runs dependencies, so malformed JSON without a token was a
422 and revealed what a write route parses to anyone; here the route's auth check runs first
(401/403), then the body is parsed, and a body JSON can't be decoded (bad JSON, not UTF-8, nested
deeper than the parser goes) is a 422 like any invalid body, never FastAPI's undocumented 400. Only
UTF-8 is JSON here: UTF-16 and UTF-32 bodies, which Python's JSON parser would take, are refused by name.

A method a path does not support is 405 with `Allow` listing every method of every route on that
path (Starlette names only the first route's, e.g. `GET` for `/v1/configs`, which also takes POST).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute, APIRouter
from starlette.types import Receive, Scope, Send

from jointtune.db.schema import printable
from jointtune.server.auth import ROLE_OF_DEPENDENCY, check_role


def role_needed(dependant: Dependant) -> str | None:
    """The role a route's dependencies ask for (read, write or admin), None when it has no auth."""
    for dep in dependant.dependencies:
        role = ROLE_OF_DEPENDENCY.get(dep.call) or role_needed(dep)  # type: ignore[arg-type]
        if role is not None:
            return role
    return None


def _parses_json(request: Request) -> bool:
    """Whether FastAPI will parse this body as JSON (its own rule: an application/json or +json type)."""
    value = request.headers.get("content-type")
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _invalid_body(position: int, msg: str) -> RequestValidationError:
    return RequestValidationError([{"type": "json_invalid", "loc": ("body", position), "msg": msg}])


def _not_utf8(loc: tuple[str | int, ...], msg: str) -> RequestValidationError:
    return RequestValidationError([{"type": "encoding", "loc": loc, "msg": msg + _UTF8}])


_UTF8 = "; send JSON as UTF-8 without a byte order mark (RFC 8259 section 8.1)"


def _utf8_text(request: Request, body: bytes) -> str:
    """The body as UTF-8 text, or a 422 naming the encoding it is in. Python's `json.loads` of bytes guesses
    UTF-16 and UTF-32 from the NUL bytes and takes them; JSON between systems is UTF-8, so neither they nor
    a declared other charset are taken. A raw NUL byte is never JSON (it is escaped inside strings), so a body
    that has one is text of a wider encoding, whatever it decodes as."""
    message = email.message.Message()
    message["content-type"] = request.headers.get("content-type", "")
    charset = message.get_param("charset")
    if isinstance(charset, str) and charset.lower().replace("-", "").replace("_", "") != "utf8":
        raise _not_utf8(("header", "content-type"), f"charset={printable(charset, 32)!r} is not allowed")
    for bom, name in _BOMS:
        if body.startswith(bom):
            raise _not_utf8(("body", 0), f"the body starts with the byte order mark of {name}")
    nul = body.find(b"\x00")
    if nul >= 0:
        raise _not_utf8(("body", nul), "the body has NUL bytes, as UTF-16 and UTF-32 text has; JSON has none")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_utf8(("body", exc.start), f"the body is not UTF-8 (byte {body[exc.start]:#04x})") from None


#: byte order marks, longest first (UTF-32's little-endian mark starts with UTF-16's)
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xef\xbb\xbf", "UTF-8"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


async def _parse_body(request: Request) -> None:
    """Parse the JSON body once and keep it where Starlette keeps it (`Request.json` reads it from there, and
    FastAPI asks that); a body that can't be decoded is a 422, and so is one sent as another media type
    (`curl -d` sends form data), which FastAPI would refuse as a bare "not an object"."""
    body = await request.body()
    if not body:
        return
    if not _parses_json(request):
        got = printable(request.headers.get("content-type", "none"), 80)
        raise RequestValidationError(
            [{"type": "content_type", "loc": ("body",),
              "msg": f"send the body as JSON with the header Content-Type: application/json (got {got!r})"}]
        )  # fmt: skip
    text = _utf8_text(request, body)
    try:
        request._json = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid_body(exc.pos, f"JSON decode error: {exc.msg}") from None
    except RecursionError:
        raise _invalid_body(0, "JSON nested deeper than the parser allows") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise _invalid_body(0, f"JSON that can't be read: {printable(str(exc), 200)}") from None


class ServiceRoute(APIRoute):
    """Auth, then the body, then FastAPI's own handling; 405s list the path's methods."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        role, has_body = role_needed(self.dependant), self.body_field is not None
        if role is None and not has_body:
            return handler

        async def checked(request: Request) -> Response:
            if role is not None:
                check_role(request, role)
            if has_body:
                await _parse_body(request)
            return await handler(request)

        return checked

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            allowed = sorted(_methods_of_path(scope))
            raise HTTPException(
                405,
                f"method {scope['method'][:16]!r} is not allowed here; allowed: {', '.join(allowed)}",
                headers={"Allow": ", ".join(allowed)},
            )
        await super().handle(scope, receive, send)


def _methods_of_path(scope: Scope) -> set[str]:
    """Every method some route of the app takes for this request's path (`service_routes`)."""
    methods: set[str] = set()
    for route in getattr(scope["app"].state, "routes", ()):
        if route.path_regex.match(scope["path"]):
            methods |= route.methods
    return methods


def service_routes(routers: Sequence[APIRouter]) -> list[APIRoute]:
    """The routes of these routers (included without a further prefix): what 405s and the OpenAPI
    security read, kept on `app.state.routes` because FastAPI's app-level route list holds
    included routers, not their routes."""
    return [route for router in routers for route in router.routes if isinstance(route, APIRoute)]
