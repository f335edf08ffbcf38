"""A Llama-architecture decoder layer over a world, in either tensor-parallel layout, and a stack of them.

`LlamaDecoderLayer`: RMSNorm -> head-parallel attention (QKV column-parallel, RoPE, attention, o_proj
row-parallel) -> residual -> RMSNorm -> SwiGLU MLP (gate_up column-parallel, down row-parallel) -> residual.
Its input and output are in the layout the caller names: `sp`, each rank's T/W rows (the norms and residuals run
on those rows; QKV and gate_up are AG+GEMM, o_proj and down GEMM+RS), or `standard`, all T rows on every rank
(local GEMMs; o_proj and down GEMM + all-reduce). Prefill of B sequences of L tokens, or a decode step of one token
per sequence, with the layer's `KVCache`.

In the standard layout the residual adds and RMSNorms sit in the row-parallel ops' epilogues (`gemm_ar_rmsnorm`):
- o_proj's all-reduce, + the residual, + the post-attention RMSNorm -> (the MLP's input, the new residual);
- down's all-reduce, + the residual, + the NEXT layer's input RMSNorm -> (the next layer's input, its residual),
  where there is a next layer: `TPDecoder` hands each layer the next one's norm weight (`forward_chained`). The
  stack's last layer, and a layer called on its own, add the residual only (`gemm_ar` with a residual): what follows
  them (a final norm, an LM head, another module) is not theirs to fuse. So every layer of a stack but the first
  reads its input norm from the layer before, and the first computes it in torch.
The sequence-parallel layout runs the same steps after `gemm_rs`, the residual add and the norm in one pass
(`fused_norm.add_rms_norm`; moving a norm from the start of one layer to the end of the previous one changes nothing
there).

`TPDecoder`: layers that all run the layout `LayoutRule` picks for the step's token count. It takes and returns
the hidden state replicated on every rank (an embedding's output is; so is what the LM head reads): in `sp` each
rank keeps its rows on the way in (no communication) and the rows are all-gathered on the way out. A token count
that does not divide by the world size runs the standard layout (`layout.py` says why: no padding).

Under torch.compile (fullgraph) every op is traced through its registered torch op, with the config an eager
call at that token count resolved (`tuned.py`): run a step eagerly at each token count, then compile.

Example:
    >>> from jointtune import create_world
    >>> from jointtune.tp.model_config import model_config_from_dict
    >>> cfg = model_config_from_dict({"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2})
    >>> world = create_world("local", world_size=2)
    >>> stack = TPDecoder([LlamaDecoderLayer.random(world, cfg, seed=0)])
    >>> caches = stack.new_caches(batch=2, capacity=8)
    >>> x = torch.randn(6, 128, dtype=torch.bfloat16)
    >>> [tuple(y.shape) for y in stack([x, x], caches, phase="prefill", batch=2)]   # 2 sequences of 3 tokens
    [(6, 128), (6, 128)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from jointtune.tp._ranks import all_gather_rows, as_list, check_ranks, like, refuse_grad, rows_of_rank
from jointtune.tp.attention import HeadParallelAttention
from jointtune.tp.functional import rms_norm, swiglu
from jointtune.tp.kv_cache import KVCache
from jointtune.tp.layout import LayoutRule
from jointtune.tp.linear import SP, ColumnParallelLinear, RowParallelLinear, check_layout
from jointtune.tp.model_config import ModelConfig
from jointtune.tp.shard import PREFIX, random_hf_layer, shard_layer, shard_state_dict
from jointtune.tp.tuned import Tuning


class LlamaDecoderLayer(nn.Module):
    """One decoder layer's shards on the local ranks (build it with `from_hf` or `random`)."""

    def __init__(self, world: Any, config: ModelConfig, shards: Sequence[Mapping[str, torch.Tensor]], *,
                 tuning: Tuning | None = None, attn_kernel: str = "sdpa") -> None:  # fmt: skip
        super().__init__()
        config.check_runnable()
        config.check_tp(world.world_size)
        check_ranks("shards", list(shards), world)
        self.world, self.config = world, config
        shards = [{k: v.to(world.device) for k, v in s.items()} for s in shards]
        self.attn = HeadParallelAttention.from_shards(world, config, shards, tuning=tuning, attn_kernel=attn_kernel)
        self.input_norm = nn.ParameterList([nn.Parameter(s["input_norm"], requires_grad=False) for s in shards])
        self.post_norm = nn.ParameterList([nn.Parameter(s["post_norm"], requires_grad=False) for s in shards])
        self.gate_up = ColumnParallelLinear(world, [s["gate_up"] for s in shards], tuning=tuning)
        self.down = RowParallelLinear(world, [s["down"] for s in shards], tuning=tuning)

    @classmethod
    def from_hf(cls, world: Any, config: ModelConfig, state_dict: Mapping[str, torch.Tensor], *, layer: int = 0,
                prefix: str = PREFIX, **kwargs: Any) -> LlamaDecoderLayer:  # fmt: skip
        """Layer `layer` of an unsharded HF state dict (`shard.load_hf_state_dict`), sharded onto the world."""
        shards = shard_state_dict(state_dict, config, world.world_size, layer=layer, ranks=world.local_ranks,
                                  prefix=prefix)  # fmt: skip
        return cls(world, config, shards, **kwargs)

    @classmethod
    def random(cls, world: Any, config: ModelConfig, *, seed: int, dtype: torch.dtype = torch.bfloat16,
               **kwargs: Any) -> LlamaDecoderLayer:  # fmt: skip
        """Random weights scaled as at initialisation (`shard.random_hf_layer(config, seed=seed)` are its unsharded
        weights, for a reference)."""
        weights = random_hf_layer(config, seed=seed, dtype=dtype)
        return cls(world, config, [shard_layer(weights, config, world.world_size, r) for r in world.local_ranks],
                   **kwargs)  # fmt: skip

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return self.attn.new_cache(batch, capacity)

    def forward(self, hidden: torch.Tensor | Sequence[torch.Tensor], cache: KVCache, *, layout: str, phase: str,
                batch: int) -> Any:  # fmt: skip
        """hidden: the step's rows in `layout` (`sp`: this rank's T/W, `standard`: all T); returns the same rows."""
        check_layout(layout)
        hs = as_list(hidden)
        check_ranks("hidden", hs, self.world)
        if not torch.compiler.is_compiling():  # dynamo (torch 2.11) can't unpack a ParameterList here
            refuse_grad("LlamaDecoderLayer", [*hs, *self.input_norm, *self.post_norm])
        hs, _ = self.forward_chained(hs, cache, layout=layout, phase=phase, batch=batch)
        return like(hidden, hs)

    def forward_chained(self, hs: list[torch.Tensor], cache: KVCache, *, layout: str, phase: str, batch: int,
                        normed: list[torch.Tensor] | None = None, next_norm: list[torch.Tensor] | None = None,
                        next_eps: float = 1e-6) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:  # fmt: skip
        """The layer on per-rank lists (checked by the caller), its norms in the row-parallel ops' epilogues.

        `normed`: this layer's input RMSNorm of `hs` where the layer before computed it (None: computed here);
        `next_norm` (one weight per local rank) and `next_eps`: the next layer's input RMSNorm, to run in down's
        epilogue. Returns (the output rows, the next layer's normed input, or None without `next_norm`)."""
        eps = self.config.rms_norm_eps
        if normed is None:
            normed = [rms_norm(h, w, eps) for h, w in zip(hs, self.input_norm)]
        attn = self.attn.attend(normed, cache, layout=layout, phase=phase, batch=batch)
        post = list(self.post_norm)
        normed, hs = self.attn.o_proj(attn, layout=layout, residual=hs, norm_weight=post, eps=eps)
        act = [swiglu(y) for y in as_list(self.gate_up(normed, layout=layout))]
        if next_norm is None:
            return as_list(self.down(act, layout=layout, residual=hs)), None
        normed, hs = self.down(act, layout=layout, residual=hs, norm_weight=next_norm, eps=next_eps)
        return hs, normed


class TPDecoder(nn.Module):
    """Decoder layers run in the layout `rule` picks per token count, the hidden state replicated at both ends."""

    def __init__(self, layers: Sequence[LlamaDecoderLayer], rule: LayoutRule | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.world = layers[0].world
        self.rule = rule or LayoutRule()

    def new_caches(self, batch: int, capacity: int) -> list[KVCache]:
        return [layer.new_cache(batch, capacity) for layer in self.layers]

    def layout_for(self, tokens: int) -> str:
        return self.rule.choose(tokens, self.world.world_size)

    def forward(self, hidden: torch.Tensor | Sequence[torch.Tensor], caches: Sequence[KVCache], *, phase: str,
                batch: int, layout: str | None = None) -> Any:  # fmt: skip
        """hidden: all T rows on every rank; `layout` overrides the rule (measurements and benchmarks use it)."""
        hs = as_list(hidden)
        check_ranks("hidden", hs, self.world)
        layout = layout or self.layout_for(hs[0].shape[0])
        check_layout(layout)
        if not torch.compiler.is_compiling():  # dynamo (torch 2.11) can't unpack a ParameterList here
            refuse_grad("TPDecoder", [*hs, *(w for layer in self.layers for w in layer.input_norm)])
        if layout == SP:
            hs = rows_of_rank(self.world, hs)
        normed = None
        n = len(self.layers)
        for i, (layer, cache) in enumerate(zip(self.layers, caches)):
            nxt = self.layers[i + 1] if i + 1 < n else None
            next_norm = None if nxt is None else list(nxt.input_norm)
            next_eps = 1e-6 if nxt is None else nxt.config.rms_norm_eps
            hs, normed = layer.forward_chained(hs, cache, layout=layout, phase=phase, batch=batch, normed=normed,
                                               next_norm=next_norm, next_eps=next_eps)  # fmt: skip
        if layout == SP:
            hs = all_gather_rows(self.world, hs)
        return like(hidden, hs)
