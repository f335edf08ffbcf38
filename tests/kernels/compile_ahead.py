"""What a tuning rank's compile worker leaves in Triton's cache is what the rank's launch then reads (sm_90, no GPU).

For each config (AG+GEMM at 2048x5120x8192, two ranks): compile it as a compile pool's worker does
(`workers.compiler.compile_config`: the family's stand-in launches through Triton's JIT, for sm_90, no driver), then
compile it again as a rank whose JIT has built nothing yet, and print one JSON line: the worker's failure (null), the
cache entries the second compile added (0: it read the worker's), and whether the worker left the C launcher that
Triton 3.6 builds at a kernel's first launch (when it builds one; $TRITON_LIBCUDA_PATH may name a stand-in libcuda).

    python tests/kernels/compile_ahead.py '[{"mode": "push_cublas", ...}]'      # TRITON_CACHE_DIR: an empty dir
"""

from __future__ import annotations

import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # compile what a GPU launches

import torch
import triton
from triton.backends.nvidia import driver as nvidia

from jointtune.autotune.workers.compiler import CompileTarget, compile_config, compile_only_for
from jointtune.kernels import get_family
from jointtune.search_spaces import Problem

TARGET = CompileTarget("cuda", 90, 32)
PROBLEM = Problem.of({"M": 2048, "N": 5120, "K": 8192}, dtype="bfloat16", world_size=2)


def entries(cache: str) -> dict[str, list[str]]:
    return {d: sorted(os.listdir(os.path.join(cache, d))) for d in os.listdir(cache)}


def check(config: dict, cache: str) -> dict:
    failure = compile_config("ag_gemm", config, PROBLEM, TARGET)
    built = entries(cache)
    launches = get_family("ag_gemm").standin_launches(config, PROBLEM, torch.device("cpu"))
    for kernel, _, _ in launches:
        kernel.device_caches.clear()  # as a fresh process: nothing compiled in process
    compile_only_for(TARGET)
    for kernel, args, options in launches:
        kernel.warmup(grid=(1,), **args, **options)
    files = [f for names in built.values() for f in names]
    return {
        "config": config,
        "triton": triton.__version__,
        "failure": failure,
        "launches": len(launches),
        "added": sorted(set(entries(cache)) - set(built)),
        "launcher": any(f.startswith("__triton_launcher") for f in files),
        "builds_launchers": hasattr(nvidia, "make_launcher"),
    }


def main() -> None:
    cache = os.environ["TRITON_CACHE_DIR"]
    for config in json.loads(sys.argv[1]):
        print(json.dumps(check(config, cache)), flush=True)


if __name__ == "__main__":
    main()
