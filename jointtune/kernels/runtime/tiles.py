"""The tile-GEMM pieces both fused GEMM kernels (AG+GEMM, GEMM+RS) share: which tile a work item is, its
K loop, and the split-K merge. Inlined by Triton, so each kernel compiles as if they were written in it.

Split-K: a tile's K loop is split over SPLIT_K work items whose fp32 partial sums meet in the tile's slot of
a workspace; the last to arrive (per-tile counter) takes the sum and leaves slot and counter at zero for the
next call, so no call clears them and a captured graph replays correctly.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(t, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    # (row tile, column tile) of tile t: GROUP_M row tiles share each column tile in turn (L2 reuse of B)
    group_size = GROUP_M * tiles_n
    first_m = (t // group_size) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (t % group_size) % group_m, (t % group_size) // group_m


@triton.jit
def tile_dot(a_rows, mmask, b_ptr, offs_n, nmask, K, kb_lo, kb_hi, stride_bk, stride_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    # fp32 sum over K blocks [kb_lo, kb_hi) of A's rows (a pointer per row) times B's columns offs_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb_lo, kb_hi):
        offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        a = tl.load(a_rows[:, None] + offs_k[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(
            b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
            mask=kmask[:, None] & nmask[None, :],
            other=0.0,
        )
        if UPCAST:  # the CPU interpreter's bf16 dot is wrong (Triton 3.9); fp32 operands are exact
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def merge_split_k(acc, ws_ptr, counts_ptr, tile, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    # (the tile's sum, whether this split arrived last and so holds it); see the module doc
    in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    slot_ptrs = ws_ptr + tile.to(tl.int64) * (BLOCK_M * BLOCK_N) + in_tile
    # Relaxed adds, a barrier, then one thread's acq_rel count: the count carries every thread's adds, and the
    # last split's count acquires them all, handed to its threads by the barrier (`signals` doc). The read is
    # `.cg`, from L2, where the adds are.
    tl.atomic_add(slot_ptrs, acc, sem="relaxed")
    tl.debug_barrier()
    arrived = tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel")
    last = arrived == SPLIT_K - 1
    if last:
        tl.debug_barrier()
        acc = tl.load(slot_ptrs, cache_modifier=".cg")
        zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        tl.debug_barrier()  # every thread has read the slot before any zeroes it (layouts may differ)
        tl.store(slot_ptrs, zeros)
        tl.store(counts_ptr + tile, 0)
    return acc, last


@triton.jit
def split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, split, ws_ptr, counts_ptr, tile, stride_bk, stride_bn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                  UPCAST: tl.constexpr):  # fmt: skip
    # (the tile's product, whether this work item holds all of it): split `split` of the K loop, merged with the
    # tile's other splits (the last to arrive holds the sum); every fused GEMM's work item
    k_blocks = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_lo = split * k_per_split
    kb_hi = tl.minimum(kb_lo + k_per_split, k_blocks)
    acc = tile_dot(a_rows, mmask, b_ptr, offs_n, nmask, K, kb_lo, kb_hi, stride_bk, stride_bn, BLOCK_M, BLOCK_N,
                   BLOCK_K, UPCAST)  # fmt: skip
    finished = True
    if SPLIT_K > 1:
        acc, finished = merge_split_k(acc, ws_ptr, counts_ptr, tile, SPLIT_K, BLOCK_M, BLOCK_N)
    return acc, finished


__all__ = ["grouped_tile", "merge_split_k", "split_product", "tile_dot"]
