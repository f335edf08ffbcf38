"""Triton cache keys of our kernels don't depend on which kernel a process hashed first (`cache_keys`).

Triton 3.6 merged a called function's globals before hashing it, so `ag_gemm_kernel`'s key differed after
`allgather_push_kernel`'s: a compile worker and a rank that compiled in other orders missed each other's cache
entries. The check runs each order in a fresh process, compiled (not interpreted), with the installed Triton and
with the GPU image's Triton 3.6 (`make test` installs it; `sm90.gpu_image_triton`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sm90 import gpu_image_triton

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = """
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from jointtune.kernels.ag_gemm import kernel
from jointtune.kernels.runtime import signals
first = {"ag": kernel.ag_gemm_kernel, "push": signals.allgather_push_kernel}[sys.argv[1]]
first.cache_key  # as a process that compiles this kernel first
from jointtune.kernels import get_family
for name in ("ag_gemm", "gemm_rs", "flash_decode", "gemm_ar"):
    get_family(name)
print(triton.__version__, kernel.ag_gemm_kernel.cache_key, signals.allgather_push_kernel.cache_key)
"""


def _keys(order: str, triton_dir: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([p for p in (triton_dir, str(ROOT)) if p])
    out = subprocess.run([sys.executable, "-c", _SCRIPT, order], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_cache_keys_do_not_depend_on_what_was_hashed_first_with_this_triton() -> None:
    assert _keys("ag", None) == _keys("push", None)


def test_cache_keys_do_not_depend_on_what_was_hashed_first_with_the_gpu_images_triton() -> None:
    triton_dir = str(gpu_image_triton())
    keys = _keys("ag", triton_dir)
    assert keys.startswith("3.6") and keys == _keys("push", triton_dir)
