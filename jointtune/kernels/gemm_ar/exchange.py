"""The exchange side of `gemm_ar_kernel` (its module doc says how the pieces fit): where a finished tile goes, how
its chunk's flag is counted and released, and which flags a reduce item waits for."""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_pack16, ll_store
from jointtune.kernels.runtime.signals import FENCED, release_ranks, sys_fence
from jointtune.kernels.runtime.tiles import grouped_tile

# ---- tiles and flags --------------------------------------------------------------------------------------------


@triton.jit
def chunk_owners(chunk, n_tiles, tiles_m, tiles_n, M, rows_per_owner, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
                  TILES_PER_FLAG: tl.constexpr):  # fmt: skip
    # (first, last) rank owning rows of the chunk's tiles (two-shot)
    lo = M
    hi = 0
    for t in range(chunk * TILES_PER_FLAG, tl.minimum(chunk * TILES_PER_FLAG + TILES_PER_FLAG, n_tiles)):
        pm, _ = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
        lo = tl.minimum(lo, pm * BLOCK_M)
        hi = tl.maximum(hi, tl.minimum(M, pm * BLOCK_M + BLOCK_M))
    return lo // rows_per_owner, (hi - 1) // rows_per_owner


@triton.jit
def wait_sources(flags_ptr, flag_stride, pm, pn_lo, pn_hi, tiles_m, tiles_n, epoch, WORLD: tl.constexpr,
                  WORLD_P2: tl.constexpr, WAIT_C: tl.constexpr, GROUP_M: tl.constexpr,
                  TILES_PER_FLAG: tl.constexpr):  # fmt: skip
    # Every rank's flags of the chunks holding tiles (pm, pn_lo..pn_hi): exactly those (in two-shot a chunk of other
    # rows is never released to this rank), polled and acquired as one vector, a flag per thread: one round trip for
    # them all, not one per flag. The acquires' values are used, so Triton keeps them (`_signals.wait_flag`), and the
    # barrier after hands them to every thread of the program.
    srcs = tl.arange(0, WORLD_P2)
    for p0 in range(pn_lo, pn_hi + 1, WAIT_C):
        pns = p0 + tl.arange(0, WAIT_C)
        # tile (pm, pns)'s index in the tile order, `grouped_tile` inverted (written out, not a helper: the CPU
        # interpreter pays about a millisecond per call of a jitted helper)
        first_m = (pm // GROUP_M) * GROUP_M
        group_m = tl.minimum(tiles_m - first_m, GROUP_M)
        chunks = (first_m * tiles_n + pns * group_m + (pm - first_m)) // TILES_PER_FLAG
        ptrs = flags_ptr + srcs[:, None] * flag_stride + chunks[None, :]
        mask = (srcs < WORLD)[:, None] & (pns <= pn_hi)[None, :]
        while tl.min(tl.where(mask, tl.load(ptrs, mask=mask, other=0, volatile=True), epoch)) < epoch:
            pass
        while tl.min(tl.where(mask, tl.atomic_add(ptrs, 0, mask=mask, sem="acquire", scope="sys"), epoch)) < epoch:
            pass
    tl.debug_barrier()


# ---- produce ----------------------------------------------------------------------------------------------------


@triton.jit
def send(val, offs_m, offs_n, mmask, nmask, send_ptr, send_deltas_ptr, half, N, rank, rows_per_owner, row_lo, row_hi,
          WORLD: tl.constexpr, TWO_SHOT: tl.constexpr, PUSH: tl.constexpr):  # fmt: skip
    # A finished tile [rows offs_m, columns offs_n] where its readers find it (module doc). Every slot is 16-element
    # aligned (`_symm.ALIGN`): deltas are rounded so the compiler may vectorise.
    mask = mmask[:, None] & nmask[None, :]
    cols = offs_n[None, :]
    if PUSH:
        if TWO_SHOT:  # each owner's rows into its inbox, slot `rank`, rows counted from its first
            owner = offs_m // rows_per_owner
            for o in range(row_lo // rows_per_owner, row_hi // rows_per_owner + 1):
                delta = (tl.load(send_deltas_ptr + o) // 16) * 16
                rows = (offs_m - o * rows_per_owner).to(tl.int64) * N
                tl.store(send_ptr + half + delta + rows[:, None] + cols, val, mask=mask & (owner == o)[:, None])
        else:  # every rank's inbox, slot `rank` (the peers first, this rank's own last)
            rows = offs_m.to(tl.int64)[:, None] * N
            for j in range(1, WORLD + 1):
                delta = (tl.load(send_deltas_ptr + (rank + j) % WORLD) // 16) * 16
                tl.store(send_ptr + half + delta + rows + cols, val, mask=mask)
    else:  # this rank's own buffer: the readers pull
        tl.store(send_ptr + half + offs_m.to(tl.int64)[:, None] * N + cols, val, mask=mask)


@triton.jit
def send_ll(val, pm, pn, M, N, send_ptr, send_deltas_ptr, half, rank, tag, rows_per_owner, row_lo, row_hi,
            WORLD: tl.constexpr, TWO_SHOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # Flags in the data (`runtime.ll`): a finished tile [BLOCK_M, BLOCK_N] (16-bit values) as words, nothing to release
    # after. One-shot: into every rank's inbox, slot `rank` (the peers first, this rank's own last); two-shot: each
    # owner's rows [row_lo, row_hi] of the tile into its inbox, slot `rank`, rows counted from its first. Row m's
    # columns 2j and 2j + 1 share word j of the row's cdiv(N, 2) (a tile starts at an even column: no word straddles
    # two tiles). Offsets are exact (`ll.word_deltas`).
    row_words = (N + 1) // 2
    words = ll_pack16(val, tag, BLOCK_M, BLOCK_N)
    rows = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pn * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    mask = (rows < M)[:, None] & (cols < row_words)[None, :]
    if TWO_SHOT:
        owner = rows // rows_per_owner
        for o in range(row_lo // rows_per_owner, row_hi // rows_per_owner + 1):
            at = (rows - o * rows_per_owner).to(tl.int64)[:, None] * row_words + cols[None, :]
            ll_store(send_ptr + half + tl.load(send_deltas_ptr + o) + at, words, mask & (owner == o)[:, None])
    else:
        at = rows.to(tl.int64)[:, None] * row_words + cols[None, :]
        for j in range(1, WORLD + 1):
            ll_store(send_ptr + half + tl.load(send_deltas_ptr + (rank + j) % WORLD) + at, words, mask)


@triton.jit
def finish_tile(t, done_ptr, flag_ptrs_ptr, epoch, rank, flag_stride, n_tiles, tiles_m, tiles_n, M, rows_per_owner,
                 row_lo, row_hi, WORLD: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
                 TILES_PER_FLAG: tl.constexpr, TWO_SHOT: tl.constexpr):  # fmt: skip
    # Count tile t towards its chunk; the tile completing the chunk releases the chunk's flag to its readers (every
    # rank, or in two-shot the owners of its rows). The count is acq_rel after a barrier: it carries every thread's
    # stores of every counted tile (`_signals` doc).
    chunk = t // TILES_PER_FLAG
    first = 0
    last = WORLD - 1
    if TILES_PER_FLAG == 1:
        if TWO_SHOT:
            first = row_lo // rows_per_owner
            last = row_hi // rows_per_owner
        release_ranks(flag_ptrs_ptr, rank * flag_stride + chunk, epoch, first, last, -1)
    else:
        expected = tl.minimum(TILES_PER_FLAG, n_tiles - chunk * TILES_PER_FLAG)
        tl.debug_barrier()
        done = tl.atomic_add(done_ptr + chunk, 1, sem="acq_rel", scope="sys")
        if done == expected - 1:
            tl.store(done_ptr + chunk, 0)  # back at zero for the next call
            if TWO_SHOT:
                first, last = chunk_owners(chunk, n_tiles, tiles_m, tiles_n, M, rows_per_owner, BLOCK_M, GROUP_M,
                                            TILES_PER_FLAG)  # fmt: skip
            release_ranks(flag_ptrs_ptr, rank * flag_stride + chunk, epoch, first, last, -1)


@triton.jit
def release_tiles(first_tile, step, n_tiles, flag_ptrs_ptr, epoch, rank, flag_stride, tiles_m, tiles_n, M,
                   rows_per_owner, WORLD: tl.constexpr, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
                   TWO_SHOT: tl.constexpr):  # fmt: skip
    # The flags of every tile this program sent (tiles first_tile, + step, ...; a flag per tile), released at once
    # after all were sent: one barrier and one fence for the program's tiles, not one per tile, each waiting for its
    # tile's writes to peers before the next tile's start. For copied tiles (no GEMM to overlap with the waits).
    tl.debug_barrier()
    if FENCED:
        value = sys_fence(epoch.to(tl.int64))
    else:
        value = epoch.to(tl.int64)
    for t in range(first_tile, n_tiles, step):
        first = 0
        last = WORLD - 1
        if TWO_SHOT:
            pm, _ = grouped_tile(t, tiles_m, tiles_n, GROUP_M)
            first = (pm * BLOCK_M) // rows_per_owner
            last = (tl.minimum(M, pm * BLOCK_M + BLOCK_M) - 1) // rows_per_owner
        for p in range(first, last + 1):
            flags = tl.load(flag_ptrs_ptr + p).to(tl.pointer_type(tl.int64))
            if FENCED:
                tl.atomic_xchg(flags + rank * flag_stride + t, value, sem="relaxed", scope="sys")
            else:
                tl.atomic_xchg(flags + rank * flag_stride + t, value, sem="release", scope="sys")


__all__ = ["chunk_owners", "finish_tile", "release_tiles", "send", "send_ll", "triton", "wait_sources"]
