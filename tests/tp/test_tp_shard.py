"""Sharding an unsharded HF state dict onto ranks: random weights saved in HF's layout, loaded and split."""

from __future__ import annotations

import pytest
import torch
from jt_tp import hf_checkpoint, layer_of, small_config

from jointtune.tp.model_config import ModelConfigError
from jointtune.tp.shard import load_hf_state_dict, shard_state_dict


def _gathered(shards, cfg, tp):
    """The unsharded weights put back together from every rank's shard (what a rank must have held)."""
    D, H_r, KV_r = cfg.head_dim, cfg.heads_per_rank(tp), cfg.kv_heads_per_rank(tp)
    q = torch.cat([s["qkv"][:, : H_r * D] for s in shards], dim=1).t()
    k = torch.cat([s["qkv"][:, H_r * D : (H_r + KV_r) * D] for s in shards], dim=1).t()
    v = torch.cat([s["qkv"][:, (H_r + KV_r) * D :] for s in shards], dim=1).t()
    inter = cfg.intermediate_per_rank(tp)
    return {
        "q": q, "k": k, "v": v,
        "o": torch.cat([s["o_proj"] for s in shards]).t(),
        "gate": torch.cat([s["gate_up"][:, :inter] for s in shards], dim=1).t(),
        "up": torch.cat([s["gate_up"][:, inter:] for s in shards], dim=1).t(),
        "down": torch.cat([s["down"] for s in shards]).t(),
        "q_bias": torch.cat([s["qkv_bias"][: H_r * D] for s in shards]),
    }  # fmt: skip


@pytest.mark.parametrize("tp", [2, 4])
def test_checkpoint_saved_in_hf_layout_shards_and_gathers_back(tmp_path, tp):
    cfg = small_config()  # 4 query heads, 2 KV heads: at tp=4 each KV head is held by the 2 ranks that read it
    state = hf_checkpoint(cfg, layers=2, seed=3)
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_hf_state_dict(tmp_path)  # a directory of checkpoint files, as HF saves them
    shards = shard_state_dict(loaded, cfg, tp, layer=1)
    hf = layer_of(state, 1)
    back = _gathered(shards, cfg, tp)
    assert torch.equal(back["q"], hf["self_attn.q_proj.weight"])
    assert torch.equal(back["o"], hf["self_attn.o_proj.weight"])
    assert torch.equal(back["gate"], hf["mlp.gate_proj.weight"]) and torch.equal(back["up"], hf["mlp.up_proj.weight"])
    assert torch.equal(back["down"], hf["mlp.down_proj.weight"])
    assert torch.equal(back["q_bias"], hf["self_attn.q_proj.bias"])
    kv_rows = cfg.head_dim * cfg.kv_heads_per_rank(tp)
    for r, shard in enumerate(shards):  # each rank's K rows are those of the KV head its query heads read
        kv0 = (r * cfg.heads_per_rank(tp)) // (cfg.num_attention_heads // cfg.num_key_value_heads)
        want = hf["self_attn.k_proj.weight"][kv0 * cfg.head_dim : kv0 * cfg.head_dim + kv_rows]
        assert torch.equal(back["k"][r * kv_rows : (r + 1) * kv_rows], want)
        assert torch.equal(shard["input_norm"], hf["input_layernorm.weight"])
    assert all(s["qkv"].is_contiguous() and s["down"].is_contiguous() for s in shards)


def test_missing_or_misshapen_weights_are_named(tmp_path):
    cfg = small_config()
    state = hf_checkpoint(cfg, layers=1, seed=0)
    del state["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(ModelConfigError, match=r"model.layers.0.mlp.up_proj.weight: missing from the state dict"):
        shard_state_dict(state, cfg, 2)
    state = hf_checkpoint(cfg, layers=1, seed=0)
    state["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(256, 128)
    with pytest.raises(ModelConfigError, match=r"o_proj.weight: shape \[256, 128\] is not allowed; small needs"):
        shard_state_dict(state, cfg, 2)
    with pytest.raises(ModelConfigError, match="tp=3 is not allowed"):
        shard_state_dict(hf_checkpoint(cfg, layers=1, seed=0), cfg, 3)
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelConfigError, match=r"junk.bin' can't be loaded"):
        load_hf_state_dict(tmp_path / "junk.bin")
    with pytest.raises(ModelConfigError, match="rope_scaling"):
        shard_state_dict({}, small_config(rope_scaling={"factor": 2.0}), 2)
