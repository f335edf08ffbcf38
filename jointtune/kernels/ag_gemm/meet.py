"""`mode="barrier"`: one launch gathers A between meetings of namesake programs (`runtime.meet`), then one cuBLAS GEMM
multiplies all M gathered rows (B read once). `landing="direct"` (`ag_gemm_meet_kernel`, below): the rows are pushed
straight into every rank's gathered buffer, between two meetings. `landing="inbox"` (`ag_gemm_inbox_meet_kernel`):
into inbox halves alternating by the call's epoch, before one meeting, then copied locally into the gathered buffer.

The first meeting: every peer's program has started this call's launch, so that peer's cuBLAS of the last call, which
read its gathered buffer, has finished (stream order): the buffer may be overwritten. The program then stores its
blocks of this rank's R rows (BLOCK-element blocks, flattened: block i goes to program i % programs, the same split on
every rank) into rows [rank * R, (rank + 1) * R) of every rank's buffer, its own too. The second meeting: every
namesake's blocks have landed here; when the whole launch ends every program's have, and cuBLAS follows on the
stream. No flags, epochs or buffer halves: a captured call replays correctly. `MEET` off: a world whose ranks launch
one after another pushes every rank's rows before any rank's GEMM.

Deltas (elements from this rank's buffer to each rank's, rounded to 16 elements) keep the compiler's alignment facts,
so stores are 16 bytes wide where the rows allow (an address loaded from memory would give it none).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.meet import MEET_SLOTS, inbox_slot, meet
from jointtune.kernels.runtime.signals import call_epoch_and_half, open_call, publish_call


@triton.jit(do_not_specialize=["rank"])
def ag_gemm_meet_kernel(
    a_ptr,
    gat_ptr,
    gat_deltas_ptr,
    sig_ptr,
    sig_deltas_ptr,
    R,
    K,
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
    size = (tl.zeros((), tl.int64) + R) * K  # this rank's rows, flattened (rank is a plain int in the interpreter)
    own = (tl.zeros((), tl.int64) + rank) * R * K
    for i in range(pid, tl.cdiv(size, BLOCK), programs):
        at = i * BLOCK + tl.arange(0, BLOCK)
        mask = at < size
        rows = tl.load(a_ptr + at, mask=mask)
        for j in tl.static_range(WORLD):  # the next rank first, this rank's own buffer last
            q = (rank + 1 + j) % WORLD
            dst = gat_ptr + (tl.load(gat_deltas_ptr + q) // 16) * 16 + own
            tl.store(dst + at, rows, mask=mask)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, MEET_SLOTS + pid, rank, WORLD, WORLD_P2)


@triton.jit(do_not_specialize=["rank"])
def ag_gemm_inbox_meet_kernel(
    a_ptr,
    gat_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    sig_ptr,
    sig_deltas_ptr,
    state_ptr,
    R,
    K,
    rank,
    slot,
    half_stride,
    WORLD: tl.constexpr,
    WORLD_P2: tl.constexpr,
    BLOCK: tl.constexpr,
    PUSH: tl.constexpr,
    COPY: tl.constexpr,
    MEET: tl.constexpr,
    EPOCH: tl.constexpr,
):
    # landing="inbox": the program's blocks of this rank's rows go into its own gathered buffer (local, read only by
    # its own cuBLAS, later on the stream) and into slot `rank` of every peer's inbox half; one meeting; then it copies
    # the same blocks of every peer's rows from its own inbox into its gathered buffer. The half is the call's epoch's
    # parity, and the epoch counter is the world's (every fused call opens one): a peer writes a half again only after
    # a call with the next epoch, in which it waited on this rank (a meeting, or a flag of a call that waits on every
    # peer), and this rank reached that call only after its copies of this one (stream order).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    size = (tl.zeros((), tl.int64) + R) * K  # one rank's rows, flattened (rank is a plain int in the interpreter)
    slot64 = tl.zeros((), tl.int64) + slot  # W slots of a half can pass 2**31 elements
    if PUSH:
        own = (tl.zeros((), tl.int64) + rank) * R * K
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            mask = at < size
            rows = tl.load(a_ptr + at, mask=mask)
            for j in tl.static_range(1, WORLD):
                q = (rank + j) % WORLD
                tl.store(inbox_slot(inbox_ptr, inbox_deltas_ptr, q, half, slot64, rank) + at, rows, mask=mask)
            tl.store(gat_ptr + own + at, rows, mask=mask)
    if MEET:
        meet(sig_ptr, sig_deltas_ptr, pid, rank, WORLD, WORLD_P2)
    if COPY:
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            mask = at < size
            for j in tl.static_range(1, WORLD):
                p = (rank + j) % WORLD
                rows = tl.load(inbox_ptr + half + p * slot64 + at, mask=mask)
                tl.store(gat_ptr + p * size + at, rows, mask=mask)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, programs)


__all__ = ["ag_gemm_inbox_meet_kernel", "ag_gemm_meet_kernel", "triton"]
