"""Does cuBLAS finish beside a kernel that holds some SMs while it waits for a flag cuBLAS's stream sets afterwards?
(The barrier exchange in chunks: the exchange waits on a side stream while the chunks' GEMMs run.) Each case runs in
a child process under a time limit; prints one JSON line per case: finished, or hung. On one H100 the cases whose
kernels had all been launched once finished, and the last, whose flag kernel had not, hung: CUDA loads a kernel at its
first launch, and the load waits for the kernels running (`results/side_stream_probe_h100_2026-11-27.json`). Run it
with `bash bench/ops/fused_ops_device.sh sideprobe`."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CASE = r"""
import os, sys, torch, triton, triton.language as tl
M, N, K, G, order, carve = (int(x) for x in sys.argv[1:7])

@triton.jit
def spin(flag_ptr, out_ptr):
    v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
    while v == 0:
        v = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
    tl.store(out_ptr + tl.program_id(0), v)

@triton.jit
def setf(flag_ptr):
    tl.atomic_xchg(flag_ptr, 1, sem="release", scope="gpu")

dev = torch.device("cuda", 0)
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
b = torch.randn(K, 2 * N, device=dev, dtype=torch.bfloat16)[:, :N]
c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
flag = torch.zeros(1, device=dev, dtype=torch.int32)
out = torch.zeros(G, device=dev, dtype=torch.int32)
print("env CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING"), "MAX_CONNECTIONS",
      os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), flush=True)
warm = int(sys.argv[7])
torch.mm(a, b, out=c); spin[(G,)](torch.ones(1, device=dev, dtype=torch.int32), out, num_warps=8)  # compile, warm
if warm:  # every kernel loaded before one waits for another (CUDA loads kernels lazily, waiting for running ones)
    setf[(1,)](torch.zeros(1, device=dev, dtype=torch.int32))
torch.cuda.synchronize()
if carve:
    torch._C._set_sm_carveout_experimental(carve)
side = torch.cuda.Stream(device=dev)
main = torch.cuda.current_stream(dev)
side.wait_stream(main)
if order == 0:  # the waiting kernel first, then cuBLAS beside it
    with torch.cuda.stream(side):
        spin[(G,)](flag, out, num_warps=8)
    torch.mm(a, b, out=c)
else:
    torch.mm(a, b, out=c)
    with torch.cuda.stream(side):
        spin[(G,)](flag, out, num_warps=8)
setf[(1,)](flag)
main.wait_stream(side)
torch.cuda.synchronize()
print("KERNELS finished", flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="side_stream_probe.json")
    args = ap.parse_args()
    # (M, N, K, waiting programs, order: waiter first 0 / cuBLAS first 1, SM carveout (torch's experimental knob;
    # 0: none), every kernel launched once first)
    cases = [(64, 4096, 2048, 32, 0, 0, 1), (64, 4096, 2048, 32, 1, 0, 1), (1024, 4096, 2048, 32, 0, 0, 1),
             (64, 4096, 2048, 32, 1, 0, 0)]  # fmt: skip
    script = Path(tempfile.mkdtemp()) / "case.py"  # Triton reads a kernel's source from its file
    script.write_text(CASE)
    lines = []
    for case in cases:
        try:
            done = subprocess.run([sys.executable, str(script), *map(str, case)], capture_output=True, text=True,
                                  timeout=25)  # fmt: skip
            err = done.stderr[-300:] if done.returncode else ""
            result = {"rc": done.returncode, "out": done.stdout[-300:], "err": err}
        except subprocess.TimeoutExpired:
            result = {"hung": True}
        line = {"M,N,K,programs,order,carveout,loaded": case, **result}
        lines.append(line)
        print(json.dumps(line), flush=True)
    import torch
    import triton

    Path(args.out).write_text(json.dumps({
        "device": f"1x {torch.cuda.get_device_name()}", "world_size": 1,
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python3 bench/ops/side_stream_probe.py " + " ".join(sys.argv[1:]), "cases": lines,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
