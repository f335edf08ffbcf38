"""Bearer tokens with roles: reads open unless configured, writes need write or admin, deletes admin.

Only SHA-256 digests of the tokens stay in memory, and every comparison is constant-time
(`hmac.compare_digest`) so response timing does not leak how much of a guess was right.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from jointtune.errors import ServiceError

ROLES = ("read", "write", "admin")
_RANK = {role: i for i, role in enumerate(ROLES)}


class TokenConfigError(ServiceError, ValueError):
    """A token list or token file the service can't use (names the entry and what is allowed)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenSet:
    """The configured tokens, as (digest, role) pairs.

    Example:
        >>> TokenSet.parse("admin:admin-token-1, write:writer-token-2").role_of("writer-token-2")
        'write'
    """

    def __init__(self, entries: list[tuple[bytes, str]]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def parse(cls, text: str, *, source: str = "JOINTTUNE_TOKENS", separator: str = ",") -> TokenSet:
        entries: list[tuple[bytes, str]] = []
        for number, raw in enumerate(text.split(separator), start=1):
            item = raw.strip()
            if not item or item.startswith("#"):
                continue
            role, sep, token = item.partition(":")
            role, token = role.strip(), token.strip()
            if not sep or role not in _RANK or len(token) < 8:
                raise TokenConfigError(
                    f"{source}: entry {number} is not allowed; use role:token with role one of "
                    f"{', '.join(ROLES)} and a token of >= 8 characters"
                )
            entries.append((_digest(token), role))
        return cls(entries)

    @classmethod
    def load(cls, tokens: str, tokens_file: Path | None) -> TokenSet:
        """Tokens from the env string and the file (one role:token per line), merged."""
        entries = cls.parse(tokens)._entries
        if tokens_file is not None:
            try:
                text = Path(tokens_file).read_text()
            except OSError as exc:
                raise TokenConfigError(
                    f"JOINTTUNE_TOKENS_FILE: {str(tokens_file)!r} can't be read ({exc.strerror})"
                ) from exc
            entries = entries + cls.parse(text, source=str(tokens_file), separator="\n")._entries
        return cls(entries)

    def role_of(self, token: str) -> str | None:
        """The highest role this token has, or None; checks every entry so timing is uniform."""
        digest, found = _digest(token), None
        for known, role in self._entries:
            if hmac.compare_digest(digest, known) and (found is None or _RANK[role] > _RANK[found]):
                found = role
        return found


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "authorization: use 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def check_role(request: Request, needed: str) -> str | None:
    """The caller's role; 401 without a valid token, 403 when its role is below `needed`.

    Runs where the route starts (`ServiceRoute`), before its body is parsed; the dependencies below
    run it again, which only costs a hash, and mark the route's role for the OpenAPI document."""
    tokens: TokenSet = request.app.state.tokens
    token = _bearer(request)
    if token is None:
        if needed == "read" and not request.app.state.settings.read_token_required:
            return None
        raise HTTPException(
            401,
            f"this endpoint needs a bearer token with role {needed} or higher",
            headers={"WWW-Authenticate": "Bearer"},
        )
    role = tokens.role_of(token)
    if role is None:
        raise HTTPException(401, "the bearer token is not valid", headers={"WWW-Authenticate": "Bearer"})
    if _RANK[role] < _RANK[needed]:
        raise HTTPException(403, f"role {role} may not do this; it needs role {needed} or higher")
    return role


# Coroutines on purpose: the check is a hash and a few comparisons, and FastAPI would hand a plain
# function to its thread pool, a thread hop on every request (measured on the lookup route).
async def require_read(request: Request) -> str | None:
    return check_role(request, "read")


async def require_write(request: Request) -> str | None:
    return check_role(request, "write")


async def require_admin(request: Request) -> str | None:
    return check_role(request, "admin")


#: dependency -> the role it asks for (the route class and the OpenAPI document read it)
ROLE_OF_DEPENDENCY = {require_read: "read", require_write: "write", require_admin: "admin"}


ReadAuthDep = Annotated[str | None, Depends(require_read)]
AuthDep = Annotated[str | None, Depends(require_write)]
AdminDep = Annotated[str | None, Depends(require_admin)]
