"""`Settings`: everything the service reads from its environment (prefix `JOINTTUNE_`), in one place.

Example:
    >>> Settings(db_url="sqlite:///tuning.db", tokens="write:s3cret").body_limit_bytes
    1048576
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Service settings: database, who may read and write, and how big a request may be.

    `tokens` is "role:token,role:token" (roles: read, write, admin); `tokens_file` holds one
    "role:token" per line. Both may be given; their tokens are merged.
    """

    model_config = SettingsConfigDict(env_prefix="JOINTTUNE_", extra="ignore")

    db_url: str | None = None
    read_token_required: bool = False
    tokens: str = Field(default="", repr=False)
    tokens_file: Path | None = None
    body_limit_bytes: int = Field(default=1024 * 1024, ge=1024)
