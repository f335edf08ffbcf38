"""Bad input and missing rights are 4xx, never 5xx, and write nothing."""

from __future__ import annotations

import json

import pytest
from jt_server import ADMIN, LOOKUP, READ, TOKENS, WRITE, LiveServer, count, record, serve

from jointtune.search_spaces import get_space
from jointtune.server import TokenConfigError, TokenSet


def test_writes_need_a_write_token(server: LiveServer) -> None:
    with server.client() as http:
        assert http.post("/v1/configs", json=record()).status_code == 401
        assert http.post("/v1/bundles", json={}).status_code == 401
    with server.client("wrong-token-123") as http:
        assert http.post("/v1/configs", json=record()).status_code == 401
    with server.client(READ) as http:
        assert http.post("/v1/configs", json=record()).status_code == 403
    with server.client(ADMIN) as http:
        assert http.post("/v1/configs", headers={"Authorization": "Basic abc"}, json=record()).status_code == 401
    assert count(server.db_url) == 0


def test_a_config_its_own_space_refuses_is_422_and_cannot_shadow_a_valid_one(server: LiveServer) -> None:
    current = get_space("ag_gemm").version
    bogus = record(space_version=current, config={"mode": "warp-drive"}, latency_p50_us=1.0)
    with server.client(WRITE) as http:
        refused = http.post("/v1/configs", json=bogus)
        assert refused.status_code == 422, refused.text
        message = refused.json()["detail"][0]["msg"]
        assert message.startswith("config: ") and "warp-drive" in message and '"push"' in message
        fp32 = http.post("/v1/configs", json=record(space_version=current, dtype="fp32", config={"mode": "baseline"}))
        assert fp32.status_code == 422 and "dtype" in fp32.text and "bfloat16, float16" in fp32.text
        assert count(server.db_url) == 0
        # the faster-but-bogus record was refused, so a slower valid one is what the key answers
        valid = record(space_version=current, config={"mode": "baseline"}, latency_p50_us=900.0, latency_p90_us=950.0)
        assert http.post("/v1/configs", json=valid).status_code == 200
        # an older space version's rules are gone: its records are kept as they come
        old = record(kernel_version="v0", space_version="0ld", config={"mode": "gone"})
        assert http.post("/v1/configs", json=old).status_code == 200
    with server.client() as http:
        found = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": 8192, "N": 4096, "K": 12288,
                                                        "kernel_version": "v1"})  # fmt: skip
        assert found.status_code == 200 and found.json()["config"] == {"mode": "baseline"}


def test_a_misspelt_filter_or_a_body_not_sent_as_json_is_a_422_that_says_so(server: LiveServer) -> None:
    with server.client(WRITE) as http:
        assert http.post("/v1/configs", json=record()).status_code == 200
        form = http.post("/v1/configs", content=json.dumps(record()), headers={"content-type": "text/plain"})
        assert form.status_code == 422 and form.json()["detail"] == [
            {"loc": ["body"], "type": "content_type",
             "msg": "send the body as JSON with the header Content-Type: application/json (got 'text/plain')"}
        ]  # fmt: skip
    with server.client() as http:
        misspelt = http.get("/v1/configs", params={"kernal": "gemm_rs", "limit": 5})
        assert misspelt.status_code == 422
        (problem,) = misspelt.json()["detail"]
        assert problem["loc"] == ["query", "kernal"] and problem["msg"].startswith("unknown query parameter; allowed: ")
        assert "kernel" in problem["msg"] and http.get("/v1/configs", params={"kernel": "ag_gemm"}).json()["total"] == 1
        bundle = http.get("/v1/bundles/h200x2-nvl", params={"kernal": "x"})
        assert bundle.status_code == 422 and bundle.json()["detail"][0]["loc"] == ["query", "kernal"]
    assert count(server.db_url) == 1


def test_bad_input_is_4xx_and_writes_nothing(server: LiveServer) -> None:
    with server.client(WRITE) as http:
        missing = http.post("/v1/configs", json={k: v for k, v in record().items() if k != "dtype"})
        assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "dtype"]
        bad_shape = http.post("/v1/configs", json=record(shape={"M": -4}))
        assert bad_shape.status_code == 422 and bad_shape.json()["detail"][0]["loc"] == ["body", "shape", "M"]
        assert http.post("/v1/configs", json=record(extra_field=1)).status_code == 422
        infinite = json.dumps(record(latency_p50_us=1.5)).replace("1.5", "1e400")
        inf = http.post("/v1/configs", content=infinite, headers={"content-type": "application/json"})
        assert inf.status_code == 422 and "latency_p50_us" in inf.text
        order = http.post("/v1/configs", json=record(latency_p10_us=900.0))
        assert order.status_code == 422 and "p10 <= p50" in order.text
        not_json = http.post("/v1/configs", content=b"{nope", headers={"content-type": "application/json"})
        assert not_json.status_code == 422
        huge = http.post("/v1/configs", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"})
        assert huge.status_code == 413
        nul = http.post("/v1/configs", json=record(config={"mode": "pu\x00ll"}))
        assert nul.status_code == 422 and nul.json()["detail"][0]["loc"] == ["body", "config", "mode"]
        assert http.post("/v1/configs", json=record(hardware_id="h\x00")).status_code == 422
        assert http.post("/v1/configs", json=record(latency_p50_us=1e-300, baseline_us=1e12)).status_code == 422
        sqlish = "x'; DROP TABLE jt_records; --"
        named = http.post("/v1/configs", json=record(dtype=sqlish, kernel=sqlish))  # outside the name charset
        assert named.status_code == 422 and [e["loc"] for e in named.json()["detail"]] == [
            ["body", "kernel"],
            ["body", "dtype"],
        ]
        assert http.post("/v1/configs", json=record(config={"mode": sqlish}, study_name=sqlish)).status_code == 200
    with server.client() as http:
        dims = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": "abc", "N": "0", "K": "1e3"})
        assert dims.status_code == 422
        assert [e["loc"] for e in dims.json()["detail"]] == [["query", "M"], ["query", "N"], ["query", "K"]]
        no_dims = http.get("/v1/configs/ag_gemm", params=LOOKUP)
        assert no_dims.status_code == 422 and "no dims given" in no_dims.text
        assert http.get("/v1/configs/ag_gemm", params={**LOOKUP, "world_size": 0, "M": 1}).status_code == 422
        assert http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M'--": 1}).status_code == 422
        assert http.get("/v1/configs/ag_gemm", params={**LOOKUP, "hardware_id": "h\x00", "M": 1}).status_code == 422
        assert http.get("/v1/configs/" + "k" * 300, params={**LOOKUP, "M": 1}).status_code == 422
        injected = http.get("/v1/configs/x' OR '1'='1", params={**LOOKUP, "M": 1})
        assert injected.status_code == 422 and "Traceback" not in injected.text
        page = http.get("/v1/configs", params={"kernel": "ag_gemm"}).json()
    assert page["total"] == 1  # the SQL-looking string is data, stored and found like any other
    assert page["items"][0]["config"] == {"mode": sqlish} and page["items"][0]["study_name"] == sqlish
    assert count(server.db_url) == 1


def test_read_token_required(sqlite_url: str) -> None:
    """Every read needs a token, /metrics included; the probes and the API's document stay open (README)."""
    for live in serve(sqlite_url, read_token_required=True):
        with live.client() as http:
            assert http.get("/v1/kernels").status_code == 401
            assert http.get("/metrics").status_code == 401
            assert [http.get(path).status_code for path in ("/healthz", "/readyz", "/openapi.json")] == [200] * 3
        with live.client(READ) as http:
            assert http.get("/v1/kernels").status_code == 200
            assert http.get("/metrics").text.startswith("# HELP")
            doc = http.get("/openapi.json").json()  # the document says reads need a token now
        assert doc["paths"]["/v1/configs"]["get"]["security"] == [{"bearer": []}]
        assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]


def test_tokens_parse_from_env_and_file(tmp_path, monkeypatch) -> None:
    tokens = TokenSet.parse(TOKENS)
    assert tokens.role_of(ADMIN) == "admin" and tokens.role_of("nope-nope") is None
    path = tmp_path / "tokens"
    path.write_text("# ops\nwrite:file-token-9999\n\n")
    monkeypatch.setenv("JOINTTUNE_TOKENS", f"read:{READ}")
    monkeypatch.setenv("JOINTTUNE_TOKENS_FILE", str(path))
    from jointtune.server import Settings

    settings = Settings()
    loaded = TokenSet.load(settings.tokens, settings.tokens_file)
    assert loaded.role_of("file-token-9999") == "write" and loaded.role_of(READ) == "read"
    assert TOKENS not in repr(settings)
    with pytest.raises(TokenConfigError, match="entry 1 is not allowed"):
        TokenSet.parse("root:abcdefghij")
    with pytest.raises(TokenConfigError, match="can't be read"):
        TokenSet.load("", tmp_path / "missing")


def test_streamed_body_over_the_limit_is_413(sqlite_server: LiveServer) -> None:
    def chunks():
        for _ in range(40):
            yield b"x" * 65536  # 2.5 MiB in chunks, no Content-Length

    with sqlite_server.client(WRITE) as http:
        response = http.post("/v1/configs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "1048576 bytes" in response.text
    assert count(sqlite_server.db_url) == 0


def test_store_outage_is_503_without_details(tmp_path) -> None:
    for live in serve(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}"):
        with live.client() as http:
            assert http.get("/healthz").status_code == 200
            ready = http.get("/readyz")
            kernels = http.get("/v1/kernels")
    assert ready.status_code == 503 and kernels.status_code == 503
    assert kernels.json() == {"detail": "the tuning store is unavailable; try again later"}
    assert "missing-dir" not in ready.text + kernels.text
