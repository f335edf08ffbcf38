"""The single-rank torch reference of the decoder layer, from the same unsharded (HF-layout) weights.

It computes what `LlamaDecoderLayer` computes, on one device with no splitting: activations in float32 (weights
kept as given and widened per product, so a 70B layer's reference needs no float32 copy of its weights), the KV
cache in `cache_dtype`; `in_dtype(torch.bfloat16)` is the same layer in bfloat16, as one GPU runs the model. The
tensor-parallel layer is checked against it by the norm-wise relative error of the layer's output, and of its change
to the residual stream (`out - x`, which carries the layer's own work).

Example:
    >>> from jointtune.tp.model_config import model_config_from_dict
    >>> from jointtune.tp.shard import random_hf_layer
    >>> cfg = model_config_from_dict({"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2})
    >>> ref = ReferenceDecoderLayer(cfg, random_hf_layer(cfg, seed=0))
    >>> cache = ref.new_cache(batch=2, capacity=8)
    >>> ref(torch.randn(6, 128), cache, phase="prefill", batch=2).shape         # 2 sequences of 3 tokens
    torch.Size([6, 128])
    >>> ref(torch.randn(2, 128), cache, phase="decode", batch=2).shape          # one more token each
    torch.Size([2, 128])
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from jointtune.tp.attention import tokens_per_sequence
from jointtune.tp.functional import (
    apply_rope,
    causal_attention,
    decode_attention,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    swiglu,
)
from jointtune.tp.kv_cache import KVCache
from jointtune.tp.model_config import ModelConfig


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Norm-wise relative error ||got - want|| / ||want|| in float32 (inf where NaN shows up)."""
    err = (got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)
    return float(err.nan_to_num(float("inf")))


class ReferenceDecoderLayer:
    """One Llama decoder layer on one device: `layer(x [T, hidden], cache, phase=..., batch=...)` -> [T, hidden]."""

    def __init__(self, config: ModelConfig, weights: Mapping[str, torch.Tensor], *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        config.check_runnable()
        self.config = config
        self.w = {k: v.to(device) for k, v in weights.items()}
        self.device = torch.device(device)
        self.dtype = dtype
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, self.device)

    def in_dtype(self, dtype: torch.dtype) -> ReferenceDecoderLayer:
        """The same layer computing in `dtype` (weights shared, not copied): float32 is the exact reference, bfloat16
        the model as one GPU would run it unsharded, whose own distance from float32 is the precision floor."""
        other = copy.copy(self)
        other.dtype = dtype
        return other

    def new_cache(self, batch: int, capacity: int, cache_dtype: torch.dtype = torch.float32) -> KVCache:
        return KVCache([0], batch=batch, kv_heads=self.config.num_key_value_heads, capacity=capacity,
                       head_dim=self.config.head_dim, dtype=cache_dtype, device=self.device)  # fmt: skip

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        bias = self.w.get(name + ".bias")
        return F.linear(x, self.w[name + ".weight"].to(self.dtype), None if bias is None else bias.to(self.dtype))

    def __call__(self, x: torch.Tensor, cache: KVCache, *, phase: str, batch: int) -> torch.Tensor:
        c, w = self.config, self.w
        T = x.shape[0]
        L = tokens_per_sequence(T, batch, phase)
        H, H_KV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = x.to(self.dtype)
        n = rms_norm(h, w["input_layernorm.weight"].to(self.dtype), c.rms_norm_eps)
        q = self._linear(n, "self_attn.q_proj").view(T, H, D)
        k = self._linear(n, "self_attn.k_proj").view(T, H_KV, D)
        v = self._linear(n, "self_attn.v_proj").view(T, H_KV, D)
        positions = torch.arange(L, device=self.device).repeat(batch) if phase == "prefill" else cache.lens[0][:batch]
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if phase == "prefill":
            k4, v4 = k.view(batch, L, H_KV, D), v.view(batch, L, H_KV, D)
            cache.write_prefill(0, k4.to(cache.k[0].dtype), v4.to(cache.v[0].dtype))
            o = causal_attention(q.view(batch, L, H, D), k4, v4).reshape(T, H * D)
        else:
            cache.append(0, k.to(cache.k[0].dtype), v.to(cache.v[0].dtype))
            ks, vs, lens = cache.k[0][:batch], cache.v[0][:batch], cache.lens[0][:batch]
            o = torch.stack([decode_attention(q[b : b + 1], ks[b : b + 1].to(self.dtype), vs[b : b + 1].to(self.dtype),
                                              lens[b : b + 1]) for b in range(batch)]).reshape(T, H * D)  # fmt: skip
        h = h + self._linear(o, "self_attn.o_proj")
        n = rms_norm(h, w["post_attention_layernorm.weight"].to(self.dtype), c.rms_norm_eps)
        gate_up = torch.cat([self._linear(n, "mlp.gate_proj"), self._linear(n, "mlp.up_proj")], dim=-1)
        return h + self._linear(swiglu(gate_up), "mlp.down_proj")
