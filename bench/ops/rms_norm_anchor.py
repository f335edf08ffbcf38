"""What the unfused residual add + RMSNorm costs on one GPU: HF Llama's composite form (float32 statistics, six
kernels, two roundings) against torch's own `F.rms_norm` (one fused kernel), each after `torch.add` of the residual,
bf16 rows of `--hidden`, in graph replay. The GEMM + all-reduce family's unfused path and the e2e benchmark's torch
layer use `F.rms_norm` since 2026-11-26; earlier results used the composite form.

Launch: `python3 bench/ops/rms_norm_anchor.py --out r.json [--rows 1,8,...] [--hidden 8192]`
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` imports as a package
from common.measure import launch_us


def hf_composite(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = h.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(w.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="rms_norm_anchor.json")
    ap.add_argument("--rows", default="1,8,32,64,128,1024,4096")
    ap.add_argument("--hidden", type=int, default=8192)
    args = ap.parse_args()
    eps, rows_list = 1e-5, [int(r) for r in args.rows.split(",")]
    result = {"device": f"1x {torch.cuda.get_device_name()}", "world_size": 1, "hidden": args.hidden,
              "date": datetime.date.today().isoformat(), "command": " ".join(["python3", *sys.argv]),
              "versions": {"torch": torch.__version__, "python": platform.python_version()}, "rows": []}  # fmt: skip
    for rows in rows_list:
        g = torch.Generator(device="cuda").manual_seed(rows)
        y, res = (torch.randn(rows, args.hidden, device="cuda", generator=g).bfloat16() for _ in range(2))
        w = (1 + 0.1 * torch.randn(args.hidden, device="cuda", generator=g)).bfloat16()
        want = hf_composite((y.float() + res.float()), w.float(), eps)
        entry = {"rows": rows}
        for name, norm in (
            ("hf_composite", hf_composite),
            ("F.rms_norm", lambda h, w, e: F.rms_norm(h, (h.shape[-1],), w, e)),
        ):
            h = torch.add(y, res)
            err = ((norm(h, w, eps).float() - want).norm() / want.norm()).item()
            step = lambda norm=norm, y=y, res=res, w=w: norm(torch.add(y, res), w, eps)
            entry[name] = {"add_norm_us": launch_us(step, calls=20, replays=20), "rel_error": err}
        print(json.dumps(entry), flush=True)
        result["rows"].append(entry)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
