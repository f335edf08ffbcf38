"""`mode="stream"`: AG+GEMM in one launch: every program pushes its share of this rank's rows, then runs the tile
GEMM over all M rows, streaming over K.

At decode sizes the GEMM reads its whole weight whatever the rows, so a gather cut along M overlaps nothing: every
row tile needs every rank's rows before its first k-step. Here the gather is cut along K. Every program first pushes
its pieces of this rank's rows into every peer's inbox (the epoch's half), a flag per chunk (a count over the
programs, then one release, as `signals.push_rows` does along M); then it runs its GEMM work items. A split of the k
loop (SPLIT_K of them; one without split-K) has two chunks: its first FIRST_K columns and the rest. A tile multiplies
its own rows of the first chunk first (B from memory) while the peers' rows travel, then, after the first chunk's
flag, the peers' rows of it (the same part of B, now in L2: a first chunk is small), then, after the second flag, all
rows of the rest. The pushes go in that order: every split's first chunk, then every split's rest.

Why two chunks and not more: each step of the k loop drains and refills its software pipeline, and Triton (3.6)
can't keep prefetching B across a wait that A's loads must not pass. One GPU, no peers, no waits:
each further chunk cost 1.4-1.8 µs (bench/README.md); so the flags' round trip hides behind the own rows' first chunk,
and everything else waits once.

Deadlock-free: a program pushes everything it owes before it waits on anything, and the grid is at most the SM count
(every program of every rank is resident), so every flag a program waits on is raised. Epoch, halves and flags are
the push mode's (`kernel`): the launch opens the call on the device, flags carry the epoch, inbox halves alternate by
its parity. A half is free to be written again at epoch e + 2: the peer writes it only after its call e + 1, which
waited on this rank's chunks of e + 1, pushed by a launch that ran after this rank's call e had read the half (stream
order). With SPLIT_K > 1 the splits meet as in `tiles.merge_split_k`.

On a world whose ranks launch one after another the plan runs every rank's pushes (`PUSH`, opening the call) before
any rank's GEMM (`GEMM`, the call already open).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.signals import (
    call_epoch_and_half,
    open_call,
    publish_call,
    release_flag,
    wait_chunks,
)
from jointtune.kernels.runtime.tiles import grouped_tile, merge_split_k, tile_dot


@triton.jit
def _chunk_blocks(c, k_blocks, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, FIRST_K: tl.constexpr):
    # k-blocks [lo, hi) of chunk c = 2 * split + part: a split's first FIRST_K columns (part 0), then the rest of it
    kps = tl.cdiv(k_blocks, SPLIT_K)
    split_lo = (c // 2) * kps
    split_hi = tl.minimum(split_lo + kps, k_blocks)
    mid = tl.minimum(split_lo + FIRST_K // BLOCK_K, split_hi)
    lo = tl.where(c % 2 == 0, split_lo, mid)
    hi = tl.where(c % 2 == 0, mid, split_hi)
    return lo, tl.maximum(hi, lo)


@triton.jit
def _chunk_pieces(c, K, R, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, FIRST_K: tl.constexpr,
                  PIECE_M: tl.constexpr, PIECE_K: tl.constexpr):  # fmt: skip
    # (first column, end column, pieces along K, pieces) of chunk c of this rank's rows [R, K]
    kb_lo, kb_hi = _chunk_blocks(c, tl.cdiv(K, BLOCK_K), SPLIT_K, BLOCK_K, FIRST_K)
    col_lo = kb_lo * BLOCK_K
    col_hi = tl.minimum(kb_hi * BLOCK_K, K)
    k_pieces = tl.cdiv(col_hi - col_lo, PIECE_K)
    return col_lo, col_hi, k_pieces, tl.cdiv(R, PIECE_M) * k_pieces


@triton.jit
def _push_chunks(a_ptr, inbox_ptr, inbox_deltas_ptr, own_ptr, pid, K, R, slot, rank, programs, WORLD: tl.constexpr,
                 SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, FIRST_K: tl.constexpr, PIECE_M: tl.constexpr,
                 PIECE_K: tl.constexpr, OWN: tl.constexpr):  # fmt: skip
    # This program's pieces of this rank's rows [R, K] into slot `rank` of every peer's inbox (`inbox_ptr`: this
    # call's half as this rank maps it; rank p's at `inbox_deltas[p]` elements from it), chunk by chunk in the order
    # the k loops read them: every split's first chunk, then every split's rest. The pieces ([PIECE_M, PIECE_K]) of a
    # chunk are dealt round-robin over the launch's programs, each chunk's deal starting where the last one stopped.
    # Stores only: `_release_chunks` counts them later.
    dealt = 0
    for q in range(0, 2 * SPLIT_K):
        c = (q % SPLIT_K) * 2 + q // SPLIT_K
        col_lo, col_hi, k_pieces, pieces = _chunk_pieces(c, K, R, BLOCK_K, SPLIT_K, FIRST_K, PIECE_M, PIECE_K)
        first = (pid - dealt % programs + programs) % programs
        dealt += pieces
        for g in range(first, pieces, programs):
            rows = (g // k_pieces) * PIECE_M + tl.arange(0, PIECE_M)
            ks = col_lo + (g % k_pieces) * PIECE_K + tl.arange(0, PIECE_K)
            mask = (rows[:, None] < R) & (ks[None, :] < col_hi)
            offs = rows[:, None].to(tl.int64) * K + ks[None, :]
            x = tl.load(a_ptr + offs, mask=mask)
            dst = inbox_ptr + rank.to(tl.int64) * slot + offs
            for j in range(1, WORLD):
                delta = (tl.load(inbox_deltas_ptr + (rank + j) % WORLD) // 16) * 16
                tl.store(dst + delta, x, mask=mask)
            if OWN:
                tl.store(own_ptr + offs, x, mask=mask)


@triton.jit
def _release_chunks(flag_ptrs_ptr, done_ptr, pid, K, R, rank, epoch, programs, WORLD: tl.constexpr,
                    SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, FIRST_K: tl.constexpr, PIECE_M: tl.constexpr,
                    PIECE_K: tl.constexpr):  # fmt: skip
    # After `_push_chunks` (the same deal): per chunk this program pushed pieces of, it adds their count to the
    # chunk's counter (after a barrier, acq_rel: it carries every thread's stores), and the one completing it releases
    # the chunk's flag to every peer, leaving the counter at zero for the next call. Called once the program's stores
    # have had time to land (after its first own-rows step): the acq_rel waits for them. An empty chunk (a split no
    # deeper than its first chunk) has no pieces and no flag: nobody waits for it.
    dealt = 0
    for q in range(0, 2 * SPLIT_K):
        c = (q % SPLIT_K) * 2 + q // SPLIT_K
        _, _, _, pieces = _chunk_pieces(c, K, R, BLOCK_K, SPLIT_K, FIRST_K, PIECE_M, PIECE_K)
        first = (pid - dealt % programs + programs) % programs
        dealt += pieces
        mine = tl.cdiv(pieces - first, programs)
        if mine > 0:
            tl.debug_barrier()
            done = tl.atomic_add(done_ptr + c, mine, sem="acq_rel", scope="sys")
            if done + mine == pieces:
                tl.store(done_ptr + c, 0)
                release_flag(flag_ptrs_ptr, rank, rank * 2 * SPLIT_K + c, epoch, WORLD)


# Integers that may be 1 stay runtime values: Triton would otherwise compile anew for 1 vs not-1.
@triton.jit(do_not_specialize=["rank", "num_programs"])
def ag_gemm_stream_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    flags_ptr,
    flag_ptrs_ptr,
    done_ptr,
    ws_ptr,
    counts_ptr,
    state_ptr,
    N,
    K,
    R,
    slot,
    half_stride,
    rank,
    num_programs,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FIRST_K: tl.constexpr,
    PIECE_M: tl.constexpr,
    PIECE_K: tl.constexpr,
    OWN: tl.constexpr,
    PUSH: tl.constexpr,
    GEMM: tl.constexpr,
    UPCAST: tl.constexpr,
    EPOCH: tl.constexpr,
):
    pid = tl.program_id(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    box = inbox_ptr + half
    if PUSH:
        _push_chunks(a_ptr, box, inbox_deltas_ptr, box + rank.to(tl.int64) * slot, pid, K, R, slot, rank, num_programs,
                     WORLD, SPLIT_K, BLOCK_K, FIRST_K, PIECE_M, PIECE_K, OWN)  # fmt: skip
    # this program's pushes are counted (and flags released) once: before its first wait, or after its first step
    released = 0
    if PUSH & (not GEMM):
        _release_chunks(flag_ptrs_ptr, done_ptr, pid, K, R, rank, epoch, num_programs, WORLD, SPLIT_K, BLOCK_K,
                        FIRST_K, PIECE_M, PIECE_K)  # fmt: skip
        released = 1
    if GEMM:
        M = R * WORLD
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_work = num_pid_m * num_pid_n * SPLIT_K
        k_blocks = tl.cdiv(K, BLOCK_K)
        own_lo = rank * R
        own_hi = own_lo + R
        for work in range(pid, num_work, num_programs):
            # work item = (tile, split); the splits of a tile are neighbours, so they run together
            tile = work // SPLIT_K
            split = work % SPLIT_K
            pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mmask = offs_m < M
            nmask = offs_n < N
            owner = offs_m // R
            local_row = (offs_m - owner * R).to(tl.int64) * K
            a_rows = tl.where(owner == rank, a_ptr + local_row, box + owner.to(tl.int64) * slot + local_row)
            own = (offs_m >= own_lo) & (offs_m < own_hi)
            theirs = (offs_m < own_lo) | (offs_m >= own_hi)
            row_first = pid_m * BLOCK_M
            row_last = tl.minimum(row_first + BLOCK_M, M) - 1
            p_lo = row_first // R
            p_hi = row_last // R
            has_own = (row_first < own_hi) & (row_last >= own_lo)
            has_peer = (p_lo != rank) | (p_hi != rank)
            # Steps of the k loop: the split's first chunk, then the rest of the split, each after its flag; with own
            # and peer rows in the tile the first chunk takes two steps, the own rows (no wait) and then the peers'.
            # One call site of the k loop (each would hold its own pipeline buffers); each step refills its pipeline.
            kb_first, kb_mid = _chunk_blocks(2 * split, k_blocks, SPLIT_K, BLOCK_K, FIRST_K)
            kb_rest, kb_end = _chunk_blocks(2 * split + 1, k_blocks, SPLIT_K, BLOCK_K, FIRST_K)
            has_first = (kb_mid > kb_first).to(tl.int32)
            two = (has_own & has_peer).to(tl.int32) * has_first
            steps = has_first + two + (kb_end > kb_rest).to(tl.int32)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for step in range(0, steps):
                rest = step >= has_first + two
                # which rows this step reads: 0 all, 1 the own, 2 the peers'
                part = tl.where(rest, 0, two * (step + 1))
                waits = has_peer & (part != 1)
                if PUSH & (released == 0) & waits:
                    _release_chunks(flag_ptrs_ptr, done_ptr, pid, K, R, rank, epoch, num_programs, WORLD, SPLIT_K,
                                    BLOCK_K, FIRST_K, PIECE_M, PIECE_K)  # fmt: skip
                    released = 1
                if waits:
                    c = 2 * split + rest.to(tl.int32)
                    wait_chunks(flags_ptr, epoch, rank, 2 * SPLIT_K, p_lo, p_hi, c, c)
                rows = mmask & tl.where(part == 1, own, tl.where(part == 2, theirs, mmask))
                acc += tile_dot(a_rows, rows, b_ptr, offs_n, nmask, K, tl.where(rest, kb_rest, kb_first),
                                tl.where(rest, kb_end, kb_mid), stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                                UPCAST)  # fmt: skip
                if PUSH & (released == 0):
                    _release_chunks(flag_ptrs_ptr, done_ptr, pid, K, R, rank, epoch, num_programs, WORLD, SPLIT_K,
                                    BLOCK_K, FIRST_K, PIECE_M, PIECE_K)  # fmt: skip
                    released = 1
            finished = True
            if SPLIT_K > 1:
                acc, finished = merge_split_k(acc, ws_ptr, counts_ptr, tile, SPLIT_K, BLOCK_M, BLOCK_N)
            if finished:
                c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
                tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
    if PUSH & (released == 0):  # a program with no work item
        _release_chunks(flag_ptrs_ptr, done_ptr, pid, K, R, rank, epoch, num_programs, WORLD, SPLIT_K, BLOCK_K,
                        FIRST_K, PIECE_M, PIECE_K)  # fmt: skip
    if EPOCH == 1:
        publish_call(state_ptr, epoch, num_programs)


__all__ = ["ag_gemm_stream_kernel", "triton"]
