"""Merge per-shape AG+GEMM benchmark JSON files and print the bench/README.md table.

Usage: python bench/ag_gemm/summarize.py OUT.json IN1.json IN2.json ...   (prints markdown to stdout)
"""

from __future__ import annotations

import argparse
import json
import sys

ORDER = [(8192, 4096, 12288), (8192, 8192, 28672), (8192, 3584, 14336), (1024, 8192, 8192), (128, 8192, 8192)]


def merge(paths: list[str]) -> dict:
    merged: dict = {}
    for path in paths:
        with open(path) as fh:
            data = json.load(fh)
        if not merged:
            merged = {k: v for k, v in data.items() if k != "shapes"} | {"shapes": []}
        merged["shapes"].extend(data["shapes"])
    merged["shapes"].sort(
        key=lambda e: ORDER.index((e["M"], e["N"], e["K"])) if (e["M"], e["N"], e["K"]) in ORDER else 99
    )
    return merged


def table(merged: dict) -> str:
    ms = lambda d: d.get("median_ms")
    rows = [
        "| M, N, K | NCCL AG | cuBLAS | NCCL+cuBLAS (best of 2 readings) | torch fused | CE anchor | ours: pull | push "
        "| push+cuBLAS | ce+cuBLAS | ce+Triton | best ours (mode) | speed-up vs NCCL+cuBLAS | vs ideal bound "
        "| vs best anchor |",
        "|" + "---|" * 15,
    ]
    for e in merged["shapes"]:
        a, o = e["anchors"], e["ours"]

        def get(k: str, o: dict = o) -> float | None:
            return ms(o[k]["symmetric_input"]) if "symmetric_input" in o.get(k, {}) else None

        base = min(x for x in (ms(a.get("nccl_cublas", {})), get("baseline")) if x)
        bound = max(ms(a["nccl_allgather"]), ms(a["cublas"]))
        fused = {k: get(k) for k in ("pull", "push", "push_cublas", "ce_cublas", "ce_triton") if get(k)}
        best_mode = min(fused, key=fused.get)
        best = min(fused[best_mode], base)
        if best == base and base < fused[best_mode]:
            best_mode = "baseline"
        anchors = min(x for x in (base, ms(a.get("torch_fused", {})), ms(a.get("ce_anchor_1chunk", {}))) if x)
        f = lambda x: f"{x:.3f}" if x else "—"
        rows.append(
            f"| {e['M']}, {e['N']}, {e['K']} | {f(ms(a['nccl_allgather']))} | {f(ms(a['cublas']))} | {f(base)} | "
            f"{f(ms(a.get('torch_fused', {})))} | {f(ms(a.get('ce_anchor_1chunk', {})))} | {f(get('pull'))} | "
            f"{f(get('push'))} | {f(get('push_cublas'))} | {f(get('ce_cublas'))} | {f(get('ce_triton'))} | "
            f"{f(best)} ({best_mode}) | "
            f"{base / best:.2f}× | {best / bound:.3f} | {anchors / best:.2f}× |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="merge per-shape ag_gemm_bench.py files; print bench/README.md's table")
    ap.add_argument("out", help="the merged JSON file to write")
    ap.add_argument("inputs", nargs="+", help="ag_gemm_bench.py result files, one shape each")
    args = ap.parse_args()
    out, inputs = args.out, args.inputs
    merged = merge(inputs)
    merged["command"] = (
        "for s in 8192x4096x12288 8192x8192x28672 8192x3584x14336 1024x8192x8192 128x8192x8192; do "
        "torchrun --nproc-per-node=2 bench/ag_gemm/ag_gemm_bench.py --shapes $s --out ag_$s.json; done; "
        "python bench/ag_gemm/summarize.py " + " ".join(sys.argv[1:])
    )
    with open(out, "w") as fh:
        json.dump(merged, fh, indent=1)
    print(table(merged))
