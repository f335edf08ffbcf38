"""`ag_gemm`: All-Gather + GEMM, column-parallel (the first linear of a tensor-parallel MLP).

Rank r holds A_r[M/W, K] and B_r[K, N/W] and computes C_r = all_gather(A) @ B_r of [M, N/W].
Dims M, N, K are global; R = M / W rows per rank, N_r = N / W columns per rank. Modes:
  pull      every program reads A's rows straight from the owning peer (waits on its flag);
  push      `comm_sms` SMs copy the local A shard to every peer in `chunk_m`-row chunks, raising a
            flag per chunk, while the other SMs run the tile GEMM on chunks as they arrive;
  push_cublas  A's chunks are pushed into every peer's inbox, by `comm_sms` Triton programs or by
            the copy engine (`push_by`), a flag raised per chunk; cuBLAS multiplies the local rows
            while they travel and then each chunk after its flag (`gemm_order=local_first`), or all
            M rows in one GEMM once everything landed (`gathered`: one read of B, for small M).
            No barrier: a rank only writes into peers and reads what it was sent;
  barrier   `barrier_sms` programs push A's rows to every rank, meeting their namesakes on every peer (a signal
            each way, `kernels.runtime.meet`), then one cuBLAS GEMM of all M rows: push_cublas's gathered order
            without flags or entry handshake (as GEMM+RS's barrier mode). `landing=direct`: straight into every
            rank's gathered buffer, between two meetings; `inbox`: into inbox halves alternating by the call's
            epoch, before one meeting, then copied locally into the gathered buffer; `ll`: into inbox halves as
            64-bit words of two values and the call's tag (`kernels.runtime.ll`), which the rank polls into its
            gathered buffer: no meeting, twice the bytes;
  ce        the copy engine gathers A in `ce_chunks` chunks per peer shard; a Triton tile GEMM or
            cuBLAS (`ce_consumer`) consumes each chunk after it lands;
  baseline  an all-gather, then one cuBLAS GEMM: the unfused path, its `collective` NCCL's default or symmetric
            kernels, or NCCL's copy engine (`_collectives`), whichever the size favours.
Tiles (BLOCK_M/N/K, GROUP_M, num_warps, num_stages, SPLIT_K) exist wherever a Triton GEMM runs;
`SPLIT_K` splits the k loop over the global K, each split at least two BLOCK_K steps deep.
The ag_gemm kernel is written against exactly these names, values and meanings.
"""

from __future__ import annotations

from jointtune.search_spaces._collectives import ALL_GATHER, collective_param
from jointtune.search_spaces._family import family_space
from jointtune.search_spaces._gemm import (
    BIG_TILE,
    ce_params,
    comm_constraints,
    mode_param,
    one_chunk,
    row_tile,
    sharded_problem,
    tile_constraints,
    tile_params,
)
from jointtune.search_spaces._params import Context, Value, categorical, next_pow2, pow2, when

_check_problem, _derive = sharded_problem("ag_gemm", ("M", "N"), {"R": "M", "N_r": "N"})

MODES = ("pull", "push", "push_cublas", "barrier", "ce", "baseline")
_PUSH_CUBLAS = when(mode="push_cublas")
CHUNK_MAX = 8192
#: from this many rows per rank the default overlaps the local rows' GEMM with the push
LOCAL_FIRST_FROM_ROWS = 2048
#: rows per rank up to which the default is the barrier launch (measured to 128 rows a rank: 256 at W=2)
BARRIER_MAX_ROWS = 128
#: values a rank sends per call ((W - 1) x R x K, 8 bytes a pair as LL words) up to which the barrier launch's default
#: landing is LL words, and up to which the seeds try them. On 4x H100 (graph replay) LL beat the inbox by 0.8-2.0 µs
#: up to 2**17 (16 rows of K=8192 at W=4, 16 and 32 rows at W=2), was within 0.4 µs of it either way at 1.5-2 x 2**17
#: (0.4 ahead at 32 rows of W=4 and 64 of W=2, even at 128 x 6144 x 4096 on W=2), and lost by 1.6-14 µs from
#: 3 x 2**17 (the doubled bytes; bench/results/ag_gemm_barrier_ll_w*_4xH100_2026-11-27.json)
LL_DEFAULT_MAX_SENT = 1 << 17
LL_SEED_MAX_SENT = 1 << 18


def _default(ctx: Context) -> dict[str, Value]:
    """What measured best, valid for any shape.

    Up to BARRIER_MAX_ROWS rows per rank: the barrier launch, its rows landing in inbox halves, on 64 programs (4x
    H100, graph replay: 1.02-1.10x the best unfused path at W=4 and 1.06-1.21x at W=2 at 16-256 rows of the decode
    shapes, where push_cublas took 0.80-0.94x at W=4 in the run before;
    bench/results/ag_gemm_barrier_*_4xH100_2026-11-27.json), or as LL words where a rank sends few enough values
    (`LL_DEFAULT_MAX_SENT`).
    Below 2048 rows per rank: `comm_sms` programs push every row and one cuBLAS GEMM reads B once (2x H200: 1.18-1.20x
    NCCL + cuBLAS at M=128, 1.13x at M=1024, and the cheapest call to issue; bench/results/ag_gemm_*_push-cublas*).
    From 2048 rows: the copy engine pushes two chunks per rank while cuBLAS multiplies the local rows (within 1% of
    the best at the three large shapes; no barrier, every SM left to cuBLAS). One rank, or no chunk that fits: NCCL +
    cuBLAS, or the copy engine pulling in one chunk.
    """
    R = ctx["R"]
    if ctx["W"] == 1 or ctx["num_sms"] < 4:
        return {"mode": "baseline"}
    if R <= BARRIER_MAX_ROWS:
        return _barrier(ctx, _landing(ctx))
    if R < LOCAL_FIRST_FROM_ROWS:
        sms = 1 << (min(32, ctx["num_sms"] // 4).bit_length() - 1)  # a power of two <= num_sms // 4
        return {"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered", "comm_sms": sms}
    chunk = default_chunk_m(R)
    if chunk is None:
        return {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1}
    return {"mode": "push_cublas", "push_by": "ce", "gemm_order": "local_first", "chunk_m": chunk}


def _seeds(ctx: Context) -> list[dict[str, Value]]:
    """The barrier launch first, up to 1024 rows: landing as LL words where a rank sends at most `LL_DEFAULT_MAX_SENT`
    values (as the default does up to BARRIER_MAX_ROWS rows a rank), else in the inbox; then the other landing where
    few enough values travel for LL to be close (`LL_SEED_MAX_SENT`). Up to 128 rows: the Triton modes with one
    row tile over all M rows (B read once; at one rank push took 1.13-1.19x cuBLAS with it, 1.69x faster than with
    64-row tiles: bench/results/ag_gemm_small_m_w1_1xH200_2026-11-24.json), split over K where its column tiles (N / W
    of them) leave SMs idle (`row_tile`)."""
    if ctx["W"] == 1:
        return []
    barrier = []
    if ctx["M"] <= 1024:
        first = _landing(ctx)
        barrier = [_barrier(ctx, first)]
        if _sent(ctx) <= LL_SEED_MAX_SENT:
            barrier.append(_barrier(ctx, "inbox" if first == "ll" else "ll"))
    if ctx["M"] > 128:
        return barrier
    tile = row_tile(ctx["M"], ctx, cols="N_r", depth="K")
    return [
        *barrier,
        {"mode": "push", "comm_sms": 8, "chunk_m": one_chunk(ctx["R"]), **tile},
        {"mode": "pull", **tile},
    ]


def _sent(ctx: Context) -> int:
    """Values of A a rank sends to its peers per call."""
    return (ctx["W"] - 1) * ctx["R"] * ctx["K"]


def _landing(ctx: Context) -> str:
    """The barrier launch's measured-best landing: LL words up to `LL_DEFAULT_MAX_SENT` values sent, else the inbox."""
    return "ll" if _sent(ctx) <= LL_DEFAULT_MAX_SENT else "inbox"


def _barrier(ctx: Context, landing: str = "inbox") -> dict[str, Value]:
    """The barrier launch on 64 programs (at most half the SMs), landing in inbox halves or as LL words: on 4x H100
    the inbox beat the direct landing by 0.3-1.8 µs at every decode shape, W=2 and W=4, with 64 and 128 programs
    within 1 µs and 32 behind at 128-256 rows (bench/results/ag_gemm_barrier_inbox_w*_4xH100_2026-11-27.json); LL
    words: `LL_DEFAULT_MAX_SENT`."""
    return {
        "mode": "barrier",
        "landing": landing,
        "barrier_sms": 1 << (min(64, max(1, ctx["num_sms"] // 2)).bit_length() - 1),
    }


def _starts(ctx: Context) -> list[dict[str, Value]]:
    """One config per mode for a tuner's start, sized by the rows per rank (so by the world size): one row tile over
    up to 128 rows, else the large fused tile; half of R per pushed chunk from 2048 rows (`default_chunk_m`); the
    copy engine in one chunk below 2048 rows per rank, two from there; both push_cublas forms (whichever the default
    is not). Not measured per world size yet: the start only has to land in each mode's good region."""
    R = ctx["R"]
    tile = row_tile(ctx["M"], ctx, cols="N_r", depth="K") if ctx["M"] <= 128 else dict(BIG_TILE)
    chunk = default_chunk_m(R) or one_chunk(R)
    sms = 1 << (min(16, max(1, ctx["num_sms"] // 4)).bit_length() - 1)
    return [
        {"mode": "pull", **tile},
        {"mode": "push", "comm_sms": sms, "chunk_m": chunk, **tile},
        {"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered", "comm_sms": sms},
        {"mode": "push_cublas", "push_by": "ce", "gemm_order": "local_first", "chunk_m": chunk},
        _barrier(ctx),
        {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1 if R < LOCAL_FIRST_FROM_ROWS else 2},
    ]


def default_chunk_m(R: int) -> int | None:
    """Half of R when R >= 2048 and that is a power of two, else one chunk, else a power-of-two divisor."""
    half = R // 2
    if R >= 2048 and R % 2 == 0 and half & (half - 1) == 0 and half <= CHUNK_MAX:
        return half
    if next_pow2(R) <= CHUNK_MAX:
        return next_pow2(R)
    divisors = [c for c in (2**e for e in range(4, CHUNK_MAX.bit_length())) if R % c == 0]
    return divisors[-1] if divisors else None


AG_GEMM = family_space(
    "ag_gemm",
    dims=("M", "N", "K"),
    revision=7,  # 2: SPLIT_K (split-K tiles) and its depth rule; 3: push_cublas; 4: one 16-row chunk below 16 rows;
    # 5: the baseline's collective; 6: mode barrier, barrier_sms; 7: landing ll
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        mode_param("how A's shards reach the GEMM: fused pull/push, pushed to cuBLAS, copy engine, or NCCL", MODES),
        *ce_params(
            "what multiplies each gathered chunk in ce mode: a Triton tile GEMM or cuBLAS",
            "copy-engine chunks per peer shard (more chunks = earlier start, more launches)",
        ),
        categorical(
            "push_by", ("sm", "ce"), when=_PUSH_CUBLAS, doc="who pushes in push_cublas: Triton programs or copy engine"
        ),
        categorical(
            "gemm_order",
            ("local_first", "gathered"),
            when=_PUSH_CUBLAS,
            doc="push_cublas: local rows while chunks travel, then per chunk; or one GEMM after the gather",
        ),
        collective_param(ALL_GATHER, "all-gather"),
        *tile_params(),
        pow2(
            "comm_sms",
            1,
            32,
            when=when(mode="push") | when(mode="push_cublas", push_by="sm"),
            doc="SMs that push A chunks to peers",
        ),
        categorical(
            "landing",
            ("direct", "inbox", "ll"),
            when=when(mode="barrier"),
            doc="where the barrier launch's pushed rows land: in the buffer cuBLAS reads (two meetings), in an "
            "inbox half by the call's epoch (one meeting, then a local copy), or in an inbox half as words tagged "
            "with the call (no meeting: the rank polls them, then copies)",
        ),
        pow2(
            "barrier_sms",
            1,
            128,
            when=when(mode="barrier"),
            doc="programs of the barrier launch (each pushes its blocks of A's rows to every rank)",
        ),
        pow2(
            "chunk_m",
            16,
            CHUNK_MAX,
            when=when(mode="push") | when(mode="push_cublas", gemm_order="local_first"),
            doc="rows of A per pushed chunk (one flag each)",
        ),
    ],
    constraints=[
        *tile_constraints("N_r", "N / world_size", "K", "global depth"),
        *comm_constraints(),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=_default,
    seeds=_seeds,
    starts=_starts,
)
