"""schemathesis against the live app, on SQLite and PostgreSQL: every operation, every check, all phases.

The whole schemathesis run (examples, coverage, fuzzing and stateful phases, as `st run` does) goes
through the app's ASGI interface with an admin token, over a store that holds a record, so lookups,
exports and deletions reach real rows. Every check is on (server errors, status codes, content types,
headers and bodies against the OpenAPI document, positive data accepted and negative data refused,
405s with `Allow`, auth enforced, use after free) except `max_response_time`, a timing check that
would flip on a loaded machine.

Deterministic and bounded by counts, not by time: a fixed seed, Hypothesis's derandomized
generation, no example database or cache, `MAX_EXAMPLES` per operation. About 15-20 s per backend
on an idle 2-core machine.

Cross-field rules JSON Schema can't state (documented in prose): a record's latencies satisfy
p10 <= p50 <= p90, and a bundle's records are of the bundle's hardware. `map_case` makes the
positive cases schemathesis draws satisfy them, so "schema-valid data is accepted" stays a check
of everything else; negative cases are left as drawn.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from jt_server import ADMIN, TOKENS, record

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.engine import Status, events  # noqa: E402

from jointtune.db import NewRecord, Store  # noqa: E402
from jointtune.server import Settings, create_app  # noqa: E402

MAX_EXAMPLES = 50
SEED = 17
_LATENCIES = ("latency_p10_us", "latency_p50_us", "latency_p90_us")


def _ordered(body: Any) -> None:
    if not isinstance(body, dict):
        return
    present = [k for k in _LATENCIES if type(body.get(k)) in (int, float)]
    for name, value in zip(present, sorted(body[k] for k in present)):
        body[name] = value


def map_case(context: Any, case: Any) -> Any:
    """Positive cases satisfy the rules JSON Schema can't state (see the module docstring)."""
    if case.meta is None or not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    if case.operation.path == "/v1/configs":
        _ordered(case.body)
    elif case.operation.path == "/v1/bundles":
        hardware = case.body.get("hardware")
        for item in case.body.get("records") or ():
            if isinstance(item, dict) and isinstance(hardware, dict):
                item["hardware_id"] = hardware.get("hardware_id")
            _ordered(item)
    return case


def _run(app: Any) -> tuple[list[str], Counter[str], set[str]]:
    config = SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {ADMIN}"},
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "cache": {"enabled": False},
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    schema.hook(map_case)
    problems: list[str] = []
    checks: Counter[str] = Counter()
    tested: set[str] = set()
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            if event.label and event.status is not Status.SKIP:
                tested.add(event.label)
            for case_id, results in event.recorder.checks.items():
                for check in results:
                    checks[check.name] += 1
                    if check.status is Status.FAILURE:
                        case = event.recorder.cases[case_id].value
                        failure = check.failure_info.failure if check.failure_info else None
                        message = getattr(failure, "title", "") + ": " + str(getattr(failure, "message", ""))[:300]
                        problems.append(f"{event.phase.name} {check.name}: {message}\n  {case.as_curl_command()}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            problems.append(f"schemathesis error: {event!r}"[:500])
    return problems, checks, tested


@pytest.mark.timeout(600)
def test_fuzzing_finds_nothing(db_url: str) -> None:
    with Store(db_url) as store:
        store.upsert_hardware(hardware_id="h200x2-nvl", name="2x H200", fingerprint={"sms": 132})
        store.upsert_record(NewRecord(**record()))
    # the gates' rests (a listing answered after 10x its time) only slow a sequential run down
    app = create_app(Settings(db_url=db_url, tokens=TOKENS, export_share=1.0, list_share=1.0))
    try:
        problems, checks, tested = _run(app)
    finally:
        store = getattr(app.state, "store", None)
        if store is not None:
            store.close()  # before the PostgreSQL database is dropped
    assert not problems, "\n".join(dict.fromkeys(problems))
    operations = {f"{method.upper()} {path}" for path, item in app.openapi()["paths"].items() for method in item}
    assert tested >= operations  # every operation, not a subset the run happened to reach
    every = {
        "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
        "response_schema_conformance", "negative_data_rejection", "positive_data_acceptance", "unsupported_method",
        "missing_required_header", "use_after_free", "ensure_resource_availability", "ignored_auth",
    }  # fmt: skip
    assert every <= set(checks), sorted(every - set(checks))
