"""`gemm_ar`: GEMM + All-Reduce, row-parallel with a replicated output (the standard layout's o_proj and down).

The standard tensor-parallel layout's row-parallel GEMMs at decode sizes, where one all-reduce costs less than the
sequence-parallel layout's reduce-scatter and all-gather.

Rank r holds A_r[M, K/W] and B_r[K/W, N], computes the partial P_r = A_r @ B_r of [M, N] and ends with all M rows of
sum_r P_r, the same bits on every rank. Dims M, N, K are global; K_r = K / W (M needs no divisibility). Modes:
  one_shot  every rank's partial tiles reach every rank (pushed into each peer's inbox, or pulled from the
            producer's buffer), and every rank sums all W partials of every tile itself, in rank order (up to
            2048 rows: its inbox holds every rank's whole partial);
  two_shot  rows are owned: rank o owns rows [o * cdiv(M, W), (o + 1) * cdiv(M, W)); each partial tile's rows go to
            their owner (a reduce-scatter in the GEMM's epilogue), the owner sums them, then hands the reduced rows
            to every rank (an all-gather from the same launch): half the bytes of one_shot, one more hop;
  baseline  one cuBLAS GEMM, then an all-reduce: the unfused path, its `collective` NCCL's default or symmetric
            kernels or torch's symmetric-memory one-shot / two-shot, whichever the size favours.
In the fused modes `gemm` picks who computes the partial: our tile GEMM in the same launch as the exchange (one launch
per call), or cuBLAS followed by one launch that copies its tiles out and exchanges them (two launches). `transport`
is push, pull, or `ll`: pushed 64-bit words that carry the call's tag beside two values, so a reader polls the data
itself and nothing is fenced or flagged (`kernels.runtime.ll`): one NVLink latency per handoff instead of a fence and
a flag (1.8 against 5.3 µs a round trip on H100s), for twice the bytes (two-shot's two handoffs both: the tiles to
their owners, the reduced rows to every rank, with a row's 1/rms as one word); or `barrier` (cuBLAS only): cuBLAS
writes the partial straight into symmetric memory, and one launch meets the peers (a signal each way per program),
reads every rank's rows over NVLink, sums them (two-shot: pushes the sums back into the peers' partials) and meets
them again, with no tiles, flags or inboxes (the pattern of torch's symmetric-memory all-reduce: on 4x H100 a plain
Triton two-shot of it ran within 0.1-1.7 µs of torch's where our flagged exchange lost 9-12 µs at 64-128 rows,
bench/ops/two_shot_probe.py); or `barrier_push` (one-shot, cuBLAS only): the launch pushes the partial into every
rank's inbox half (by the device epoch), meets once and sums its own inbox; `tiles_per_flag` is the flag
granularity of push and pull (consecutive tiles of the partial per flag); `comm_sms` the
programs given to the exchange: beside the tile GEMM, programs that only sum (0: the GEMM programs sum after their
last tile); after cuBLAS, the programs of the exchange launch. Tiles are ag_gemm's; `SPLIT_K` splits the local k loop
over K_r, each split at least two BLOCK_K steps deep. A residual add and RMSNorm epilogue is part of the call, never a
knob (the `gemm_ar_rmsnorm` kernel tunes the same space under its own records).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import zip_longest

from jointtune.search_spaces._collectives import ALL_REDUCE, collective_param
from jointtune.search_spaces._family import family_space
from jointtune.search_spaces._gemm import row_tile, sharded_problem, tile_constraints, tile_params
from jointtune.search_spaces._params import Constraint, Context, Value, categorical, cdiv, choice, next_pow2, when

_check_problem, _derive = sharded_problem("gemm_ar", ("K",), {"K_r": "K"})

MODES = ("one_shot", "two_shot", "baseline")
_FUSED = when(mode=("one_shot", "two_shot"))
_TILES = when(mode=("one_shot", "two_shot"), gemm="triton")
_FLAGGED = when(mode=("one_shot", "two_shot"), transport=("push", "pull"))
TRANSPORTS = ("push", "pull", "ll", "barrier", "barrier_push")
#: the flag granularities offered: consecutive tiles of the partial per flag
TILES_PER_FLAG = (1, 2, 4, 8, 16, 32)
COMM_SMS = (0, 4, 8, 16, 32, 64, 128)
#: columns of one copied tile when cuBLAS computed the partial
COPY_N = 256
#: rows up to which the seeds lead one-shot with LL words and follow two-shot's first seed with them (bench/README.md,
#: "Flags carried in the data": one-shot's LL won at 1-32 rows of every shape measured at W=2 and of most at W=4, where
#: the flagged push was 0.3-1.1 µs ahead in two, and lost at 64 and 128; "Two-shot with LL words on GPUs": two-shot's
#: won at 1-32 rows of the plain sum and lost from 64 at W=4)
LL_SEED_ROWS = 32
#: rows from which, at W >= 4, the seeds alternate one-shot and two-shot (`_seeds`)
TWO_SHOT_SEED_ROWS = 32
#: rows up to which two-shot's barrier exchange leads the seeds (from TWO_SHOT_SEED_ROWS): measured to 1024 rows at W=4
#: (bench/README.md, "GEMM + all-reduce's barrier exchange"); above, cuBLAS then the exchange, unoverlapped, is a guess
BARRIER_SEED_MAX_ROWS = 1024
#: rows up to which one-shot pushed before one meeting leads the seeds: on 4x H100 at W=4 it was our best call at 8
#: and 32 rows of Llama-3-70B's o_proj in both forms, and lost to two-shot's barrier exchange from 64 rows
#: (bench/README.md, "One meeting for GEMM + all-reduce's one-shot")
BARRIER_PUSH_SEED_ROWS = 32
#: one-shot's inbox holds every rank's whole partial (W * M * N elements per half): past this many rows its bytes, and
#: its memory, grow W-fold for nothing two-shot or the baseline don't do better
ONE_SHOT_MAX_ROWS = 2048
#: LL words carry two values in 8 bytes, so their inboxes and bytes double: past this many rows (where flags won every
#: measured shape from 64) they only cost memory (8 M N bytes a rank for two-shot's gathered rows alone)
LL_MAX_ROWS = 1024


def copy_tile(M: int, N: int) -> tuple[int, int]:
    """[rows, columns] of the tiles the exchange launch copies out of a cuBLAS partial: up to 16 rows (at least 2),
    256 columns (fewer for a narrower N). The flags count these tiles as they count the tile GEMM's."""
    return max(2, min(16, next_pow2(M))), min(COPY_N, max(16, next_pow2(N)))


def partial_tiles(cfg: Mapping[str, Value], ctx: Context) -> int:
    """Tiles of the partial a fused config produces: the tile GEMM's, or the copied tiles of a cuBLAS partial."""
    if cfg["gemm"] == "triton":
        bm, bn = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"])
    else:
        bm, bn = copy_tile(ctx["M"], ctx["N"])
    return cdiv(ctx["M"], bm) * cdiv(ctx["N"], bn)


def _flag_fit(cfg: Mapping[str, Value], tiles: int, what: str) -> str | None:
    if cfg["tiles_per_flag"] <= next_pow2(tiles):
        return None
    return (
        f"tiles_per_flag: {cfg['tiles_per_flag']} is not allowed for {tiles} tiles of the partial ({what}); "
        f"allowed: <= next_pow2(tiles) = {next_pow2(tiles)}"
    )


def _flags_fit_tiles(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    tiles = cdiv(ctx["M"], int(cfg["BLOCK_M"])) * cdiv(ctx["N"], int(cfg["BLOCK_N"]))
    return _flag_fit(cfg, tiles, f"BLOCK_M={cfg['BLOCK_M']}, BLOCK_N={cfg['BLOCK_N']}")


def _flags_fit_copies(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["gemm"] != "cublas":
        return None
    rows, cols = copy_tile(ctx["M"], ctx["N"])
    return _flag_fit(cfg, partial_tiles(cfg, ctx), f'gemm="cublas": copied in [{rows}, {cols}] tiles')


def _comm_sms(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    sms, limit = cfg["comm_sms"], ctx["num_sms"]
    if cfg["gemm"] == "triton":
        if sms <= limit // 4:
            return None
        return (
            f'comm_sms: {sms} is not allowed with gemm="triton" and num_sms={limit}; allowed: <= num_sms // 4 = '
            f"{limit // 4} (programs beside the tile GEMM; 0: the GEMM programs sum)"
        )
    if 1 <= sms <= limit:
        return None
    return (
        f'comm_sms: {sms} is not allowed with gemm="cublas" and num_sms={limit}; allowed: 1 <= comm_sms <= num_sms '
        f"= {limit} (the programs of the exchange launch)"
    )


def _rows_cap(
    field: str, value: str, limit: int, why: str, above: str
) -> Callable[[Mapping[str, Value], Context], str | None]:
    """A rule: `field == value` only up to `limit` rows (why, and what to use above, in its message)."""

    def check(cfg: Mapping[str, Value], ctx: Context) -> str | None:
        if cfg[field] != value or ctx["M"] <= limit:
            return None
        return f'{field}: "{value}" is not allowed for M={ctx["M"]} rows; allowed: M <= {limit} ({why}); {above} above'

    return check


_one_shot_rows = _rows_cap("mode", "one_shot", ONE_SHOT_MAX_ROWS, "its inbox holds every rank's whole partial",
                           '"two_shot" or "baseline"')  # fmt: skip
_ll_rows = _rows_cap("transport", "ll", LL_MAX_ROWS, "its words carry two values in 8 bytes", '"push" or "pull"')


def _barrier_cublas(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["transport"] not in ("barrier", "barrier_push") or cfg["gemm"] == "cublas":
        return None
    return (
        f'transport: "{cfg["transport"]}" is not allowed with gemm="triton"; allowed: gemm="cublas" (cuBLAS writes the '
        "partial the launch exchanges between meetings of the ranks)"
    )


def _barrier_push_one_shot(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["transport"] != "barrier_push" or cfg["mode"] == "one_shot":
        return None
    return (
        'transport: "barrier_push" is not allowed with mode="two_shot"; allowed: mode="one_shot" (every rank\'s whole '
        'partial pushed to every rank before one meeting); two-shot meets twice anyway: its barrier is "barrier"'
    )


def _default(ctx: Context) -> dict[str, Value]:
    """cuBLAS + NCCL's all-reduce, valid for any shape: no fused mode has been measured on a GPU yet, so none is served
    before a tuner has timed it against the baseline (the seeds below are its first candidates)."""
    return {"mode": "baseline"}


def _seeds(ctx: Context) -> list[dict[str, Value]]:
    """Fused candidates for a tuner's first trials (and a benchmark's per mode) where W > 1, in both exchanges:
    the tile GEMM pushing and pulling, and cuBLAS followed by a pushed exchange on half the SMs. Up to 128 rows one row
    tile over every row (the weight is read once; split-K only where the column tiles leave SMs idle: `row_tile`),
    one-shot first, led up to LL_SEED_ROWS rows by the tile GEMM pushing LL words (the handoff is latency there, not
    bytes: LL won most measured shapes at 1-32 rows and lost at 64-128); from 256 rows 128 x 128 tiles grouped for L2
    reuse of the weight, two-shot first (half the bytes of one-shot).

    From TWO_SHOT_SEED_ROWS rows at W >= 4, where two-shot moves 2/W of one-shot's bytes, the two exchanges alternate,
    two-shot's cuBLAS form first: at W=4 each won there in one form (one-shot the plain sum, two-shot the RMSNorm form;
    bench/README.md, "GEMM + all-reduce at four GPUs"), and a short study (the baseline's variants, then a few seeds)
    would otherwise time no two-shot at all. Up to LL_SEED_ROWS rows two-shot's LL words follow its first seed, in its
    GEMM: on 4x H100 they beat two-shot's flags at 1-32 rows of the plain sum and lost from 64 rows at W=4 (in the
    RMSNorm form, whose h and 1/rms go as words, they lost at every size at W=4; bench/README.md, "Two-shot with LL
    words on GPUs").

    Two-shot's barrier exchange after cuBLAS (two launches) leads from TWO_SHOT_SEED_ROWS to BARRIER_SEED_MAX_ROWS
    rows and closes the list elsewhere: its two meetings cost more than LL's one handoff at a few rows; the probe of
    its pattern (bench/ops/two_shot_probe.py) ran within 0.1-1.7 µs of torch's two-shot at 64 and 128 rows at W=2 and
    4, where the flagged exchange lost 9-12 µs, and at W=4 it was our best call at 32-1024 rows in both forms."""
    if ctx["W"] == 1:
        return []
    if ctx["M"] <= 128:
        modes, tile = ("one_shot", "two_shot"), row_tile(ctx["M"], ctx, cols="N", depth="K_r")
    else:
        group = 8 if cdiv(ctx["M"], 128) >= 8 else 1
        modes = ("two_shot", "one_shot")
        tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=group, num_warps=8, num_stages=4, SPLIT_K=1)
    comm = 1 << (max(1, ctx["num_sms"] // 2).bit_length() - 1)
    alternate = ctx["W"] >= 4 and TWO_SHOT_SEED_ROWS <= ctx["M"] <= 128
    by_mode: list[list[dict[str, Value]]] = []
    for mode in modes:
        fused = {"mode": mode, "tiles_per_flag": 1}
        triton_push = {**fused, "gemm": "triton", "transport": "push", "comm_sms": 0, **tile}
        cublas_push = {**fused, "gemm": "cublas", "transport": "push", "comm_sms": comm}
        first = [cublas_push, triton_push] if alternate and mode == "two_shot" else [triton_push, cublas_push]
        if mode == "one_shot":
            ll = {"mode": mode, "gemm": "triton", "transport": "ll", "comm_sms": 0, **tile}
            seeds = [ll, *first] if ctx["M"] <= LL_SEED_ROWS else first
        else:  # two-shot's LL words after its first seed, in the same GEMM
            ll = {"mode": mode, "gemm": first[0]["gemm"], "transport": "ll", "comm_sms": first[0]["comm_sms"]}
            if first[0]["gemm"] == "triton":
                ll.update(tile)
            seeds = [first[0], ll, *first[1:]] if ctx["M"] <= LL_SEED_ROWS else first
        by_mode.append([*seeds, {**fused, "gemm": "triton", "transport": "pull", "comm_sms": 0, **tile}])
    barrier = {"mode": "two_shot", "gemm": "cublas", "transport": "barrier", "comm_sms": comm}
    if not alternate:
        seeds = [seed for seeds in by_mode for seed in seeds]
    else:
        seeds = [seed for pair in zip_longest(*by_mode) for seed in pair if seed is not None]
    lead = TWO_SHOT_SEED_ROWS <= ctx["M"] <= BARRIER_SEED_MAX_ROWS
    seeds = [barrier, *seeds] if lead else [*seeds, barrier]
    if ctx["M"] <= BARRIER_PUSH_SEED_ROWS:
        seeds.insert(0, {"mode": "one_shot", "gemm": "cublas", "transport": "barrier_push", "comm_sms": comm})
    return seeds


def _starts(ctx: Context) -> list[dict[str, Value]]:
    """One config per exchange for a tuner's start at any world size (the seeds cover W > 1): cuBLAS followed by a
    pushed exchange on half the SMs, the simplest fused call. Not measured."""
    comm = 1 << (max(1, ctx["num_sms"] // 2).bit_length() - 1)
    return [
        {"mode": mode, "gemm": "cublas", "transport": "push", "tiles_per_flag": 1, "comm_sms": comm}
        for mode in ("one_shot", "two_shot")
    ]


GEMM_AR = family_space(
    "gemm_ar",
    dims=("M", "N", "K"),
    example=(64, 8192, 8192),
    revision=5,  # 2: transport "ll" (one-shot), tiles_per_flag only with flags; 3: "ll" in two-shot too; 4: "barrier"
    # 5: "barrier_push" (one-shot)
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        categorical(
            "mode", MODES, doc="how partial sums meet: one-shot (every rank sums all), two-shot (owners sum), cuBLAS+AR"
        ),
        collective_param(ALL_REDUCE, "all-reduce"),
        categorical(
            "gemm",
            ("triton", "cublas"),
            when=_FUSED,
            doc="who computes the partial: the tile GEMM in the exchange's launch, or cuBLAS before it",
        ),
        categorical(
            "transport",
            TRANSPORTS,
            when=_FUSED,
            doc="partials written into peers, read from them, pushed as words that carry their flag, read between "
            "two meetings of the ranks, or pushed into inbox halves before one (one-shot; both cuBLAS only)",
        ),
        *tile_params(_TILES),
        choice("tiles_per_flag", TILES_PER_FLAG, when=_FLAGGED, doc="consecutive tiles of the partial per flag"),
        choice(
            "comm_sms",
            COMM_SMS,
            when=_FUSED,
            doc="programs that sum: beside the tile GEMM (0: its programs, after their tiles), or after cuBLAS",
        ),
    ],
    constraints=[
        *tile_constraints("N", "global columns", "K_r", "K / world_size"),
        Constraint(
            "flags_fit_tiles",
            ("tiles_per_flag", "BLOCK_M", "BLOCK_N"),
            "tiles_per_flag <= next_pow2(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N))",
            _flags_fit_tiles,
        ),
        Constraint(
            "flags_fit_copies",
            ("tiles_per_flag", "gemm"),
            "gemm == triton or tiles_per_flag <= next_pow2(tiles copy_tile(M, N) cuts the cuBLAS partial into)",
            _flags_fit_copies,
        ),
        Constraint(
            "comm_sms_budget",
            ("comm_sms", "gemm"),
            "comm_sms <= num_sms // 4 beside the tile GEMM; 1 <= comm_sms <= num_sms after cuBLAS",
            _comm_sms,
        ),
        Constraint("one_shot_rows", ("mode",), f"mode != one_shot or M <= {ONE_SHOT_MAX_ROWS}", _one_shot_rows),
        Constraint("ll_rows", ("transport",), f"transport != ll or M <= {LL_MAX_ROWS}", _ll_rows),
        Constraint(
            "barrier_cublas",
            ("transport", "gemm"),
            "transport not in (barrier, barrier_push) or gemm == cublas",
            _barrier_cublas,
        ),
        Constraint(
            "barrier_push_one_shot",
            ("transport", "mode"),
            "transport != barrier_push or mode == one_shot",
            _barrier_push_one_shot,
        ),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=_default,
    seeds=_seeds,
    starts=_starts,
)
