"""Bundles round trip through the API and the offline CLI; a bad bundle writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jt_server import WRITE, LiveServer, count, record

from jointtune.cli import main
from jointtune.db import Store


def _cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_bundle_round_trip_over_http(server: LiveServer, tmp_path: Path) -> None:
    with Store(server.db_url) as store:
        store.upsert_hardware(hardware_id="h200x2-nvl", name="2x H200 NVLink", fingerprint={"sm": 132})
    with server.client(WRITE) as http:
        for m in (1024, 2048):
            assert http.post("/v1/configs", json=record(shape={"M": m, "N": 64, "K": 64})).status_code == 200
        assert http.post("/v1/configs", json=record(kernel="gemm_rs")).status_code == 200
        bundle = http.get("/v1/bundles/h200x2-nvl", params={"kernel": "ag_gemm"}).json()
        assert bundle["schema_version"] == 1 and len(bundle["records"]) == 2
        assert bundle["hardware"]["fingerprint"] == {"sm": 132}
        assert http.get("/v1/bundles/unknown-hw").status_code == 404

        again = http.post("/v1/bundles", json=bundle).json()
        assert again == {"hardware_id": "h200x2-nvl", "records": 2, "changed": 0, "unchanged": 2}

        bundle["records"][0]["latency_p50_us"] = 100.0
        bundle["records"][0]["latency_p10_us"] = None
        assert http.post("/v1/bundles", json=bundle).json()["changed"] == 1

        bundle["records"][1]["hardware_id"] = "other"
        bad = http.post("/v1/bundles", json=bundle)
        assert bad.status_code == 422 and "records[1].hardware_id" in bad.text
        assert http.post("/v1/bundles", json={**bundle, "schema_version": 99}).status_code == 422
    assert count(server.db_url) == 3


def test_offline_export_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, target = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    with Store(source) as store:
        from jointtune.db import NewRecord

        for m in (512, 1024, 2048):
            store.upsert_record(NewRecord(**record(shape={"M": m, "N": 64, "K": 64})))
    out = tmp_path / "bundle.json"
    assert _cli(["export", "--hardware", "h200x2-nvl", "--db", source, "-o", str(out)]) == 0
    assert _cli(["import", str(out), "--db", target]) == 0
    assert "3 records for h200x2-nvl: 3 stored" in capsys.readouterr().out
    with Store(target) as store:
        assert sorted(r.shape["M"] for r in store.list_records()) == [512, 1024, 2048]

    broken = json.loads(out.read_text())
    broken["records"][2]["world_size"] = 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    empty = f"sqlite:///{tmp_path / 'c.db'}"
    for path in (bad, tmp_path / "missing.json"):
        assert _cli(["import", str(path), "--db", empty]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "records[2].world_size" in err[0] and "can't be read" in err[1]
    with Store(empty) as store:
        assert store.count_records() == 0
    capsys.readouterr()
    assert _cli(["import", str(out), "--db", target]) == 0  # the same records again: identical, nothing stored
    assert "3 records for h200x2-nvl: 0 stored, 3 left as they were (the store's record for its key was as fast or " \
        "faster: identical, or better)" in capsys.readouterr().out  # fmt: skip
    assert _cli(["export", "--hardware", "nope", "--db", source, "-o", str(tmp_path / "x.json")]) == 2
    assert "--hardware: 'nope' is unknown in" in capsys.readouterr().err
