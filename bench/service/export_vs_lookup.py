"""Lookup latency while clients pull full exports, against the same lookups on an idle service.

A benchmark, not a test (issue 17's target: lookup p99 under a concurrent full export no worse than
2x idle). It fills a fresh PostgreSQL database `jt_load_<random>` with `--records` records, starts
`jointtune serve --workers N` on loopback and drives the open-loop lookup load of
bench/service/service_load.py (`--rate` per second for `--duration` seconds, exact and nearest shapes) in
alternating phases: idle, then with `--exporters` client processes each pulling the hardware's
whole export page by page (`GET /v1/bundles/{hw}?after=...`, honouring 429 + Retry-After) again and
again for the whole phase. `--pairs` idle/export pairs alternate, so a machine shared with other
work affects both sides alike; the report gives every phase and the median ratio of p99s.

    python bench/service/export_vs_lookup.py --out bench/results/export_vs_lookup_<date>.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
import common  # noqa: F401  (first: this checkout's jointtune, for the imports below)

from service.service_load import (
    DEFAULT_URL,
    HARDWARE,
    CpuMeter,
    fill,
    postmaster_pid,
    quantile,
    queries,
    report_header,
    run_clients,
    scratch_database,
    serve,
    stop,
    summarize,
    warm,
)


def _next_after(page: bytes) -> int | None:
    """The page's cursor, read without parsing the page (the client shares the service's 2 cores)."""
    start = page.index(b'"next_after":') + len(b'"next_after":')
    text = page[start : page.index(b",", start)]
    return None if text == b"null" else int(text)


def export_forever(base: str, hardware_id: str, stop: Any, out: Any) -> None:
    """One exporting client: full exports back to back until `stop`; reports what it pulled."""
    done = pages = refused = size = 0
    durations: list[float] = []
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as http:
        while not stop.is_set():
            after: int | None = 0
            began = time.monotonic()
            while after is not None and not stop.is_set():
                response = http.get(f"/v1/bundles/{hardware_id}", params={"after": after, "limit": 1000})
                if response.status_code == 429:
                    refused += 1
                    stop.wait(float(response.headers.get("retry-after", "1")))
                    continue
                response.raise_for_status()
                pages += 1
                size += len(response.content)
                after = _next_after(response.content)
            if after is None:
                done += 1
                durations.append(time.monotonic() - began)
    out.put({"full_exports": done, "pages": pages, "refused_429": refused, "bytes": size, "export_s": durations})


def phase(base: str, url: str, pid: int, args: argparse.Namespace, seed: int, exporters: int) -> dict[str, Any]:
    plan = queries(int(args.rate * args.duration), args.records, args.nearest_fraction, seed=seed)
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=export_forever, args=(base, HARDWARE[0], stop, out)) for _ in range(exporters)]
    for proc in procs:
        proc.start()
    try:
        if procs:
            time.sleep(2.0)  # the exports are under way before the lookups start
        samples, wall_s, cpu = run_clients(base, plan, args.rate, 1, args.threads, CpuMeter(pid, postmaster_pid(url)))
    finally:
        stop.set()
        pulled = [out.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
    result = summarize(samples, wall_s, cpu)
    lat = [s[2] * 1000 for s in samples if s[3] == 200]
    result["all"] = {"p50_ms": round(quantile(lat, 0.5), 2), "p99_ms": round(quantile(lat, 0.99), 2)}
    if procs:
        result["exports"] = {
            "clients": exporters,
            "full_exports": sum(p["full_exports"] for p in pulled),
            "pages": sum(p["pages"] for p in pulled),
            "refused_429": sum(p["refused_429"] for p in pulled),
            "mbytes": round(sum(p["bytes"] for p in pulled) / 1e6, 1),
            "full_export_s": [round(s, 1) for p in pulled for s in p["export_s"]],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default=DEFAULT_URL)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=80.0, help="offered lookups per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of lookups per phase")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--exporters", type=int, default=4, help="client processes pulling full exports")
    parser.add_argument("--pairs", type=int, default=3, help="idle/export phase pairs, alternating")
    parser.add_argument("--nearest-fraction", type=float, default=0.5)
    parser.add_argument("--device", default="2-core sandbox (shared), PostgreSQL 15 on loopback")
    parser.add_argument("--out")
    args = parser.parse_args()

    with scratch_database(args.db_url) as (_name, url):
        proc = None
        try:
            fill_s = fill(url, args.records)
            proc, base = serve(url, args.workers, "cli")
            warm(base, queries(200, args.records, args.nearest_fraction, seed=3), args.workers)
            phase(base, url, proc.pid, argparse.Namespace(**{**vars(args), "duration": 5.0}), 5, 0)  # settle
            per_hw = args.records // len(HARDWARE)
            phases = []
            for pair in range(args.pairs):
                for exporters in (0, args.exporters):
                    result = phase(base, url, proc.pid, args, 11 + pair, exporters)
                    phases.append({"pair": pair, "exporters": exporters, **result})
                    shown = {k: phases[-1].get(k) for k in ("pair", "exporters", "all", "exports")}
                    print(json.dumps(shown), flush=True)
            idle = [p["all"]["p99_ms"] for p in phases if not p["exporters"]]
            busy = [p["all"]["p99_ms"] for p in phases if p["exporters"]]
            ratios = [b / i for i, b in zip(idle, busy)]
            report = {
                **report_header("export_vs_lookup", args, fill_s),
                "records_of_the_exported_hardware": per_hw,
                "summary": {
                    "idle_p99_ms": idle,
                    "export_p99_ms": busy,
                    "p99_ratio_per_pair": [round(r, 2) for r in ratios],
                    "p99_ratio_median": round(statistics.median(ratios), 2),
                    "target": "export p99 <= 2x idle p99",
                    "met": statistics.median(ratios) <= 2.0,
                },
                "phases": phases,
            }
            print(json.dumps(report["summary"], indent=1))
            if args.out:
                with open(args.out, "w") as fh:
                    fh.write(json.dumps(report, indent=1) + "\n")
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
