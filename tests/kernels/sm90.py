"""Run a script that lowers kernels for Hopper (sm_90) without a GPU, under this Triton or the GPU image's (3.6),
which `make test` installs beside the venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GPU_TRITON = Path(os.environ.get("JOINTTUNE_GPU_TRITON_DIR", ROOT / ".venv" / "gpu-triton"))


def run_sm90(script: str, configs: list[dict], triton_dir: Path | None = None) -> subprocess.CompletedProcess:
    """`script` (in tests/kernels) on `configs`, compiled rather than interpreted; `triton_dir` first on the path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (triton_dir, ROOT) if p)
    cmd = [sys.executable, str(HERE / script), json.dumps(configs)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def gpu_image_triton() -> Path:
    """The GPU image's Triton; skips the test where it is not installed (fails under JOINTTUNE_REQUIRE_GPU_TRITON)."""
    if not (GPU_TRITON / "triton").is_dir():
        if os.environ.get("JOINTTUNE_REQUIRE_GPU_TRITON"):
            pytest.fail(f"{GPU_TRITON} has no Triton; `make test` installs the GPU image's Triton there")
        pytest.skip(f"no GPU-image Triton at {GPU_TRITON} (`make test` installs it)")
    return GPU_TRITON
