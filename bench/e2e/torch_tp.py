"""The paths jointtune's decoder layer is compared with, written in plain torch over the same weight shards.

- `TorchStandardLayer`: the standard tensor-parallel layer a user writes today: activations replicated, cuBLAS GEMMs,
  an all-reduce after o_proj and after down (NCCL, or torch's symmetric-memory one-shot all-reduce where it is
  faster: `AllReduce`).
- `async_tp_step`: the sequence-parallel layer written with functional collectives (all-gather before QKV and
  gate_up, reduce-scatter after o_proj and down), for `torch.compile` with micro-pipeline TP
  (`torch._inductor.config._micro_pipeline_tp`), which rewrites each all-gather + matmul and matmul +
  reduce-scatter into torch's fused symmetric-memory ops: torch's async-TP.

Both read the shards of a `jointtune.tp.LlamaDecoderLayer` (its public parameters: no second copy of the weights) and
attend with the same kernel as it (`attend`), so the comparison is the layers' GEMMs and collectives, and where
jointtune's standard layout fuses the residual add + RMSNorm into its GEMM + all-reduce, the torch layer's own
(`add_rms_norm`, timed alone in the breakdown). Public names only: torch, and `jointtune.tp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from jointtune.tp.attention import decode_world
from jointtune.tp.functional import apply_rope, causal_attention, decode_attention, rms_norm, rope_cos_sin, swiglu


class AllReduce:
    """Sum over the ranks of one tensor per local rank: `nccl` (torch.distributed), `one_shot` (torch's
    symmetric-memory one-shot all-reduce, from a buffer of its own), or a plain sum on a local world."""

    def __init__(self, world: Any, variant: str = "nccl") -> None:
        self.world, self.variant = world, variant
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def __call__(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.world.kind == "local":
            total = sum(x.float() for x in xs).to(xs[0].dtype)
            return [total for _ in xs]
        (x,) = xs
        if self.variant == "one_shot":
            buf = self._symm(x)
            buf.copy_(x)
            return [torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.world.group.group_name)]
        import torch.distributed as dist

        dist.all_reduce(x, group=self.world.group)
        return [x]

    def _symm(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype)
        buf = self._buffers.get(key)
        if buf is None:
            import torch.distributed._symmetric_memory as symm_mem

            buf = symm_mem.empty(x.shape, dtype=x.dtype, device=x.device)
            symm_mem.rendezvous(buf, self.world.group.group_name)
            self._buffers[key] = buf
        return buf


def add_rms_norm(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """The torch layer's residual add and the RMSNorm after it: (normed, h + y), what gemm_ar_rmsnorm's epilogue
    computes inside the all-reduce."""
    h = h + y
    return rms_norm(h, weight, eps), h


def attend(layer: Any, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Any, *, phase: str,
           batch: int, L: int) -> torch.Tensor:  # fmt: skip
    """Attention of local rank index i as jointtune's layer computes it (same kernel: `layer.attn.attn_kernel`)."""
    H, H_KV, D = layer.attn.heads, layer.attn.kv_heads, layer.attn.head_dim
    if phase == "prefill":
        k4, v4 = k.view(batch, L, H_KV, D), v.view(batch, L, H_KV, D)
        cache.write_prefill(i, k4, v4)
        return causal_attention(q.view(batch, L, H, D), k4, v4)
    cache.append(i, k, v)
    kc, vc, lens = cache.k[i][:batch], cache.v[i][:batch], cache.lens[i][:batch]
    if layer.attn.attn_kernel == "sdpa":
        return decode_attention(q, kc, vc, lens)
    (out,) = layer.attn.decode_op([q.contiguous()], [kc], [vc], [lens], world=decode_world(q.device))
    return out


def _qkv_rope(layer: Any, i: int, qkv: torch.Tensor, cache: Any, phase: str, batch: int, L: int) -> Any:
    H, H_KV, D = layer.attn.heads, layer.attn.kv_heads, layer.attn.head_dim
    T = qkv.shape[0]
    q, k, v = qkv.split([H * D, H_KV * D, H_KV * D], dim=-1)
    q, k, v = q.reshape(T, H, D), k.reshape(T, H_KV, D), v.reshape(T, H_KV, D)
    positions = torch.arange(L, device=qkv.device).repeat(batch) if phase == "prefill" else cache.lens[i][:batch]
    cos, sin = rope_cos_sin(positions, layer.attn.inv_freq)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class TorchStandardLayer:
    """jointtune's layer's weights run as the standard torch TP layer: `step(hs, cache, phase=, batch=)` on every
    local rank's T rows (replicated), returning them."""

    def __init__(self, layer: Any, all_reduce: AllReduce) -> None:
        self.layer, self.all_reduce = layer, all_reduce

    def __call__(self, hs: Sequence[torch.Tensor], cache: Any, *, phase: str, batch: int) -> list[torch.Tensor]:
        lay = self.layer
        eps = lay.config.rms_norm_eps
        T = hs[0].shape[0]
        L = T // batch
        qkv_w, qkv_b = list(lay.attn.qkv.weight), lay.attn.qkv.bias
        partial = []
        for i, h in enumerate(hs):
            qkv = rms_norm(h, lay.input_norm[i], eps) @ qkv_w[i]
            if qkv_b is not None:
                qkv = qkv + qkv_b[i]
            q, k, v = _qkv_rope(lay, i, qkv, cache, phase, batch, L)
            o = attend(lay, i, q, k, v, cache, phase=phase, batch=batch, L=L).reshape(T, -1)
            partial.append(o @ lay.attn.o_proj.weight[i])
        normed, hs = zip(*(add_rms_norm(h, o, w, eps) for h, o, w in zip(hs, self.all_reduce(partial), lay.post_norm)))
        partial = [swiglu(n @ lay.gate_up.weight[i]) @ lay.down.weight[i] for i, n in enumerate(normed)]
        return [h + d for h, d in zip(hs, self.all_reduce(partial))]


def async_tp_step(layers: Sequence[Any], group: Any, h: torch.Tensor, caches: Sequence[Any], *, phase: str,
                  batch: int) -> torch.Tensor:  # fmt: skip
    """One step of `layers` in the sequence-parallel layout with functional collectives (CUDA world: this rank's
    T/W rows in and out); compile it with micro-pipeline TP on to get torch's async-TP."""
    import torch.distributed._functional_collectives as funcol

    for lay, cache in zip(layers, caches):
        eps = lay.config.rms_norm_eps
        full = funcol.all_gather_tensor(rms_norm(h, lay.input_norm[0], eps), 0, group)
        T = full.shape[0]
        L = T // batch
        qkv = full @ lay.attn.qkv.weight[0]
        if lay.attn.qkv.bias is not None:
            qkv = qkv + lay.attn.qkv.bias[0]
        q, k, v = _qkv_rope(lay, 0, qkv, cache, phase, batch, L)
        o = attend(lay, 0, q, k, v, cache, phase=phase, batch=batch, L=L).reshape(T, -1)
        h = h + funcol.reduce_scatter_tensor(o @ lay.attn.o_proj.weight[0], "sum", 0, group)
        full = funcol.all_gather_tensor(rms_norm(h, lay.post_norm[0], eps), 0, group)
        act = swiglu(full @ lay.gate_up.weight[0])
        h = h + funcol.reduce_scatter_tensor(act @ lay.down.weight[0], "sum", 0, group)
    return h


def compile_async_tp(group: Any) -> Any:
    """`async_tp_step` compiled with micro-pipeline TP (symmetric memory enabled for the group, as it needs)."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(group.group_name)
    inductor_config._micro_pipeline_tp = True
    return torch.compile(async_tp_step, fullgraph=True)


__all__ = ["AllReduce", "TorchStandardLayer", "add_rms_norm", "async_tp_step", "attend", "compile_async_tp"]
