"""`transport="barrier"`: cuBLAS writes the partial straight into symmetric memory, and one launch meets the peers,
sums, and meets them again (the pattern of torch's symmetric-memory two-shot all-reduce, in our launch with our
epilogue).

Each program meets its namesakes on the other ranks (`runtime.meet`: a signal to each and one from each), so no
grid-wide wait and nothing that lives across calls but signals left at 0. Then:
- two-shot: the program's share of the rows this rank owns (plain: BLOCK-element blocks of them, flattened; with
  the norm: whole rows) is read straight from every rank's partial over NVLink, summed in rank order in float32 (+
  the residual), rounded, stored into this rank's output and into every peer's partial in place (the only reader of
  those rows there was this program, which has read them); with the norm 1/rms goes to every peer's row slot too;
  after a second meeting, every peer's reduced rows the program's namesakes wrote are copied out of this rank's own
  partial (with the norm: normed from the owner's h and 1/rms, so every rank has the owner's bits);
- one-shot: every row, read from every rank, summed on every rank; the second meeting keeps a peer's next call
  from overwriting a partial a reader still reads.

The second meeting is also why no buffer alternates halves: when a launch ends, every peer has finished with this
rank's partial, so the next call's cuBLAS may write it. A program's work is the same on every rank (item i goes to
program i % programs), so meeting namesakes is enough for every copy a program makes. `MEET` off: a world whose
ranks launch one after another runs the reduce launch of every rank, then the gather launch of every rank.

Deltas (elements from this rank's buffer to each rank's, rounded to 16 elements) keep the compiler's alignment
facts, so loads and stores are 16 bytes wide; an address loaded from memory would give it none (2-byte accesses).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.meet import MEET_SLOTS, inbox_slot, meet
from jointtune.kernels.runtime.signals import call_epoch_and_half, open_call, publish_call


@triton.jit
def _source(buf_ptr, deltas_ptr, inbox_ptr, half, slot64, q, PUSHED: tl.constexpr):
    # where rank q's partial is read: its slot of this rank's inbox half (pushed), or its own buffer over NVLink
    if PUSHED:
        return inbox_ptr + half + q * slot64
    return buf_ptr + (tl.load(deltas_ptr + q) // 16) * 16


@triton.jit(do_not_specialize=["rank", "rows_per_owner"])
def gemm_ar_meet_kernel(
    buf_ptr,
    deltas_ptr,
    rms_ptr,
    rms_deltas_ptr,
    sig_ptr,
    sig_deltas_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    hout_ptr,
    M,
    N,
    eps,
    rank,
    rows_per_owner,
    inbox_ptr,
    inbox_deltas_ptr,
    state_ptr,
    slot,
    half_stride,
    WORLD: tl.constexpr,
    WORLD_P2: tl.constexpr,
    TWO_SHOT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
    RED_N: tl.constexpr,
    REDUCE: tl.constexpr,
    GATHER: tl.constexpr,
    MEET: tl.constexpr,
    PUSHED: tl.constexpr,
    PUSH: tl.constexpr,
    EPOCH: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)  # (0, 0) unless PUSHED
    slot64 = tl.zeros((), tl.int64) + slot  # W slots of a half can pass 2**31 elements
    if EPOCH == 1:
        open_call(state_ptr)
    row_lo = rank * 0  # tensors either way: `.to` below
    row_hi = M + rank * 0
    if TWO_SHOT:
        row_lo = tl.minimum(M, rank * rows_per_owner)
        row_hi = tl.minimum(M, row_lo + rows_per_owner)
    if PUSH:  # one-shot, pushed: this program's items of the (local) partial into slot `rank` of every inbox half
        if NORM:
            for m in range(pid, M, programs):
                row = (tl.zeros((), tl.int64) + m) * N  # m is a plain int in the interpreter
                for c0 in range(0, N, RED_N):
                    at = row + c0 + tl.arange(0, RED_N)
                    mask = c0 + tl.arange(0, RED_N) < N
                    vals = tl.load(buf_ptr + at, mask=mask)
                    for j in tl.static_range(WORLD):
                        q = (rank + 1 + j) % WORLD
                        tl.store(inbox_slot(inbox_ptr, inbox_deltas_ptr, q, half, slot64, rank) + at, vals, mask=mask)
        else:
            size = (tl.zeros((), tl.int64) + M) * N
            for i in range(pid, tl.cdiv(size, BLOCK), programs):
                at = i * BLOCK + tl.arange(0, BLOCK)
                mask = at < size
                vals = tl.load(buf_ptr + at, mask=mask)
                for j in tl.static_range(WORLD):
                    q = (rank + 1 + j) % WORLD
                    tl.store(inbox_slot(inbox_ptr, inbox_deltas_ptr, q, half, slot64, rank) + at, vals, mask=mask)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, pid, rank, WORLD, WORLD_P2)
    if REDUCE:
        if NORM:  # whole rows: pass 1 sums into h (the new residual) and its squares, pass 2 normalises
            for m in range(row_lo + pid, row_hi, programs):
                row = (tl.zeros((), tl.int64) + m) * N  # m is a plain int in the interpreter
                sq = tl.zeros((RED_N,), dtype=tl.float32)
                for c0 in range(0, N, RED_N):
                    at = row + c0 + tl.arange(0, RED_N)
                    mask = c0 + tl.arange(0, RED_N) < N
                    total = tl.zeros((RED_N,), dtype=tl.float32)
                    for q in tl.static_range(WORLD):  # rank order: the same bits on every rank
                        src = _source(buf_ptr, deltas_ptr, inbox_ptr, half, slot64, q, PUSHED)
                        total += tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
                    if RESIDUAL:
                        total += tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
                    h = total.to(hout_ptr.dtype.element_ty)
                    tl.store(hout_ptr + at, h, mask=mask)
                    if TWO_SHOT:
                        for j in tl.static_range(1, WORLD):
                            dst = buf_ptr + (tl.load(deltas_ptr + (rank + j) % WORLD) // 16) * 16
                            tl.store(dst + at, h, mask=mask)
                    hf = h.to(tl.float32)
                    sq += hf * hf
                inv = tl.rsqrt(tl.sum(sq, axis=0) / N + eps)
                if TWO_SHOT:
                    for j in tl.static_range(1, WORLD):
                        tl.store(rms_ptr + tl.load(rms_deltas_ptr + (rank + j) % WORLD) + m, inv)
                tl.debug_barrier()  # pass 2 reads the h every thread stored
                for c0 in range(0, N, RED_N):
                    at = row + c0 + tl.arange(0, RED_N)
                    mask = c0 + tl.arange(0, RED_N) < N
                    hf = tl.load(hout_ptr + at, mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(w_ptr + c0 + tl.arange(0, RED_N), mask=mask, other=0.0).to(tl.float32)
                    tl.store(out_ptr + at, (hf * inv * w).to(out_ptr.dtype.element_ty), mask=mask)
        else:  # BLOCK-element blocks of the rows, flattened
            lo = row_lo.to(tl.int64) * N
            hi = row_hi.to(tl.int64) * N
            for i in range(pid, tl.cdiv(hi - lo, BLOCK), programs):
                at = lo + i * BLOCK + tl.arange(0, BLOCK)
                mask = at < hi
                total = tl.zeros((BLOCK,), dtype=tl.float32)
                for q in tl.static_range(WORLD):  # rank order: the same bits on every rank
                    src = _source(buf_ptr, deltas_ptr, inbox_ptr, half, slot64, q, PUSHED)
                    total += tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
                if RESIDUAL:
                    total += tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
                val = total.to(out_ptr.dtype.element_ty)
                tl.store(out_ptr + at, val, mask=mask)
                if TWO_SHOT:
                    for j in tl.static_range(1, WORLD):
                        dst = buf_ptr + (tl.load(deltas_ptr + (rank + j) % WORLD) // 16) * 16
                        tl.store(dst + at, val, mask=mask)
    if MEET:  # noqa: SIM102 (constexpr)
        if not PUSHED:  # pushed: the inbox halves alternate, so the next call overwrites no reader of this one
            meet(sig_ptr, sig_deltas_ptr, MEET_SLOTS + pid, rank, WORLD, WORLD_P2)
    if GATHER:
        # two-shot: the rows every other owner's namesake of this program wrote into this rank's partial
        for j in tl.static_range(1, WORLD):
            o = (rank + j) % WORLD
            o_lo = tl.minimum(M, o * rows_per_owner)
            o_hi = tl.minimum(M, o_lo + rows_per_owner)
            if NORM:
                for m in range(o_lo + pid, o_hi, programs):
                    row = (tl.zeros((), tl.int64) + m) * N  # m is a plain int in the interpreter
                    inv = tl.load(rms_ptr + m)
                    for c0 in range(0, N, RED_N):
                        at = row + c0 + tl.arange(0, RED_N)
                        mask = c0 + tl.arange(0, RED_N) < N
                        h = tl.load(buf_ptr + at, mask=mask, other=0.0)
                        tl.store(hout_ptr + at, h, mask=mask)
                        w = tl.load(w_ptr + c0 + tl.arange(0, RED_N), mask=mask, other=0.0).to(tl.float32)
                        tl.store(out_ptr + at, (h.to(tl.float32) * inv * w).to(out_ptr.dtype.element_ty), mask=mask)
            else:
                lo = o_lo.to(tl.int64) * N
                hi = o_hi.to(tl.int64) * N
                for i in range(pid, tl.cdiv(hi - lo, BLOCK), programs):
                    at = lo + i * BLOCK + tl.arange(0, BLOCK)
                    mask = at < hi
                    tl.store(out_ptr + at, tl.load(buf_ptr + at, mask=mask, other=0.0), mask=mask)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, programs)


__all__ = ["gemm_ar_meet_kernel", "triton"]
