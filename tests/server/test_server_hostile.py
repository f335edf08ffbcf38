"""Issue 17's hostile client, replayed against the live service on SQLite and PostgreSQL: each item it
found is a 4xx (or a documented behaviour), nothing bad is written, and every read keeps working."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from jt_server import ADMIN, LOOKUP, WRITE, LiveServer, count, record, serve

from jointtune.cli import main
from jointtune.db import NewRecord, Store
from jointtune.server.metrics import METHODS

JSON = {"content-type": "application/json"}
SHAPE = {"M": 8192, "N": 4096, "K": 12288}


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"x": value}
    return value


def _cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _locs(response: httpx.Response) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [item["loc"] for item in response.json()["detail"]]


def _reads_work(http: httpx.Client) -> None:
    assert http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE}).status_code == 200
    assert http.get("/v1/configs").status_code == 200
    assert http.get("/v1/bundles/h200x2-nvl").status_code == 200
    assert http.get("/dashboard").status_code == 200


def test_unreadable_records_are_refused_and_reads_keep_working(server: LiveServer, tmp_path: Path) -> None:
    """Item 1: a config ~300 levels deep or with a lone surrogate was saved (after a 500) and then broke reads."""
    deep = json.dumps(record(config=_nested(300)))
    surrogate = json.dumps(record(config={"mode": "LONE"})).replace("LONE", "\\ud800")
    with server.client(WRITE) as http:
        assert http.post("/v1/configs", json=record()).status_code == 200
        assert _locs(http.post("/v1/configs", content=deep, headers=JSON))[0][:3] == ["body", "config", "x"]
        assert _locs(http.post("/v1/configs", content=surrogate, headers=JSON)) == [["body", "config", "mode"]]
        page = http.get("/v1/bundles/h200x2-nvl").json()
        page["records"][0]["config"] = {"mode": "LONE"}
        bad_bundle = json.dumps(page).replace("LONE", "\\ud800")
        assert _locs(http.post("/v1/bundles", content=bad_bundle, headers=JSON))[0][:3] == ["body", "records", 0]
        _reads_work(http)
    assert count(server.db_url) == 1
    bundle = tmp_path / "surrogate.json"  # `jointtune import` took both too
    bundle.write_text(bad_bundle)
    assert _cli(["import", str(bundle), "--db", server.db_url]) == 2
    bundle.write_text(json.dumps({**page, "records": [record(config=_nested(300))]}))
    assert _cli(["import", str(bundle), "--db", server.db_url]) == 2
    with Store(server.db_url) as store:
        assert [r.config for r in store.list_records()] == [record()["config"]]


def test_huge_dimensions_are_refused_and_the_largest_still_serves(server: LiveServer) -> None:
    """Item 2: after M = 10**309, PostgreSQL failed every nearest lookup of the group (503)."""
    huge = json.dumps(record(shape={"M": 1, "N": 4096, "K": 12288})).replace('"M": 1,', f'"M": {10**309},')
    with server.client(WRITE) as http:
        assert _locs(http.post("/v1/configs", content=huge, headers=JSON)) == [["body", "shape", "M"]]
        assert http.post("/v1/configs", json=record(shape={**SHAPE, "M": 2**53})).status_code == 200
        near = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "M": 4096})
        too_big = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "M": 2**53 + 1})
    assert near.status_code == 200 and near.json()["shape"]["M"] == 2**53
    assert _locs(too_big) == [["query", "M"]]


def test_metrics_labels_stay_bounded(sqlite_server: LiveServer) -> None:
    """Item 3: every invented HTTP method became its own metrics series (34 MB, a 21 MB /metrics)."""

    def series(http: httpx.Client) -> set[str]:
        text = http.get("/metrics").text
        return {line.split("}")[0] for line in text.splitlines() if line.startswith("jointtune_request_seconds_count")}

    def hostile(http: httpx.Client, first: int, last: int) -> None:
        for i in range(first, last):
            assert http.request(f"M{i:04d}", "/v1/kernels").status_code == 405
            assert http.request(f"Q{i}", f"/nowhere/{i}").status_code == 404

    with sqlite_server.client() as http:
        hostile(http, 0, 3)
        series(http)
        before = series(http)
        hostile(http, 3, 200)
        after = series(http)
    methods = {m for line in after for m in re.findall(r'method="([^"]*)"', line)}
    assert methods <= METHODS | {"other"} and "other" in methods
    assert after == before  # one series per route and status, however many methods and paths are invented


def test_loose_types_are_refused_everywhere(server: LiveServer, tmp_path: Path) -> None:
    """Item 4: `true` was stored as 1 µs (and then never replaced), `"M": true` as M=1, `"2"` as 2;
    Infinity in a bundle's fingerprint became null."""
    loose = [
        ({"latency_p50_us": True}, ["body", "latency_p50_us"]),
        ({"shape": {"M": True}}, ["body", "shape", "M"]),
        ({"world_size": "2"}, ["body", "world_size"]),
        ({"trials": "64"}, ["body", "trials"]),
    ]
    with server.client(WRITE) as http:
        for override, loc in loose:
            assert _locs(http.post("/v1/configs", json=record(**override))) == [loc]
        assert http.post("/v1/configs", json=record(world_size=2.0)).status_code == 200  # JSON Schema's integer
        page = http.get("/v1/bundles/h200x2-nvl").json()
        for override, loc in loose:
            bundle = {**page, "records": [{**page["records"][0], **override}]}
            assert _locs(http.post("/v1/bundles", json=bundle)) == [["body", "records", 0, *loc[1:]]]
        infinite = json.dumps({**page, "hardware": {**page["hardware"], "fingerprint": {"sms": "INF"}}})
        infinite = infinite.replace('"INF"', "Infinity")
        assert _locs(http.post("/v1/bundles", content=infinite, headers=JSON)) == [
            ["body", "hardware", "fingerprint", "sms"]
        ]
    path = tmp_path / "bundle.json"
    for text in (infinite, json.dumps({**page, "records": [{**page["records"][0], "world_size": "2"}]})):
        path.write_text(text)
        assert _cli(["import", str(path), "--db", server.db_url]) == 2
    with Store(server.db_url) as store:
        assert store.get_hardware("h200x2-nvl").fingerprint == {}
        assert [r.world_size for r in store.list_records()] == [2]


def test_ids_out_of_range_are_4xx_not_503(server: LiveServer) -> None:
    """Item 5: deleting an id >= 2**31 was a PostgreSQL range error (503)."""
    with server.client(ADMIN) as http:
        for method in ("GET", "DELETE"):
            assert _locs(http.request(method, f"/v1/records/{2**31}")) == [["path", "record_id"]]
            assert _locs(http.request(method, f"/v1/records/{2**63}")) == [["path", "record_id"]]
            assert http.request(method, f"/v1/records/{2**31 - 1}").status_code == 404


def test_every_stored_name_is_reachable(server: LiveServer) -> None:
    """Item 6: ids with "/" or markup were stored and no GET could reach them."""
    with server.client(WRITE) as http:
        for name in ("ag/gemm", "<b>x</b>", "..", ".hidden", "a b", "ag%2Fgemm"):
            assert _locs(http.post("/v1/configs", json=record(kernel=name))) == [["body", "kernel"]]
            assert _locs(http.post("/v1/configs", json=record(hardware_id=name))) == [["body", "hardware_id"]]
        odd = {"kernel": "Ag_9.gemm:v-2", "hardware_id": "_h200.x2:nvl-1", "kernel_version": "v1.2:3-b_4"}
        stored = http.post("/v1/configs", json=record(**odd)).json()["record"]
        query = {**LOOKUP, **SHAPE, "hardware_id": odd["hardware_id"], "kernel_version": odd["kernel_version"]}
        found = http.get(f"/v1/configs/{odd['kernel']}", params=query)
        assert found.status_code == 200 and found.json()["id"] == stored["id"]
        assert http.get(f"/v1/bundles/{odd['hardware_id']}").json()["records"][0]["kernel"] == odd["kernel"]
        assert http.get(f"/v1/records/{stored['id']}").json()["kernel"] == odd["kernel"]
    assert count(server.db_url) == 1


def test_the_openapi_document_tells_the_truth(sqlite_server: LiveServer) -> None:
    """Item 7: string 422 details, undocumented 400/404, missing dims/schema_version, a wrong Allow,
    and malformed JSON answered 422 before 401."""
    with sqlite_server.client() as http:
        doc = http.get("/openapi.json").json()
        assert http.post("/v1/configs", content=b"{nope", headers=JSON).status_code == 401  # auth first
        assert http.post("/v1/bundles", content=b"[[[", headers=JSON).status_code == 401
        wrong_methods = [("PUT", "/v1/configs", "GET, POST"), ("DELETE", "/v1/configs/5", "GET"),
                         ("POST", "/v1/records/5", "DELETE, GET"), ("PATCH", "/v1/kernels", "GET")]  # fmt: skip
        for method, path, allow in wrong_methods:
            wrong = http.request(method, path)
            assert wrong.status_code == 405 and wrong.headers["allow"] == allow, (method, path)
    with sqlite_server.client(WRITE) as http:
        assert _locs(http.post("/v1/configs", content=b"{nope", headers=JSON)) == [["body", 1]]
        assert _locs(http.post("/v1/configs", content=b"\xff\xfe{}", headers=JSON)) == [["body", 0]]  # was 400
        assert _locs(http.post("/v1/configs", content=b"[" * 50_000, headers=JSON)) == [["body", 0]]  # was 400
        assert _locs(http.post("/v1/bundles", json={"schema_version": 0})) == [
            ["body", "schema_version"], ["body", "hardware"], ["body", "records"],
        ]  # fmt: skip
    operations = {(m.upper(), p): op for p, item in doc["paths"].items() for m, op in item.items()}
    invalid = {"$ref": "#/components/schemas/Invalid"}
    for (method, path), op in operations.items():
        if "parameters" in op or "requestBody" in op:
            assert op["responses"]["422"]["content"]["application/json"]["schema"] == invalid, (method, path)
    assert doc["components"]["schemas"]["Invalid"]["properties"]["detail"]["type"] == "array"
    for method, path, codes in [
        ("GET", "/v1/configs/{kernel}", {"200", "401", "404", "422", "503"}),
        ("POST", "/v1/configs", {"200", "401", "403", "413", "422", "503"}),
        ("GET", "/v1/bundles/{hardware_id}", {"200", "401", "404", "422", "429", "503"}),
        ("DELETE", "/v1/records/{record_id}", {"204", "401", "403", "404", "422", "503"}),
    ]:
        assert set(operations[(method, path)]["responses"]) == codes, (method, path)
    lookup = operations[("GET", "/v1/configs/{kernel}")]
    dims = next(p for p in lookup["parameters"] if p["name"] == "dims")
    assert dims["required"] and dims["style"] == "form" and dims["explode"] and dims["schema"]["minProperties"] == 1
    assert {p["name"] for p in lookup["parameters"] if p["required"]} == {"kernel", "dtype", "world_size",
                                                                           "hardware_id", "dims"}  # fmt: skip
    schemas = doc["components"]["schemas"]
    assert "schema_version" in schemas["BundleOut"]["required"] and "schema_version" in schemas["BundleIn"]["required"]
    assert operations[("POST", "/v1/configs")]["security"] == [{"bearer": []}]
    assert operations[("GET", "/v1/configs")]["security"] == [{}, {"bearer": []}]


def test_a_full_export_round_trips_in_pages(sqlite_url: str, tmp_path: Path) -> None:
    """Item 8: an export of > ~3,000 records could not be posted back (1 MiB limit), an import
    committed record by record, and anyone could pull a 34 MB export at once. What broke was the bytes,
    not the count: 900 records of ~2 KiB (the 1.7 MB that 3,500 of ~0.5 KiB made) need more than three
    512 KiB pages, and more than two import batches."""
    n = 900
    records = [NewRecord(**record(shape={"M": m, "N": 4096, "K": 12288}, config={"pad": "x" * 900, "pad2": "y" * 900}))
               for m in range(1, n + 1)]  # fmt: skip
    with Store(sqlite_url) as store:
        store.upsert_hardware(hardware_id="h200x2-nvl", name="2x H200", fingerprint={"sms": 132})
        assert store.import_records(records) == (n, n)
    target, files = f"sqlite:///{tmp_path / 'target.db'}", []
    for source in serve(sqlite_url):
        for sink in serve(target):
            with source.client() as get, sink.client(WRITE) as post:
                after: int | None = 0
                while after is not None:
                    page = get.get("/v1/bundles/h200x2-nvl", params={"after": after, "limit": 1000})
                    assert page.status_code == 200 and len(page.content) <= 512 * 1024 + 128 * 1024
                    files.append(tmp_path / f"page{len(files)}.json")
                    files[-1].write_bytes(page.content)
                    assert post.post("/v1/bundles", content=page.content, headers=JSON).status_code == 200
                    after = page.json()["next_after"]
                assert len(files) > 3  # 900 records of ~2 KiB: more than one body's worth
                with source.app.state.export_gate.enter():  # a page being built: the next is refused
                    busy = get.get("/v1/bundles/h200x2-nvl")
                assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
                assert _locs(get.get("/v1/bundles/h200x2-nvl", params={"limit": 1001})) == [["query", "limit"]]
    assert count(target) == n
    pages_db = f"sqlite:///{tmp_path / 'pages.db'}"
    assert _cli(["import", *map(str, files), "--db", pages_db]) == 0  # every page, one transaction
    whole = tmp_path / "whole.json"
    assert _cli(["export", "--hardware", "h200x2-nvl", "--db", sqlite_url, "-o", str(whole)]) == 0
    file_db = f"sqlite:///{tmp_path / 'file.db'}"
    assert _cli(["import", str(whole), "--db", file_db]) == 0
    for url in (pages_db, file_db):
        with Store(url) as store:
            assert store.count_records() == n and store.get_hardware("h200x2-nvl").fingerprint == {"sms": 132}


def test_rest_takes_the_cli_dtype_names(server: LiveServer) -> None:
    """Item 9: `dtype=bf16` was a 404 (the CLI's own name), and an unknown dtype a 404, not a 422."""
    with server.client(WRITE) as http:
        assert http.post("/v1/configs", json=record(dtype="bf16")).json()["record"]["dtype"] == "bfloat16"
        for name in ("bf16", "bfloat16", "torch.bfloat16"):
            found = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "dtype": name})
            assert found.status_code == 200 and found.json()["match"] == "exact", name
        assert http.get("/v1/configs", params={"dtype": "bf16"}).json()["total"] == 1
        assert _locs(http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "dtype": "bfloat17"})) == [
            ["query", "dtype"]
        ]


def test_a_misspelt_parameter_of_a_known_kernel_is_named(server: LiveServer) -> None:
    """`timng=gpu` was read as a dim ("'gpu' is not allowed; dims must be integers"): for a family registered here
    the dims are known, so the parameter is named as what it is. Unknown kernels still take any dim names."""
    with server.client() as http:
        typo = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "timng": "gpu"})
        other = http.get("/v1/configs/somebody_elses", params={**LOOKUP, "rows": 64})
    assert typo.status_code == 422 and _locs(typo) == [["query", "timng"]]
    assert "not a known parameter and not a dim of this kernel (its dims: M, N, K)" in typo.text
    assert other.status_code == 404  # a kernel nobody stored: looked up with its own dims, then a miss


def test_an_unreadable_tokens_file_names_its_variable(sqlite_url: str, tmp_path: Path) -> None:
    from jointtune.server import Settings, TokenConfigError, create_app

    with pytest.raises(TokenConfigError, match=r"^JOINTTUNE_TOKENS_FILE: '.*nope' can't be read"):
        create_app(Settings(db_url=sqlite_url, tokens_file=tmp_path / "nope"))


@pytest.mark.parametrize("tokens", ["write:secret1", "write:change-me-writer,admin:short"])
def test_short_tokens_are_refused_naming_the_rule(tokens: str, sqlite_url: str) -> None:
    """Item 10 (the rule stays: tokens of >= 8 characters; the README's example now follows it)."""
    from jointtune.server import Settings, TokenConfigError, create_app

    with pytest.raises(TokenConfigError, match="a token of >= 8 characters"):
        create_app(Settings(db_url=sqlite_url, tokens=tokens))
