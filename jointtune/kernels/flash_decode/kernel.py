"""The distributed Flash-Decode kernel: split-KV decode attention of this rank's keys, the rank's partial (O, LSE)
sent towards every rank, and the LSE-weighted combine of all ranks' partials.

Work comes in two kinds, decode units and combine units, in one launch or two:

- A decode unit is one split (`KV_SPLIT` keys, stepped `BLOCK_N` at a time) of one item: `HPP` query heads of one
  GQA group of one sequence, so K and V are read once for those heads. It stores its split's normalised output and
  base-2 log-sum-exp into `parts`, then counts itself towards its group of `IPF` items (a "chunk"). The unit that
  completes a chunk merges the chunk's splits into packed rows [O (D floats), LSE, pad] and stores them at every
  destination in `dest_deltas` (SEND_TO of them: every rank's inbox slot for this rank when pushing, else this
  rank's own buffer); with SIGNAL it then releases flag (rank, chunk) at every rank, itself included.
- A combine unit is one chunk: with WAIT it waits for every source's flag of the chunk (this rank's own too with
  WAIT_OWN), then merges the W ranks' packed rows, weighted by LSE, into `out`.

A split with no keys (lengths are per sequence and may be 0 on a rank) has LSE = EMPTY, a finite stand-in for
-inf: merging it gives it weight 0 beside any real partial, and a sequence with no keys anywhere gets 0, not NaN.

Deadlock-free by construction: with TICKET, units are numbered in the order programs start (an atomic ticket),
every decode unit before any combine unit; decode units never wait, so every decode unit of every rank runs to
its end, and every wait of a combine unit ends whatever the grid size and residency. Without TICKET (a world
whose ranks launch one after another), each launch holds one kind of unit and every rank's decode launch comes
before any rank's combine launch.

Cross-call state is device memory only: the epoch comes from the call counter (EPOCH 1: this launch opens the call
and publishes it once all its programs have read it; 2: an earlier launch did); flags carry epochs; halves alternate
by epoch parity. The split counters are handed back at zero by the units that finish with them, the ticket by its
last draw.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.signals import (
    call_epoch_and_half,
    open_call,
    publish_call,
    release_ranks,
    wait_flag,
)

#: LSE of a partial with no keys: finite, so merges need no special case (exp2(EMPTY - x) == 0 for real x)
EMPTY = tl.constexpr(-1.0e30)


@triton.jit
def _merge(m, l, o, lse_s, o_s):
    # online merge of a partial (o_s normalised, lse_s base 2) into the running (max, weight sum, weighted sum)
    m_new = tl.maximum(m, lse_s)
    a = tl.exp2(m - m_new)
    w = tl.exp2(lse_s - m_new)
    return m_new, l * a + w, o * a[:, None] + w[:, None] * o_s


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, lens_ptr, parts_ptr, row0, split, n_splits, S_r, H, G, sm_scale, stride_qb,
                  stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, D: tl.constexpr,
                  PW: tl.constexpr, HPP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  KV_SPLIT: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    b = row0 // H
    h0 = row0 % H
    kvh = h0 // G
    n_keys = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), S_r).to(tl.int32)  # clamped before any narrowing
    lo = split * KV_SPLIT
    hi = tl.minimum(lo + KV_SPLIT, n_keys)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < HPP
    ds = tl.arange(0, D)
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + (h0 + hs)[:, None] * stride_qh + ds[None, :],
                mask=hmask[:, None], other=0.0)  # fmt: skip
    if UPCAST:  # the CPU interpreter's bf16 dot is wrong (Triton 3.9); fp32 operands are exact
        q = q.to(tl.float32)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
    m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, D), dtype=tl.float32)
    for n in range(lo, hi, BLOCK_N):
        ns = n + tl.arange(0, BLOCK_N)
        nmask = ns < hi
        kt = tl.load(k_base + ns[None, :].to(tl.int64) * stride_kn + ds[:, None], mask=nmask[None, :], other=0.0)
        v = tl.load(v_base + ns[:, None].to(tl.int64) * stride_vn + ds[None, :], mask=nmask[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt) * sm_scale  # [BLOCK_H, BLOCK_N], base-2 logits
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: every step has a key
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    o = acc / tl.maximum(l, 1e-30)[:, None]
    lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), EMPTY)
    part = parts_ptr + ((row0 + hs).to(tl.int64) * n_splits + split) * PW
    tl.store(part[:, None] + ds[None, :], o, mask=hmask[:, None])
    tl.store(part + D, lse, mask=hmask)


@triton.jit
def _send_chunk(parts_ptr, dest_ptr, dest_deltas_ptr, chunk, n_items, n_splits, half, D: tl.constexpr,
                PW: tl.constexpr, HPP: tl.constexpr, HB: tl.constexpr, IPF: tl.constexpr, SPLITS: tl.constexpr,
                SEND_TO: tl.constexpr):  # fmt: skip
    # merge each head's splits into one packed row [O, LSE] and store it at every destination. All HPP heads of
    # an item are merged at once, SPLITS splits per step as one [HB, SPLITS, D] block: the merge is the serial
    # tail of the launch (one program per chunk, after every split), so it costs n_splits / SPLITS memory round
    # trips per item, not one per head
    hs = tl.arange(0, HB)
    hmask = hs < HPP
    ds = tl.arange(0, D)
    for item in range(chunk * IPF, tl.minimum(chunk * IPF + IPF, n_items)):
        rows = (item * HPP + hs).to(tl.int64)
        m = tl.full((HB,), float("-inf"), dtype=tl.float32)
        l = tl.zeros((HB,), dtype=tl.float32)
        o = tl.zeros((HB, D), dtype=tl.float32)
        for s0 in range(0, n_splits, SPLITS):
            ss = s0 + tl.arange(0, SPLITS)
            smask = hmask[:, None] & (ss < n_splits)[None, :]
            part = parts_ptr + (rows[:, None] * n_splits + ss[None, :]) * PW  # [HB, SPLITS]
            lse_s = tl.load(part + D, mask=smask, other=EMPTY, cache_modifier=".cg")
            o_s = tl.load(part[:, :, None] + ds[None, None, :], mask=smask[:, :, None], other=0.0,
                          cache_modifier=".cg")  # fmt: skip
            m_new = tl.maximum(m, tl.max(lse_s, 1))
            a = tl.exp2(m - m_new)
            w = tl.exp2(lse_s - m_new[:, None])
            l = l * a + tl.sum(w, 1)
            o = o * a[:, None] + tl.sum(w[:, :, None] * o_s, 1)
            m = m_new
        o = o / l[:, None]
        lse = m + tl.log2(l)
        for t in range(0, SEND_TO):
            dest = dest_ptr + half + (tl.load(dest_deltas_ptr + t) // 16) * 16 + rows * PW  # 16-element aligned
            tl.store(dest[:, None] + ds[None, :], o, mask=hmask[:, None])
            tl.store(dest + D, lse, mask=hmask)


@triton.jit
def _combine_chunk(src_ptr, src_deltas_ptr, out_ptr, chunk, n_items, rank, half, H, stride_ob, stride_oh,
                   D: tl.constexpr, PW: tl.constexpr, HPP: tl.constexpr, BLOCK_H: tl.constexpr, IPF: tl.constexpr,
                   WORLD: tl.constexpr, HALF_OWN: tl.constexpr):  # fmt: skip
    # out rows of the chunk := LSE-weighted merge of every rank's packed rows (own rows without the half
    # unless HALF_OWN: in wait mode they stay in the rank's local buffer)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < HPP
    ds = tl.arange(0, D)
    for item in range(chunk * IPF, tl.minimum(chunk * IPF + IPF, n_items)):
        rows = item * HPP + hs
        m = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
        l = tl.zeros((BLOCK_H,), dtype=tl.float32)
        o = tl.zeros((BLOCK_H, D), dtype=tl.float32)
        for p in range(0, WORLD):
            h = half
            if not HALF_OWN:
                h = tl.where(p == rank, 0, half)
            src = src_ptr + h + (tl.load(src_deltas_ptr + p) // 16) * 16 + rows.to(tl.int64) * PW
            lse_p = tl.load(src + D, mask=hmask, other=EMPTY)
            o_p = tl.load(src[:, None] + ds[None, :], mask=hmask[:, None], other=0.0)
            m, l, o = _merge(m, l, o, lse_p, o_p)
        o = o / l[:, None]
        b = rows // H
        dst = out_ptr + b.to(tl.int64) * stride_ob + (rows % H) * stride_oh
        tl.store(dst[:, None] + ds[None, :], o.to(out_ptr.dtype.element_ty), mask=hmask[:, None])


# Integers that may be 1 stay runtime values: Triton would make them constants and compile per value.
@triton.jit(do_not_specialize=["S_r", "n_splits", "n_items", "n_chunks", "rank", "num_programs", "H", "G"])
def flash_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    lens_ptr,
    out_ptr,
    parts_ptr,
    counts_ptr,
    dest_ptr,
    dest_deltas_ptr,
    src_ptr,
    src_deltas_ptr,
    flags_ptr,
    flag_ptrs_ptr,
    state_ptr,
    ticket_ptr,
    sm_scale,
    S_r,
    n_splits,
    n_items,
    n_chunks,
    rank,
    half_stride,
    num_programs,
    H,
    G,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    D: tl.constexpr,
    PW: tl.constexpr,
    HPP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_SPLIT: tl.constexpr,
    IPF: tl.constexpr,
    HB: tl.constexpr,
    SPLITS: tl.constexpr,
    WORLD: tl.constexpr,
    DECODE: tl.constexpr,
    COMBINE: tl.constexpr,
    SEND_TO: tl.constexpr,
    SIGNAL: tl.constexpr,
    WAIT: tl.constexpr,
    WAIT_OWN: tl.constexpr,
    HALF_OWN: tl.constexpr,
    TICKET: tl.constexpr,
    EPOCH: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if TICKET:
        # the ticket is also the launch's arrival (`open_call`): once all its threads hold the epoch, the program
        # draws; the last to draw hands the ticket back at zero and publishes the epoch it opened
        tl.debug_barrier()
        unit = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
        if unit == num_programs - 1:
            tl.store(ticket_ptr, 0)
            if EPOCH == 1:
                tl.atomic_xchg(state_ptr, epoch, sem="release", scope="gpu")
        tl.debug_barrier()  # only the publish needs the acquire; the barrier keeps the rule: every acquire, then one
    else:
        unit = pid
        if EPOCH == 1:
            open_call(state_ptr)
    n_decode = 0
    if DECODE:
        n_decode = n_items * n_splits
        if unit < n_decode:
            # ---- decode: one split of one item, then count it towards its chunk ----
            item = unit // n_splits
            _decode_split(q_ptr, k_ptr, v_ptr, lens_ptr, parts_ptr, item * HPP, unit % n_splits, n_splits, S_r, H, G,
                          sm_scale, stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                          stride_vn, D, PW, HPP, BLOCK_H, BLOCK_N, KV_SPLIT, UPCAST)  # fmt: skip
            chunk = item // IPF
            expected = tl.minimum(IPF, n_items - chunk * IPF) * n_splits
            tl.debug_barrier()  # the count carries every thread's partial (`signals` doc)
            arrived = tl.atomic_add(counts_ptr + chunk, 1, sem="acq_rel", scope="gpu")
            if arrived == expected - 1:
                # ---- the chunk's last split: merge its splits, send the packed rows, flag them ----
                tl.store(counts_ptr + chunk, 0)
                tl.debug_barrier()  # every thread reads the other splits' partials after the count's acquire
                _send_chunk(parts_ptr, dest_ptr, dest_deltas_ptr, chunk, n_items, n_splits, half, D, PW, HPP, HB,
                            IPF, SPLITS, SEND_TO)  # fmt: skip
                if SIGNAL:  # every thread's rows reach every rank (this one too) before the flag
                    release_ranks(flag_ptrs_ptr, rank * n_chunks + chunk, epoch, 0, WORLD - 1, -1)
    if COMBINE:  # noqa: SIM102 (constexpr: a decode-only launch has no combine code at all)
        if unit >= n_decode:
            # ---- combine: one chunk, once every source's rows are in ----
            chunk = unit - n_decode
            if WAIT:
                for p in range(0, WORLD):
                    if WAIT_OWN or p != rank:
                        wait_flag(flags_ptr + p * n_chunks + chunk, epoch)
            _combine_chunk(src_ptr, src_deltas_ptr, out_ptr, chunk, n_items, rank, half, H, stride_ob, stride_oh, D,
                           PW, HPP, BLOCK_H, IPF, WORLD, HALF_OWN)  # fmt: skip
    if EPOCH == 1:  # noqa: SIM102 (constexpr)
        if not TICKET:  # with the ticket, its last draw published the epoch
            publish_call(state_ptr, epoch, num_programs)


__all__ = ["EMPTY", "flash_decode_kernel", "triton"]
