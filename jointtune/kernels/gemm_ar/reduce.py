"""The reduce and gather side of `gemm_ar_kernel` (its module doc says how the pieces fit): summing every rank's
partial in rank order, the residual + RMSNorm epilogue on whole rows, and an owner's rows handed to the others."""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_data, ll_pack16, ll_store, ll_unpack16, ll_wait, ll_word
from jointtune.kernels.runtime.signals import release_ranks

# ---- reduce and gather ------------------------------------------------------------------------------------------
# Loops over sources are written out in each function rather than in a helper: the CPU interpreter pays about a
# millisecond per call of a jitted helper, and these run once per item.


@triton.jit
def _hand_out(val, offs, mask, dest_ptr, dest_deltas_ptr, half, rank, WORLD: tl.constexpr, PUSH: tl.constexpr):
    # an owner's reduced values to the other ranks: into each one's buffer (push) or its own for them to read (pull)
    if PUSH:
        for j in range(1, WORLD):
            delta = (tl.load(dest_deltas_ptr + (rank + j) % WORLD) // 16) * 16
            tl.store(dest_ptr + half + delta + offs, val, mask=mask)
    else:
        tl.store(dest_ptr + half + offs, val, mask=mask)


@triton.jit
def _hand_out_ll(val, rows, wcols, wmask, N, dest_ptr, dest_deltas_ptr, half, rank, tag, WORLD: tl.constexpr,
                 ROWS: tl.constexpr, COLS: tl.constexpr):  # fmt: skip
    # an owner's reduced [ROWS, COLS] values (two-shot, LL) to the other ranks as words at their rows (`runtime.ll`),
    # into each one's buffer at exact offsets: nothing to release after
    words = ll_pack16(val, tag, ROWS, COLS)
    at = rows.to(tl.int64)[:, None] * ((N + 1) // 2) + wcols[None, :]
    for j in range(1, WORLD):
        ll_store(dest_ptr + half + tl.load(dest_deltas_ptr + (rank + j) % WORLD) + at, words, wmask)


@triton.jit
def reduce_block(kr, kc, M, N, row_lo, row_hi, recv_ptr, recv_deltas_ptr, half, recv_row0, res_ptr, out_ptr, gat_ptr,
                  gat_deltas_ptr, ghalf, rank, tag, WORLD: tl.constexpr, RED_M: tl.constexpr, RED_N: tl.constexpr,
                  RESIDUAL: tl.constexpr, TWO_SHOT: tl.constexpr, PUSH: tl.constexpr,
                  LL: tl.constexpr):  # fmt: skip
    # rows [kr * RED_M, +RED_M) within [row_lo, row_hi), columns [kc * RED_N, +RED_N): summed, stored, handed out.
    # LL: every source's words of the block, each read once it carries the call's `tag` (no flags); in two-shot the
    # sum goes out as words too.
    rws = kr * RED_M + tl.arange(0, RED_M)
    cols = kc * RED_N + tl.arange(0, RED_N)
    rmask = (rws >= row_lo) & (rws < row_hi)
    mask = rmask[:, None] & (cols < N)[None, :]
    at = rws.to(tl.int64)[:, None] * N + cols[None, :]
    row_words = (N + 1) // 2
    wcols = kc * (RED_N // 2) + tl.arange(0, RED_N // 2)
    wmask = rmask[:, None] & (wcols < row_words)[None, :]
    total = tl.zeros((RED_M, RED_N), dtype=tl.float32)
    if LL:
        wat = (rws - recv_row0).to(tl.int64)[:, None] * row_words + wcols[None, :]
        for s in range(0, WORLD):  # every rank's partial, in rank order
            delta = (tl.load(recv_deltas_ptr + s) // 16) * 16
            words = ll_wait(recv_ptr + half + delta + wat, wmask, tag)
            total += ll_unpack16(words, RED_M, RED_N, out_ptr.dtype.element_ty).to(tl.float32)
    else:
        for s in range(0, WORLD):  # every rank's partial, in rank order
            delta = (tl.load(recv_deltas_ptr + s) // 16) * 16
            total += tl.load(recv_ptr + half + delta - recv_row0 * N + at, mask=mask, other=0.0).to(tl.float32)
    if RESIDUAL:
        total += tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
    val = total.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + at, val, mask=mask)
    if TWO_SHOT and LL:
        _hand_out_ll(val, rws, wcols, wmask, N, gat_ptr, gat_deltas_ptr, ghalf, rank, tag, WORLD, RED_M, RED_N)
    elif TWO_SHOT:
        _hand_out(val, at, mask, gat_ptr, gat_deltas_ptr, ghalf, rank, WORLD, PUSH)


@triton.jit
def reduce_row(m, N, eps, recv_ptr, recv_deltas_ptr, half, recv_row0, res_ptr, w_ptr, out_ptr, hout_ptr, gat_ptr,
                gat_deltas_ptr, ghalf, rms_ptr, rms_deltas_ptr, rhalf, flag_ptrs_ptr, flag_index, epoch, tag, rank,
                WORLD: tl.constexpr, RED_N: tl.constexpr, RESIDUAL: tl.constexpr, TWO_SHOT: tl.constexpr,
                PUSH: tl.constexpr, LL: tl.constexpr):  # fmt: skip
    # One whole row with the RMSNorm epilogue: pass 1 sums every source (+ residual) into h, stored rounded (the new
    # residual, and the value normalised: what the next layer reads), and accumulates h^2; pass 2 scales by 1/rms and
    # the weight. Two-shot: h and 1/rms go to the other ranks, and the item's flag, before pass 2. LL: the sources'
    # words of the row, each read once it carries the call's tag (`reduce_block`); in two-shot h goes out as words and
    # 1/rms as one word (its float32 bits), with no flag.
    row = m.to(tl.int64) * N
    row_words = (N + 1) // 2
    sq = tl.zeros((RED_N,), dtype=tl.float32)
    for c0 in range(0, N, RED_N):
        cols = c0 + tl.arange(0, RED_N)
        mask = cols < N
        total = tl.zeros((RED_N,), dtype=tl.float32)
        if LL:
            wcols = c0 // 2 + tl.arange(0, RED_N // 2)
            wmask = (wcols < row_words)[None, :]
            wat = (m - recv_row0).to(tl.int64) * row_words + wcols[None, :]
            for s in range(0, WORLD):  # every rank's partial, in rank order
                delta = (tl.load(recv_deltas_ptr + s) // 16) * 16
                words = ll_wait(recv_ptr + half + delta + wat, wmask, tag)
                vals = ll_unpack16(words, 1, RED_N, hout_ptr.dtype.element_ty)
                total += tl.reshape(vals, (RED_N,)).to(tl.float32)
        else:
            for s in range(0, WORLD):  # every rank's partial, in rank order
                delta = (tl.load(recv_deltas_ptr + s) // 16) * 16
                total += tl.load(recv_ptr + half + delta - recv_row0 * N + row + cols, mask=mask,
                                 other=0.0).to(tl.float32)  # fmt: skip
        if RESIDUAL:
            total += tl.load(res_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        h = total.to(hout_ptr.dtype.element_ty)
        tl.store(hout_ptr + row + cols, h, mask=mask)
        if TWO_SHOT and LL:  # the step's words, as its sources' (wcols, wmask)
            _hand_out_ll(tl.reshape(h, (1, RED_N)), tl.zeros((1,), tl.int32) + m, wcols, wmask, N, gat_ptr,
                         gat_deltas_ptr, ghalf, rank, tag, WORLD, 1, RED_N)  # fmt: skip
        elif TWO_SHOT:
            _hand_out(h, row + cols, mask, gat_ptr, gat_deltas_ptr, ghalf, rank, WORLD, PUSH)
        hf = h.to(tl.float32)
        sq += hf * hf
    inv = tl.rsqrt(tl.sum(sq, axis=0) / N + eps)
    if TWO_SHOT and LL:  # 1/rms as one word (a vector of two, the second masked off)
        pair = tl.arange(0, 2)
        inv_words = ll_word(tl.zeros((2,), tl.int32) + inv.to(tl.int32, bitcast=True), tag)
        for j in range(1, WORLD):
            ll_store(rms_ptr + rhalf + tl.load(rms_deltas_ptr + (rank + j) % WORLD) + m + pair, inv_words, pair < 1)
    elif TWO_SHOT:
        if PUSH:
            for j in range(1, WORLD):
                delta = (tl.load(rms_deltas_ptr + (rank + j) % WORLD) // 16) * 16
                tl.store(rms_ptr + rhalf + delta + m, inv)
        else:
            tl.store(rms_ptr + rhalf + m, inv)
        release_ranks(flag_ptrs_ptr, flag_index, epoch, 0, WORLD - 1, rank)
    tl.debug_barrier()  # pass 2 reads the h every thread stored
    for c0 in range(0, N, RED_N):  # normed = h * 1/rms * weight, rounded once
        cols = c0 + tl.arange(0, RED_N)
        mask = cols < N
        hf = tl.load(hout_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + cols, (hf * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gather_row(m, N, src_ptr, inv, w_ptr, out_ptr, hout_ptr, RED_N: tl.constexpr):
    # a row another rank owns: its h (the new residual) copied, and normed from it with the owner's 1/rms
    row = m.to(tl.int64) * N
    for c0 in range(0, N, RED_N):
        cols = c0 + tl.arange(0, RED_N)
        mask = cols < N
        h = tl.load(src_ptr + row + cols, mask=mask, other=0.0)
        tl.store(hout_ptr + row + cols, h, mask=mask)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + cols, (h.to(tl.float32) * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gather_row_ll(m, N, src_ptr, inv_ptr, w_ptr, out_ptr, hout_ptr, tag, RED_N: tl.constexpr):
    # `gather_row` from the owner's words (two-shot, LL): its 1/rms word, then each step's words of h, each read once
    # it carries the call's tag
    pair = tl.arange(0, 2)
    inv_bits = tl.sum(tl.where(pair < 1, ll_data(ll_wait(inv_ptr + m + pair, pair < 1, tag)), 0), axis=0)
    inv = inv_bits.to(tl.float32, bitcast=True)
    row = m.to(tl.int64) * N
    row_words = (N + 1) // 2
    for c0 in range(0, N, RED_N):
        cols = c0 + tl.arange(0, RED_N)
        mask = cols < N
        wcols = c0 // 2 + tl.arange(0, RED_N // 2)
        words = ll_wait(src_ptr + m.to(tl.int64) * row_words + wcols[None, :], (wcols < row_words)[None, :], tag)
        h = tl.reshape(ll_unpack16(words, 1, RED_N, hout_ptr.dtype.element_ty), (RED_N,))
        tl.store(hout_ptr + row + cols, h, mask=mask)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + cols, (h.to(tl.float32) * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gather_block_ll(kr, kc, o_lo, o_hi, N, src_ptr, out_ptr, tag, RED_M: tl.constexpr, RED_N: tl.constexpr):
    # the owner's reduced block (rows [kr * RED_M, +RED_M) within [o_lo, o_hi), columns [kc * RED_N, +RED_N)) from its
    # words (two-shot, LL), each read once it carries the call's tag, into the output
    rws = kr * RED_M + tl.arange(0, RED_M)
    cols = kc * RED_N + tl.arange(0, RED_N)
    wcols = kc * (RED_N // 2) + tl.arange(0, RED_N // 2)
    rmask = (rws >= o_lo) & (rws < o_hi)
    row_words = (N + 1) // 2
    words = ll_wait(src_ptr + rws.to(tl.int64)[:, None] * row_words + wcols[None, :],
                    rmask[:, None] & (wcols < row_words)[None, :], tag)  # fmt: skip
    vals = ll_unpack16(words, RED_M, RED_N, out_ptr.dtype.element_ty)
    tl.store(out_ptr + rws.to(tl.int64)[:, None] * N + cols[None, :], vals, mask=rmask[:, None] & (cols < N)[None, :])


__all__ = ["gather_block_ll", "gather_row", "gather_row_ll", "reduce_block", "reduce_row", "triton"]
