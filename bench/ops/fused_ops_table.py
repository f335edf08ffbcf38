"""Print bench/README.md's table rows from `fused_ops.py` result files.

Usage: python bench/ops/fused_ops_table.py bench/results/fused_ops_*.json
One row per shape: our best mode and the best unfused path in graph replay (µs), the ratio best unfused / ours in graph
replay (bold), eager and GPU time, torch's fused op and the ideal bound max(compute alone, best collective alone).
"""

from __future__ import annotations

import argparse
import json


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _ratio(best: dict, regime: str) -> str:
    r = best.get(regime, {}).get("speedup_vs_best_unfused")
    return "-" if r is None else f"{r:.2f}x"


def rows(path: str) -> list[str]:
    with open(path) as fh:
        data = json.load(fh)
    gpu = data.get("device", "?").split(",")[0]
    out = []
    for shape, entry in data.get("summary", {}).items():
        best = entry.get("best", {})
        g = best.get("graph_ms")
        if not g:
            out.append(f"| {data['family']} | {data['world_size']} | {shape} | no valid result | | | | | | | {gpu} |")
            continue
        unfused = g["best_unfused"].removeprefix("baseline:")
        out.append(
            f"| {data['family']} | {data['world_size']} | {shape} | {g['best_ours']} {_us(g['best_ours_ms'])} | "
            f"{unfused} {_us(g['best_unfused_ms'])} | **{_ratio(best, 'graph_ms')}** | {_ratio(best, 'eager_ms')} | "
            f"{_ratio(best, 'median_ms')} | {_us(g['torch_fused_ms'])} | {_us(g['ideal_bound_ms'])} | {gpu} |"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="bench/README.md's table rows from fused_ops.py result files")
    ap.add_argument("results", nargs="+", help="fused_ops result JSON files")
    args = ap.parse_args()
    print("| family | W | shape | best of ours, graph µs | best unfused, graph µs | graph | eager | GPU "
          "| torch fused, graph µs | ideal bound µs | device |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in args.results:
        print("\n".join(rows(path)))


if __name__ == "__main__":
    main()
