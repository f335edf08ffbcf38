"""A short schemathesis run against the app's own OpenAPI schema: whatever the input, never a 5xx.

The app is built at import time (schemathesis parametrizes at collection) over a SQLite file in a
temporary folder that holds one record, so lookups also reach the store's code paths.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from jt_server import WRITE, record

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402

from jointtune.db import NewRecord, Store  # noqa: E402
from jointtune.server import Settings, create_app  # noqa: E402

_FOLDER = tempfile.mkdtemp(prefix="jt-schema-")
atexit.register(shutil.rmtree, _FOLDER, ignore_errors=True)
_URL = f"sqlite:///{_FOLDER}/schema.db"
with Store(_URL) as _store:
    _store.upsert_record(NewRecord(**record()))
_APP = create_app(Settings(db_url=_URL, tokens=f"admin:{WRITE}"))

schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {WRITE}"}, checks=[not_a_server_error])
