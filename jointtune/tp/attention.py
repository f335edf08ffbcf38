"""Head-parallel attention: rank r holds H/W query heads, their KV heads and its KV cache over the whole sequence.

QKV is a column-parallel projection and o_proj a row-parallel one, so the module runs in either layout
(`linear.py`): in `sp` its input and output are each rank's T/W rows, in `standard` all T rows. Between them
every rank has all T tokens of its own heads, applies RoPE, writes K and V into its cache and attends locally; no
collective runs outside the two projections.

A rank's KV heads: H_KV / W of them, or, where W is a multiple of H_KV, the one KV head its query heads read
(held by W / H_KV ranks alike). Prefill: B sequences of L tokens each (rows sequence-major), from position 0,
causal attention (torch SDPA). Decode: one token per sequence at its cache length, attention over the cache with
`attn_kernel` `sdpa` (torch) or `flash_decode` (our decode kernel on a one-rank world, its config through
`@joint_autotune` at world size 1).

Example:
    >>> from jointtune import create_world
    >>> from jointtune.tp.model_config import model_config_from_dict
    >>> cfg = model_config_from_dict({"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
    ...                               "num_key_value_heads": 2})
    >>> world = create_world("local", world_size=2)
    >>> attn = HeadParallelAttention.random(world, cfg, seed=0)
    >>> cache = attn.new_cache(batch=1, capacity=8)
    >>> x = [torch.randn(4, 128, dtype=torch.bfloat16) for _ in range(2)]        # one sequence of 4 tokens
    >>> [tuple(y.shape) for y in attn(x, cache, layout="standard", phase="prefill", batch=1)]
    [(4, 128), (4, 128)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jointtune.errors import ShapeError
from jointtune.tp._ranks import as_list, like
from jointtune.tp.functional import apply_rope, causal_attention, decode_attention, rope_cos_sin, rope_inv_freq
from jointtune.tp.kv_cache import KVCache
from jointtune.tp.linear import ColumnParallelLinear, RowParallelLinear
from jointtune.tp.model_config import ModelConfig
from jointtune.tp.tuned import Tuning, tuned_op

ATTN_KERNELS = ("sdpa", "flash_decode")
PHASES = ("prefill", "decode")
_DECODE_WORLDS: dict[torch.device, Any] = {}


def decode_world(device: torch.device) -> Any:
    """The one-rank world head-parallel decode runs `flash_decode` in (one per device, shared by every layer)."""
    from jointtune.kernels.runtime.world import LocalWorld

    world = _DECODE_WORLDS.get(device)
    if world is None:
        world = _DECODE_WORLDS[device] = LocalWorld(world_size=1, device=device)
    return world


def tokens_per_sequence(rows: int, batch: int, phase: str) -> int:
    """L of a call of `rows` tokens over `batch` sequences; ShapeError naming the argument when they don't fit."""
    if phase not in PHASES:
        raise ShapeError(f"phase: {phase!r} is not allowed; allowed: {', '.join(PHASES)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1 or rows % batch:
        raise ShapeError(f"batch: {batch!r} is not allowed for {rows} tokens; give an integer >= 1 dividing them")
    if phase == "decode" and rows != batch:
        raise ShapeError(f"batch: a decode step has one token per sequence; got {rows} tokens for batch={batch}")
    return rows // batch


class HeadParallelAttention(nn.Module):
    """QKV (column-parallel) -> RoPE -> attention over the rank's heads -> o_proj (row-parallel)."""

    def __init__(self, world: Any, config: ModelConfig, qkv: ColumnParallelLinear, o_proj: RowParallelLinear, *,
                 tuning: Tuning | None = None, attn_kernel: str = "sdpa") -> None:  # fmt: skip
        super().__init__()
        W = world.world_size
        self.world, self.config = world, config
        self.attn_kernel = attn_kernel  # checked here; may be switched later (a benchmark times both)
        self.heads, self.kv_heads = config.heads_per_rank(W), config.kv_heads_per_rank(W)
        self.head_dim = config.head_dim
        self.qkv, self.o_proj = qkv, o_proj
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, world.device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.decode_op = tuned_op("flash_decode", tuning)

    @classmethod
    def from_shards(cls, world: Any, config: ModelConfig, shards: Sequence[dict[str, torch.Tensor]], *,
                    tuning: Tuning | None = None, attn_kernel: str = "sdpa") -> HeadParallelAttention:  # fmt: skip
        """From the local ranks' shards (`shard.shard_layer`: qkv, qkv_bias where the model has it, o_proj)."""
        bias = [s["qkv_bias"] for s in shards] if config.qkv_bias else None
        qkv = ColumnParallelLinear(world, [s["qkv"] for s in shards], bias=bias, tuning=tuning)
        o_proj = RowParallelLinear(world, [s["o_proj"] for s in shards], tuning=tuning)
        return cls(world, config, qkv, o_proj, tuning=tuning, attn_kernel=attn_kernel)

    @classmethod
    def random(cls, world: Any, config: ModelConfig, *, seed: int, dtype: torch.dtype = torch.bfloat16,
               **kwargs: Any) -> HeadParallelAttention:  # fmt: skip
        """Random weights, scaled as at initialisation (`shard.random_hf_layer`), sharded onto the world."""
        from jointtune.tp.shard import random_hf_layer, shard_layer

        weights = random_hf_layer(config, seed=seed, dtype=dtype)
        shards = [shard_layer(weights, config, world.world_size, r) for r in world.local_ranks]
        shards = [{k: v.to(world.device) for k, v in s.items()} for s in shards]
        return cls.from_shards(world, config, shards, **kwargs)

    @property
    def attn_kernel(self) -> str:
        """What a decode step attends with: `sdpa` (torch) or `flash_decode` (ours, on a one-rank world)."""
        return self._attn_kernel

    @attn_kernel.setter
    def attn_kernel(self, kernel: str) -> None:
        if kernel not in ATTN_KERNELS:
            raise ShapeError(f"attn_kernel: {kernel!r} is not allowed; allowed: {', '.join(ATTN_KERNELS)}")
        self._attn_kernel = kernel

    def new_cache(self, batch: int, capacity: int, dtype: torch.dtype | None = None) -> KVCache:
        """An empty cache of this module's KV heads for `batch` sequences of up to `capacity` positions."""
        dtype = dtype or self.qkv.weight[0].dtype
        return KVCache(self.world.local_ranks, batch=batch, kv_heads=self.kv_heads, capacity=capacity,
                       head_dim=self.head_dim, dtype=dtype, device=self.world.device)  # fmt: skip

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor], cache: KVCache, *, layout: str, phase: str,
                batch: int) -> Any:  # fmt: skip
        """x: rows of the step's T = batch * L tokens in `layout`; returns the attention output in the same layout."""
        return self.o_proj(like(x, self.attend(x, cache, layout=layout, phase=phase, batch=batch)), layout=layout)

    def attend(self, x: torch.Tensor | Sequence[torch.Tensor], cache: KVCache, *, layout: str, phase: str,
               batch: int) -> list[torch.Tensor]:  # fmt: skip
        """Everything before o_proj: each local rank's attention output [T, H/W * D] over its heads, all T rows in
        either layout (a decoder layer calls o_proj itself, with its residual and norm epilogue)."""
        qkv = as_list(self.qkv(x, layout=layout))
        T = qkv[0].shape[0]
        L = tokens_per_sequence(T, batch, phase)
        H, H_KV, D = self.heads, self.kv_heads, self.head_dim
        outs = []
        for i, y in enumerate(qkv):
            q, k, v = y.split([H * D, H_KV * D, H_KV * D], dim=-1)
            q, k, v = q.reshape(T, H, D), k.reshape(T, H_KV, D), v.reshape(T, H_KV, D)
            if phase == "prefill":
                positions = torch.arange(L, device=y.device).repeat(batch)
            else:
                positions = cache.lens[i][:batch]
            cos, sin = rope_cos_sin(positions, self.inv_freq)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if phase == "prefill":
                k4, v4 = k.view(batch, L, H_KV, D), v.view(batch, L, H_KV, D)
                cache.write_prefill(i, k4, v4)
                o = causal_attention(q.view(batch, L, H, D), k4, v4)
            else:
                cache.append(i, k, v)
                o = self._decode(i, q, cache, batch)
            outs.append(o.reshape(T, H * D))
        return outs

    def _decode(self, i: int, q: torch.Tensor, cache: KVCache, batch: int) -> torch.Tensor:
        k, v, lens = cache.k[i][:batch], cache.v[i][:batch], cache.lens[i][:batch]
        if self.attn_kernel == "sdpa":
            return decode_attention(q, k, v, lens)
        (out,) = self.decode_op([q.contiguous()], [k], [v], [lens], world=decode_world(q.device))
        return out
