"""`mode="barrier"`: one launch pushes this rank's rows of A into every rank's gathered buffer between two meetings of
namesake programs (`runtime.meet`), then one cuBLAS GEMM multiplies all M gathered rows (B read once).

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

from jointtune.kernels.runtime.meet import MEET_SLOTS, meet


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


__all__ = ["ag_gemm_meet_kernel", "triton"]
