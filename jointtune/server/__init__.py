"""The config service: FastAPI over the tuning store (lookups, publish, bundles, auth, metrics).

Example:
    >>> from jointtune.server import Settings, create_app                       # doctest: +SKIP
    >>> app = create_app(Settings(db_url="sqlite:///tuning.db"))               # doctest: +SKIP
"""

from __future__ import annotations

from jointtune.server.app import app_from_env, create_app
from jointtune.server.auth import ROLES, TokenConfigError, TokenSet
from jointtune.server.bundle import (
    BundleError,
    export_page,
    import_bundle,
    import_bundles,
    parse_bundle,
    write_bundle,
)
from jointtune.server.schemas import SCHEMA_VERSION
from jointtune.server.settings import Settings

__all__ = [
    "ROLES",
    "SCHEMA_VERSION",
    "BundleError",
    "Settings",
    "TokenConfigError",
    "TokenSet",
    "app_from_env",
    "create_app",
    "export_page",
    "import_bundle",
    "import_bundles",
    "parse_bundle",
    "write_bundle",
]
