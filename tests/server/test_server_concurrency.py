"""Many publishers on one key and on distinct keys at once: the best wins, no 5xx, nothing lost.
Lookups beside deletes and republishes, and across worker processes, answer from what is stored now."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from jt_server import ADMIN, LOOKUP, WRITE, LiveServer, record


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def test_lookups_while_records_are_deleted_and_republished(server: LiveServer) -> None:
    """Every lookup answers 200 with a whole record while others delete and republish its neighbours."""
    anchor = record(shape={"M": 8192, "N": 4096, "K": 12288})
    churn = [record(shape={"M": 512 * (i + 1), "N": 4096, "K": 12288}) for i in range(6)]
    shapes = {tuple(sorted(body["shape"].items())) for body in [anchor, *churn]}
    with server.client(WRITE) as http:
        for body in [anchor, *churn]:
            assert http.post("/v1/configs", json=body).status_code == 200
    stop = threading.Event()

    def churner() -> int:
        rounds = 0
        with server.client(ADMIN) as http:
            while not stop.is_set():
                for body in churn:
                    found = http.get(f"/v1/configs/{body['kernel']}", params={**LOOKUP, **body["shape"]}).json()
                    http.delete(f"/v1/records/{found['id']}")
                    http.post("/v1/configs", json=body)
                rounds += 1
        return rounds

    def looker(seed: int) -> list[tuple[int, dict]]:
        out = []
        with server.client() as http:
            for i in range(40):
                m = 300 + 97 * ((seed * 40 + i) % 37)  # never stored: always a nearest answer
                response = http.get("/v1/configs/ag_gemm", params={**LOOKUP, "M": m, "N": 4096, "K": 12288})
                out.append((response.status_code, response.json()))
        return out

    with ThreadPoolExecutor(max_workers=4) as pool:
        churning = pool.submit(churner)
        answers = [a for part in pool.map(looker, range(3)) for a in part]
        stop.set()
        assert churning.result() >= 1
    assert {status for status, _ in answers} == {200}
    for _, body in answers:
        assert body["match"] == "nearest" and body["distance"] > 0
        assert tuple(sorted(body["shape"].items())) in shapes and body["config"] == anchor["config"]


def test_every_worker_process_sees_writes_at_once(tmp_path: Path) -> None:
    """`jointtune serve --workers 2`: a record published through one worker is found (and, deleted, is
    gone) on every new connection at once, whichever worker takes it: no per-process answer cache."""
    port = _free_port()
    env = {**os.environ, "JOINTTUNE_TOKENS": f"write:{WRITE},admin:{ADMIN}"}
    cmd = [sys.executable, "-c", "from jointtune.cli import main; main()", "serve", "--port", str(port)]
    cmd += ["--workers", "2", "--db", f"sqlite:///{tmp_path / 'workers.db'}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    query = {**LOOKUP, "M": 8192, "N": 4096, "K": 12288}

    def statuses() -> set[int]:  # a new connection per request, so both workers answer some
        return {httpx.get(f"{base}/v1/configs/ag_gemm", params=query, trust_env=False).status_code for _ in range(16)}

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                httpx.get(f"{base}/readyz", timeout=1, trust_env=False)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with httpx.Client(base_url=base, trust_env=False) as http:
            assert http.get("/v1/kernels").json() == []
            assert statuses() == {404}
            published = http.post("/v1/configs", json=record(), headers={"Authorization": f"Bearer {WRITE}"})
            assert published.status_code == 200
            assert statuses() == {200}
            rid = published.json()["record"]["id"]
            assert http.delete(f"/v1/records/{rid}", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 204
            assert statuses() == {404}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
