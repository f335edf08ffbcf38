"""The timing policy over REST: a `timing` field on lookups (default gpu), the policy in answers, lists,
bundles and the dashboard; records of another policy never answer a lookup as their own."""

from __future__ import annotations

from jt_server import LOOKUP, WRITE, LiveServer, record

SHAPE = {"M": 8192, "N": 4096, "K": 12288}


def test_lookups_answer_within_the_asked_policy(server: LiveServer) -> None:
    with server.client(WRITE) as http:
        assert http.post("/v1/configs", json=record(config={"mode": "push"})).status_code == 200
        eager = record(config={"mode": "ce"}, timing="eager", latency_p50_us=700.0)
        stored = http.post("/v1/configs", json=eager).json()["record"]
        assert stored["timing"] == "eager"

        default = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE}).json()
        assert default["timing"] == "gpu" and default["config"] == {"mode": "push"}
        asked = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "timing": "eager"}).json()
        assert asked["timing"] == "eager" and asked["config"] == {"mode": "ce"} and asked["match"] == "exact"
        near = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": 4096, "N": 4096, "K": 12288, "timing": "eager"})
        assert near.json()["match"] == "nearest" and near.json()["timing"] == "eager"

        missing = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "timing": "graph"})
        assert missing.status_code == 404
        assert (
            "no record was measured with timing 'graph'; these policies have: ['eager', 'gpu']"
            in (missing.json()["detail"])
        )
        bad = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, "timing": "wall"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "timing"]
        assert http.post("/v1/configs", json=record(timing=1)).status_code == 422

        listed = http.get("/v1/configs", params={"timing": "eager"}).json()
        assert listed["total"] == 1 and listed["items"][0]["timing"] == "eager"
        assert http.get("/v1/configs").json()["total"] == 2


def test_bundles_and_the_dashboard_carry_the_policy(sqlite_server: LiveServer) -> None:
    server = sqlite_server
    with server.client(WRITE) as http:
        for timing in ("gpu", "graph"):
            assert http.post("/v1/configs", json=record(timing=timing)).status_code == 200
        bundle = http.get("/v1/bundles/h200x2-nvl").json()
        assert sorted(r["timing"] for r in bundle["records"]) == ["gpu", "graph"]
        for r in bundle["records"]:
            r["kernel_version"] = "v2"
        assert http.post("/v1/bundles", json=bundle).json()["changed"] == 2
        v2 = http.get("/v1/configs", params={"kernel_version": "v2"}).json()["items"]
        assert sorted(r["timing"] for r in v2) == ["gpu", "graph"]
        page = http.get("/dashboard").text
        assert "<th>timing</th>" in page and "<td>graph</td>" in page and "bfloat16 / w2 / graph" in page
