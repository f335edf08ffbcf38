"""`gemm_rs`: GEMM + Reduce-Scatter, row-parallel (the second linear of a tensor-parallel MLP).

Rank r holds A_r[M, K/W] and B_r[K/W, N], computes the partial P_r = A_r @ B_r of [M, N] and
ends with its R = M / W rows of sum_r P_r. Dims M, N, K are global; K_r = K / W. Modes:
  push      the tile GEMM's epilogue stores each finished tile into the owner's inbox slot and
            releases a flag per `chunk_m` rows; `reduce_sms` programs of the same launch sum the
            owner's slots as flags arrive (`reduce_by=programs`), or every SM runs the GEMM and the
            epilogue of each own-rows tile, computed last, sums the peers' tiles (`epilogue`), or tiles
            span every rank's rows (B read once: few rows), send the rows others own and sum their own
            rows after the peers' same tile arrives (`tile`, a flag per tile, no chunk_m; or with
            `handoff=ll` no flag: the rows go as 64-bit words of two values and the call's tag, which the
            owner polls, one NVLink latency per handoff instead of a fence and a flag, for twice the bytes);
  pull      the epilogue stores into the rank's own partial buffer and flags the owner; the
            owner's reduce programs, or own-rows epilogues, read peers' tiles over NVLink;
  atomic    the epilogue adds float32 tiles atomically into the owner's accumulator; the reduce
            programs cast it. Non-deterministic (the order of the adds varies): the tuner offers it
            only where the caller allows it (`allow_nondeterministic`, off by default);
  pull_cublas  cuBLAS computes the whole partial into symmetric memory; one launch of `reduce_sms`
            programs pulls and sums the rank's rows from every peer (two launches, as GEMM + NCCL);
  barrier   cuBLAS computes the whole partial; one launch of `reduce_sms` programs exchanges it between meetings
            with its namesakes on every peer (a signal each way, `kernels.runtime.meet`). `transport=pull`: the
            partial is in symmetric memory; meet, pull and sum the rank's rows, meet again (pull_cublas without
            flags, epochs or exit handshake: the pattern of GEMM + all-reduce's barrier exchange, which ran within
            0.1-1.7 µs of torch's symmetric-memory two-shot, bench/ops/two_shot_probe.py). `transport=push`: write
            every owner's rows into its inbox (halves alternating by the call's epoch), meet once, sum locally;
  ce        a Triton tile GEMM or cuBLAS (`ce_consumer`) computes each destination's rows in
            `ce_chunks` chunks; the copy engine sends each chunk as it completes; `reduce_sms`
            programs sum the slots;
  baseline  one cuBLAS GEMM, then a reduce-scatter: the unfused path, its `collective` NCCL's default or symmetric
            kernels (`_collectives`), whichever the size favours.
Tiles are ag_gemm's; `SPLIT_K` splits the local k loop, over K_r (not K), each split at least two
BLOCK_K steps deep. `tile_order` starts with the next rank's rows (own rows last) or the own rows; an
epilogue reduce always computes the own rows last (its waits would otherwise wait on each other).
"""

from __future__ import annotations

from collections.abc import Mapping

from jointtune.search_spaces._collectives import REDUCE_SCATTER, collective_param
from jointtune.search_spaces._family import family_space
from jointtune.search_spaces._gemm import (
    BASELINE_BELOW_ROWS,
    BIG_TILE,
    ce_params,
    comm_constraints,
    mode_param,
    row_tile,
    sharded_problem,
    tile_constraints,
    tile_params,
)
from jointtune.search_spaces._params import Constraint, Context, Value, categorical, pow2, when

_check_problem, _derive = sharded_problem("gemm_rs", ("M", "K"), {"R": "M", "K_r": "K"})

MODES = ("pull", "push", "atomic", "pull_cublas", "barrier", "ce", "baseline")
_FUSED = when(mode=("pull", "push", "atomic"))
#: fused modes whose own rows are summed by reduce programs beside the GEMM
_REDUCE_PROGRAMS = when(mode="atomic") | when(mode=("pull", "push"), reduce_by="programs")
#: fused modes that flag chunks of a rank's rows (with `reduce_by=tile` a flag is per tile)
_CHUNKED = when(mode="atomic") | when(mode=("pull", "push"), reduce_by=("programs", "epilogue"))
#: rows up to which cuBLAS + the barrier launch leads the seeds (the decode regime, where the collective's latency,
#: not its bandwidth, decides)
BARRIER_SEED_MAX_ROWS = 1024
#: modes whose results may differ in the last bits between identical calls
NONDETERMINISTIC = ("atomic",)


def _default(ctx: Context) -> dict[str, Value]:
    """What measured best, valid for any shape: below 512 rows per rank cuBLAS + the pushed barrier launch on 64
    programs (4x H100, graph replay: 1.12-1.30x the best unfused path at 64-256 rows of the three decode shapes, W=2
    and W=4, where cuBLAS + the flagged pull-and-sum launch, the default before, took 0.68-1.00x at W=4 in the run
    before; bench/results/gemm_rs_barrier_*_4xH100_2026-11-27.json); from 512 rows cuBLAS + the copy engine in one
    chunk, 128 reduce programs (2x H200: 1.06-1.19x at M = 1024 and the large shapes,
    bench/results/gemm_rs_modes_2xH200_2026-11-23.json); one rank: cuBLAS alone."""
    if ctx["W"] == 1 or ctx["num_sms"] < 4:
        return {"mode": "baseline"}
    if ctx["R"] < BASELINE_BELOW_ROWS:
        return _barrier_seed(ctx)
    return {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": _pow2_at_most(128, ctx["num_sms"])}


def _seeds(ctx: Context) -> list[dict[str, Value]]:
    """The fused launches that measured best at one rank (bench/results/gemm_rs_tile_w1_* and gemm_rs_epilogue_w1_*,
    1x H200), for a tuner's first trials: tiles over every rank's rows up to 128 rows, own-rows epilogues above.
    Up to BARRIER_SEED_MAX_ROWS rows cuBLAS + the barrier launch leads (`_barrier_seed`)."""
    if ctx["W"] == 1:
        return []
    if ctx["M"] <= BARRIER_SEED_MAX_ROWS:
        return [_barrier_seed(ctx), *_fused_seeds(ctx)]
    return _fused_seeds(ctx)


def _barrier_seed(ctx: Context) -> dict[str, Value]:
    """cuBLAS + the pushed barrier launch on 64 programs (at most half the SMs): on 4x H100 it beat the pulled one at
    every decode shape, W=2 and W=4, by 0.4-7 µs, with 64 and 128 programs within 0.5 µs of each other and 32 behind
    (bench/results/gemm_rs_barrier_w{2,4}_4xH100_2026-11-27.json)."""
    return {"mode": "barrier", "transport": "push", "reduce_sms": _pow2_at_most(64, max(1, ctx["num_sms"] // 2))}


def _fused_seeds(ctx: Context) -> list[dict[str, Value]]:
    if ctx["M"] <= 128:
        tile = row_tile(ctx["M"], ctx, cols="N", depth="K_r")
        # LL words first: they beat the flagged push at 64-128 rows of every measured shape at W=4 (by 1.2-6.1 µs)
        # and in three of four at W=2 (0.6 µs behind in the fourth; bench/README.md, "GEMM + all-reduce at four
        # GPUs"); the flagged push stays second
        return [
            {"mode": "push", "reduce_by": "tile", "handoff": "ll", **tile},
            {"mode": "push", "reduce_by": "tile", "handoff": "flag", **tile},
            {"mode": "pull", "reduce_by": "tile", **tile},
        ]
    return [{"mode": mode, "reduce_by": "epilogue", "chunk_m": 256, **BIG_TILE} for mode in ("pull", "push")]


def _starts(ctx: Context) -> list[dict[str, Value]]:
    """One config per mode for a tuner's start (the seeds cover pull and push): cuBLAS + pull-and-sum and the copy
    engine as the default has them, atomic with the fused tile of the seeds' regime. Not measured per world size."""
    tile = row_tile(ctx["M"], ctx, cols="N", depth="K_r") if ctx["M"] <= 128 else dict(BIG_TILE)
    reduce_beside = _pow2_at_most(16, max(1, ctx["num_sms"] // 4))
    return [
        {"mode": "pull", "reduce_by": "epilogue", "chunk_m": 256, **tile},
        {"mode": "push", "reduce_by": "epilogue", "chunk_m": 256, **tile},
        {"mode": "atomic", "chunk_m": 256, "reduce_sms": reduce_beside, "tile_order": "peers_first", **tile},
        {"mode": "pull_cublas", "reduce_sms": _pow2_at_most(64, ctx["num_sms"])},
        _barrier_seed(ctx),
        {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": _pow2_at_most(128, ctx["num_sms"])},
    ]


def _pow2_at_most(want: int, num_sms: int) -> int:
    return 1 << (min(want, num_sms).bit_length() - 1)


def _reduce_budget(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    """Reduce programs share the grid with a fused GEMM (a quarter of the SMs at most); after cuBLAS or beside
    the copy engine they have the GPU to themselves."""
    beside_gemm = cfg["mode"] in ("pull", "push", "atomic")
    limit = ctx["num_sms"] // 4 if beside_gemm else ctx["num_sms"]
    if cfg["reduce_sms"] <= limit:
        return None
    rule = "num_sms // 4 beside a fused GEMM" if beside_gemm else "num_sms"
    return (
        f"reduce_sms: {cfg['reduce_sms']} is not allowed with mode={cfg['mode']} and num_sms={ctx['num_sms']}; "
        f"allowed: <= {rule} = {limit}"
    )


GEMM_RS = family_space(
    "gemm_rs",
    dims=("M", "N", "K"),
    # 2: SPLIT_K and its depth rule; 3: the kernel's modes (atomic, pull_cublas, reduce_sms, tile_order); 4: no
    # atomic_tile rule (atomic mode's wrong sums were a race in its kernel, fixed: bench/results/
    # gemm_rs_atomic_fix_1xH200_2026-11-24.json), so atomic takes every tile the other fused modes take; 5: reduce_by;
    # 6: the baseline's collective; 7: handoff (LL words with reduce_by=tile, push); 8: mode barrier, transport
    revision=8,
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        mode_param(
            "how partial rows reach their owner: fused push/pull/atomic, cuBLAS + pull (flagged or between two "
            "barriers), copy engine, or cuBLAS + NCCL",
            MODES,
        ),
        *ce_params(
            "what computes each chunk of partial rows in ce mode: a Triton tile GEMM or cuBLAS",
            "chunks per destination rank's rows (more chunks = earlier sends, more launches)",
        ),
        collective_param(REDUCE_SCATTER, "reduce-scatter"),
        *tile_params(_FUSED | when(mode="ce", ce_consumer="triton")),
        categorical(
            "reduce_by",
            ("programs", "epilogue", "tile"),
            when=when(mode=("pull", "push")),
            doc="who sums the owner's rows: reduce programs beside the GEMM, the own-rows tiles' epilogues, or every "
            "tile of all ranks' rows, after swapping rows with the peers' same tile",
        ),
        categorical(
            "handoff",
            ("flag", "ll"),
            when=when(mode="push", reduce_by="tile"),
            implied="flag",
            doc="how a tile's rows announce themselves: a flag after a fence, or in the data (LL words: twice the "
            "bytes, no fence)",
        ),
        categorical(
            "transport",
            ("pull", "push"),
            when=when(mode="barrier"),
            doc="how the barrier launch moves partial rows: pulled from every rank's partial between two meetings, "
            "or pushed into the owner's inbox before one",
        ),
        pow2(
            "chunk_m",
            16,
            8192,
            when=_CHUNKED,
            doc="rows of the partial result per flag (whole tiles: at least BLOCK_M)",
        ),
        pow2(
            "reduce_sms",
            1,
            128,
            when=_REDUCE_PROGRAMS | when(mode=("pull_cublas", "barrier", "ce")),
            doc="programs that sum (or cast) the owner's rows as their flags arrive",
        ),
        categorical(
            "tile_order",
            ("peers_first", "own_first"),
            when=_REDUCE_PROGRAMS,
            doc="which rows the GEMM computes first: the next ranks' (own last), or its own",
        ),
    ],
    constraints=[
        *tile_constraints("N", "global columns", "K_r", "K / world_size"),
        *[c for c in comm_constraints(sms_field="reduce_sms", ragged_chunks=True) if c.name != "reduce_sms_budget"],
        Constraint(
            "reduce_sms_budget",
            ("reduce_sms", "mode"),
            "reduce_sms <= num_sms // 4 beside a fused GEMM (pull, push, atomic), else <= num_sms",
            _reduce_budget,
        ),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=_default,
    nondeterministic=NONDETERMINISTIC,
    seeds=_seeds,
    starts=_starts,
)
