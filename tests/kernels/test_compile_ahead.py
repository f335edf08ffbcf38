"""A tuning rank's compile worker (`jointtune.autotune.workers.compiler`) builds, for sm_90 and without a GPU, the cache
entries the rank's own launch of the config then reads: with this Triton and with the GPU image's (3.6), which also
builds each kernel's C launcher at its first launch (the worker builds it too)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from sm90 import gpu_image_triton, run_sm90

#: the smallest kernel a tuned config compiles (AG+GEMM's push by SMs), to keep the test short
CONFIGS = [{"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered", "comm_sms": 32}]


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    """An empty Triton cache, and a stand-in libcuda to link launchers against where a C compiler is at hand."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        (tmp_path / "stub.c").write_text("")
        for name in ("libcuda.so", "libcuda.so.1"):
            subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / name), str(tmp_path / "stub.c")], check=True)
        monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(tmp_path))
    return cc is not None


def _reads_what_the_worker_built(done: subprocess.CompletedProcess, can_link: bool) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [json.loads(text) for text in done.stdout.splitlines() if text.startswith("{")]
    assert line["failure"] is None and line["launches"] == 1
    assert line["added"] == []  # the rank's compile found the worker's cache entry: nothing compiled twice
    if line["builds_launchers"] and can_link:
        assert line["launcher"]  # and the C launcher Triton 3.6 builds at a first launch is there too


def test_a_compile_worker_leaves_what_the_rank_reads_with_this_triton(cold_cache):
    _reads_what_the_worker_built(run_sm90("compile_ahead.py", CONFIGS), cold_cache)


def test_a_compile_worker_leaves_what_the_rank_reads_with_the_gpu_images_triton(cold_cache):
    _reads_what_the_worker_built(run_sm90("compile_ahead.py", CONFIGS, gpu_image_triton()), cold_cache)
