"""`mode="barrier"`: cuBLAS writes this rank's whole partial straight into symmetric memory, and one launch meets the
peers, sums this rank's rows from every rank's partial, and meets them again (a reduce-scatter in the pattern of
torch's symmetric-memory collectives, with no tiles, flags, epochs or buffer halves).

Each program meets its namesakes on the other ranks (`runtime.meet`): after the first meeting every peer's cuBLAS
partial is complete (it came before that peer's launch on its stream); the program then reads its share of this
rank's R rows (BLOCK-element blocks of them, flattened: item i goes to program i % programs, the same split on every
rank) from every rank's partial over NVLink, sums them in rank order in float32 (the bits every mode gives), and
stores the rounded sum. The second meeting keeps a peer's next call from overwriting a partial a reader of this call
still reads: when the launch ends, every peer has finished with this rank's partial. `MEET` off: a world whose ranks
launch one after another runs every rank's cuBLAS before any rank's launch, and needs no meeting.

Deltas (elements from this rank's buffer to each rank's, rounded to 16 elements) keep the compiler's alignment facts,
so loads are 16 bytes wide (an address loaded from memory would give it none).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.meet import MEET_SLOTS, inbox_slot, meet
from jointtune.kernels.runtime.signals import call_epoch_and_half, open_call, publish_call


@triton.jit(do_not_specialize=["rank"])
def gemm_rs_meet_kernel(
    buf_ptr,
    deltas_ptr,
    sig_ptr,
    sig_deltas_ptr,
    out_ptr,
    R,
    N,
    rank,
    WORLD: tl.constexpr,
    WORLD_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    MEET: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, pid, rank, WORLD, WORLD_P2)
    size = (tl.zeros((), tl.int64) + R) * N  # this rank's rows, flattened (rank is a plain int in the interpreter)
    own = (tl.zeros((), tl.int64) + rank) * R * N
    for i in range(pid, tl.cdiv(size, BLOCK), programs):
        at = i * BLOCK + tl.arange(0, BLOCK)
        mask = at < size
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for q in tl.static_range(WORLD):  # rank order: the bits every mode gives
            src = buf_ptr + (tl.load(deltas_ptr + q) // 16) * 16 + own
            total += tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, MEET_SLOTS + pid, rank, WORLD, WORLD_P2)


@triton.jit(do_not_specialize=["rank"])
def gemm_rs_push_meet_kernel(
    part_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    sig_ptr,
    sig_deltas_ptr,
    state_ptr,
    out_ptr,
    R,
    N,
    rank,
    slot,
    half_stride,
    WORLD: tl.constexpr,
    WORLD_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    PUSH: tl.constexpr,
    SUM: tl.constexpr,
    MEET: tl.constexpr,
    EPOCH: tl.constexpr,
):
    # transport="push": the program's blocks of every owner's rows go from this rank's partial (cuBLAS's, local) into
    # slot `rank` of the owner's inbox half (the own rows into its own inbox too); one meeting; then the program sums
    # the same blocks of its own rows from the W slots of its own inbox, in rank order. The half is the call's epoch's
    # parity, and the epoch counter is the world's (every fused call opens one): a peer writes a half again only after
    # a call with the next epoch, in which it waited on this rank (a meeting, or a flag of a call that waits on every
    # peer), and this rank reached that call only after its reads of this one (stream order).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    size = (tl.zeros((), tl.int64) + R) * N  # one owner's rows, flattened (rank is a plain int in the interpreter)
    slot64 = tl.zeros((), tl.int64) + slot  # W slots of a half can pass 2**31 elements
    if PUSH:
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            mask = at < size
            for j in tl.static_range(WORLD):  # the next rank's rows first, the own rows last
                q = (rank + 1 + j) % WORLD
                rows = tl.load(part_ptr + q * size + at, mask=mask)
                dst = inbox_slot(inbox_ptr, inbox_deltas_ptr, q, half, slot64, rank)
                tl.store(dst + at, rows, mask=mask)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, pid, rank, WORLD, WORLD_P2)
    if SUM:
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            mask = at < size
            total = tl.zeros((BLOCK,), dtype=tl.float32)
            for p in tl.static_range(WORLD):  # rank order: the bits every mode gives
                total += tl.load(inbox_ptr + half + p * slot64 + at, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + at, total.to(out_ptr.dtype.element_ty), mask=mask)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, programs)


__all__ = ["gemm_rs_meet_kernel", "gemm_rs_push_meet_kernel", "triton"]
