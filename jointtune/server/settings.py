"""`Settings`: everything the service reads from its environment (prefix `JOINTTUNE_`), in one place.

Example:
    >>> Settings(db_url="sqlite:///tuning.db", tokens="write:s3cret-token").body_limit_bytes
    1048576
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jointtune.db.schema import MAX_JSON_BYTES

#: room in a request body for one bundle's envelope and hardware profile (fingerprint <= MAX_JSON_BYTES)
ENVELOPE_BYTES = 2 * MAX_JSON_BYTES
#: the largest record a page must still hold: a config of MAX_JSON_BYTES plus its other fields
MAX_RECORD_BYTES = MAX_JSON_BYTES + 4096


class Settings(BaseSettings):
    """Service settings: database, who may read and write, how big a request and an export page may be.

    `tokens` is "role:token,role:token" (roles: read, write, admin; tokens of >= 8 characters);
    `tokens_file` holds one "role:token" per line. Both may be given; their tokens are merged.
    An export page is at most `export_page_bytes` (and so always fits in a request body: a page can
    be posted back as it is); each worker builds at most `export_concurrency` pages at once and
    spends at most `export_share` of its time on exports; `list_concurrency` and `list_share` are the same
    for the dashboard and record listings (`CostGate`). A worker holds at most `max_connections` open
    connections (uvicorn answers 503 beyond them), and closes one whose request has not arrived whole,
    headers and body, within `read_timeout_s` of its start (`jointtune.server.serving`).
    """

    model_config = SettingsConfigDict(env_prefix="JOINTTUNE_", extra="ignore")

    db_url: str | None = None
    read_token_required: bool = False
    tokens: str = Field(default="", repr=False)
    tokens_file: Path | None = None
    body_limit_bytes: int = Field(default=1024 * 1024, ge=ENVELOPE_BYTES + MAX_RECORD_BYTES, le=2**31 - 1)
    export_page_bytes: int = Field(default=512 * 1024, ge=MAX_RECORD_BYTES)
    export_concurrency: int = Field(default=1, ge=1, le=64)
    export_share: float = Field(default=0.1, gt=0, le=1)
    list_concurrency: int = Field(default=1, ge=1, le=64)
    list_share: float = Field(default=0.1, gt=0, le=1)
    max_connections: int = Field(default=1000, ge=1, le=1_000_000)
    read_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _page_fits_a_body(self) -> Settings:
        if self.export_page_bytes > self.body_limit_bytes - ENVELOPE_BYTES:
            raise ValueError(
                f"export_page_bytes: {self.export_page_bytes} is not allowed; it must be <= body_limit_bytes - "
                f"{ENVELOPE_BYTES} = {self.body_limit_bytes - ENVELOPE_BYTES}, so that an exported page can be "
                "posted back"
            )
        return self
