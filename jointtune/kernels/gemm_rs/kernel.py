"""The fused GEMM+Reduce-Scatter kernel: a persistent tile GEMM of this rank's partial, whose epilogue sends
each finished tile towards the rank owning its rows, and reduce programs that sum this rank's rows.

Rows of the partial P_r = A_r @ B_r come in segments of `R` rows, segment s owned by rank s. A GEMM
program walks tiles segment by segment, starting at segment `first_seg` (the next rank's rows: own rows
last), and its epilogue (EPI) puts a finished tile at `dest_ptr + half + dest_deltas[s]`:

- EPI 0: a plain store (the copy-engine mode's Triton consumer: no flags);
- EPI 1: a store (into the owner's inbox slot for this rank: push; into this rank's own partial buffer,
  which the owner reads: pull), then a count per (segment, chunk); the tile completing a chunk releases
  flag (rank, chunk) at the owner, with system-scope release semantics;
- EPI 2: fp32 atomic adds into the owner's accumulator, then the same count and flag (atomic mode: the
  order of the adds, hence the rounding, differs from call to call).

Reduce programs (program ids from `gemm_programs` on) own this rank's R rows: per (chunk, column block)
they wait for every source's flag of the chunk, then sum the sources at `src_ptr + half + src_deltas[s]`
in fp32, in source order (deterministic), and store the output. With ZERO_SRC (atomic) the one source is
the accumulator, which they hand back zeroed for the call after next.

With EPI_REDUCE (push or pull, `reduce_by=epilogue`) there are no reduce programs: every SM runs the GEMM,
and the epilogue of a tile of the rank's own rows, which come last in every program's order, waits for the
peers' flags of its chunk and sums the sources there (the own one straight from the fp32 accumulator, never
stored), in source order. A program waits only after it finished every tile of other ranks' rows, so every
flag is released whatever the waits: deadlock-free as long as the grid is resident, as above. OWN_TILES
splits the work for a world whose ranks launch one after another: 1 = every tile but the own rows', 2 = only
those (0 = all).

With SPAN (push or pull, `reduce_by=tile`, for few rows) tiles run over all M rows, not segment by segment, so B is
read once however many ranks' rows a tile holds, and every rank walks the tiles in the same order. A finished tile
sends each row another rank owns to that owner's slot (push: the owner's inbox; pull: this rank's own partial
buffer) and releases one flag per (this rank, tile) at each such owner; then, if it holds own rows, it waits for the
same tile's flag of every peer and sums there (`_sum_own_tile`). Every tile sends before it waits and every rank
takes the tiles in the same order, so by induction over that order every wait ends (the grid is resident, as
above). With LL (push only) the rows go out as 64-bit words of two values and the call's tag (`runtime.ll`): no flag is
released, and the own rows' sum polls the peers' words themselves (`_send_tile_rows_ll`, `_sum_own_tile_ll`). With
OWN_TILES, a one-rank-at-a-time world first sends every tile (1), then recomputes the tiles holding own rows and sums
(2).

pull_cublas (READY, EXIT): cuBLAS wrote this rank's whole partial earlier on the stream, at a fixed address;
a reduce-only launch releases "ready" to every peer, pulls and sums, and its last program ends the call
with an exit handshake (every peer done reading), so the next call's GEMM may overwrite the partial.

With reduce programs, GEMM programs wait on nothing and the grid is no larger than the SM count, so every
program is resident and every wait ends: deadlock-free by construction. A world whose ranks launch one after
another issues every rank's GEMM programs (EPOCH 1) before any rank's reduce programs (EPOCH 2, `pid_base`).
Every fused launch assumes its grid gets the SMs it asks for: a kernel of another stream that holds SMs on one
rank while waiting on its peer (a collective) can starve a peer's waiting programs, and with an epilogue reduce
or SPAN every program may be waiting. Run them on one stream with the collectives, as serving engines do.

Halves: the buffers a call writes into alternate by the parity of the device epoch (`half_stride` > 0),
so a rank writes call e + 2's tiles into a half only after its call e + 1 waited for every peer's flags (or LL words)
of e + 1, which each peer released after finishing its reads of call e: no handshake, no host state.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_pack16, ll_store, ll_unpack16, ll_wait
from jointtune.kernels.runtime.signals import (
    call_epoch_and_half,
    open_call,
    publish_call,
    release_flag,
    release_ranks,
    wait_chunks,
    wait_flag,
)
from jointtune.kernels.runtime.tiles import grouped_tile, split_product


@triton.jit
def _sum_own_tile(acc, out_ptr, src_ptr, src_deltas_ptr, flags_ptr, epoch, half, own_rows, own_mask, offs_n, nmask, N,
                  rank, n_flags, flag, stride_om, WORLD: tl.constexpr):  # fmt: skip
    # A tile's rows of this rank (`own_rows`: rows of its R, where `own_mask`), once every peer's flag `flag` is in:
    # the sources in source order (this rank's from the accumulator), stored as output rows
    wait_chunks(flags_ptr, epoch, rank, n_flags, 0, WORLD - 1, flag, flag)
    mask = own_mask[:, None] & nmask[None, :]
    in_slot = own_rows[:, None].to(tl.int64) * N + offs_n[None, :]
    total = tl.zeros(acc.shape, dtype=tl.float32)
    for s in range(0, WORLD):
        if s == rank:
            total += acc
        else:
            delta = (tl.load(src_deltas_ptr + s) // 16) * 16  # every slot is 16-element aligned (`symm.ALIGN`)
            total += tl.load(src_ptr + half + delta + in_slot, mask=mask, other=0.0).to(tl.float32)
    o_ptrs = out_ptr + own_rows[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _send_tile_rows(acc, dest_ptr, dest_deltas_ptr, flag_ptrs_ptr, epoch, half, offs_m, owner, mmask, offs_n, nmask, R,
                    rank, first_owner, last_owner, n_tiles, tile, stride_dm):  # fmt: skip
    # SPAN: every row of the tile that another rank owns goes to that owner's slot for this rank (a slot delta per
    # row), then each owner in the tile gets this tile's flag
    delta = tl.load(dest_deltas_ptr + owner, mask=mmask, other=0)
    rows_at = (offs_m - owner * R).to(tl.int64) * stride_dm
    d_ptrs = dest_ptr + half + (delta + rows_at)[:, None] + offs_n[None, :]
    others = mmask & (owner != rank)
    tl.store(d_ptrs, acc.to(dest_ptr.dtype.element_ty), mask=others[:, None] & nmask[None, :])
    release_ranks(flag_ptrs_ptr, rank * n_tiles + tile, epoch, first_owner, last_owner, rank)


@triton.jit
def _send_tile_rows_ll(acc, dest_ptr, dest_deltas_ptr, half, offs_m, owner, mmask, pid_n, N, R, rank, tag,
                       DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # SPAN with LL words (`runtime.ll`): every row another rank owns goes to that owner's slot for this rank as
    # words of two values and the call's tag (row m of a slot at m * cdiv(N, 2) words); nothing to release after
    row_words = (N + 1) // 2
    words = ll_pack16(acc.to(DTYPE), tag, BLOCK_M, BLOCK_N)
    wcols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    delta = tl.load(dest_deltas_ptr + owner, mask=mmask, other=0)  # exact word offsets (`ll.word_deltas`)
    rows_at = (offs_m - owner * R).to(tl.int64) * row_words
    others = mmask & (owner != rank)
    ll_store(dest_ptr + half + (delta + rows_at)[:, None] + wcols[None, :], words,
             others[:, None] & (wcols < row_words)[None, :])  # fmt: skip


@triton.jit
def _sum_own_tile_ll(acc, out_ptr, src_ptr, src_deltas_ptr, half, own_rows, own_mask, offs_n, nmask, pid_n, N, rank,
                     tag, stride_om, WORLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # `_sum_own_tile` with LL words: each peer's words of the tile's own rows, read once they carry the call's tag
    # (no flag to wait for), in source order (this rank's from the accumulator)
    row_words = (N + 1) // 2
    wcols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    wmask = own_mask[:, None] & (wcols < row_words)[None, :]
    in_slot = own_rows[:, None].to(tl.int64) * row_words + wcols[None, :]
    total = tl.zeros(acc.shape, dtype=tl.float32)
    for s in range(0, WORLD):
        if s == rank:
            total += acc
        else:
            delta = (tl.load(src_deltas_ptr + s) // 16) * 16  # slots are 16-word aligned: vector polls
            words = ll_wait(src_ptr + half + delta + in_slot, wmask, tag)
            total += ll_unpack16(words, BLOCK_M, BLOCK_N, out_ptr.dtype.element_ty).to(tl.float32)
    mask = own_mask[:, None] & nmask[None, :]
    o_ptrs = out_ptr + own_rows[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)


# Integers that may be 1 stay runtime values: Triton would otherwise compile anew for 1 vs not-1.
@triton.jit(do_not_specialize=["rows", "rank", "n_chunks", "chunk_rows", "first_seg", "gemm_programs", "pid_base",
                               "num_programs"])  # fmt: skip
def gemm_rs_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    dest_ptr,
    dest_deltas_ptr,
    src_ptr,
    src_deltas_ptr,
    flags_ptr,
    flag_ptrs_ptr,
    done_ptr,
    state_ptr,
    ws_ptr,
    counts_ptr,
    exit_ptrs_ptr,
    exit_ptr,
    N,
    K,
    R,
    rows,
    half_stride,
    rank,
    n_chunks,
    chunk_rows,
    first_seg,
    gemm_programs,
    pid_base,
    num_programs,
    stride_am,
    stride_bk,
    stride_bn,
    stride_dm,
    stride_om,
    WORLD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EPI: tl.constexpr,
    GEMM: tl.constexpr,
    REDUCE: tl.constexpr,
    SOURCES: tl.constexpr,
    WAIT_OWN: tl.constexpr,
    ZERO_SRC: tl.constexpr,
    READY: tl.constexpr,
    EXIT: tl.constexpr,
    ALIGNED: tl.constexpr,
    RED_M: tl.constexpr,
    RED_N: tl.constexpr,
    UPCAST: tl.constexpr,
    EPOCH: tl.constexpr,
    EPI_REDUCE: tl.constexpr,
    OWN_TILES: tl.constexpr,
    SPAN: tl.constexpr,
    LL: tl.constexpr,
):
    pid = tl.program_id(0) + pid_base
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    tag = epoch.to(tl.int64) & 0xFFFFFFFF  # LL words carry it (`runtime.ll.ll_tag`)
    if EPOCH == 1:  # noqa: SIM102 (constexpr)
        if not EXIT:  # the exit handshake publishes the epoch at the end (below)
            open_call(state_ptr)
    if SPAN:  # noqa: SIM102 (constexpr)
        if pid < gemm_programs:
            # tiles over all `rows` (every rank's), in the same order on every rank; n_chunks counts the tiles
            num_pid_n = tl.cdiv(N, BLOCK_N)
            tiles_m = tl.cdiv(rows, BLOCK_M)
            for work in range(pid, tiles_m * num_pid_n * SPLIT_K, gemm_programs):
                tile = work // SPLIT_K
                split = work % SPLIT_K
                pid_m, pid_n = grouped_tile(tile, tiles_m, num_pid_n, GROUP_M)
                first_owner = (pid_m * BLOCK_M) // R
                last_owner = (tl.minimum(rows, pid_m * BLOCK_M + BLOCK_M) - 1) // R
                mine = (first_owner <= rank) & (rank <= last_owner)
                run = mine
                if OWN_TILES != 2:  # the second half of a one-rank-at-a-time world takes the own rows' tiles only
                    run = first_owner >= 0
                if run:
                    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
                    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                    mmask = offs_m < rows
                    nmask = offs_n < N
                    a_rows = a_ptr + offs_m.to(tl.int64) * stride_am
                    acc, finished = split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, split, ws_ptr, counts_ptr,
                                                  tile, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K,
                                                  UPCAST)  # fmt: skip
                    if finished:
                        owner = offs_m // R
                        if OWN_TILES != 2:
                            if LL:
                                _send_tile_rows_ll(acc, dest_ptr, dest_deltas_ptr, half, offs_m, owner, mmask, pid_n,
                                                   N, R, rank, tag, out_ptr.dtype.element_ty, BLOCK_M,
                                                   BLOCK_N)  # fmt: skip
                            else:
                                _send_tile_rows(acc, dest_ptr, dest_deltas_ptr, flag_ptrs_ptr, epoch, half, offs_m,
                                                owner, mmask, offs_n, nmask, R, rank, first_owner, last_owner,
                                                n_chunks, tile, stride_dm)  # fmt: skip
                        if OWN_TILES != 1:
                            if mine and LL:
                                _sum_own_tile_ll(acc, out_ptr, src_ptr, src_deltas_ptr, half, offs_m - rank * R,
                                                 mmask & (owner == rank), offs_n, nmask, pid_n, N, rank, tag,
                                                 stride_om, WORLD, BLOCK_M, BLOCK_N)  # fmt: skip
                            elif mine:
                                _sum_own_tile(acc, out_ptr, src_ptr, src_deltas_ptr, flags_ptr, epoch, half,
                                              offs_m - rank * R, mmask & (owner == rank), offs_n, nmask, N, rank,
                                              n_chunks, tile, stride_om, WORLD)  # fmt: skip
    if GEMM:  # noqa: SIM102 (constexpr: a reduce-only launch has no GEMM code at all)
        if pid < gemm_programs:
            num_pid_n = tl.cdiv(N, BLOCK_N)
            seg_tiles_m = tl.cdiv(R, BLOCK_M)
            n_segs = tl.cdiv(rows, R)
            tiles_per_seg = seg_tiles_m * num_pid_n
            num_work = n_segs * tiles_per_seg * SPLIT_K
            work_lo, work_hi = 0, num_work
            if EPI_REDUCE:  # the own rows' tiles are the last work items (peers_first), when the rank has rows
                own_lo = tl.where(rank < n_segs, (n_segs - 1) * tiles_per_seg * SPLIT_K, num_work)
                if OWN_TILES == 1:
                    work_hi = own_lo
                if OWN_TILES == 2:
                    work_lo = own_lo
            for work in range(work_lo + pid, work_hi, gemm_programs):
                # work item = (tile, split); the splits of a tile are neighbours, so they run together
                tile = work // SPLIT_K
                split = work % SPLIT_K
                seg = (tile // tiles_per_seg + first_seg) % n_segs
                t = tile % tiles_per_seg
                pid_m, pid_n = grouped_tile(t, seg_tiles_m, num_pid_n, GROUP_M)

                offs_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows within the segment
                offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                seg_rows = tl.minimum(R, rows - seg * R)
                mmask = offs_r < seg_rows
                nmask = offs_n < N
                a_rows = a_ptr + (seg * R + offs_r).to(tl.int64) * stride_am
                # the tile's splits meet in its workspace slot; the last one has the sum
                acc, finished = split_product(a_rows, mmask, b_ptr, offs_n, nmask, K, split, ws_ptr, counts_ptr,
                                              tile, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K,
                                              UPCAST)  # fmt: skip
                if EPI_REDUCE and seg == rank:
                    if finished:
                        _sum_own_tile(acc, out_ptr, src_ptr, src_deltas_ptr, flags_ptr, epoch, half, offs_r, mmask,
                                      offs_n, nmask, N, rank, n_chunks, (pid_m * BLOCK_M) // chunk_rows, stride_om,
                                      WORLD)  # fmt: skip
                elif finished:
                    delta = tl.load(dest_deltas_ptr + seg)
                    if EPI != 2:  # 16-element aligned: vector stores. Atomics stay scalar (see the module doc)
                        delta = (delta // 16) * 16
                    d_ptrs = dest_ptr + half + delta + offs_r[:, None].to(tl.int64) * stride_dm + offs_n[None, :]
                    dmask = mmask[:, None] & nmask[None, :]
                    if EPI == 2:
                        tl.atomic_add(d_ptrs, acc, mask=dmask, sem="relaxed", scope="sys")
                    else:
                        tl.store(d_ptrs, acc.to(dest_ptr.dtype.element_ty), mask=dmask)
                    if EPI > 0:
                        # count the tile towards its chunk (chunks are whole tiles: chunk_rows is a
                        # multiple of BLOCK_M, or the whole segment); the one completing it releases
                        chunk = (pid_m * BLOCK_M) // chunk_rows
                        in_chunk = tl.minimum(chunk_rows, seg_rows - chunk * chunk_rows)
                        expected = tl.cdiv(in_chunk, BLOCK_M) * num_pid_n
                        tl.debug_barrier()  # the count carries every thread's stores or atomics (`signals` doc)
                        done = tl.atomic_add(done_ptr + seg * n_chunks + chunk, 1, sem="acq_rel", scope="sys")
                        if done == expected - 1:
                            tl.store(done_ptr + seg * n_chunks + chunk, 0)
                            release_ranks(flag_ptrs_ptr, rank * n_chunks + chunk, epoch, seg, seg, -1)
    if READY:  # noqa: SIM102 (constexpr)
        # pull_cublas: the partial a library GEMM wrote (earlier on the stream) is ready for every peer
        if pid == gemm_programs:
            release_flag(flag_ptrs_ptr, rank, rank, epoch, WORLD)
    if REDUCE:  # noqa: SIM102 (constexpr)
        if pid >= gemm_programs:
            # ---- reduce: this rank's R rows, per (chunk, column block), once every source's chunk is in ----
            # work item = (chunk, row block, column block): as many items as the rows allow, whatever the chunking
            rpid = pid - gemm_programs
            num_nb = tl.cdiv(N, RED_N)
            num_rb = tl.cdiv(chunk_rows, RED_M)
            for work in range(rpid, n_chunks * num_rb * num_nb, num_programs - gemm_programs):
                chunk = work // (num_rb * num_nb)
                rb = (work // num_nb) % num_rb
                nb = work % num_nb
                for s in range(0, WORLD):
                    if WAIT_OWN or s != rank:
                        wait_flag(flags_ptr + s * n_chunks + chunk, epoch)
                cols = nb * RED_N + tl.arange(0, RED_N)
                cmask = cols < N
                row_hi = tl.minimum(R, chunk * chunk_rows + chunk_rows)
                rws = chunk * chunk_rows + rb * RED_M + tl.arange(0, RED_M)
                mask = (rws < row_hi)[:, None] & cmask[None, :]
                in_slot = rws[:, None].to(tl.int64) * N + cols[None, :]
                total = tl.zeros((RED_M, RED_N), dtype=tl.float32)
                for s in range(0, SOURCES):
                    delta = tl.load(src_deltas_ptr + s)
                    if ALIGNED:  # every source 16-element aligned: say so, for vector loads
                        delta = (delta // 16) * 16
                    total += tl.load(src_ptr + half + delta + in_slot, mask=mask, other=0.0).to(tl.float32)
                o_ptrs = out_ptr + rws[:, None].to(tl.int64) * stride_om + cols[None, :]
                tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
                if ZERO_SRC:
                    # Triton may give the zeroing store another thread layout than the loads (8 warps: rows
                    # per warp vs a 4x2 warp grid), so without the barrier one thread zeroes an element
                    # before another has read it; every read must be done first
                    tl.debug_barrier()
                    delta = tl.load(src_deltas_ptr)
                    zeros = tl.zeros((RED_M, RED_N), dtype=tl.float32)
                    tl.store(src_ptr + half + delta + in_slot, zeros, mask=mask)
    if EPOCH == 1:
        if EXIT:
            # pull_cublas: the last program to finish tells every peer "done reading your partial of call
            # e" and waits until each peer said the same, so the next call's GEMM may overwrite this rank's
            # partial as soon as this launch ends; then it publishes the epoch
            tl.debug_barrier()
            arrived = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="gpu")
            if arrived == num_programs - 1:
                tl.store(state_ptr + 1, 0)
                release_flag(exit_ptrs_ptr, rank, rank, epoch, WORLD)
                for j in range(1, WORLD):
                    wait_flag(exit_ptr + (rank + j) % WORLD, epoch)
                tl.atomic_xchg(state_ptr, epoch, sem="release", scope="gpu")
        else:
            publish_call(state_ptr, epoch, num_programs)


@triton.jit(do_not_specialize=["owner", "index"])
def release_flag_kernel(flag_ptrs_ptr, state_ptr, owner, index):
    # Queued behind copy-engine copies into `owner`: stream order puts them first, the release publishes them.
    release_ranks(flag_ptrs_ptr, index, tl.load(state_ptr), owner, owner, -1)


__all__ = ["gemm_rs_kernel", "release_flag_kernel", "triton"]
