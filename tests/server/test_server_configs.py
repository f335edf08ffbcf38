"""Lookups (exact, nearest, 404 that says what exists), publish, list, delete, kernels, hardware, health."""

from __future__ import annotations

import re

from jt_server import ADMIN, LOOKUP, WRITE, LiveServer, record

from jointtune.search_spaces import get_space


def _publish(server: LiveServer, **overrides: object) -> dict:
    with server.client(WRITE) as http:
        response = http.post("/v1/configs", json=record(**overrides))
    assert response.status_code == 200, response.text
    return response.json()


def test_lookup_exact_nearest_and_miss(server: LiveServer) -> None:
    _publish(server)
    with server.client() as http:
        exact = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": 8192, "N": 4096, "K": 12288}).json()
        assert exact["match"] == "exact" and exact["distance"] == 0
        assert exact["config"] == {"BLOCK_M": 128, "BLOCK_N": 128, "mode": "pull"}
        assert exact["latency_us"] == {"p10": 590.0, "p50": 600.0, "p90": 620.0}
        assert exact["speedup"] == 940.0 / 600.0
        assert exact["provenance"]["study_name"] == "ag_gemm-8192" and exact["provenance"]["trials"] == 64

        near = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": 4096, "N": 4096, "K": 12288}).json()
        assert near["match"] == "nearest" and near["distance"] == 1.0

        only_exact = http.get(
            "/v1/configs/ag_gemm", params={**LOOKUP, "M": 4096, "N": 4096, "K": 12288, "nearest": "false"}
        )
        assert only_exact.status_code == 404
        assert "closest stored shapes: K=12288,M=8192,N=4096" in only_exact.json()["detail"]

        other_dtype = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "dtype": "float16", "M": 1, "N": 1, "K": 1})
        assert other_dtype.status_code == 404
        assert "dtype=bfloat16 world_size=2" in other_dtype.json()["detail"]

        # a registered kernel's dims are known: other names are refused as parameters (a typo), not looked up
        other_dims = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "B": 4, "S": 1024})
        assert other_dims.status_code == 422
        assert [e["loc"] for e in other_dims.json()["detail"]] == [["query", "B"], ["query", "S"]]
        assert "not a dim of this kernel (its dims: M, N, K)" in other_dims.text
        # where the store's kernel is not one of ours, the dims are the caller's: a miss says what is stored
        _publish(server, kernel="their_gemm")
        their = http.get("/v1/configs/their_gemm", params={**LOOKUP, "B": 4, "S": 1024})
        assert their.status_code == 404 and "dims K,M,N, the query has B,S" in their.json()["detail"]

        unknown = http.get("/v1/configs/no_such_kernel", params={**LOOKUP, "M": 1})
        assert unknown.status_code == 404 and "'ag_gemm'" in unknown.json()["detail"]

        version = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "kernel_version": "v9", "M": 8192})
        assert version.status_code == 404

        metrics = http.get("/metrics").text
    assert 'jointtune_lookups_total{result="exact"} 1.0' in metrics
    assert 'jointtune_lookups_total{result="nearest"} 1.0' in metrics
    assert 'jointtune_lookups_total{result="miss"} 5.0' in metrics
    assert 'route="/v1/configs/{kernel}"' in metrics


def test_publish_keeps_better_and_is_idempotent(server: LiveServer) -> None:
    first = _publish(server)
    assert first["changed"] is True
    again = _publish(server)
    assert again["changed"] is False and again["record"]["id"] == first["record"]["id"]
    slower = _publish(server, latency_p50_us=700.0, config={"BLOCK_M": 64})
    assert slower["changed"] is False and slower["record"]["config"]["BLOCK_M"] == 128
    faster = _publish(server, latency_p50_us=500.0, config={"BLOCK_M": 256})
    assert faster["changed"] is True and faster["record"]["config"] == {"BLOCK_M": 256}
    with server.client() as http:
        page = http.get("/v1/configs").json()
    assert page["total"] == 1 and page["items"][0]["latency_p50_us"] == 500.0


def test_list_filter_paginate_delete_kernels_hardware(server: LiveServer) -> None:
    for m in (1024, 2048, 4096):
        _publish(server, shape={"M": m, "N": 4096, "K": 4096})
    _publish(server, kernel="gemm_rs", hardware_id="h100x8")
    with server.client() as http:
        page = http.get("/v1/configs", params={"kernel": "ag_gemm", "limit": 2, "offset": 1}).json()
        assert page["total"] == 3 and len(page["items"]) == 2
        assert http.get("/v1/configs", params={"limit": 1001}).status_code == 422
        assert http.get("/v1/configs", params={"hardware_id": "h100x8"}).json()["total"] == 1
        kernels = {k["name"] for k in http.get("/v1/kernels").json()}
        hardware = {h["hardware_id"] for h in http.get("/v1/hardware").json()}
        target = page["items"][0]["id"]
    assert kernels == {"ag_gemm", "gemm_rs"} and hardware == {"h200x2-nvl", "h100x8"}
    with server.client(WRITE) as http:
        assert http.delete(f"/v1/records/{target}").status_code == 403
    with server.client(ADMIN) as http:
        assert http.delete(f"/v1/records/{target}").status_code == 204
        assert http.delete(f"/v1/records/{target}").status_code == 404
        assert http.get("/v1/configs", params={"kernel": "ag_gemm"}).json()["total"] == 2


def test_health_ready_docs(server: LiveServer) -> None:
    with server.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz").json()
        assert ready["status"] == "ready" and ready["revision"]
        assert http.get("/docs").status_code == 200
        assert "/v1/configs/{kernel}" in http.get("/openapi.json").json()["paths"]


def test_docs_load_nothing_from_outside_the_service(sqlite_server: LiveServer) -> None:
    """/docs and /redoc work on an air-gapped cluster: every script, style sheet and icon they name is served
    by the service itself (no CDN), and the Swagger UI served reads OpenAPI 3.1, the version FastAPI writes."""
    with sqlite_server.client() as http:
        assert http.get("/openapi.json").json()["openapi"].startswith("3.1")
        for page in ("/docs", "/redoc"):
            html = http.get(page).text
            assets = re.findall(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]""", html) + re.findall(
                r"""url:\s*['"]([^'"]+)['"]""", html
            )
            assert assets and not [a for a in assets if "://" in a or a.startswith("//")], (page, assets)
            for asset in assets:
                assert http.get(asset).status_code == 200, (page, asset)
        swagger = next(a for a in re.findall(r'src="([^"]+)"', http.get("/docs").text) if "swagger-ui-bundle" in a)
        assert "openapi: 3.1" in http.get(swagger).text


def test_flash_decode_records_by_their_five_dims_and_timing(server: LiveServer) -> None:
    """A flash_decode record as the GPU sweep stored it (graph timing, B, H, H_KV, S, D): an exact lookup, and the
    nearest KV bucket for a longer cache of the same batch and heads."""
    shape = {"B": 1, "H": 64, "H_KV": 8, "S": 32768, "D": 128}
    config = {"mode": "pull", "kv_split": 512, "BLOCK_N": 64, "heads_per_program": 8, "num_warps": 4,
              "num_stages": 4, "items_per_flag": 1}  # fmt: skip
    _publish(server, kernel="flash_decode", shape=shape, config=config, timing="graph", latency_p50_us=48.3,
             baseline_us=49.6, study_name="flash_decode-b1")  # fmt: skip
    with server.client() as http:
        exact = http.get("/v1/configs/flash_decode", params={**LOOKUP, **shape, "timing": "graph"}).json()
        assert exact["match"] == "exact" and exact["config"] == config
        longer = http.get("/v1/configs/flash_decode", params={**LOOKUP, **shape, "S": 65536, "timing": "graph"}).json()
        assert longer["match"] == "nearest" and longer["distance"] == 1.0 and longer["config"] == config
        assert http.get("/v1/configs/flash_decode", params={**LOOKUP, **shape}).status_code == 404  # gpu timing
        # any cache length in the bucket (24,690 keys: 12,345 per rank, in (8K, 16K]) finds the record exactly, as the
        # decorator's key does; a length past the bucket only as the nearest
        within = http.get("/v1/configs/flash_decode", params={**LOOKUP, **shape, "S": 24690, "timing": "graph"}).json()
        assert within["match"] == "exact" and within["shape"]["S"] == 32768 and within["config"] == config
        past = http.get("/v1/configs/flash_decode", params={**LOOKUP, **shape, "S": 32770, "timing": "graph"}).json()
        assert past["match"] == "nearest" and past["distance"] == 1.0
    # a record at a length that is not a bucket (an older client's, or an old bundle's) is kept as given
    with server.client(WRITE) as http:
        body = record(kernel="flash_decode", shape={**shape, "S": 24690}, config=config, timing="graph",
                      space_version=get_space("flash_decode").version)  # fmt: skip
        kept = http.post("/v1/configs", json=body)
    assert kept.status_code == 200 and kept.json()["record"]["shape"]["S"] == 24690, kept.text
