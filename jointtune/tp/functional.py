"""The per-rank pieces of a Llama layer that need no communication: RMSNorm, RoPE, SwiGLU, attention.

All of them are plain torch on one rank's tensors, so they compile and capture as they are; the reference layer
(`reference.py`) calls the same functions, in float32 (or, as the one-GPU bf16 floor, in bfloat16), so the
tensor-parallel layer and its reference differ only in how the work is split and in the precision of the activations.

Positions come from device tensors (a decode step's position is its sequence's cache length), so a captured
CUDA graph serves any position.

Example:
    >>> x = torch.randn(3, 4, 8)                                   # [tokens, heads, head_dim]
    >>> cos, sin = rope_cos_sin(torch.arange(3), rope_inv_freq(8, 10000.0))
    >>> apply_rope(x, cos, sin).shape
    torch.Size([3, 4, 8])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x's last dim, in the weight's dtype as HF's Llama returns it: torch's own `F.rms_norm` (the
    statistics and the scale in float32, rounded once; one fused kernel on CUDA in the torch 2.11 we run, where HF's
    composite form launches six and rounds twice). A weight of another dtype is applied in float32, unrounded."""
    if weight.dtype == x.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(weight.dtype)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies (float32, [head_dim / 2])."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim] (float32) of each token's position, the halves repeated (HF's rotate_half layout)."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by its tokens' angles; computed in float32, returned in x's dtype."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a rank's fused [T, 2 * I_r] projection (gate columns first, then up)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Prefill attention of q [B, L, H, D] over k, v [B, L, H_KV, D], causal, GQA; returns [B, L, H, D].

    KV heads are repeated for the query heads of their group, so the fused (flash) kernel runs for any group size."""
    H, H_KV = q.shape[2], k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if H != H_KV:
        k = k.repeat_interleave(H // H_KV, dim=1)
        v = v.repeat_interleave(H // H_KV, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """One decode step: q [B, H, D] over the first lens[b] keys of k, v [B, H_KV, S, D]; returns [B, H, D].

    A GQA group's query heads are the query rows of its KV head (no copy of the cache per query head); the valid
    keys are a mask built from `lens` on the device, so a captured graph serves any lengths."""
    B, H, D = q.shape
    H_KV, S = k.shape[1], k.shape[2]
    groups = q.view(B, H_KV, H // H_KV, D)
    valid = torch.arange(S, device=q.device)[None, :] < lens[:, None].to(torch.int64)
    out = F.scaled_dot_product_attention(groups, k, v, attn_mask=valid[:, None, None, :])
    return out.reshape(B, H, D)
