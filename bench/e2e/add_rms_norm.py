"""The sequence-parallel layout's residual add + RMSNorm on one GPU: `jointtune.tp.add_rms_norm` (one pass)
against torch's `r + y` then `F.rms_norm` (what the layer ran before, and what the torch layer runs), at the rows a
rank holds in sp (tokens / TP) and the hidden sizes of the shipped models.

Per shape: both paths on fresh random inputs, checked first (h bit for bit against torch's add, the norm's largest
difference from `F.rms_norm` in units of the last place, both against a float32 reference), then timed eagerly and
in CUDA-graph replay (a graph of `--calls` calls, median over replays after warm-up), µs per call. `ours` is
`jointtune.tp.add_rms_norm` as the layer calls it (the kernel, launched directly); `ours_op` the same kernel through
its torch op (`torch.ops.jointtune.add_rms_norm`, what a compiled graph calls): its eager time shows what the op's
dispatch adds on the host.

    python bench/e2e/add_rms_norm.py --out add_rms_norm.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` imports as a package

# isort: split

import torch
import torch.nn.functional as F
import triton
from common.measure import capture

from jointtune.errors import ShapeError
from jointtune.tp import add_rms_norm

DEFAULT_SHAPES = "16x8192,128x8192,1024x8192,2048x8192,4096x8192,1024x5120,2048x5120"


def _torch(y: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = r + y
    return F.rms_norm(h, (h.shape[-1],), w, eps), h


def _time(fn, calls: int, replays: int) -> tuple[float, float]:
    """(eager, graph-replay) µs per call: medians over `replays` rounds of `calls` calls, after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    eager = []
    for _ in range(replays):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        eager.append(start.elapsed_time(end) * 1e3 / calls)
    graph = capture(fn, calls)
    for _ in range(3):
        graph.replay()
    replay = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replay.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(eager), statistics.median(replay)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between a and b in units of the last place of their (16-bit) dtype."""
    ai, bi = (x.view(torch.int16).int() for x in (a, b))
    ai = torch.where(ai < 0, -32768 - ai, ai)  # sign-magnitude to a monotone integer line
    bi = torch.where(bi < 0, -32768 - bi, bi)
    return int((ai - bi).abs().max().item()) if a.numel() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="ROWSxHIDDEN,... (default: %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--calls", type=int, default=8, help="calls per timed round and per captured graph")
    ap.add_argument("--replays", type=int, default=30, help="timed rounds per path")
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--out", required=True, help="JSON results file")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",") if s]
        if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        print(f"--shapes: {args.shapes!r} is not allowed; give ROWSxHIDDEN,... with positive integers", file=sys.stderr)
        return 2
    for name, value in (("--calls", args.calls), ("--replays", args.replays)):
        if value < 1:
            print(f"{name}: {value} is not allowed; give an integer >= 1", file=sys.stderr)
            return 2
    if not math.isfinite(args.eps) or args.eps <= 0:
        print(f"--eps: {args.eps} is not allowed; give a finite number > 0", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("add_rms_norm.py: needs a GPU (it times CUDA graphs)", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    rows_out = []
    for rows, n in shapes:
        gen = torch.Generator(device="cuda").manual_seed(rows * n)
        y, r = (torch.randn(rows, n, device="cuda", generator=gen).to(dtype) for _ in range(2))
        w = (0.5 + torch.rand(n, device="cuda", generator=gen)).to(dtype)
        try:  # the kernel itself (the op checks what it is given), whatever path the eager call would take
            ours = torch.ops.jointtune.add_rms_norm(y, r, w, args.eps)
        except ShapeError as exc:
            print(f"--shapes: {rows}x{n}: {exc}", file=sys.stderr)
            return 2
        theirs = _torch(y, r, w, args.eps)
        h32 = r.float() + y.float()
        ref = F.rms_norm(h32, (n,), w.float(), args.eps)
        row = {
            "rows": rows, "hidden": n, "dtype": args.dtype,
            "h_equal_torch": bool(torch.equal(ours[1], theirs[1])),
            "norm_ulps_from_torch": _ulps(ours[0], theirs[0]),
            "norm_error_fp32": {"ours": ((ours[0].float() - ref).norm() / ref.norm()).item(),
                                "torch": ((theirs[0].float() - ref).norm() / ref.norm()).item()},
        }  # fmt: skip
        for name, path in (("ours", add_rms_norm), ("ours_op", torch.ops.jointtune.add_rms_norm), ("torch", _torch)):
            call = functools.partial(path, y, r, w, args.eps)
            row[f"{name}_eager_us"], row[f"{name}_graph_us"] = _time(call, args.calls, args.replays)
        row["speedup_graph"] = row["torch_graph_us"] / row["ours_graph_us"]
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    result = {
        "device": f"1x {torch.cuda.get_device_name()}",
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "calls_per_graph": args.calls, "replays": args.replays, "rows": rows_out,
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
