"""Pieces the two GEMM families share: tile params, copy-engine params, and their constraints.

Both `ag_gemm` and `gemm_rs` run a Triton tile GEMM in `pull`/`push` modes and, in `ce` mode,
either a Triton tile GEMM or cuBLAS per chunk; `baseline` is NCCL + cuBLAS with no knobs. Only
the GEMM's extents differ (all-gather: M x N/W x K; reduce-scatter: M x N x K/W), so the tile
rules take the context names of those extents. `SPLIT_K` splits one output tile's k loop over
that many programs whose fp32 partial sums meet through atomics; the depth it splits is the one
the local GEMM loops over (K for all-gather, K/W for reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jointtune.errors import SpaceError
from jointtune.search_spaces._params import (
    Condition,
    Constraint,
    Context,
    Param,
    Value,
    categorical,
    cdiv,
    choice,
    next_pow2,
    pow2,
    when,
)
from jointtune.search_spaces._problem import Problem

MODES = ("pull", "push", "ce", "baseline")
#: tiles exist whenever a Triton GEMM runs
TILES_WHEN = when(mode=("pull", "push")) | when(mode="ce", ce_consumer="triton")
#: below this many rows per rank a fused kernel rarely beats NCCL + cuBLAS: default to baseline
BASELINE_BELOW_ROWS = 512
#: programs one output tile's k loop is split over
SPLIT_KS = (1, 2, 4, 8)


def mode_param(doc: str, modes: tuple[str, ...] = MODES) -> Param:
    return categorical("mode", modes, doc=doc)


def ce_params(consumer_doc: str, chunks_doc: str) -> list[Param]:
    on_ce = when(mode="ce")
    return [
        categorical("ce_consumer", ("triton", "cublas"), when=on_ce, doc=consumer_doc),
        choice("ce_chunks", (1, 2, 4, 8), when=on_ce, doc=chunks_doc),
    ]


def tile_params(cond: Condition = TILES_WHEN) -> list[Param]:
    return [
        pow2("BLOCK_M", 16, 256, when=cond, doc="rows of C per program"),
        pow2("BLOCK_N", 32, 256, when=cond, doc="columns of C per program"),
        pow2("BLOCK_K", 32, 256, when=cond, doc="depth of one k-step"),
        choice("GROUP_M", (1, 4, 8, 16), when=cond, doc="row tiles per group of the L2-friendly swizzle"),
        choice("num_warps", (4, 8), when=cond, doc="warps per program"),
        choice("num_stages", (2, 3, 4, 5, 6), when=cond, doc="software-pipeline depth of the k loop"),
        choice("SPLIT_K", SPLIT_KS, when=cond, doc="programs sharing one tile's k loop (fp32 atomic reduction)"),
    ]


def _tile_bound(field: str, floor: int, extent: str, label: str) -> Constraint:
    def check(cfg: Mapping[str, Value], ctx: Context) -> str | None:
        limit = max(floor, next_pow2(ctx[extent]))
        if cfg[field] <= limit:
            return None
        return (
            f"{field}: {cfg[field]} is not allowed for {extent}={ctx[extent]} ({label}); "
            f"allowed: <= max({floor}, next_pow2({extent})) = {limit}"
        )

    return Constraint(f"{field}_fits_problem", (field,), f"{field} <= max({floor}, next_pow2({extent}))", check)


def _smem(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    bm, bn, bk, stages = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_stages"]
    need = (bm * bk + bk * bn) * ctx["dtype_bytes"] * stages
    if need <= ctx["max_shared_mem"]:
        return None
    return (
        f"shared memory: (BLOCK_M*BLOCK_K + BLOCK_K*BLOCK_N) * dtype_bytes * num_stages = "
        f"({bm}*{bk} + {bk}*{bn}) * {ctx['dtype_bytes']} * {stages} = {need} bytes with "
        f"BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, num_stages={stages} is not allowed; "
        f"allowed: <= max_shared_mem = {ctx['max_shared_mem']}"
    )


def _warps(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    area = cfg["BLOCK_M"] * cfg["BLOCK_N"]
    if cfg["num_warps"] != 8 or area >= 8192:
        return None
    return (
        f"num_warps: 8 is not allowed with BLOCK_M*BLOCK_N = {cfg['BLOCK_M']}*{cfg['BLOCK_N']} = {area}; "
        f"allowed: 8 only when BLOCK_M*BLOCK_N >= 8192, else 4"
    )


def _group_m(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    row_tiles = cdiv(ctx["M"], cfg["BLOCK_M"])
    if cfg["GROUP_M"] == 1 or cfg["GROUP_M"] <= row_tiles:
        return None
    return (
        f"GROUP_M: {cfg['GROUP_M']} is not allowed with BLOCK_M={cfg['BLOCK_M']}, M={ctx['M']} "
        f"(cdiv(M, BLOCK_M) = {row_tiles} row tiles); allowed: 1 or <= {row_tiles}"
    )


def _split_k(depth: str, label: str) -> Constraint:
    def check(cfg: Mapping[str, Value], ctx: Context) -> str | None:
        split, bk = cfg["SPLIT_K"], cfg["BLOCK_K"]
        need = 2 * bk  # each split runs at least two k-steps, or splitting only adds atomics
        if split == 1 or cdiv(ctx[depth], split) >= need:
            return None
        ok = ", ".join(str(s) for s in SPLIT_KS if s == 1 or cdiv(ctx[depth], s) >= need)
        return (
            f"SPLIT_K: {split} is not allowed with BLOCK_K={bk} for {depth}={ctx[depth]} ({label}); "
            f"cdiv({depth}, SPLIT_K) = {cdiv(ctx[depth], split)} < 2 * BLOCK_K = {need}; "
            f"allowed: 1 or cdiv({depth}, SPLIT_K) >= 2 * BLOCK_K, here {ok}"
        )

    rule = f"SPLIT_K == 1 or cdiv({depth}, SPLIT_K) >= 2 * BLOCK_K"
    return Constraint("split_k_fits_depth", ("SPLIT_K", "BLOCK_K"), rule, check)


def tile_constraints(cols: str, cols_label: str, depth: str, depth_label: str) -> list[Constraint]:
    """Rules for one GEMM of extents M x `cols` x `depth` (context names, with their meaning)."""
    return [
        Constraint(
            "shared_memory",
            ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"),
            "(BLOCK_M*BLOCK_K + BLOCK_K*BLOCK_N) * dtype_bytes * num_stages <= max_shared_mem",
            _smem,
        ),
        _tile_bound("BLOCK_M", 16, "M", "global rows"),
        _tile_bound("BLOCK_N", 32, cols, cols_label),
        _tile_bound("BLOCK_K", 32, depth, depth_label),
        Constraint(
            "warps_fit_tile",
            ("num_warps", "BLOCK_M", "BLOCK_N"),
            "num_warps == 4 or BLOCK_M*BLOCK_N >= 8192",
            _warps,
        ),
        Constraint("group_fits_rows", ("GROUP_M", "BLOCK_M"), "GROUP_M == 1 or GROUP_M <= cdiv(M, BLOCK_M)", _group_m),
        _split_k(depth, depth_label),
    ]


def one_chunk(R: int) -> int:
    """chunk_m of one chunk per rank of R rows: next_pow2(R), at least chunk_m's smallest choice (16)."""
    return max(16, next_pow2(R))


def _chunk_m(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    rows, chunk = ctx["R"], cfg["chunk_m"]
    single = one_chunk(rows)
    if rows % chunk == 0 or chunk == single:
        return None
    return (
        f"chunk_m: {chunk} is not allowed for R={rows} rows per rank (M / world_size); "
        f"allowed: a divisor of R, or {single} (one chunk per rank)"
    )


def _sms_budget(field: str) -> Constraint:
    def check(cfg: Mapping[str, Value], ctx: Context) -> str | None:
        if cfg[field] <= ctx["num_sms"] // 4:
            return None
        return (
            f"{field}: {cfg[field]} is not allowed with num_sms={ctx['num_sms']}; "
            f"allowed: <= num_sms // 4 = {ctx['num_sms'] // 4}"
        )

    return Constraint(f"{field}_budget", (field,), f"{field} <= num_sms // 4", check)


def _ce_chunks(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["ce_chunks"] <= ctx["R"]:
        return None
    return f"ce_chunks: {cfg['ce_chunks']} is not allowed for R={ctx['R']} rows per rank; allowed: <= R"


def _chunk_fits(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["chunk_m"] <= one_chunk(ctx["R"]):
        return None
    return (
        f"chunk_m: {cfg['chunk_m']} is not allowed for R={ctx['R']} rows per rank (M / world_size); "
        f"allowed: <= max(16, next_pow2(R)) = {one_chunk(ctx['R'])}"
    )


def comm_constraints(sms_field: str = "comm_sms", *, ragged_chunks: bool = False) -> list[Constraint]:
    """Rules for the communication knobs; `R` is the rows each rank owns (M / world_size); `sms_field`
    names the programs given to communication (at most a quarter of the SMs). With `ragged_chunks` the
    kernel takes a shorter last chunk, so chunk_m need not divide R."""
    chunk = (
        Constraint("chunk_fits_rows", ("chunk_m",), "chunk_m <= max(16, next_pow2(R))", _chunk_fits)
        if ragged_chunks
        else Constraint(
            "chunk_divides_rows", ("chunk_m",), "R % chunk_m == 0 or chunk_m == max(16, next_pow2(R))", _chunk_m
        )
    )
    return [
        chunk,
        _sms_budget(sms_field),
        Constraint("ce_chunks_fit_rows", ("ce_chunks",), "ce_chunks <= R", _ce_chunks),
    ]


#: the fused GEMM tile that measured best at large shapes (bench/results/gemm_rs_epilogue_w1_1xH200_2026-11-24.json)
BIG_TILE: dict[str, Value] = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, SPLIT_K=1)


def row_tile(M: int, ctx: Context | None = None, *, cols: str = "", depth: str = "") -> dict[str, Value]:
    """One row tile over up to 128 rows, 64 columns, 128-deep steps: our tile GEMM's best at 32-128 rows, 1.05-1.16x
    cuBLAS (bench/results/tile_gemm_small_m_1xH200_2026-11-24.json). No split-K, unless `ctx` names the GEMM's column
    and depth extents (`cols`, `depth`: context names): then `row_split`'s."""
    bm = max(16, min(128, next_pow2(M)))
    tile: dict[str, Value] = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=8 if bm >= 128 else 4,
                                  num_stages=4, SPLIT_K=1)  # fmt: skip
    if ctx is not None:
        tile["SPLIT_K"] = row_split(ctx, tile, cols, depth)
    return tile


def row_split(ctx: Context, tile: Mapping[str, Value], cols: str, depth: str) -> int:
    """Split-K for one row tile over every row of an M x `cols` x `depth` GEMM: only where its tiles would leave three
    quarters of the SMs idle, doubling while the doubled work items still fit the SMs and each split stays two BLOCK_K
    steps deep. At 32 column tiles of 64 (AG+GEMM's 2048 columns per rank at W=4) split 4 ran 10.2 µs where no split
    ran 25.1 (64x2048x8192 on one H100, best of each over a grid: bench/results/tile_gemm_rate_1xH100_2026-11-26.json);
    at 64 column tiles the best split 2 was even with the best no-split, and at 128 (N=8192) no split is fastest (the
    best split 2 1.02-1.84x slower, more so with more rows)."""
    tiles = cdiv(ctx["M"], int(tile["BLOCK_M"])) * cdiv(ctx[cols], int(tile["BLOCK_N"]))
    split, deep = 1, 2 * int(tile["BLOCK_K"])
    if tiles * 4 > ctx["num_sms"]:
        return 1
    while split < 8 and tiles * split * 2 <= ctx["num_sms"] and cdiv(ctx[depth], split * 2) >= deep:
        split *= 2
    return split


def gemm_default(ctx: Context) -> dict[str, Value]:
    """Baseline for small per-rank row counts, else copy engine + cuBLAS: valid for any shape."""
    if ctx["R"] < BASELINE_BELOW_ROWS:
        return {"mode": "baseline"}
    return {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1}


def sharded_problem(space: str, split: tuple[str, ...], per_rank: dict[str, str]) -> tuple[Any, Any]:
    """(check_problem, derive) for a GEMM space whose dims `split` are sharded over the ranks.

    `per_rank` names the derived per-rank sizes, e.g. {"R": "M", "N_r": "N"}: R = M / world_size.
    """

    def check_problem(problem: Problem) -> None:
        w = problem.world_size
        for dim in split:
            if problem.dim(dim) % w:
                raise SpaceError(
                    f"world_size: {w} is not allowed for {space}; {dim}={problem.dim(dim)} must be divisible by it"
                )

    def derive(problem: Problem) -> dict[str, int]:
        return {name: problem.dim(dim) // problem.world_size for name, dim in per_rank.items()}

    return check_problem, derive
