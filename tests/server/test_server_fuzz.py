"""schemathesis against the live app, on SQLite and PostgreSQL: every operation, every check, all phases.

The whole schemathesis run (examples, coverage, fuzzing and stateful phases, as `st run` does) goes
through the app's ASGI interface with an admin token, over a store that holds a record, so lookups,
exports and deletions reach real rows. Every check is on (server errors, status codes, content types,
headers and bodies against the OpenAPI document, positive data accepted and negative data refused,
405s with `Allow`, auth enforced, use after free) except `max_response_time`, a timing check that
would flip on a loaded machine.

Deterministic and bounded by counts, not by time: a fixed seed, Hypothesis's derandomized
generation, no example database or cache, `MAX_EXAMPLES` per operation. About 10-13 s per backend
on an idle 2-core machine (50 examples took 15-20 s; the suite has a 15-minute budget on 2 cores).

Rules across fields, which JSON Schema can't state (a record's p10 <= p50 <= p90, a bundle's records of the
bundle's hardware), are stated in the document beside it: `x-jointtune-ordered` and `x-jointtune-equal` on
the object they bind. `map_case` reads them from the document, never from this file, and makes the
positive cases schemathesis draws satisfy them, so "schema-valid data is accepted" checks every rule the
document states; negative cases are left as drawn.
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
from jointtune.db.schema import EQUAL, LATENCY_ORDER, ORDERED  # noqa: E402
from jointtune.server import Settings, create_app  # noqa: E402

MAX_EXAMPLES = 30
SEED = 17


def _resolve(document: dict[str, Any], schema: Any) -> Any:
    while isinstance(schema, dict) and "$ref" in schema:
        node: Any = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _at(value: Any, parts: list[str]) -> list[tuple[Any, str]]:
    """(container, key) of every place a JSON pointer with `*` items names in `value`, where it exists."""
    if not parts:
        return []
    head, rest = parts[0], parts[1:]
    items = list(enumerate(value)) if head == "*" and isinstance(value, list) else []
    if head != "*" and isinstance(value, dict) and head in value:
        items = [(head, value[head])]
    if not rest:
        return [(value, key) for key, _ in items]
    return [place for _, child in items for place in _at(child, rest)]


def _apply_rules(document: dict[str, Any], schema: Any, value: Any) -> None:
    """Make `value` satisfy the document's cross-field rules of `schema` and of every schema inside it."""
    schema = _resolve(document, schema)
    if not isinstance(schema, dict):
        return
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        _apply_rules(document, branch, value)
    if isinstance(value, list):
        for item in value:
            _apply_rules(document, schema.get("items"), item)
        return
    if not isinstance(value, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        if name in value:
            _apply_rules(document, sub, value[name])
    given = [name for name in schema.get(ORDERED, []) if type(value.get(name)) in (int, float)]
    for name, number in zip(given, sorted(value[name] for name in given)):
        value[name] = number
    places = [place for pointer in schema.get(EQUAL, []) for place in _at(value, pointer.split("/")[1:])]
    for container, key in places[1:]:
        container[key] = places[0][0][places[0][1]]


def map_case(context: Any, case: Any) -> Any:
    """Positive cases satisfy the rules the document states beside JSON Schema (see the module docstring)."""
    if case.meta is None or not case.meta.generation.mode.is_positive or case.body is None:
        return case
    document = case.operation.schema.raw_schema
    operation = document["paths"][case.operation.path][case.method.lower()]
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    _apply_rules(document, schema, case.body)
    return case


def test_the_document_states_the_rules_across_fields(sqlite_url: str) -> None:
    schemas = create_app(Settings(db_url=sqlite_url)).openapi()["components"]["schemas"]
    assert schemas["RecordIn"][ORDERED] == list(LATENCY_ORDER)
    assert schemas["BundleIn"][EQUAL] == ["/hardware/hardware_id", "/records/*/hardware_id"]
    body = record(latency_p10_us=700.0, latency_p90_us=650.0)
    document = {"components": {"schemas": schemas}}
    _apply_rules(document, {"$ref": "#/components/schemas/RecordIn"}, body)
    assert [body[name] for name in LATENCY_ORDER] == [600.0, 650.0, 700.0]


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
