"""Load benchmark of the config service: lookups/s and p50/p99 latency per query kind on PostgreSQL.

A benchmark, not a test. It creates a fresh database `jt_load_<random>` next to the given one,
bulk-inserts `--records` records through the store's models and engine, starts `jointtune serve`
(uvicorn, `--workers` processes) on loopback, and drives lookups at a fixed rate (`--rate` per
second, open loop: each request has a scheduled start, so a slow server cannot slow the offered
load down) for `--duration` seconds from `--clients` separate processes with `--threads` httpx
threads each (request i goes to client i mod clients; all share one start time). Queries mix exact
shapes (stored) and nearest shapes (not stored: the service falls back to the closest). The
database is dropped at the end, whatever happens.

Besides latencies it reports the CPU the service's processes and PostgreSQL's used during the load
(from /proc, when they run on this machine) per request, and how busy the whole machine was: on a
saturated machine latencies are queueing, and CPU per request is the figure that compares runs.

    python bench/service/service_load.py --out bench/results/service_load_<date>.json
    OUT=dir bash bench/service/service_load_device.sh    # on a machine without PostgreSQL (the lent GPU node)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import multiprocessing
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import httpx
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
import common  # noqa: F401  (first: this checkout's jointtune, for the imports below)

# isort: split

from jointtune import __version__
from jointtune.db import Store

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
KERNELS = ("ag_gemm", "gemm_rs")
VERSION = "v1"
HARDWARE = ("h200x2-nvl", "h200x8-nvl", "h100x8-nvl", "a100x8-nvl", "mi300x8-xgmi")
COMBOS = (("bfloat16", 2), ("bfloat16", 8), ("float16", 4), ("float16", 8))
#: stored M values: multiples of 128, so M=64 and odd Ms are never stored (they are the nearest queries)
M_VALUES = tuple(128 * k for k in range(1, 126))
NK_VALUES = tuple((n, k) for n in (2048, 4096, 8192, 14336) for k in (2048, 4096, 8192, 12288, 28672))
TARGET_P99_MS = {"exact": 10.0, "nearest": 20.0}


def keys(count: int) -> list[tuple[str, str, str, int, int, int, int]]:
    """`count` distinct (kernel, hardware, dtype, world, M, N, K) keys, deterministic."""
    out = []
    for kernel in KERNELS:
        for hw in HARDWARE:
            for dtype, world in COMBOS:
                for m in M_VALUES:
                    for n, k in NK_VALUES:
                        out.append((kernel, hw, dtype, world, m, n, k))
    if count > len(out):
        raise SystemExit(f"--records: {count} is not allowed; at most {len(out)} distinct keys are generated")
    return out[:count]


def fill(url: str, count: int, chunk: int = 5000) -> float:
    """Insert `count` records with Core bulk inserts into the store's tables (read from the database itself, the
    schema its migrations made: no ORM model of the package's is needed); returns the seconds taken."""
    start = time.perf_counter()
    now = datetime.now(timezone.utc)
    rng = random.Random(7)
    with Store(url) as store, store.engine.begin() as conn:
        tables = sa.MetaData()
        tables.reflect(conn, only=("jt_kernels", "jt_hardware_profiles", "jt_records"))
        kernels, hardware, records_table = (tables.tables[name] for name in ("jt_kernels", "jt_hardware_profiles",
                                                                             "jt_records"))  # fmt: skip
        conn.execute(sa.insert(kernels), [{"name": k, "version": VERSION, "created_at": now} for k in KERNELS])
        conn.execute(
            sa.insert(hardware),
            [{"hardware_id": h, "name": h, "fingerprint": {"gpu": h}, "created_at": now} for h in HARDWARE],
        )
        all_keys = keys(count)
        for first in range(0, count, chunk):
            records = []
            for offset, (kernel, hw, dtype, world, m, n, k) in enumerate(all_keys[first : first + chunk]):
                rid = first + offset + 1
                shape = {"K": k, "M": m, "N": n}
                p50 = 10.0 + m * n * k / 2e9 * rng.uniform(0.8, 1.2)
                baseline = p50 * rng.uniform(0.9, 1.8)
                records.append(
                    {
                        "id": rid,
                        "kernel": kernel,
                        "kernel_version": VERSION,
                        "space_version": "s1",
                        "shape": shape,
                        "shape_key": f"K={k},M={m},N={n}",
                        "dims_signature": "K,M,N",
                        "dtype": dtype,
                        "world_size": world,
                        "hardware_id": hw,
                        "triton_version": "3.6",
                        "config": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "mode": rng.choice(["push", "pull"])},
                        "config_hash": f"{rid:064x}",
                        "latency_p10_us": p50 * 0.97,
                        "latency_p50_us": p50,
                        "latency_p90_us": p50 * 1.05,
                        "baseline_us": baseline,
                        "speedup": baseline / p50,
                        "trials": 64,
                        "study_name": None,
                        "tuner_version": __version__,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            conn.execute(sa.insert(records_table), records)
        conn.execute(sa.text("SELECT setval(pg_get_serial_sequence('jt_records', 'id'), :n)"), {"n": count})
    with Store(url) as store, store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))
    return time.perf_counter() - start


def queries(count: int, records: int, nearest_fraction: float, seed: int = 11) -> list[tuple[str, dict[str, Any]]]:
    """(kind, query params) pairs: exact = a stored key, nearest = a stored key's M made unstored."""
    rng = random.Random(seed)
    stored = keys(records)
    out = []
    for _ in range(count):
        kernel, hw, dtype, world, m, n, k = rng.choice(stored)
        kind = "nearest" if rng.random() < nearest_fraction else "exact"
        if kind == "nearest":
            m = m + rng.choice((-37, 29, 61))
        params = {"kernel": kernel, "dtype": dtype, "world_size": world, "hardware_id": hw}
        out.append((kind, {**params, "kernel_version": VERSION, "M": m, "N": n, "K": k}))
    return out


Sample = tuple[str, float, float, int, str]  # kind, late start (s), latency (s), status, match


def drive(
    base_url: str, plan: list[tuple[str, dict[str, Any]]], first: int, step: int, rate: float, threads: int, link: Any
) -> None:
    """One client process: requests first, first+step, ... of `plan`, request i due at t0 + i/rate.

    `link` is (ready queue, start event, t0 value, results queue): the process says it is ready,
    waits for the common t0 (time.monotonic, the same clock in every process), and sends back its
    samples and the time its last request ended.
    """
    ready, start, t0_value, out = link
    mine = list(range(first, len(plan), step))
    lock = threading.Lock()
    state = {"next": 0}
    samples: list[Sample] = []
    ready.put(first)
    start.wait()
    t0 = t0_value.value

    def worker() -> None:
        with httpx.Client(base_url=base_url, timeout=5.0, trust_env=False) as http:
            while True:
                with lock:
                    n = state["next"]
                    state["next"] += 1
                if n >= len(mine):
                    return
                i = mine[n]
                due = t0 + i / rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                kind, params = plan[i]
                query = {key: value for key, value in params.items() if key != "kernel"}
                sent = time.monotonic()
                try:
                    response = http.get(f"/v1/configs/{params['kernel']}", params=query)
                    status, match = response.status_code, response.json().get("match", "")
                except httpx.HTTPError as exc:
                    status, match = 0, type(exc).__name__
                samples.append((kind, sent - due, time.monotonic() - sent, status, match))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    out.put({"samples": samples, "end": time.monotonic()})


def run_clients(
    base: str, plan: list[tuple[str, dict[str, Any]]], rate: float, clients: int, threads: int, meter: CpuMeter
) -> tuple[list[Sample], float, dict[str, Any]]:
    """Start `clients` processes, release them at one t0, gather samples, wall time and CPU use."""
    ctx = multiprocessing.get_context("spawn")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    t0_value = ctx.Value("d", 0.0)
    link = (ready, start, t0_value, out)
    procs = [ctx.Process(target=drive, args=(base, plan, j, clients, rate, threads, link)) for j in range(clients)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        t0_value.value = time.monotonic() + 0.5
        start.set()
        time.sleep(max(0.0, t0_value.value - time.monotonic()))
        meter.begin()
        timeout = len(plan) / rate * 4 + 60
        parts = [out.get(timeout=timeout) for _ in procs]
        cpu = meter.end()
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    samples = [sample for part in parts for sample in part["samples"]]
    return samples, max(part["end"] for part in parts) - t0_value.value, cpu


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used) for every process /proc shows (Linux): its own and that of its
    children it has reaped, so a tree's sum does not drop when a child exits (PostgreSQL's backends do)."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), sum(int(value) for value in fields[11:15]) / tick)
    return table


def _tree_cpu(table: dict[int, tuple[int, float]], root: int | None) -> float | None:
    if root is None or root not in table:
        return None
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


class CpuMeter:
    """CPU used during the load by the service's process tree and PostgreSQL's (when local), and
    the machine's busy fraction. Best effort: None where /proc can't tell (not Linux, remote DB)."""

    def __init__(self, server_pid: int, postmaster_pid: int | None) -> None:
        self.roots = {"server": server_pid, "postgres": postmaster_pid}
        self._start: dict[str, Any] = {}

    def _read(self) -> dict[str, Any]:
        try:
            table = _proc_table()
            now = {name: _tree_cpu(table, pid) for name, pid in self.roots.items()}
            now["machine"] = _machine_ticks()
        except (OSError, ValueError, IndexError):
            now = {"server": None, "postgres": None, "machine": None}
        now["t"] = time.monotonic()
        return now

    def begin(self) -> None:
        self._start = self._read()

    def end(self) -> dict[str, Any]:
        stop, start = self._read(), self._start
        out: dict[str, Any] = {"window_s": round(stop["t"] - start["t"], 2)}
        for name in self.roots:
            used = None if stop[name] is None or start[name] is None else stop[name] - start[name]
            out[f"{name}_cpu_s"] = None if used is None else round(used, 2)
        if stop["machine"] and start["machine"]:
            busy = stop["machine"][0] - start["machine"][0]
            total = stop["machine"][1] - start["machine"][1]
            out["machine_busy_fraction"] = round(busy / total, 3) if total else None
        return out


def postmaster_pid(url: str) -> int | None:
    """PostgreSQL's postmaster, when the server runs on this machine (parent of our backend, read while the
    backend lives: once its connection closes it may be gone, and the CPU of PostgreSQL went unreported)."""
    try:
        with Store(url) as store, store.engine.connect() as conn:
            backend = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with open(f"/proc/{backend}/stat") as fh:
                return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, sa.exc.SQLAlchemyError):
        return None


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(samples: list[Sample], wall_s: float, cpu: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": len(samples), "wall_s": round(wall_s, 2)}
    out["throughput_per_s"] = round(len(samples) / wall_s, 1)
    out["errors"] = sum(1 for s in samples if s[3] != 200)
    out["late_starts_over_5ms"] = sum(1 for s in samples if s[1] > 0.005)
    for kind in ("exact", "nearest"):
        mine = [s for s in samples if s[0] == kind]
        lat = [s[2] * 1000 for s in mine if s[3] == 200]
        ok = all(s[4] == kind for s in mine if s[3] == 200)
        out[kind] = {
            "requests": len(mine),
            "ok": len(lat),
            "answered_as_asked": ok,
            "p50_ms": round(quantile(lat, 0.50), 2) if lat else None,
            "p90_ms": round(quantile(lat, 0.90), 2) if lat else None,
            "p99_ms": round(quantile(lat, 0.99), 2) if lat else None,
            "max_ms": round(max(lat), 2) if lat else None,
            "target_p99_ms": TARGET_P99_MS[kind],
            "met": bool(lat) and quantile(lat, 0.99) <= TARGET_P99_MS[kind],
        }
    out["cpu"] = dict(cpu)
    for name in ("server", "postgres"):
        used = cpu.get(f"{name}_cpu_s")
        out["cpu"][f"{name}_cpu_ms_per_request"] = round(used * 1000 / len(samples), 2) if used and samples else None
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: the same app and workers as `jointtune serve`, but on a socket made with proto IPPROTO_TCP (see README)
_FIXED_SOCKET = """
import socket, sys
from uvicorn import Config
from uvicorn.supervisors import Multiprocess
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
config = Config("jointtune.server.app:app_from_env", factory=True, workers=int(sys.argv[2]), log_level="warning")
Multiprocess(config, sockets=[sock]).run()
"""


def serve(
    url: str, workers: int | None, launcher: str, log: IO[bytes] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the service: `jointtune serve` itself (`workers` None: the count it picks), or its app on a
    TCP_NODELAY-capable socket. Its output goes to `log` (kept open for the caller) or to a file shown only if it
    does not come up."""
    port = _free_port()
    if launcher == "cli":
        cmd = [sys.executable, "-c", "from jointtune.cli import main; main()", "serve", "--port", str(port)]
        cmd += ["--db", url, *(["--workers", str(workers)] if workers is not None else [])]
    else:
        cmd = [sys.executable, "-c", _FIXED_SOCKET, str(port), str(workers or 1)]
    env = {**os.environ, "JOINTTUNE_TOKENS": "", "JOINTTUNE_DB_URL": url}
    base = f"http://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        out = log if log is not None else stack.enter_context(tempfile.TemporaryFile())
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{base}/readyz", timeout=1, trust_env=False).status_code == 200:
                    return proc, base
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        out.seek(0)
        tail = out.read().decode(errors="replace")[-4000:]
    raise SystemExit(f"{tail}\nthe service did not become ready on {base} (exit code {proc.poll()})")


def warm(base: str, plan: list[tuple[str, dict[str, Any]]], workers: int) -> None:
    """A few requests per worker so every worker has opened its store and connections."""
    with httpx.Client(base_url=base, timeout=10, trust_env=False) as http:
        for _, params in plan[: 50 * workers]:
            http.get(f"/v1/configs/{params['kernel']}", params={k: v for k, v in params.items() if k != "kernel"})


def versions() -> dict[str, str]:
    import fastapi
    import psycopg
    import uvicorn

    with Store(os.environ["_JT_LOAD_URL"]) as store, store.engine.connect() as conn:
        server = conn.execute(sa.text("SHOW server_version")).scalar_one()
    found = {}
    for name in ("uvloop", "httptools"):  # uvicorn uses them when importable ("auto"), else asyncio and h11
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return {
        "jointtune": __version__,
        "python": platform.python_version(),
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "sqlalchemy": sa.__version__,
        "psycopg": psycopg.__version__,
        "httpx": httpx.__version__,
        "postgresql": str(server),
        **found,
    }


@contextlib.contextmanager
def scratch_database(db_url: str) -> Iterator[tuple[str, str]]:
    """(name, URL) of a fresh database `jt_load_<random>` beside `db_url`, dropped at the end whatever happens."""
    admin = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    name = f"jt_load_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    os.environ["_JT_LOAD_URL"] = url
    try:
        yield name, url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def stop(proc: subprocess.Popen[Any] | None) -> None:
    """Stop the service (killed when it does not exit within 20 s)."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def report_header(benchmark: str, args: argparse.Namespace, fill_s: float) -> dict[str, Any]:
    """What every report of these benchmarks starts with: what ran, where, when, and how."""
    return {
        "benchmark": benchmark,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": args.device,
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "command": "python " + " ".join(sys.argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("db_url", "out")},
        "fill_s": round(fill_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default=DEFAULT_URL, help="PostgreSQL server to create the scratch database on")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=500.0, help="offered lookups per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="seconds of the same load first, not recorded")
    parser.add_argument("--workers", type=int, default=3, help="uvicorn worker processes")
    parser.add_argument("--threads", type=int, default=32, help="httpx threads per client process")
    parser.add_argument("--clients", type=int, default=1, help="client processes (request i goes to client i mod N)")
    parser.add_argument("--nearest-fraction", type=float, default=0.5)
    parser.add_argument("--device", default="2-core CPU sandbox, PostgreSQL 15 on loopback")
    parser.add_argument(
        "--launcher",
        choices=("cli", "nodelay-socket"),
        default="cli",
        help="cli: `jointtune serve`; nodelay-socket: the same app and workers on an IPPROTO_TCP socket",
    )
    parser.add_argument("--out", help="write the JSON result here")
    args = parser.parse_args()

    with scratch_database(args.db_url) as (name, url):
        proc = None
        try:
            fill_s = fill(url, args.records)
            print(f"{name}: {args.records} records in {fill_s:.1f} s", flush=True)
            proc, base = serve(url, args.workers, args.launcher)
            plan = queries(int(args.rate * args.duration), args.records, args.nearest_fraction)
            warm(base, queries(200, args.records, args.nearest_fraction, seed=3), args.workers)
            if args.warmup_s > 0:  # the same open-loop load, not recorded: pools, caches and plans settle first
                warmup = queries(int(args.rate * args.warmup_s), args.records, args.nearest_fraction, seed=5)
                warmup_meter = CpuMeter(proc.pid, postmaster_pid(url))
                run_clients(base, warmup, args.rate, args.clients, args.threads, warmup_meter)
            meter = CpuMeter(proc.pid, postmaster_pid(url))
            samples, wall_s, cpu = run_clients(base, plan, args.rate, args.clients, args.threads, meter)
            summary = summarize(samples, wall_s, cpu)
            report = {**report_header("service_load", args, fill_s), "result": summary}
            print(json.dumps(report, indent=1))
            if args.out:
                with open(args.out, "w") as fh:
                    fh.write(json.dumps(report, indent=1) + "\n")
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
