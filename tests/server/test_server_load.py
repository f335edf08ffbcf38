"""Reads an anonymous client can ask for as fast as it likes stay cheap or gated (issue 38): a listing or a
dashboard page beyond the gate's slots is a 429 with Retry-After, the dashboard comes a page at a time, a
miss's explanation is read from the lookup index (and names every hardware, however many records there are),
and no message lists more than 50 ids. No timings here: bench/service/service_flood.py measures the latencies."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from jt_server import LOOKUP, LiveServer, record, serve

from jointtune.cli import main
from jointtune.db import NewRecord, Store
from jointtune.server.dashboard.data import PAGE_RECORDS

SHAPE = {"M": 8192, "N": 4096, "K": 12288}


def _records(count: int, **overrides: object) -> list[NewRecord]:
    return [NewRecord(**record(shape={"M": m, "N": 4096, "K": 12288}, **overrides)) for m in range(1, count + 1)]


def test_listings_answer_429_with_retry_after_under_a_flood(sqlite_url: str) -> None:
    for live in serve(sqlite_url, list_concurrency=1, list_share=1.0):
        gate = live.app.state.list_gate
        paths = ["/dashboard", "/v1/configs"] * 8

        def get(path: str, live: LiveServer = live) -> tuple[int, str, str]:
            with live.client() as http:
                response = http.get(path)
                return response.status_code, response.headers.get("retry-after", ""), response.text

        with gate.enter(), ThreadPoolExecutor(max_workers=8) as pool:  # a page being built: every other is refused
            answers = list(pool.map(get, paths))
        assert {(status, retry) for status, retry, _ in answers} == {(429, "1")}
        assert "JOINTTUNE_LIST_CONCURRENCY" in answers[0][2]
        assert [get(path)[0] for path in ("/dashboard", "/v1/configs")] == [200, 200]  # the slot is free again


def test_the_dashboard_comes_a_page_at_a_time(sqlite_url: str) -> None:
    total = 2 * PAGE_RECORDS + 50
    with Store(sqlite_url) as store:
        assert store.import_records(_records(total)) == (total, total)
    for live in serve(sqlite_url, list_share=1.0):
        with live.client() as http:
            first, last = http.get("/dashboard"), http.get("/dashboard", params={"page": 3})
            past, zero = http.get("/dashboard", params={"page": 4}), http.get("/dashboard", params={"page": 0})
            typo = http.get("/dashboard", params={"pgae": 2})
    assert first.text.count('class="config-row"') == PAGE_RECORDS and last.text.count('class="config-row"') == 50
    assert f"configs 1–{PAGE_RECORDS} of {total} · page 1 of 3" in first.text
    assert 'rel="next" href="?page=2"' in first.text and 'rel="prev"' not in first.text
    assert 'rel="prev" href="?page=2"' in last.text and 'rel="next"' not in last.text
    assert "Tuning curves" in first.text and "Tuning curves" not in last.text  # Optuna is read on page 1 only
    assert past.status_code == 404 and past.json() == {"detail": "page: 4 is past the last page (3)"}
    assert zero.status_code == 422 and typo.status_code == 422


def test_a_miss_names_every_hardware_however_many_records_come_first(sqlite_url: str) -> None:
    """The explanation read the kernel's first 1,000 records and named only the hardware among them."""
    with Store(sqlite_url) as store:
        store.import_records(_records(1001, hardware_id="a100x8"))
        store.upsert_record(NewRecord(**record(hardware_id="h200x2-nvl")))
        store.upsert_record(NewRecord(**record(dtype="float16", world_size=4, timing="eager")))
    for live in serve(sqlite_url):
        with live.client() as http:

            def miss(**query: object) -> str:
                response = http.get("/v1/configs/ag_gemm", params={**LOOKUP, **SHAPE, **query})
                assert response.status_code == 404, response.text
                return response.json()["detail"]

            assert miss(hardware_id="mi300x8").endswith("has records only for hardware ['a100x8', 'h200x2-nvl']")
            assert miss(dtype="float32").endswith(
                "on this hardware the kernel has records for: dtype=bfloat16 world_size=2, dtype=float16 world_size=4"
            )
            assert miss(timing="graph").endswith("no record was measured with timing 'graph'; these policies have: "
                                                 "['gpu']")  # fmt: skip
            assert miss(kernel_version="v9").endswith("kernel_version 'v9' has none, these do: ['v1']")
            assert "; closest stored shapes: K=12288,M=8192,N=4096 (nearest=false" in miss(M=100, nearest="false")
            exact_only = {**LOOKUP, **SHAPE, "nearest": "false", "kernel_version": "v1"}  # one probe of the key
            assert http.get("/v1/configs/ag_gemm", params=exact_only).json()["match"] == "exact"


def test_an_unknown_hardware_lists_at_most_50_ids_in_the_404_and_the_cli(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(sqlite_url) as store:
        for i in range(60):
            store.upsert_hardware(hardware_id=f"hw{i:02d}", name=f"machine {i}", fingerprint={})
    for live in serve(sqlite_url):
        with live.client() as http:
            response = http.get("/v1/bundles/nope")
    listed = f"{[f'hw{i:02d}' for i in range(50)]} and 10 more"
    assert response.status_code == 404
    assert response.json()["detail"] == f"hardware_id: 'nope' is unknown; the store has {listed}"
    with pytest.raises(SystemExit) as exited:
        main(["export", "--hardware", "nope", "--db", sqlite_url, "-o", str(tmp_path / "x.json")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"; it has {listed}")
