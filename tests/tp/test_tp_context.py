"""Context-parallel decode attention on Flash-Decode: the KV cache dealt round-robin over simulated ranks, new tokens
appended by rank (position mod W), checked against attention over each whole sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from jointtune import create_world
from jointtune.errors import ShapeError
from jointtune.tp import ContextParallelDecodeAttention, rel_error

H, H_KV, D = 4, 2, 64


def _attention(q, k, v):
    """q [H, D] over k, v [H_KV, L, D] in float32 (GQA: each KV head serves H / H_KV query heads)."""
    k, v = k.float().repeat_interleave(H // H_KV, 0), v.float().repeat_interleave(H // H_KV, 0)
    return F.scaled_dot_product_attention(q.float()[:, None], k, v)[:, 0]


@pytest.mark.parametrize("W", [2, 4])
def test_round_robin_cache_and_decode_steps_match_attention_over_whole_sequences(W):
    world = create_world("local", world_size=W)
    attn = ContextParallelDecodeAttention(world, num_heads=H, num_kv_heads=H_KV, head_dim=D, batch=2, capacity=16)
    gen = torch.Generator().manual_seed(W)
    lengths = [5, 2]  # ragged: each sequence has its own length, and its own next position
    k_all = torch.randn(2, H_KV, 16, D, generator=gen).bfloat16()
    v_all = torch.randn(2, H_KV, 16, D, generator=gen).bfloat16()
    attn.fill([k_all[:, :, :5]] * W, [v_all[:, :, :5]] * W, lengths)
    with torch.no_grad():
        for step in range(2):
            q = torch.randn(2, H, D, generator=gen).bfloat16()
            pos = [n + step for n in lengths]  # where each sequence's new token goes
            k_new = torch.stack([k_all[b, :, p] for b, p in enumerate(pos)])
            v_new = torch.stack([v_all[b, :, p] for b, p in enumerate(pos)])
            out = attn([q] * W, [k_new] * W, [v_new] * W)
            for b, p in enumerate(pos):
                want = _attention(q[b], k_all[b, :, : p + 1], v_all[b, :, : p + 1])
                assert all(rel_error(o[b], want) < 2e-2 for o in out)
    final = [n + 2 for n in lengths]
    for i, r in enumerate(world.local_ranks):  # rank r holds the positions p with p % W == r
        assert attn.lens[i].tolist() == [len(range(r, n, W)) for n in final]
        assert attn.seq_lens[i].tolist() == final
        for b, n in enumerate(final):
            mine = k_all[b, :, r:n:W]
            assert torch.equal(attn.k[i][b, :, : mine.shape[1]], mine)


def test_bad_arguments_are_named():
    world = create_world("local", world_size=2)
    with pytest.raises(ShapeError, match="num_kv_heads: 3 is not allowed; num_heads=4 must be divisible by it"):
        ContextParallelDecodeAttention(world, num_heads=4, num_kv_heads=3, head_dim=64, batch=1, capacity=8)
    attn = ContextParallelDecodeAttention(world, num_heads=4, num_kv_heads=2, head_dim=64, batch=1, capacity=8)
    k = torch.zeros(1, 2, 4, 64).bfloat16()
    with pytest.raises(ShapeError, match=r"lengths: \[9\] is not allowed"):
        attn.fill([k, k], [k, k], [9])
    q = torch.zeros(1, 4, 64).bfloat16()
    with pytest.raises(ShapeError, match="k, v: give both"):
        attn([q, q], [k[:, :, 0]] * 2)
