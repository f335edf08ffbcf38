"""The Llama decoder layer on simulated ranks (W = 2 and 4), both layouts, prefill then decode, against the
single-rank reference built from the same unsharded weights; the layout rule, refusals, torch.compile."""

from __future__ import annotations

import pytest
import torch
from jt_tp import fast_store, hf_checkpoint, layer_of, small_config

from jointtune import create_world
from jointtune.errors import ShapeError
from jointtune.tp import LayoutRule, LlamaDecoderLayer, ModelConfigError, ReferenceDecoderLayer, TPDecoder, Tuning
from jointtune.tp import rel_error as _rel

HIDDEN = 256


def _stack(world, cfg, state, tuning, attn_kernel, layers=2):
    built = [LlamaDecoderLayer.from_hf(world, cfg, state, layer=i, tuning=tuning, attn_kernel=attn_kernel)
             for i in range(layers)]  # fmt: skip
    return TPDecoder(built), [ReferenceDecoderLayer(cfg, layer_of(state, i)) for i in range(layers)]


def _reference(refs, caches, x, **step):
    for ref, cache in zip(refs, caches):
        x = ref(x, cache, **step)
    return x


def _check(outs, x, want, tol=2e-2):
    """Every rank holds the same rows; the layers' change to the residual stream matches the reference's."""
    for out in outs:
        assert out.shape == want.shape and torch.equal(out, outs[0])
        assert _rel(out.float() - x.float(), want - x.float()) < tol


@pytest.mark.parametrize(("W", "attn_kernel", "layers", "steps"), [(2, "flash_decode", 2, 2), (4, "sdpa", 1, 1)])
def test_layers_prefill_and_decode_match_the_single_rank_reference(tmp_path, W, attn_kernel, layers, steps):
    cfg = small_config()  # GQA 4/2 heads, q/k/v bias; at W=4 each KV head is held by the two ranks that read it
    state = hf_checkpoint(cfg, layers=layers, seed=W)
    tuning = Tuning(db_url=fast_store(tmp_path / "jt.db"))
    stack, refs = _stack(create_world("local", world_size=W), cfg, state, tuning, attn_kernel, layers)
    gen = torch.Generator().manual_seed(0)
    B, L = 4, 2
    with torch.no_grad():
        for layout in ("sp", "standard"):
            caches, ref_caches = stack.new_caches(B, 8), [ref.new_cache(B, 8, torch.bfloat16) for ref in refs]
            x = torch.randn(B * L, HIDDEN, generator=gen).bfloat16()
            _check(stack([x] * W, caches, phase="prefill", batch=B, layout=layout), x,
                   _reference(refs, ref_caches, x, phase="prefill", batch=B))  # fmt: skip
            for _ in range(steps):  # decode steps: each sequence's next token at its own position
                x = torch.randn(B, HIDDEN, generator=gen).bfloat16()
                _check(stack([x] * W, caches, phase="decode", batch=B, layout=layout), x,
                       _reference(refs, ref_caches, x, phase="decode", batch=B))  # fmt: skip
            assert [int(n) for n in caches[0].lens[0]] == [L + steps] * B
    first = stack.layers[0]
    ops = [first.attn.qkv.op, first.attn.o_proj.op, first.attn.o_proj.ar_norm_op, first.down.ar_op]
    assert {s for op in ops for s in op.launcher.sources.values()} == {"nearest-store"}  # found through the decorator
    # the standard layout's row-parallel GEMMs ran fused: o_proj (and down but the last layer's) with the residual +
    # RMSNorm epilogue, the last down with the residual; keys are the calls' global dims (K = W x K per rank)
    norm_keys = {dict(k[0])["K"] for k in first.attn.o_proj.ar_norm_op.launcher.cache}
    assert norm_keys == ({256, 512} if layers > 1 else {256})  # o_proj's K = heads x head_dim; down's = intermediate
    assert {dict(k[0])["K"] for k in first.down.ar_op.launcher.cache} == {512}
    assert {c["mode"] for op in ops[2:] for c in op.launcher.cache.values()} == {"one_shot", "two_shot"}


def test_the_reference_in_bf16_shares_its_weights_and_lands_near_float32():
    """`in_dtype(torch.bfloat16)`: the unsharded model as one GPU runs it, the e2e benchmark's precision floor."""
    cfg = small_config()
    ref = ReferenceDecoderLayer(cfg, layer_of(hf_checkpoint(cfg, layers=1, seed=3), 0))
    single = ref.in_dtype(torch.bfloat16)
    assert single.w is ref.w and ref.dtype == torch.float32 and single.dtype == torch.bfloat16
    x = torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(1)).bfloat16()
    step = {"phase": "prefill", "batch": 2}
    want = ref(x.float(), ref.new_cache(2, 8, torch.bfloat16), **step)
    got = single(x, single.new_cache(2, 8, torch.bfloat16), **step)
    assert got.dtype == torch.bfloat16 and want.dtype == torch.float32
    assert 0 < _rel(got.float() - x.float(), want - x.float()) < 2e-2


def test_uneven_token_counts_run_the_standard_layout(tmp_path):
    W = 4
    cfg = small_config()
    state = hf_checkpoint(cfg, layers=1, seed=1)
    stack, refs = _stack(create_world("local", world_size=W), cfg, state, Tuning(db_url=fast_store(tmp_path / "a.db")),
                         "sdpa", layers=1)  # fmt: skip
    stack.rule = LayoutRule(sp_from=1)  # sp wherever it can run
    x = torch.randn(6, HIDDEN).bfloat16()  # 2 sequences of 3 tokens: 6 rows do not split over 4 ranks
    assert stack.rule.explain(6, W) == ("standard", "6 tokens do not divide by 4 ranks")
    with torch.no_grad():
        _check(stack([x] * W, stack.new_caches(2, 4), phase="prefill", batch=2), x,
               _reference(refs, [refs[0].new_cache(2, 4, torch.bfloat16)], x, phase="prefill", batch=2))  # fmt: skip
        with pytest.raises(ShapeError, match="rows: 6 tokens are not allowed in the sequence-parallel layout with 4"):
            stack([x] * W, stack.new_caches(2, 4), phase="prefill", batch=2, layout="sp")
        with pytest.raises(ShapeError, match="batch: a decode step has one token per sequence; got 6 tokens"):
            stack([x] * W, stack.new_caches(2, 4), phase="decode", batch=2, layout="standard")


def test_configs_it_cant_run_and_grad_are_refused_by_name():
    world = create_world("local", world_size=2)
    for changes, message in (({"num_local_experts": 8}, "num_local_experts: 8 is a mixture-of-experts MLP"),
                             ({"rope_scaling": {"factor": 8.0}}, "rope_scaling: .* is not supported")):  # fmt: skip
        with pytest.raises(ModelConfigError, match=message):
            LlamaDecoderLayer.random(world, small_config(**changes), seed=0)
    with pytest.raises(ModelConfigError, match="tp=2 is not allowed; num_attention_heads=3"):
        LlamaDecoderLayer.random(world, small_config(num_attention_heads=3, num_key_value_heads=1, head_dim=64), seed=0)
    layer = LlamaDecoderLayer.random(world, small_config(), seed=0)
    x = torch.randn(4, HIDDEN).bfloat16().requires_grad_()
    with pytest.raises(ShapeError, match="LlamaDecoderLayer: an input or weight requires grad"):
        layer([x, x], layer.new_cache(1, 4), layout="standard", phase="prefill", batch=1)


def test_decode_steps_compile_with_fullgraph_in_both_layouts_and_match_eager(tmp_path):
    """Two layers, so the standard layout's compiled step has every row-parallel form: o_proj and the first down with
    the residual + RMSNorm epilogue (`gemm_ar_rmsnorm`), the last down with the residual (`gemm_ar`)."""
    torch._dynamo.reset()
    W, B = 2, 2
    cfg = small_config()
    state = hf_checkpoint(cfg, layers=2, seed=5)
    tuning = Tuning(db_url=fast_store(tmp_path / "c.db", (2,)))
    stack, _ = _stack(create_world("local", world_size=W), cfg, state, tuning, "flash_decode", layers=2)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randn(B * 2, HIDDEN, generator=gen).bfloat16()
    eager_caches, compiled_caches = stack.new_caches(B, 8), stack.new_caches(B, 8)
    compiled = torch.compile(stack, fullgraph=True, backend="aot_eager")  # a graph break raises
    with torch.no_grad():
        stack([prompt] * W, eager_caches, phase="prefill", batch=B, layout="sp")
        for mine, theirs in zip(compiled_caches, eager_caches):  # the same prompt in the compiled steps' cache
            for name in ("k", "v", "lens"):
                for dst, src in zip(getattr(mine, name), getattr(theirs, name)):
                    dst.copy_(src)
        # sp: ag_gemm, gemm_rs, decode; standard: gemm_ar_rmsnorm, gemm_ar, decode. The eager step of each resolves
        # the decode shapes' configs; the compiled graph bakes them in
        for layout in ("sp", "standard"):
            x = torch.randn(B, HIDDEN, generator=gen).bfloat16()
            want = stack([x] * W, eager_caches, phase="decode", batch=B, layout=layout)
            got = compiled([x] * W, compiled_caches, phase="decode", batch=B, layout=layout)
            for g, w in zip(got, want):
                assert _rel(g, w) < 1e-2
            assert torch.equal(got[0], got[1])  # replicated rows stay the same bits on every rank
        assert torch.equal(compiled_caches[1].lens[1], eager_caches[1].lens[1])  # the cache advanced inside the graph
