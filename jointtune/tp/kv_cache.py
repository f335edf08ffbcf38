"""A head-parallel KV cache: each rank holds its KV heads for every position of every sequence.

Per local rank: K and V [batch, kv_heads_per_rank, capacity, head_dim] and `lens` [batch] int32 on the device,
how many positions of each sequence are filled. A prefill writes positions 0..L-1 of the first B sequences; a
decode step writes each sequence's new token at its own length and advances the length, all on the device (no
host read of a length), so a captured CUDA graph of a step serves every later step. Stepping a sequence past
`capacity` is the caller's to prevent (the lengths live on the device, and checking them would synchronise).

Example:
    >>> cache = KVCache([0, 1], batch=2, kv_heads=1, capacity=16, head_dim=8, dtype=torch.float32)
    >>> cache.write_prefill(0, torch.ones(2, 5, 1, 8), torch.ones(2, 5, 1, 8))
    >>> cache.lens[0].tolist()
    [5, 5]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    """One layer's K and V for the local ranks `ranks` (see the module docstring)."""

    def __init__(self, ranks: Sequence[int], *, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:  # fmt: skip
        shape = (batch, kv_heads, capacity, head_dim)
        self.batch, self.capacity = batch, capacity
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in ranks]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in ranks]
        self.lens = [torch.zeros(batch, dtype=torch.int32, device=device) for _ in ranks]

    def reset(self) -> None:
        """Empty every sequence (the memory is kept)."""
        for lens in self.lens:
            lens.zero_()

    def write_prefill(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Local rank index i: positions 0..L-1 of the first B sequences from k, v [B, L, kv_heads, head_dim]."""
        B, L = k.shape[0], k.shape[1]
        self.k[i][:B, :, :L] = k.transpose(1, 2)
        self.v[i][:B, :, :L] = v.transpose(1, 2)
        self.lens[i][:B] = L

    def append(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Local rank index i: each of the first B sequences' new token from k, v [B, kv_heads, head_dim], at its
        length, which then grows by one."""
        B = k.shape[0]
        pos = self.lens[i][:B].long()
        rows = torch.arange(B, device=pos.device)
        self.k[i][rows, :, pos] = k
        self.v[i][rows, :, pos] = v
        self.lens[i][:B] += 1
