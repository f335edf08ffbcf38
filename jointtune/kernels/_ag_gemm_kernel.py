"""The Triton kernels behind All-Gather+GEMM: one kernel for the pull, push and copy-engine modes,
and for `push_cublas` the push alone plus two one-program kernels (release a chunk's flag after the
copy engine's copies; wait for chunks' flags before cuBLAS), all on the same flags and inboxes.

Rows this rank owns come from `a_ptr`; rows of other ranks through a table of element offsets,
one per owning rank, relative to a stable base `src_ptr`: peers' symmetric buffers (pull), or this
rank's inbox that peers pushed into (push). The table depends only on buffer addresses, so the
host builds it once and reuses it. Offsets are rounded `// 16 * 16` in the kernel, a no-op on the
16-element-aligned buffers we hand in (checked on the host) that lets the compiler keep 16-byte
vector loads.

Program ids below `COMM_SMS` are producers (push only): they copy this rank's rows chunk by chunk
into every peer's inbox and release a flag per chunk (value = the call's epoch). The other
programs, and the producers once they are done, are a persistent GEMM taking tiles from a ticket
counter, in an order rotated so each rank starts on its own rows; under push a tile acquire-waits
on the flags of the remote chunks it reads. Producers wait on nothing before they finish pushing,
and the grid is no larger than the SM count, so every producer is resident and every wait ends:
deadlock-free by construction.

With SPLIT_K > 1 a tile's K loop is split over SPLIT_K work items whose fp32 partial sums meet in a
per-tile slot of a workspace through atomics; the last to arrive (per-tile counter) writes C and
resets slot and counter. Small M needs that parallelism: without it a few dozen tiles with long K
loops leave most SMs idle.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl


@triton.jit
def _thread_fence(fence_ptr, pid, THREADS: tl.constexpr, FENCE: tl.constexpr):
    # One acq_rel system-scope atomic per thread (a 1-D block of THREADS elements puts one on each):
    # a per-thread fence, ordering that thread's own loads/stores around the barrier-based handshake.
    if FENCE:
        tl.atomic_add(fence_ptr + pid * THREADS + tl.arange(0, THREADS), 0, sem="acq_rel", scope="sys")


@triton.jit
def _push_chunks(
    a_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    flag_ptrs_ptr,
    done_ptr,
    fence_ptr,
    pid,
    K,
    R,
    slot,
    rank,
    epoch,
    n_chunks,
    WORLD: tl.constexpr,
    COMM_SMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    GATHER_LOCAL: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
    THREADS: tl.constexpr,
    FENCE: tl.constexpr,
):
    # ---- producer: copy my rows into every peer's inbox, one flag per chunk ----
    # All producers share every chunk, piece by piece ([CP_M, CP_K] blocks; global piece g goes to
    # program g % COMM_SMS), so the copy runs on all COMM_SMS programs whatever the chunk size. A
    # program fences once per chunk, after its last piece of it, and adds its piece count to the
    # chunk's counter; the program that completes the count (and leaves it at zero) releases the
    # chunk's flag to every peer.
    k_pieces = tl.cdiv(K, CP_K)
    pieces = tl.cdiv(CHUNK_M, CP_M) * k_pieces
    for c in range(0, n_chunks):
        first = (pid - (c * pieces) % COMM_SMS + COMM_SMS) % COMM_SMS
        for q in range(first, pieces, COMM_SMS):
            rows = c * CHUNK_M + (q // k_pieces) * CP_M + tl.arange(0, CP_M)
            ks = (q % k_pieces) * CP_K + tl.arange(0, CP_K)
            mask = (rows[:, None] < tl.minimum(c * CHUNK_M + CHUNK_M, R)) & (ks[None, :] < K)
            x = tl.load(a_ptr + rows[:, None].to(tl.int64) * K + ks[None, :], mask=mask)
            dst = inbox_ptr + rank.to(tl.int64) * slot + rows[:, None].to(tl.int64) * K + ks[None, :]
            for j in range(1 - GATHER_LOCAL, WORLD):
                peer = (rank + j) % WORLD
                delta = (tl.load(inbox_deltas_ptr + peer) // 16) * 16
                tl.store(dst + delta, x, mask=mask)
        mine = tl.cdiv(pieces - first, COMM_SMS)
        if mine > 0:
            _thread_fence(fence_ptr, pid, THREADS, FENCE)
            tl.debug_barrier()
            done = tl.atomic_add(done_ptr + c, mine, sem="acq_rel", scope="sys")
            if done + mine == pieces:
                tl.store(done_ptr + c, 0)
                for j in range(1, WORLD):
                    peer = (rank + j) % WORLD
                    flags = tl.load(flag_ptrs_ptr + peer).to(tl.pointer_type(tl.int32))
                    tl.atomic_xchg(flags + rank * n_chunks + c, epoch, sem="release", scope="sys")


@triton.jit
def _wait_rows(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M: tl.constexpr):
    # ---- consumer: acquire every remote chunk that rows [row_first, row_last] read ----
    for p in range(row_first // R, row_last // R + 1):
        if p != rank:
            lo = tl.maximum(row_first, p * R) - p * R
            hi = tl.minimum(row_last, p * R + R - 1) - p * R
            for c in range(lo // CHUNK_M, hi // CHUNK_M + 1):
                flag = flags_ptr + p * n_chunks + c
                while tl.atomic_add(flag, 0, sem="acquire", scope="sys") < epoch:
                    pass


# Call-varying integers stay runtime values: Triton would otherwise compile anew for 1 vs not-1.
@triton.jit(do_not_specialize=["row_lo", "rank", "epoch", "n_chunks", "shift", "num_consumers", "pid_base"])
def ag_gemm_kernel(
    a_ptr,
    src_ptr,
    deltas_ptr,
    b_ptr,
    c_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    flags_ptr,
    flag_ptrs_ptr,
    tickets_ptr,
    ws_ptr,
    counts_ptr,
    done_ptr,
    fence_ptr,
    N,
    K,
    R,
    slot,
    row_lo,
    rows,
    rank,
    epoch,
    n_chunks,
    shift,
    num_consumers,
    pid_base,
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
    COMM_SMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    WAIT: tl.constexpr,
    GATHER_LOCAL: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
    DYNAMIC: tl.constexpr,
    PRODUCERS_CONSUME: tl.constexpr,
    UPCAST: tl.constexpr,
    THREADS: tl.constexpr,
    FENCE: tl.constexpr,
):
    pid = tl.program_id(0) + pid_base
    if COMM_SMS > 0:  # noqa: SIM102 (constexpr: without push no producer code at all, not even dead)
        if pid < COMM_SMS:
            _push_chunks(
                a_ptr, inbox_ptr, inbox_deltas_ptr, flag_ptrs_ptr, done_ptr, fence_ptr, pid, K, R, slot, rank, epoch,
                n_chunks, WORLD, COMM_SMS, CHUNK_M, GATHER_LOCAL, CP_M, CP_K, THREADS, FENCE,
            )  # fmt: skip
    if (pid >= COMM_SMS) or PRODUCERS_CONSUME:
        # ---- consumer: GEMM tiles over the gathered rows [row_lo, row_lo + rows) ----
        # DYNAMIC: tiles are taken from a ticket counter, so programs that finished pushing (or
        # waited less) take the next tile; else a static round-robin over `num_consumers` programs.
        num_pid_m = tl.cdiv(rows, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_work = num_pid_m * num_pid_n * SPLIT_K
        k_blocks = tl.cdiv(K, BLOCK_K)
        k_per_split = tl.cdiv(k_blocks, SPLIT_K)
        row_end = row_lo + rows
        if DYNAMIC:
            work = tl.atomic_add(tickets_ptr, 1)
        else:
            work = pid - COMM_SMS
        while work < num_work:
            # work item = (tile, split); the splits of a tile are neighbours, so they run together
            tile = work // SPLIT_K
            split = work % SPLIT_K
            group_size = GROUP_M * num_pid_n
            group = tile // group_size
            first_m = group * GROUP_M
            group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
            pid_m = first_m + (tile % group_size) % group_m
            pid_n = (tile % group_size) // group_m
            pid_m = (pid_m + shift) % num_pid_m

            offs_m = row_lo + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mmask = offs_m < row_end
            nmask = offs_n < N
            owner = offs_m // R
            local_row = (offs_m - owner * R).to(tl.int64) * K
            delta = (tl.load(deltas_ptr + owner, mask=mmask, other=0) // 16) * 16
            a_rows = tl.where(owner == rank, a_ptr + local_row, src_ptr + delta + local_row)
            if WAIT:
                row_first = row_lo + pid_m * BLOCK_M
                row_last = tl.minimum(row_first + BLOCK_M, row_end) - 1
                _wait_rows(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M)
                tl.debug_barrier()
                if (row_first // R != rank) | (row_last // R != rank):  # tiles of my own rows waited on nothing
                    _thread_fence(fence_ptr, pid, THREADS, FENCE)

            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            kb_lo = split * k_per_split
            kb_hi = tl.minimum(kb_lo + k_per_split, k_blocks)
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
            c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
            if SPLIT_K == 1:
                tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
            else:
                # ---- split-K: add into the tile's fp32 slot; the last split to arrive stores C and
                # leaves slot and counter at zero for the next call (no per-call clearing) ----
                in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                slot_ptrs = ws_ptr + tile.to(tl.int64) * (BLOCK_M * BLOCK_N) + in_tile
                # acq_rel per thread: each add is performed at GPU scope before its thread reaches the
                # barrier (as a per-thread fence would), so the counter orders every warp's adds
                tl.atomic_add(slot_ptrs, acc, sem="acq_rel")
                tl.debug_barrier()
                arrived = tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel")
                if arrived == SPLIT_K - 1:
                    zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    total = tl.atomic_add(slot_ptrs, zeros, sem="acquire")
                    tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
                    tl.store(slot_ptrs, zeros)
                    tl.store(counts_ptr + tile, 0)
            if DYNAMIC:
                work = tl.atomic_add(tickets_ptr, 1)
            else:
                work += num_consumers


# ---- push_cublas: the push as its own kernel, so cuBLAS can do the multiplying ----


@triton.jit(do_not_specialize=["rank", "epoch", "n_chunks"])
def ag_push_kernel(
    a_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    flag_ptrs_ptr,
    flags_ptr,
    done_ptr,
    fence_ptr,
    K,
    R,
    slot,
    rank,
    epoch,
    n_chunks,
    WORLD: tl.constexpr,
    COMM_SMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    GATHER_LOCAL: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
    THREADS: tl.constexpr,
    FENCE: tl.constexpr,
    WAIT_ALL: tl.constexpr,
):
    # COMM_SMS programs, the fused kernel's producers alone. Pushing waits on nothing, so every
    # rank's push finishes whatever else holds its GPU. WAIT_ALL (a GPU world's gather-then-GEMM):
    # program 0 then also waits for every peer's rows, so the next kernel on the stream (cuBLAS)
    # reads them without a separate wait launch. The interpreter runs one rank's launch to its end
    # before the next rank's starts, so there the wait is a kernel of its own, after every push.
    pid = tl.program_id(0)
    _push_chunks(
        a_ptr, inbox_ptr, inbox_deltas_ptr, flag_ptrs_ptr, done_ptr, fence_ptr, pid, K, R, slot, rank, epoch,
        n_chunks, WORLD, COMM_SMS, CHUNK_M, GATHER_LOCAL, CP_M, CP_K, THREADS, FENCE,
    )  # fmt: skip
    if WAIT_ALL:  # noqa: SIM102 (constexpr: without it no wait code at all)
        if pid == 0:
            _wait_rows(flags_ptr, 0, R * WORLD - 1, R, rank, epoch, n_chunks, CHUNK_M)


@triton.jit(do_not_specialize=["rank", "epoch", "n_chunks", "chunk", "R"])
def ag_signal_kernel(
    flag_ptrs_ptr, flags_ptr, rank, epoch, n_chunks, chunk, R, WORLD: tl.constexpr, WAIT_ALL: tl.constexpr,
    CHUNK_M: tl.constexpr,
):  # fmt: skip
    # Queued behind the copy engine's copies of `chunk` into every peer: stream order puts them
    # before this kernel, the system-scope release publishes them with the flag. WAIT_ALL: then
    # wait for every peer's rows, as in ag_push_kernel.
    for j in range(1, WORLD):
        peer = (rank + j) % WORLD
        flags = tl.load(flag_ptrs_ptr + peer).to(tl.pointer_type(tl.int32))
        tl.atomic_xchg(flags + rank * n_chunks + chunk, epoch, sem="release", scope="sys")
    if WAIT_ALL:
        _wait_rows(flags_ptr, 0, R * WORLD - 1, R, rank, epoch, n_chunks, CHUNK_M)


@triton.jit(do_not_specialize=["row_first", "row_last", "R", "rank", "epoch", "n_chunks"])
def ag_wait_kernel(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M: tl.constexpr):
    # One program: the stream's next kernel (cuBLAS) starts only once every remote chunk that
    # global rows [row_first, row_last] read has been released to this rank.
    _wait_rows(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M)


INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def compile_options(config: dict) -> dict:
    """Launch options Triton takes beside the kernel arguments."""
    return {"num_warps": int(config.get("num_warps", 4)), "num_stages": int(config.get("num_stages", 3))}


__all__ = ["ag_gemm_kernel", "ag_push_kernel", "ag_signal_kernel", "ag_wait_kernel", "compile_options", "triton"]
