"""The fused All-Gather+GEMM kernel behind the pull, push and copy-engine (Triton consumer) modes.

Rows this rank owns come from `a_ptr`; rows of other ranks through a table of element offsets, one
per owning rank, relative to `src_ptr`: peers' symmetric buffers (pull), or this rank's inbox that
peers pushed into (push). The table depends only on buffer addresses, so a plan builds it once.
Offsets are rounded `// 16 * 16` in the kernel, a no-op on the 16-element-aligned buffers we hand in
(checked on the host) that lets the compiler keep 16-byte vector loads.

Program ids below `COMM_SMS` are producers (push only): they push this rank's rows chunk by chunk into
every peer's inbox (`push_rows`, a flag per chunk). The other programs, and the producers once they
are done, are a persistent GEMM taking tiles from a ticket counter, in an order rotated so each rank
starts on its own rows; under push a tile acquire-waits on the flags of the remote chunks it reads.
Producers wait on nothing before they finish pushing, and the grid is no larger than the SM count,
so every producer is resident and every wait ends: deadlock-free by construction.

Under push the call's epoch comes from the device (`call_epoch`), the inbox half from its parity, and
the launch's last program publishes it once every program read it (`open_call`, `publish_call`); the last
program to take a ticket hands the counter back at zero. Nothing a later call needs is set by the host.

With SPLIT_K > 1 a tile's K loop is split over SPLIT_K work items that meet in the tile's workspace slot
(`tiles.merge_split_k`); the last to arrive writes C. Small M needs that parallelism: without it a few
dozen tiles with long K loops leave most SMs idle.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.signals import call_epoch_and_half, open_call, publish_call, push_rows, wait_chunks
from jointtune.kernels.runtime.tiles import grouped_tile, split_product


@triton.jit
def _wait_rows(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M: tl.constexpr):
    # acquire every remote chunk that gathered rows [row_first, row_last] read
    for p in range(row_first // R, row_last // R + 1):
        lo = tl.maximum(row_first, p * R) - p * R
        hi = tl.minimum(row_last, p * R + R - 1) - p * R
        wait_chunks(flags_ptr, epoch, rank, n_chunks, p, p, lo // CHUNK_M, hi // CHUNK_M)


# Integers that may be 1 stay runtime values: Triton would otherwise compile anew for 1 vs not-1.
@triton.jit(do_not_specialize=["row_lo", "rank", "n_chunks", "shift", "num_consumers", "pid_base", "ticket_takers",
                               "num_programs"])  # fmt: skip
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
    state_ptr,
    N,
    K,
    R,
    slot,
    half_stride,
    row_lo,
    rows,
    rank,
    n_chunks,
    shift,
    num_consumers,
    pid_base,
    ticket_takers,
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
    COMM_SMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    WAIT: tl.constexpr,
    OWN: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
    DYNAMIC: tl.constexpr,
    PRODUCERS_CONSUME: tl.constexpr,
    UPCAST: tl.constexpr,
    EPOCH: tl.constexpr,
):
    pid = tl.program_id(0) + pid_base
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    if COMM_SMS > 0:  # noqa: SIM102 (constexpr: without push no producer code at all, not even dead)
        if pid < COMM_SMS:
            push_rows(
                a_ptr, inbox_ptr + half, inbox_deltas_ptr, inbox_ptr + half + rank.to(tl.int64) * slot, flag_ptrs_ptr,
                done_ptr, pid, K, R, slot, rank, epoch, n_chunks, WORLD, COMM_SMS, CHUNK_M, OWN, CP_M, CP_K,
            )  # fmt: skip
    if (pid >= COMM_SMS) or PRODUCERS_CONSUME:
        # ---- consumer: GEMM tiles over the gathered rows [row_lo, row_lo + rows) ----
        # DYNAMIC: tiles are taken from a ticket counter, so programs that finished pushing (or
        # waited less) take the next tile; else a static round-robin over `num_consumers` programs.
        num_pid_m = tl.cdiv(rows, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_work = num_pid_m * num_pid_n * SPLIT_K
        row_end = row_lo + rows
        if DYNAMIC:
            work = tl.atomic_add(tickets_ptr, 1, sem="relaxed")  # a work counter, no handoff
        else:
            work = pid - COMM_SMS
        while work < num_work:
            # work item = (tile, split); the splits of a tile are neighbours, so they run together
            tile = work // SPLIT_K
            split = work % SPLIT_K
            pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            pid_m = (pid_m + shift) % num_pid_m

            offs_m = row_lo + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mmask = offs_m < row_end
            nmask = offs_n < N
            owner = offs_m // R
            local_row = (offs_m - owner * R).to(tl.int64) * K
            delta = (tl.load(deltas_ptr + owner, mask=mmask, other=0) // 16) * 16
            a_rows = tl.where(owner == rank, a_ptr + local_row, src_ptr + half + delta + local_row)
            if WAIT:
                row_first = row_lo + pid_m * BLOCK_M
                row_last = tl.minimum(row_first + BLOCK_M, row_end) - 1
                _wait_rows(flags_ptr, row_first, row_last, R, rank, epoch, n_chunks, CHUNK_M)

            # the tile's splits meet in its workspace slot; the last one stores C
            acc, finished = split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, split, ws_ptr, counts_ptr, tile,
                                          stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, UPCAST)  # fmt: skip
            if finished:
                c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
                tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
            if DYNAMIC:
                work = tl.atomic_add(tickets_ptr, 1, sem="relaxed")  # a work counter, no handoff
            else:
                work += num_consumers
        if DYNAMIC:  # noqa: SIM102 (constexpr)
            # Each taker's last ticket is >= num_work; the one that took the very last hands the counter
            # back at zero for the next call (nobody takes a ticket after it).
            if work == num_work + ticket_takers - 1:
                tl.store(tickets_ptr, 0)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, num_programs)


__all__ = ["ag_gemm_kernel", "triton"]
