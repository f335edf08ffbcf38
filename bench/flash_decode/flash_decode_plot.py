"""The PNG of issue 16: speed-up of our best mode over the user's path (SDPA + NCCL + combine) and over our own
collective baseline, against the global KV length, one line per batch, for graph replay and eager calls.

    python bench/flash_decode/flash_decode_plot.py bench/results/flash_decode_b{1_stress,8,32}_2xH200_2026-11-24.json \
        --out bench/results/flash_decode_speedup_2xH200_2026-11-24.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    shapes = [s for path in args.results for s in json.loads(Path(path).read_text())["shapes"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, regime, title in ((axes[0], "graph_ms", "CUDA-graph replay"), (axes[1], "eager_ms", "eager calls")):
        for batch in sorted({s["B"] for s in shapes}):
            rows = sorted((s for s in shapes if s["B"] == batch), key=lambda s: s["S"])
            xs = [s["S"] // 1024 for s in rows]
            user = [s["best"][regime]["speedup_vs_user_path"] or 0 for s in rows]
            best = [s["best"][regime] for s in rows]
            coll = [b["collective_baseline_ms"] / b["per_mode"][b["best_mode"]]["ms"] for b in best]
            line = ax.plot(xs, user, marker="o", label=f"batch {batch}: vs SDPA + NCCL + combine")[0]
            ax.plot(xs, coll, marker="x", linestyle="--", color=line.get_color(),
                    label=f"batch {batch}: vs our kernel + NCCL")  # fmt: skip
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global KV length (K tokens), 2 ranks")
        ax.set_title(f"Flash-Decode, best mode, {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speed-up (higher is better)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
