"""Every fused-op shape of a model at a TP degree, against shapes worked out by hand from the published configs."""

from __future__ import annotations

import pytest

from jointtune.autotune.tuner.settings import TuneSettings
from jointtune.autotune.workers.sweeps.models import model_plan
from jointtune.tp.model_config import ModelConfigError, load_model_config
from jointtune.tp.shapes import model_op_shapes

# (hidden, QKV columns over all ranks, attention width H*D, intermediate) worked out by hand:
# QKV = (H/TP + 2 * KV heads per rank) * D * TP; KV heads per rank = H_KV/TP, or 1 once TP > H_KV
HAND = {
    ("llama-3-8b", 2): (4096, (16 + 2 * 4) * 128 * 2, 32 * 128, 14336),  # 6144
    ("llama-3-8b", 4): (4096, (8 + 2 * 2) * 128 * 4, 4096, 14336),  # 6144
    ("llama-3-70b", 2): (8192, (32 + 2 * 4) * 128 * 2, 64 * 128, 28672),  # 10240
    ("llama-3-70b", 4): (8192, (16 + 2 * 2) * 128 * 4, 8192, 28672),  # 10240
    ("llama-3-70b", 16): (8192, (4 + 2 * 1) * 128 * 16, 8192, 28672),  # 12288: KV heads held twice
    ("qwen2.5-32b", 2): (5120, (20 + 2 * 4) * 128 * 2, 40 * 128, 27648),  # 7168
    ("qwen2.5-32b", 4): (5120, (10 + 2 * 2) * 128 * 4, 5120, 27648),  # 7168
    ("mixtral-8x7b", 2): (4096, (16 + 2 * 4) * 128 * 2, 4096, None),  # attention only
}


@pytest.mark.parametrize(("model", "tp"), sorted(HAND))
def test_gemm_shapes_of_both_layouts_match_the_hand_computed_ones(model, tp):
    hidden, qkv, attn, inter = HAND[(model, tp)]
    ops = model_op_shapes(load_model_config(model), tp=tp, tokens=[64, 4096], kv_lens=[])
    got = {(o.tokens, o.op, o.layout): (o.kernel, o.shape, o.world_size) for o in ops}
    for T in (64, 4096):
        want_sp = {
            "qkv": ("ag_gemm", {"M": T, "N": qkv, "K": hidden}),
            "o_proj": ("gemm_rs", {"M": T, "N": hidden, "K": attn}),
            "gate_up": ("ag_gemm", {"M": T, "N": 2 * inter if inter else 0, "K": hidden}),
            "down": ("gemm_rs", {"M": T, "N": hidden, "K": inter}),
        }
        want_standard = {  # the column-parallel GEMMs per rank; the row-parallel ones as GEMM + all-reduce sees them
            "qkv": (None, {"M": T, "N": qkv // tp, "K": hidden}),
            "o_proj": ("gemm_ar_rmsnorm", {"M": T, "N": hidden, "K": attn}),  # + residual, post-attention norm
            "gate_up": (None, {"M": T, "N": 2 * inter // tp if inter else 0, "K": hidden}),
            "down": ("gemm_ar_rmsnorm", {"M": T, "N": hidden, "K": inter}),  # + residual, the next layer's norm
            "down_last": ("gemm_ar", {"M": T, "N": hidden, "K": inter}),  # + residual: a stack's last layer
        }
        ops_here = ("qkv", "o_proj", "gate_up", "down") if inter else ("qkv", "o_proj")
        for op in ops_here:
            assert got[(T, op, "sp")] == (*want_sp[op], tp)
        for op in (*ops_here, "down_last") if inter else ops_here:
            assert got[(T, op, "standard")] == (*want_standard[op], tp)
        assert len([o for o in ops if o.tokens == T]) == (9 if inter else 4)
        if not inter:
            assert (T, "gate_up", "sp") not in got and (T, "down_last", "standard") not in got  # MoE: not a dense MLP


def test_decode_attention_head_and_context_parallel():
    cfg = load_model_config("qwen2.5-32b")
    ops = model_op_shapes(cfg, tp=4, tokens=[1, 8, 4096], kv_lens=[4096, 32768], attention="both")
    attn = [(o.tokens, o.layout, o.world_size, o.shape) for o in ops if o.op == "attn"]
    assert attn == [
        (T, kind, w, {"B": T, "H": h, "H_KV": kv, "S": S, "D": 128})
        for T in (1, 8)  # 4096 tokens are a prefill, not a decode batch
        for S in (4096, 32768)
        for kind, w, h, kv in (("head", 1, 10, 2), ("context", 4, 40, 8))
    ]


def test_token_counts_that_dont_divide_run_standard_and_tune_nothing_for_sp():
    ops = model_op_shapes(load_model_config("llama-3-8b"), tp=4, tokens=[6], kv_lens=[])
    sp = [o for o in ops if o.layout == "sp"]
    assert sp and all(o.kernel is None and "do not divide by TP=4: standard" in o.note for o in sp)


def test_plan_dedupes_jobs_and_buckets_kv_lengths():
    plan = model_plan("llama-3-70b", tp=2, tokens=[8, 8, 32], kv_lens=[3000], settings=TuneSettings(trials=4))
    assert len([o for o in plan.ops if o.op == "qkv" and o.layout == "sp"]) == 2
    (fd,) = [j for j in plan.jobs if j.kernel == "flash_decode" and dict(j.shape)["B"] == 8]
    assert dict(fd.shape)["S"] == 4096 and fd.world_size == 1  # the bucket a call at 3000 keys looks up
    assert all(j.settings.trials == 4 for j in plan.jobs)
    both = model_plan("llama-3-70b", tp=2, tokens=[8], kv_lens=[], timings=["eager", "graph"])
    # per timing: the sequence-parallel layout's four GEMMs; the standard layout's row-parallel GEMM + all-reduces:
    # o_proj and down with the RMSNorm epilogue, down without it (a stack's last layer)
    assert sorted({j.settings.timing for j in both.jobs}) == ["eager", "graph"] and len(both.jobs) == 14
    graph = sorted(j.kernel for j in both.jobs if j.settings.timing == "graph")
    assert graph == ["ag_gemm", "ag_gemm", "gemm_ar", "gemm_ar_rmsnorm", "gemm_ar_rmsnorm", "gemm_rs", "gemm_rs"]


def test_a_shape_a_family_cant_run_is_listed_with_the_reason_not_tuned(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 1536, "intermediate_size": 4096, "num_attention_heads": 16, "num_key_value_heads": 4}'
    )  # head_dim 96: the decode kernel has variants for 64, 128 and 256
    plan = model_plan(str(tmp_path), tp=2, tokens=[8], kv_lens=[4096])
    (attn,) = [(op, job) for op, job in zip(plan.ops, plan.job_of) if op.op == "attn"]
    assert attn[1] is None and attn[0].note.startswith("flash_decode can't run it: shape.D: 96 is not allowed")
    assert sorted({j.kernel for j in plan.jobs}) == ["ag_gemm", "gemm_ar", "gemm_ar_rmsnorm", "gemm_rs"]


def test_bad_requests_name_the_field():
    cfg = load_model_config("llama-3-8b")
    with pytest.raises(ModelConfigError, match="tokens: 0 is not allowed"):
        model_op_shapes(cfg, tp=2, tokens=[0], kv_lens=[])
    with pytest.raises(ModelConfigError, match="attention: 'ring' is not allowed; allowed: head, context, both"):
        model_op_shapes(cfg, tp=2, tokens=[8], kv_lens=[], attention="ring")
    with pytest.raises(ModelConfigError, match="tp=5 is not allowed"):
        model_op_shapes(cfg, tp=5, tokens=[8], kv_lens=[])
