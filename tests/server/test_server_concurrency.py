"""Many publishers on one key and on distinct keys at once: the best wins, no 5xx, nothing lost."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from jt_server import WRITE, LiveServer, record


def test_concurrent_publishers(server: LiveServer) -> None:
    latencies = [500.0 + (i * 37) % 101 for i in range(24)]
    bodies = [record(latency_p50_us=p50, config={"BLOCK_M": i}) for i, p50 in enumerate(latencies)]
    bodies += [record(shape={"M": 256 * (i + 1), "N": 512, "K": 512}) for i in range(12)]

    def publish(body: dict) -> int:
        with server.client(WRITE) as http:
            return http.post("/v1/configs", json=body).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(publish, bodies))
    assert codes == [200] * len(bodies)
    with server.client() as http:
        page = http.get("/v1/configs", params={"limit": 100}).json()
    assert page["total"] == 13
    winner = [r for r in page["items"] if r["shape"] == {"M": 8192, "N": 4096, "K": 12288}]
    assert winner[0]["latency_p50_us"] == min(latencies)
    assert winner[0]["config"] == {"BLOCK_M": latencies.index(min(latencies))}
