"""Markdown tables from `ag_gemm_modes.py` results: per shape and regime (GPU, eager, graph), NCCL+cuBLAS,
torch's fused op, the best of each of our modes, and the ratios; then host issue times.

    python bench/ag_gemm/summarize_modes.py bench/results/ag_gemm_modes_2xH200_2026-11-23.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("push_cublas", "push", "ce_cublas", "ce_triton", "pull", "baseline")
REGIMES = {"median_ms": "GPU", "eager_ms": "eager", "graph_ms": "graph"}


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def main(paths: list[str]) -> None:
    shapes = [s for p in paths for s in json.loads(Path(p).read_text())["shapes"]]
    print("| M, N, K | regime | NCCL+cuBLAS | torch fused | cuBLAS alone | " + " | ".join(MODES)
          + " | best ours | vs NCCL+cuBLAS |")  # fmt: skip
    print("|---" * (7 + len(MODES)) + "|")
    for s in shapes:
        a = s["anchors"]
        for key, label in REGIMES.items():
            per = s["best"][key]["per_mode"]
            best = s["best"][key]["best_mode"]
            cells = [_fmt(per.get(m, {}).get("ms")) for m in MODES]
            base = a["nccl_cublas"].get(key)
            ratio = base / per[best]["ms"] if best and base else None
            print(f"| {s['M']}, {s['N']}, {s['K']} | {label} | {_fmt(base)} | {_fmt(a['torch_fused'].get(key))} | "
                  f"{_fmt(a.get('cublas_alone', {}).get(key))} | " + " | ".join(cells)
                  + f" | {best} | {'–' if ratio is None else f'{ratio:.2f}×'} |")  # fmt: skip
    print()
    print("| M, N, K | NCCL+cuBLAS host µs | " + " | ".join(MODES) + " |")
    print("|---" * (2 + len(MODES)) + "|")
    for s in shapes:
        per = s["best"]["median_ms"]["per_mode"]
        hosts = [f"{per[m]['host_us']:.0f}" if m in per and per[m].get("host_us") else "–" for m in MODES]
        print(f"| {s['M']}, {s['N']}, {s['K']} | {s['anchors']['nccl_cublas'].get('host_us', 0):.0f} | "
              + " | ".join(hosts) + " |")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Markdown tables from ag_gemm_modes.py result files")
    ap.add_argument("results", nargs="+", help="ag_gemm_modes.py result JSON files")
    main(ap.parse_args().results)
