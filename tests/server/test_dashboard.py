"""`/dashboard`: rendered by headless Chromium over a live server with real records and a real study.

Chromium comes from Debian (`apt-get install -y chromium`); without it the browser test is skipped
unless JOINTTUNE_REQUIRE_CHROMIUM=1. The screenshot lands in test-artifacts/dashboard.png.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from jt_server import READ, WRITE, LiveServer, record, serve

from jointtune.db import open_store

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",
)
#: (M, dtype, world_size, p50, baseline): 4 shapes x 2 columns, one combination left out
RECORDS = [
    (128, "bfloat16", 2, 52.0, 47.0),
    (1024, "bfloat16", 2, 133.0, 146.0),
    (4096, "bfloat16", 2, 301.0, 480.0),
    (8192, "bfloat16", 2, 551.0, 917.0),
    (1024, "float16", 4, 120.0, 150.0),
    (8192, "float16", 4, 500.0, 1000.0),
    (4096, "float16", 4, 300.0, None),
]
TRIAL_VALUES = [900.0, 700.0, 800.0, 650.0, 660.0, 600.0]


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("JOINTTUNE_REQUIRE_CHROMIUM") == "1":
            pytest.fail("chromium is required (JOINTTUNE_REQUIRE_CHROMIUM=1) but not on PATH")
        pytest.skip("chromium is not on PATH; install it with: apt-get install -y chromium")
    return found


def _browse(url: str, tmp_path: Path, *extra: str) -> str:
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *extra, url]
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def filled(sqlite_url: str) -> Iterator[LiveServer]:
    """A server over records of two kernels and one finished Optuna study in the same database."""
    for server in serve(sqlite_url):
        with server.client(WRITE) as http:
            for m, dtype, world, p50, baseline in RECORDS:
                body = record(shape={"M": m, "N": 8192, "K": 8192}, dtype=dtype, world_size=world)
                body.update(latency_p10_us=None, latency_p90_us=None, latency_p50_us=p50, baseline_us=baseline)
                assert http.post("/v1/configs", json=body).status_code == 200
            other = record(kernel="gemm_rs", hardware_id="h100x8", config={"BLOCK_M": "<b>bold</b>"})
            assert http.post("/v1/configs", json=other).status_code == 200
        storage = optuna.storages.RDBStorage(open_store(sqlite_url).url)
        study = optuna.create_study(study_name="jointtune:ag_gemm@v1:demo", storage=storage)
        key = {"kernel": "ag_gemm", "shape": {"M": 8192, "N": 8192, "K": 8192}, "dtype": "bfloat16"}
        study.set_user_attr("jt_key", {**key, "world_size": 2, "hardware_id": "h200x2-nvl"})
        study.optimize(lambda t: TRIAL_VALUES[t.number] + 0 * t.suggest_int("BLOCK_M", 16, 256), n_trials=6)
        storage.engine.dispose()
        yield server


def test_dashboard_in_chromium(filled: LiveServer, tmp_path: Path) -> None:
    dom = _browse(f"{filled.url}/dashboard", tmp_path, "--dump-dom")
    kernels = re.findall(r'<section class="card kernel" data-kernel="([^"]+)" data-hardware="([^"]+)"', dom)
    assert kernels == [("ag_gemm", "h200x2-nvl"), ("gemm_rs", "h100x8")]
    ag_gemm = dom[dom.index('data-kernel="ag_gemm"') : dom.index('data-kernel="gemm_rs"')]
    assert ag_gemm.count('class="hm-cell"') == len(RECORDS)
    assert ag_gemm.count('class="hm-empty"') == 4 * 2  # 4 shapes x (bfloat16/w2, float16/w4)
    rows = re.findall(r'<text class="hm-row"[^>]*>([^<]+)</text>', ag_gemm)
    assert rows == [f"M={m} N=8192 K=8192" for m in (128, 1024, 4096, 8192)]
    assert re.findall(r'<text class="hm-col"[^>]*>([^<]+)</text>', ag_gemm) == [
        "bfloat16 / w2 / gpu",
        "float16 / w4 / gpu",
    ]
    assert ">1.66×<" in ag_gemm and ">0.90×<" in ag_gemm and ">n/a<" in ag_gemm
    assert ag_gemm.count('class="config-row"') == len(RECORDS)
    assert "&lt;b&gt;bold&lt;/b&gt;" in dom and "<b>bold</b>" not in dom  # database text is escaped
    assert '<span id="shown" class="muted">8 rows</span>' in dom  # the inline script ran

    study = dom[dom.index('data-study="jointtune:ag_gemm@v1:demo"') :]
    assert "ag_gemm · M=8192 N=8192 K=8192 · bfloat16 · w2 · h200x2-nvl" in study
    assert study.count('class="curve-pt"') == len(TRIAL_VALUES)
    assert "6 complete, 0 failed · best 600 µs" in study
    bests = re.findall(r"best so far ([0-9.]+) µs", study)
    assert [float(b) for b in bests] == [900.0, 700.0, 700.0, 650.0, 650.0, 600.0]

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    _browse(f"{filled.url}/dashboard", tmp_path, f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dashboard_empty_store(server: LiveServer) -> None:
    with server.client() as http:
        page = http.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="no-records"' in page.text and 'id="no-studies"' in page.text
    assert "<svg" not in page.text and "http://" not in page.text and "https://" not in page.text


def test_dashboard_follows_read_auth(tmp_path: Path) -> None:
    for server in serve(f"sqlite:///{tmp_path / 'auth.db'}", read_token_required=True):
        with server.client() as http:
            assert http.get("/dashboard").status_code == 401
        with server.client("not-a-valid-token") as http:
            assert http.get("/dashboard").status_code == 401
        with server.client(READ) as http:
            assert http.get("/dashboard").status_code == 200


def test_flash_decode_records_in_the_heatmap_and_table(server: LiveServer) -> None:
    """A decode family's five dims read in the space's order (B H H_KV S D), rows by batch, then KV length."""
    decode = [(8, 131072, 510.0, 530.0), (1, 32768, 47.2, 65.9), (1, 8192, 28.0, 44.7)]
    with server.client(WRITE) as http:
        for b, s, p50, baseline in decode:
            body = record(kernel="flash_decode", shape={"B": b, "H": 64, "H_KV": 8, "S": s, "D": 128},
                          config={"mode": "pull", "kv_split": 512}, timing="graph")  # fmt: skip
            body.update(latency_p10_us=None, latency_p90_us=None, latency_p50_us=p50, baseline_us=baseline)
            assert http.post("/v1/configs", json=body).status_code == 200
    with server.client() as http:
        page = http.get("/dashboard").text
    card = page[page.index('data-kernel="flash_decode"') :]
    rows = re.findall(r'<text class="hm-row"[^>]*>([^<]+)</text>', card)
    assert rows == [f"B={b} H=64 H_KV=8 S={s} D=128" for b, s in ((1, 8192), (1, 32768), (8, 131072))]
    assert re.findall(r'<text class="hm-col"[^>]*>([^<]+)</text>', card) == ["bfloat16 / w2 / graph"]
    assert card.count('class="hm-cell"') == card.count('class="config-row"') == 3
    assert ">1.40×<" in card  # 65.9 / 47.2
