"""`jointtune tune --model`: a tiny model's every fused-op shape tuned on the CPU (eight shapes, a trial each), the
records stored and exported as a bundle, and a stack of the layers then finding exactly those records in both layouts;
a sweep file's `model:` job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from jointtune import create_world
from jointtune.autotune.workers.sweeps.models import model_plan
from jointtune.autotune.workers.sweeps.sweepfile import parse_sweep
from jointtune.cli import main
from jointtune.db import open_store
from jointtune.server.bundle import import_bundle
from jointtune.tp import LlamaDecoderLayer, TPDecoder, Tuning, load_model_config

TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}  # fmt: skip


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY))
    return path.parent


def test_tune_model_stores_exports_and_the_layer_finds_the_records(tmp_path, tiny):
    url, bundle = f"sqlite:///{tmp_path / 'jt.db'}", tmp_path / "tiny-tp2.json"
    env = {**os.environ, "COLUMNS": "200", "JOINTTUNE_HEARTBEAT_S": "1", "JOINTTUNE_GRACE_S": "3"}
    env.pop("JOINTTUNE_DB_URL", None)
    args = ["tune", "--model", str(tiny), "--tp", "2", "--tokens", "4", "--kv-lens", "64", "--trials", "1",
            "--warmup", "0", "--iters", "1", "--timing", "eager", "--db", url, "--export", str(bundle)]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "from jointtune.cli import main; main()", *args], env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "tiny at TP=2: each op of a decoder layer" in out and "layer (sp)" in out
    # QKV and gate_up (ag_gemm), o_proj and down (gemm_rs) at 4 tokens; in the standard layout o_proj and down with the
    # residual + RMSNorm epilogue (gemm_ar_rmsnorm) and down with the residual only (gemm_ar, a stack's last layer);
    # decode attention at batch 4 x 64 keys
    records = open_store(url).list_records()
    assert sorted((r.kernel, r.world_size, tuple(sorted(r.shape.items()))) for r in records) == [
        ("ag_gemm", 2, (("K", 128), ("M", 4), ("N", 384))),
        ("ag_gemm", 2, (("K", 128), ("M", 4), ("N", 512))),
        ("flash_decode", 1, (("B", 4), ("D", 64), ("H", 1), ("H_KV", 1), ("S", 64))),
        ("gemm_ar", 2, (("K", 256), ("M", 4), ("N", 128))),
        ("gemm_ar_rmsnorm", 2, (("K", 128), ("M", 4), ("N", 128))),
        ("gemm_ar_rmsnorm", 2, (("K", 256), ("M", 4), ("N", 128))),
        ("gemm_rs", 2, (("K", 128), ("M", 4), ("N", 128))),
        ("gemm_rs", 2, (("K", 256), ("M", 4), ("N", 128))),
    ]
    assert "exported: 8 of 8 tuned records" in out and "layer (standard)" in out
    elsewhere = f"sqlite:///{tmp_path / 'serving.db'}"  # a serving machine imports the bundle
    assert import_bundle(open_store(elsewhere), bundle.read_text())["records"] == 8

    # a stack of two layers, built from the same config, finds exactly these records through @joint_autotune
    world = create_world("local", world_size=2)
    tuning = Tuning(db_url=elsewhere, on_miss="error")  # a miss would raise: every key must be found
    config = load_model_config(tiny)
    layers = [LlamaDecoderLayer.random(world, config, seed=i, tuning=tuning, attn_kernel="flash_decode")
              for i in (0, 1)]  # fmt: skip
    stack = TPDecoder(layers)
    with torch.no_grad():
        for layout in ("sp", "standard"):
            caches = stack.new_caches(batch=4, capacity=64)
            for phase in ("prefill", "decode"):  # 4 sequences of 1 token, then one decode step: 4 rows each time
                x = torch.randn(4, 128).bfloat16()
                stack([x, x], caches, layout=layout, phase=phase, batch=4)
    first = layers[0]  # the layers share one op per family (and Tuning): these are every key either layer resolved
    ops = [first.attn.qkv.op, first.attn.o_proj.op, first.attn.decode_op, first.down.ar_norm_op, first.down.ar_op]
    # every key from the store (tuned in the CPU interpreter here: interp records, named so), one per record
    sources = [s.removesuffix(" [interp record]") for op in ops for s in op.launcher.sources.values()]
    assert sources == ["store"] * 8


def test_sweep_file_model_jobs_are_the_jobs_tune_model_runs(tiny):
    sweep = parse_sweep({"profiles": {"cpu": {"tuning": {"trials": 3}, "jobs": [
        {"kernel": "ag_gemm", "shapes": ["64x64x64"]},
        {"model": str(tiny), "tp": [2], "tokens": [4, 8], "kv_lens": [64], "attention": "both"},
    ]}}})  # fmt: skip
    plan = model_plan(str(tiny), tp=2, tokens=[4, 8], kv_lens=[64], attention="both",
                      settings=sweep.jobs("cpu")[0].settings)  # fmt: skip
    assert sweep.jobs("cpu")[1:] == plan.jobs  # the same studies: one resumes what the other started
    assert [p.name for p in sweep.models["cpu"]] == ["tiny"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kernel", "ag_gemm"], "--kernel: not allowed with --model"),
        (["--tokens", "4"], "--tp: required with --model"),
        (["--tp", "2"], "--tokens: required with --model"),
        (["--tp", "2", "--tokens", "4,0"], "--tokens: '4,0' is not allowed; give comma-separated integers >= 1"),
        (["--tp", "3", "--tokens", "4"], "tiny: tp=3 is not allowed; num_attention_heads=2 must be divisible"),
        (["--tp", "2", "--tokens", "4", "--restrict", "mode=baseline"], "--restrict: not allowed with --model"),
    ],
)
def test_bad_model_options_name_the_option(capsys, tmp_path, tiny, extra, message):
    with pytest.raises(SystemExit) as exc:
        main(["tune", "--model", str(tiny), "--db", f"sqlite:///{tmp_path / 'jt.db'}", *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_export_path_and_model_only_options_are_checked_first(capsys, tmp_path, tiny):
    with pytest.raises(SystemExit):
        main(["tune", "--model", str(tiny), "--tp", "2", "--tokens", "4", "--export", str(tmp_path)])
    assert "--export: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--kernel", "ag_gemm", "--shape", "64x64x64", "--tp", "2"])
    assert "--tp only with --model" in capsys.readouterr().err
