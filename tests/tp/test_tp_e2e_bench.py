"""bench/e2e/decoder_layers.py's CPU-checkable parts: every path, the reference check, the per-op breakdown, the
anchors and the result file, on simulated ranks (`--cpu`; the CUDA graphs and async-TP need GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jt_tp import fast_store

from jointtune.autotune.workers.sweeps.sweepfile import load_sweep_file
from jointtune.tp.model_config import load_model_config
from jointtune.tp.shapes import model_op_shapes

BENCH = Path(__file__).resolve().parents[2] / "bench" / "e2e" / "decoder_layers.py"
#: GEMM + all-reduce records of the unfused mode: the script is checked here, the fused kernels in the layers' tests
#: (each fused call costs a tenth of a second or more in the interpreter, and the benchmark makes dozens)
BASELINE_AR = {"gemm_ar": {"mode": "baseline"}, "gemm_ar_rmsnorm": {"mode": "baseline"}}


def test_the_benchmark_runs_every_path_on_simulated_ranks_and_writes_its_result(tmp_path):
    out = tmp_path / "e2e.json"
    args = ["--cpu", "--world-size", "2", "--model", "tiny", "--layers", "1", "--prefill", "8", "--batches", "2",
            "--kv-lens", "16", "--iters", "1", "--warmup", "0", "--no-compile-check", "--out", str(out),
            "--db", fast_store(tmp_path / "jt.db", (2,), BASELINE_AR),
            "--paths", "jointtune,jointtune_compiled,torch", "--compile-backend", "aot_eager"]  # fmt: skip
    done = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["device"].startswith("cpu (2 simulated ranks") and result["world_size"] == 2
    assert {"torch", "triton", "jointtune", "python"} <= set(result["versions"]) and result["date"]
    assert "decoder_layers.py --cpu" in result["command"]
    prefill, decode = result["cells"]
    assert (prefill["cell"], decode["cell"]) == ("prefill 8", "decode b2 kv16")
    for cell in (prefill, decode):
        # the compiled stack too (aot_eager here: the CPU has no inductor toolchain to spare), in both layouts
        assert set(cell["paths"]) == {"jointtune/sp", "jointtune/standard", "jointtune_compiled/sp",
                                      "jointtune_compiled/standard", "torch/nccl"}  # fmt: skip
        compiled = [cell["paths"][f"jointtune_compiled/{layout}"] for layout in ("sp", "standard")]
        assert cell["jointtune_compiled_us"] == min(compiled)
        assert all(err < 2e-2 for err in cell["errors"].values()), cell["errors"]  # every path against the reference
        assert 0 < cell["single_gpu_bf16_error"] < 2e-2  # the unsharded bf16 model's own distance from float32
        breakdown = cell["breakdown"]
        assert set(breakdown["jointtune"]) == {"qkv", "o_proj", "gate_up", "down", "attention"}
        assert all(isinstance(us, float) for us in breakdown["jointtune"].values()), breakdown["jointtune"]
        assert all(isinstance(breakdown["torch_standard"][op], float) for op in ("all_reduce", "add_rms_norm"))
        # what each path's step spends outside its timed ops, per layer (a number: every op and step was timed)
        assert all(isinstance(us, float) for us in breakdown["outside_ops_per_layer"].values())
        assert set(breakdown["outside_ops_per_layer"]) == {"jointtune", "torch_standard"}
        # the op each timed entry ran, in the layout the cell chose (the faster one: either may win here)
        fused = breakdown["layout"] == "standard"
        assert breakdown["jointtune_kernels"]["o_proj"].startswith("gemm_ar_rmsnorm" if fused else "gemm_rs")
        assert breakdown["jointtune_kernels"]["down"].startswith("gemm_ar (" if fused else "gemm_rs")
        assert cell["jointtune_tokens_per_s"] > 0 and cell["torch_standard_tokens_per_s"] > 0
    assert set(decode["attention"]["us_per_layer"]) == {"flash_decode", "sdpa"}  # both kernels timed, one chosen
    assert sorted(result["layout_rule"]["measured"]) == ["2", "8"]
    assert result["config_sources"]["ag_gemm"] == {"nearest-store": 4}  # the layers' configs came from the store
    # jointtune/standard's row-parallel ops: o_proj with the RMSNorm epilogue, down (one layer: the stack's last) with
    # the residual, at 8 and 2 tokens, each with the store's record
    for kernel, K in (("gemm_ar_rmsnorm", 256), ("gemm_ar", 512)):
        assert result["config_sources"][kernel] == {"nearest-store": 2}
        modes = sorted(result["config_modes"][kernel].items())
        assert modes == [(f"M={m},N=256,K={K} eager", "baseline") for m in (2, 8)]
    kinds = {a["anchor"] for a in result["anchors"]}
    assert {"prefill >= 1.15x the standard torch TP layer", "decode >= 1.10x the standard torch TP layer"} <= kinds
    assert all(a["passed"] for a in result["anchors"] if a["anchor"].startswith("correct"))


def test_the_decode_mini_sweeps_tune_exactly_the_standard_layouts_row_parallel_shapes():
    """Each bench/e2e/decode_mini file holds the GEMM + all-reduce shapes `tune --model` derives for its model and TP
    degree at decode batches 1, 8 and 32: what the benchmark's standard layout looks up, nothing else."""
    files = sorted((Path(__file__).resolve().parents[2] / "bench" / "e2e" / "decode_mini").glob("*_tp*.yaml"))
    assert len(files) == 3
    for path in files:
        model, tp = path.stem.rsplit("_tp", 1)
        derived = {
            (s.kernel, s.world_size, (s.shape["M"], s.shape["N"], s.shape["K"]))
            for s in model_op_shapes(load_model_config(model), tp=int(tp), tokens=[1, 8, 32], kv_lens=[4096])
            if s.kernel in ("gemm_ar", "gemm_ar_rmsnorm")
        }
        swept = {
            (j.kernel, j.world_size, (j.problem.dims["M"], j.problem.dims["N"], j.problem.dims["K"]))
            for j in load_sweep_file(path).jobs("gpu")
        }
        assert swept == derived, path.name


def test_the_correctness_anchor_allows_one_gpus_bf16_error_and_no_more():
    """A path passes below 2e-2, or within 0.005 of the unsharded bf16 model's own error (the cell's
    `single_gpu_bf16_error`); a cell without that floor is held to 2e-2."""
    sys.path.insert(0, str(BENCH.parent))
    import decoder_layers

    times = {"jointtune_us": None, "torch_standard_us": None, "async_tp_us": None}
    cell = {"cell": "prefill 4096", "phase": "prefill", "paths": {}, **times,
            "errors": {"a": 0.019, "b": 0.026, "c": 0.0275}, "single_gpu_bf16_error": 0.022}  # fmt: skip
    passed = {a["anchor"].split()[1]: a["passed"] for a in decoder_layers.anchors([cell], None, 1)}
    assert passed == {"a": True, "b": True, "c": False}
    passed = {
        a["anchor"].split()[1]: a["passed"]
        for a in decoder_layers.anchors([{**cell, "single_gpu_bf16_error": None}], None, 1)
    }
    assert passed == {"a": True, "b": False, "c": False}
