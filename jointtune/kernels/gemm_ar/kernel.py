"""The fused GEMM + All-Reduce kernel: one launch produces this rank's partial tile by tile, exchanges it, sums every
rank's partials in rank order and (optionally) adds the residual and applies RMSNorm.

Three phases, each a constexpr switch, so one launch runs them all where ranks run at once, and a world whose ranks
launch one after another runs them as three launches per rank (every rank's first before any rank's second):

- produce (PRODUCE 1: the tile GEMM, split-K merged in the tiles' workspace; 2: tiles copied out of a partial cuBLAS
  wrote earlier on the stream). A finished tile, rounded once to the input dtype, goes where its readers find it
  (`send`): push puts it into every reader's inbox (one-shot: every rank, slot `rank`; two-shot: each row's owner),
  pull into this rank's own buffer. Consecutive tiles (TILES_PER_FLAG, in tile order) share a flag; the tile that
  completes the count releases it to every reader, at system scope, carrying the call's epoch. Copied tiles with a
  flag each are flagged together once their program has sent them all. Compiled, a release to W readers is one
  system-scope fence and W relaxed flag writes (`runtime.signals.release_ranks`). LL (`transport="ll"`): the tile goes
  out as 64-bit words, two values and the call's tag each (`runtime.ll`), to every rank (one-shot) or its rows to their
  owners (two-shot), and nothing is flagged.
  Producing never waits.
- reduce: this rank's items (one-shot: every row; two-shot: the rows it owns) wait for the flags of every source's tiles
  under them (LL: for every source's words under them to carry the call's tag), then sum the W sources in rank order in
  float32 (this rank's own partial read back as rounded, so every rank adds the same values in the same order:
  bit-identical outputs), add the residual, store. With NORM an item is one whole row: pass 1 sums, stores the new
  residual h (rounded) and accumulates h^2; pass 2 scales. In two-shot the owner also hands each item to the other
  ranks (the reduced rows; with NORM the rows of h and their 1/rms, float32) and releases the item's gather flag;
  with LL it hands them out as words (1/rms as one word of its float32 bits) and releases nothing.
- gather (two-shot): every item another rank owns, once its gather flag is in (LL: once its words carry the call's
  tag), is copied into the outputs (with NORM: normed = h * 1/rms * weight, computed from the owner's h and 1/rms, so
  every rank gets the owner's bits).

Who waits on whom: producing waits on nothing; a reduce item waits on produced tiles only; a gather item on reduce
items only. Programs take their work in that order (the GEMM programs' reduce after their last tile, or `comm`
programs beside them), and the grid is at most one program per SM, so every program is resident and every wait ends:
deadlock-free by construction. Like every fused launch here, it assumes its grid gets the SMs it asks for.

Halves: every buffer a call writes into alternates halves by the parity of the device epoch, so a rank writes call
e + 2's data into a half only after its call e + 1 waited on each rank it writes to (one-shot: every rank's tiles;
two-shot: the owners' tiles it sums, or their reduced rows it copies), which that rank produced after finishing
its reads of call e. Flags carry epochs and are never reset; flag (writer p, index i) sits at p * flag_stride + i of
the reader's flag buffer and has one writer in every plan that shares the buffer.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.gemm_ar.exchange import finish_tile, release_tiles, send, send_ll, wait_sources
from jointtune.kernels.gemm_ar.reduce import gather_block_ll, gather_row, gather_row_ll, reduce_block, reduce_row
from jointtune.kernels.runtime.signals import call_epoch, open_call, publish_call, release_ranks, wait_flag
from jointtune.kernels.runtime.tiles import grouped_tile, split_product

# ---- the kernel -------------------------------------------------------------------------------------------------


# Integers that may be 1 stay runtime values: Triton would otherwise compile anew for 1 vs not-1 (per rank, too).
@triton.jit(do_not_specialize=["rank", "rows_per_owner", "flag_stride", "n_chunks", "n_items", "produce_programs",
                               "comm_lo", "comm_programs", "num_programs", "pid_base"])  # fmt: skip
def gemm_ar_kernel(
    a_ptr,
    b_ptr,
    part_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    hout_ptr,
    send_ptr,
    send_deltas_ptr,
    recv_ptr,
    recv_deltas_ptr,
    gat_ptr,
    gat_deltas_ptr,
    rms_ptr,
    rms_deltas_ptr,
    flags_ptr,
    flag_ptrs_ptr,
    done_ptr,
    state_ptr,
    ws_ptr,
    counts_ptr,
    M,
    N,
    K,
    eps,
    half_stride,
    ghalf_stride,
    rhalf_stride,
    rank,
    rows_per_owner,
    flag_stride,
    n_chunks,
    n_items,
    produce_programs,
    comm_lo,
    comm_programs,
    num_programs,
    pid_base,
    stride_am,
    stride_bk,
    stride_bn,
    WORLD: tl.constexpr,
    WORLD_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    TILES_PER_FLAG: tl.constexpr,
    PRODUCE: tl.constexpr,
    REDUCE: tl.constexpr,
    GATHER: tl.constexpr,
    TWO_SHOT: tl.constexpr,
    PUSH: tl.constexpr,
    LL: tl.constexpr,
    RESIDUAL: tl.constexpr,
    NORM: tl.constexpr,
    RED_M: tl.constexpr,
    RED_N: tl.constexpr,
    WAIT_C: tl.constexpr,
    UPCAST: tl.constexpr,
    EPOCH: tl.constexpr,
):
    pid = tl.program_id(0) + pid_base
    epoch = call_epoch(state_ptr, EPOCH)
    parity = epoch % 2
    half = parity * half_stride
    tag = epoch.to(tl.int64) & 0xFFFFFFFF  # LL words carry it (`runtime.ll.ll_tag`)
    if EPOCH == 1:
        open_call(state_ptr)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tiles_m * tiles_n
    # this rank's rows: every row (one-shot), or the rows it owns (two-shot)
    row_lo = 0
    row_hi = M
    if TWO_SHOT:
        row_lo = tl.minimum(M, rank * rows_per_owner)
        row_hi = tl.minimum(M, row_lo + rows_per_owner)
    recv_row0 = 0
    if TWO_SHOT and PUSH:  # an owner's inbox slots start at its first row
        recv_row0 = row_lo
    col_blocks = tl.cdiv(N, RED_N)
    # copied tiles, a flag each: a program sends all its tiles, then releases their flags at once
    BATCHED: tl.constexpr = PRODUCE == 2 and TILES_PER_FLAG == 1 and not LL
    if PRODUCE > 0:  # noqa: SIM102 (constexpr)
        # ---- produce: tiles of the partial, each sent to its readers, a flag per TILES_PER_FLAG of them ----
        if pid < produce_programs:
            for work in range(pid, n_tiles * SPLIT_K, produce_programs):
                tile = work // SPLIT_K
                pm, pn = grouped_tile(tile, tiles_m, tiles_n, GROUP_M)
                offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
                offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
                mmask = offs_m < M
                nmask = offs_n < N
                if PRODUCE == 1:  # the tile GEMM; a tile's splits meet in its workspace slot, the last has the sum
                    a_rows = a_ptr + offs_m.to(tl.int64) * stride_am
                    acc, finished = split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, work % SPLIT_K, ws_ptr,
                                                  counts_ptr, tile, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
                                                  SPLIT_K, UPCAST)  # fmt: skip
                else:  # a tile of the partial cuBLAS wrote
                    at = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
                    acc = tl.load(part_ptr + at, mask=mmask[:, None] & nmask[None, :], other=0.0)
                    finished = True
                first_row = pm * BLOCK_M
                last_row = tl.minimum(M, first_row + BLOCK_M) - 1
                if finished and LL:  # words that carry their flag: nothing to count or release
                    send_ll(acc.to(a_ptr.dtype.element_ty), pm, pn, M, N, send_ptr, send_deltas_ptr, half, rank, tag,
                            rows_per_owner, first_row, last_row, WORLD, TWO_SHOT, BLOCK_M, BLOCK_N)  # fmt: skip
                elif finished:
                    send(acc.to(send_ptr.dtype.element_ty), offs_m, offs_n, mmask, nmask, send_ptr,
                          send_deltas_ptr, half, N, rank, rows_per_owner, first_row, last_row, WORLD, TWO_SHOT,
                          PUSH)  # fmt: skip
                    if not BATCHED:
                        finish_tile(tile, done_ptr, flag_ptrs_ptr, epoch, rank, flag_stride, n_tiles, tiles_m,
                                     tiles_n, M, rows_per_owner, first_row, last_row, WORLD, BLOCK_M, GROUP_M,
                                     TILES_PER_FLAG, TWO_SHOT)  # fmt: skip
            if BATCHED:
                release_tiles(pid, produce_programs, n_tiles, flag_ptrs_ptr, epoch, rank, flag_stride, tiles_m,
                               tiles_n, M, rows_per_owner, WORLD, BLOCK_M, GROUP_M, TWO_SHOT)  # fmt: skip
    if REDUCE:  # noqa: SIM102 (constexpr)
        # ---- reduce: this rank's rows, item by item, once every source's tiles under the item are in ----
        if pid >= comm_lo:
            cid = pid - comm_lo
            if NORM:  # an item is one whole row
                for i in range(cid, row_hi - row_lo, comm_programs):
                    m = row_lo + i
                    if not LL:
                        wait_sources(flags_ptr, flag_stride, m // BLOCK_M, 0, tiles_n - 1, tiles_m, tiles_n, epoch,
                                      WORLD, WORLD_P2, WAIT_C, GROUP_M, TILES_PER_FLAG)  # fmt: skip
                    reduce_row(m, N, eps, recv_ptr, recv_deltas_ptr, half, recv_row0, res_ptr, w_ptr, out_ptr,
                                hout_ptr, gat_ptr, gat_deltas_ptr, parity * ghalf_stride, rms_ptr, rms_deltas_ptr,
                                parity * rhalf_stride, flag_ptrs_ptr, rank * flag_stride + n_chunks + i, epoch, tag,
                                rank, WORLD, RED_N, RESIDUAL, TWO_SHOT, PUSH, LL)  # fmt: skip
            else:  # an item is [RED_M, RED_N] inside one row tile
                kr_lo = row_lo // RED_M
                row_blocks = tl.where(row_hi > row_lo, (row_hi - 1) // RED_M - kr_lo + 1, 0)
                for i in range(cid, row_blocks * col_blocks, comm_programs):
                    kr = kr_lo + i // col_blocks
                    kc = i % col_blocks
                    pn_lo = (kc * RED_N) // BLOCK_N
                    pn_hi = (tl.minimum(N, kc * RED_N + RED_N) - 1) // BLOCK_N
                    if not LL:
                        wait_sources(flags_ptr, flag_stride, (kr * RED_M) // BLOCK_M, pn_lo, pn_hi, tiles_m, tiles_n,
                                      epoch, WORLD, WORLD_P2, WAIT_C, GROUP_M, TILES_PER_FLAG)  # fmt: skip
                    reduce_block(kr, kc, M, N, row_lo, row_hi, recv_ptr, recv_deltas_ptr, half, recv_row0, res_ptr,
                                  out_ptr, gat_ptr, gat_deltas_ptr, parity * ghalf_stride, rank, tag, WORLD, RED_M,
                                  RED_N, RESIDUAL, TWO_SHOT, PUSH, LL)  # fmt: skip
                    if TWO_SHOT and not LL:
                        item_flag = rank * flag_stride + n_chunks + i
                        release_ranks(flag_ptrs_ptr, item_flag, epoch, 0, WORLD - 1, rank)
    if GATHER:  # noqa: SIM102 (constexpr)
        # ---- gather (two-shot): every item another rank owns, once the owner released it (LL: once its words carry
        # the call's tag) ----
        if pid >= comm_lo:
            cid = pid - comm_lo
            ghalf = parity * ghalf_stride
            for w in range(cid, WORLD * n_items, comm_programs):
                o = w // n_items
                i = w % n_items
                o_lo = tl.minimum(M, o * rows_per_owner)
                o_hi = tl.minimum(M, o_lo + rows_per_owner)
                if NORM:
                    count = o_hi - o_lo
                else:
                    count = tl.where(o_hi > o_lo, ((o_hi - 1) // RED_M - o_lo // RED_M + 1) * col_blocks, 0)
                if (o != rank) & (i < count):
                    if LL:  # the owner's words, each read once it carries the call's tag
                        if NORM:
                            gather_row_ll(o_lo + i, N, gat_ptr + ghalf, rms_ptr + parity * rhalf_stride, w_ptr,
                                          out_ptr, hout_ptr, tag, RED_N)  # fmt: skip
                        else:
                            gather_block_ll(o_lo // RED_M + i // col_blocks, i % col_blocks, o_lo, o_hi, N,
                                            gat_ptr + ghalf, out_ptr, tag, RED_M, RED_N)  # fmt: skip
                    else:
                        wait_flag(flags_ptr + o * flag_stride + n_chunks + i, epoch)
                        src = gat_ptr + ghalf
                        if not PUSH:
                            src += (tl.load(gat_deltas_ptr + o) // 16) * 16
                        if NORM:
                            m = o_lo + i
                            inv_at = rms_ptr + parity * rhalf_stride + m
                            if not PUSH:
                                inv_at += (tl.load(rms_deltas_ptr + o) // 16) * 16
                            gather_row(m, N, src, tl.load(inv_at), w_ptr, out_ptr, hout_ptr, RED_N)
                        else:
                            kr = o_lo // RED_M + i // col_blocks
                            rws = kr * RED_M + tl.arange(0, RED_M)
                            cols = (i % col_blocks) * RED_N + tl.arange(0, RED_N)
                            mask = ((rws >= o_lo) & (rws < o_hi))[:, None] & (cols < N)[None, :]
                            at = rws.to(tl.int64)[:, None] * N + cols[None, :]
                            tl.store(out_ptr + at, tl.load(src + at, mask=mask, other=0.0), mask=mask)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, num_programs)


__all__ = ["gemm_ar_kernel", "triton"]
