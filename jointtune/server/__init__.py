"""The config service: FastAPI over the tuning store (lookups, publish, bundles, auth, metrics).

Example:
    >>> from jointtune.server import Settings, create_app                       # doctest: +SKIP
    >>> app = create_app(Settings(db_url="sqlite:///tuning.db"))               # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jointtune._lazy import lazy_exports

if TYPE_CHECKING:
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

# lazily (`jointtune._lazy`): a bundle's import or export (`jointtune.server.bundle`, the CLI's, a benchmark's) loads
# the store and the schemas, not the FastAPI app and what it imports
_EXPORTS = {
    "app_from_env": "app", "create_app": "app", "ROLES": "auth", "TokenConfigError": "auth", "TokenSet": "auth",
    "BundleError": "bundle", "export_page": "bundle", "import_bundle": "bundle", "import_bundles": "bundle",
    "parse_bundle": "bundle", "write_bundle": "bundle", "SCHEMA_VERSION": "schemas", "Settings": "settings",
}  # fmt: skip

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
