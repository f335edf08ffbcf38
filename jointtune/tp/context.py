"""Context-parallel decode attention: the KV cache split by sequence over the ranks, attention through Flash-Decode.

For when a rank can't hold a head's whole cache: fewer KV heads than ranks, or sequences too long for one GPU.
Every rank holds all H_KV heads for a share of each sequence's positions, and the same queries; `flash_decode`
combines the ranks' partial results (by their log-sum-exps) into the whole output on every rank.

Which rank holds what: position p of a sequence lives on rank p mod W, in slot p div W (round-robin). So the
new token of a decode step is appended by rank (its position) mod W, a different rank each step, and the shards
never differ by more than one position; the other ranks leave their slots as they were. Every rank receives the
new K and V (they are the same on every rank, e.g. from a replicated KV projection) and decides on the device,
from the sequence's length, whether to store them: nothing is read back to the host, so a captured CUDA graph of
a step serves every later step. The cache holds `capacity` positions per sequence (cdiv(capacity, W) per rank).

Example:
    >>> from jointtune import create_world
    >>> world = create_world("local", world_size=2)
    >>> attn = ContextParallelDecodeAttention(world, num_heads=4, num_kv_heads=2, head_dim=64, batch=1, capacity=32,
    ...                                       tuning=Tuning(on_miss="default"))  # the space default: nothing tuned here
    >>> prefix = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16)                     # K (and V) of 5 positions
    >>> attn.fill([prefix, prefix], [prefix, prefix], [5])
    >>> q, kv = torch.randn(1, 4, 64, dtype=torch.bfloat16), torch.randn(1, 2, 64, dtype=torch.bfloat16)
    >>> out = attn([q, q], [kv, kv], [kv, kv])                       # position 5 is appended by rank 5 % 2 = 1
    >>> [tuple(o.shape) for o in out], [lens.tolist() for lens in attn.lens]
    ([(1, 4, 64), (1, 4, 64)], [[3], [3]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jointtune.errors import ShapeError
from jointtune.tp._ranks import as_list, check_ranks, like, refuse_grad
from jointtune.tp.tuned import Tuning, tuned_op


class ContextParallelDecodeAttention(nn.Module):
    """Decode attention over a round-robin sequence-split KV cache (see the module docstring)."""

    def __init__(self, world: Any, *, num_heads: int, num_kv_heads: int, head_dim: int, batch: int, capacity: int,
                 dtype: torch.dtype = torch.bfloat16, tuning: Tuning | None = None) -> None:  # fmt: skip
        super().__init__()
        for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("batch", batch), ("capacity", capacity)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ShapeError(f"{name}: {value!r} is not allowed; give an integer >= 1")
        if num_heads % num_kv_heads:
            raise ShapeError(
                f"num_kv_heads: {num_kv_heads} is not allowed; num_heads={num_heads} must be divisible by it"
            )
        self.world, self.heads, self.kv_heads, self.head_dim = world, num_heads, num_kv_heads, head_dim
        W = world.world_size
        self.slots = -(-capacity // W)
        shape = (batch, num_kv_heads, self.slots, head_dim)
        dev = world.device
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in world.local_ranks]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in world.local_ranks]
        #: per local rank: this rank's valid positions of each sequence (what flash_decode reads)
        self.lens = [torch.zeros(batch, dtype=torch.int32, device=dev) for _ in world.local_ranks]
        #: per local rank: each sequence's whole length (the same on every rank)
        self.seq_lens = [torch.zeros(batch, dtype=torch.int32, device=dev) for _ in world.local_ranks]
        self.op = tuned_op("flash_decode", tuning)

    def fill(self, k: Any, v: Any, lengths: Sequence[int]) -> None:
        """A prefix of each sequence from whole-sequence K, V [B, H_KV, L, D] (the same on every rank, one per local
        rank): sequence b's first lengths[b] positions, dealt round-robin."""
        W = self.world.world_size
        ks, vs = as_list(k), as_list(v)
        check_ranks("k", ks, self.world)
        B = ks[0].shape[0]
        if len(lengths) != B or any(not 0 <= n <= min(ks[0].shape[2], self.slots * W) for n in lengths):
            raise ShapeError(f"lengths: {list(lengths)} is not allowed; give {B} lengths within the given keys and "
                             f"the capacity ({self.slots * W})")  # fmt: skip
        for i, (r, k_i, v_i) in enumerate(zip(self.world.local_ranks, ks, vs)):
            mine_k, mine_v = k_i[:, :, r::W], v_i[:, :, r::W]
            n = min(mine_k.shape[2], self.slots)
            self.k[i][:B, :, :n] = mine_k[:, :, :n]
            self.v[i][:B, :, :n] = mine_v[:, :, :n]
            counts = [max(0, -(-(length - r) // W)) for length in lengths]
            self.lens[i][:B] = torch.tensor(counts, dtype=torch.int32)
            self.seq_lens[i][:B] = torch.tensor(list(lengths), dtype=torch.int32)

    def append(self, k: Any, v: Any) -> None:
        """Each sequence's new token, K and V [B, H_KV, D] (the same on every rank): stored by rank (position) mod W."""
        W = self.world.world_size
        for i, (r, k_i, v_i) in enumerate(zip(self.world.local_ranks, as_list(k), as_list(v))):
            B = k_i.shape[0]
            pos = self.seq_lens[i][:B].long()
            mine = (pos % W) == r
            slot = torch.clamp(pos // W, max=self.slots - 1)  # a rank that doesn't store writes its own slot back
            rows = torch.arange(B, device=pos.device)
            keep = mine[:, None, None]
            self.k[i][rows, :, slot] = torch.where(keep, k_i, self.k[i][rows, :, slot])
            self.v[i][rows, :, slot] = torch.where(keep, v_i, self.v[i][rows, :, slot])
            self.lens[i][:B] += mine.to(torch.int32)
            self.seq_lens[i][:B] += 1

    def forward(self, q: Any, k: Any = None, v: Any = None) -> Any:
        """Attention of q [B, H, D] (the same on every rank) over each sequence's cached positions, after appending
        the step's k, v [B, H_KV, D] when given; returns [B, H, D] on every rank."""
        qs = as_list(q)
        check_ranks("q", qs, self.world)
        if not torch.compiler.is_compiling():  # the eager call before compiling checked; dynamo can't unpack these
            refuse_grad("ContextParallelDecodeAttention", [*qs, *(as_list(k) if k is not None else [])])
        if (k is None) != (v is None):
            raise ShapeError("k, v: give both (the step's new token) or neither")
        if k is not None:
            self.append(k, v)
        B = qs[0].shape[0]
        ks, vs, lens = [x[:B] for x in self.k], [x[:B] for x in self.v], [x[:B] for x in self.lens]
        return like(q, self.op([x.contiguous() for x in qs], ks, vs, lens, world=self.world))
