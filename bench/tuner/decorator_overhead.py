"""Per-call cost of `@joint_autotune` on a cache hit, against calling the launcher with a fixed config.

CPU-only (no kernel runs): a trivial Python function, and a tiny launcher (a 4-element torch add
with the ag_gemm key function of M, N, K). Each pair is timed in interleaved batches of 1,000 calls;
the overhead is the median over batches of (decorated - plain) per call, over 100,000 calls.

    python bench/tuner/decorator_overhead.py [--calls 100000] [--out overhead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
import common  # noqa: F401  (first: this checkout's jointtune, for the imports below)

# isort: split

from jointtune import create_world, joint_autotune


def _per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def overhead(plain: Callable[[], Any], decorated: Callable[[], Any], *, calls: int, batch: int = 1000) -> dict:
    """Median per-call times (ns) of both, and of their difference, over interleaved batches."""
    decorated()  # resolve the key once: what follows are cache hits
    plain_ns, deco_ns, diff_ns = [], [], []
    for _ in range(calls // batch):
        p = _per_call_ns(plain, batch)
        d = _per_call_ns(decorated, batch)
        plain_ns.append(p)
        deco_ns.append(d)
        diff_ns.append(d - p)
    return {
        "plain_ns": statistics.median(plain_ns),
        "decorated_ns": statistics.median(deco_ns),
        "overhead_ns": statistics.median(diff_ns),
        "calls": calls,
    }


class _NoopKernel:
    """Stands in for a compiled `@triton.jit` kernel whose launch costs nothing (`run` returns at once)."""

    def __init__(self) -> None:
        self.arg_names = ["x", "n"]
        self.fn = _noop_source

    def run(self, *args: Any, **kwargs: Any) -> None:
        return None


def _noop_source(x: Any, n: int) -> None:
    return None


def _triton_pair(db: str, calls: int) -> dict:
    """Our drop-in against Triton's own Autotuner on a cache hit, around a launch that costs nothing."""
    import triton
    from triton.runtime.autotuner import Autotuner

    configs = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]
    bench = lambda kernel_call, quantiles: [1.0, 1.0, 1.0]  # the timings don't matter here
    theirs = Autotuner(_NoopKernel(), ["x", "n"], configs, ["n"], None, None, do_bench=bench)
    ours = joint_autotune(configs=configs, key=["n"], do_bench=bench, db_url=db)(_NoopKernel())
    x = torch.ones(4)
    return overhead(lambda: theirs.run(x, 4), lambda: ours.run(x, 4), calls=calls)


def triton_version() -> str:
    import triton

    return triton.__version__


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    folder = tempfile.mkdtemp(prefix="jt-overhead-")
    db = f"sqlite:///{folder}/overhead.db"
    world = create_world("local", 2)
    fixed = {"mode": "baseline"}

    def trivial(a: Any, b: Any, *, world: Any, config: Any) -> Any:
        return a

    def tiny(a: Any, b: Any, *, world: Any, config: Any) -> Any:
        return torch.add(a, b)

    def key(a: Any, b: Any, *, world: Any) -> dict[str, int]:
        return {"M": a.shape[0] * world.world_size, "N": b.shape[1] * world.world_size, "K": a.shape[1]}

    a = torch.ones(2, 2, dtype=torch.bfloat16)
    b = torch.ones(2, 2, dtype=torch.bfloat16)
    results = {}
    for name, fn in (("trivial", trivial), ("tiny_launcher", tiny)):
        deco = joint_autotune(space="ag_gemm", key=key, on_miss="default", db_url=db)(fn)
        results[name] = overhead(
            lambda fn=fn: fn(a, b, world=world, config=fixed),
            lambda deco=deco: deco(a, b, world=world),
            calls=args.calls,
        )
    results["triton_dropin_vs_triton_autotune"] = _triton_pair(db, args.calls)
    report = {
        "command": " ".join(["python", "bench/tuner/decorator_overhead.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d"),
        "device": "2-core CPU sandbox (" + (platform.processor() or platform.machine()) + "), no GPU",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version()},
        "results": results,
    }
    for name, r in results.items():
        print(f"{name:34s} plain {r['plain_ns'] / 1e3:7.3f} µs  decorated {r['decorated_ns'] / 1e3:7.3f} µs  "
              f"overhead {r['overhead_ns'] / 1e3:6.3f} µs/call (median, {r['calls']:,} calls)")  # fmt: skip
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=2)
    return report


if __name__ == "__main__":
    main()
