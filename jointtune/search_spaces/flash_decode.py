"""`flash_decode`: decode attention over a KV cache sharded by sequence across ranks (context parallelism).

Dims: B (batch), H (query heads), H_KV (kv heads), S (global KV capacity: every rank holds S_r = cdiv(S, W)
positions of every sequence), D (head dim). One decode item is `heads_per_program` query heads of one GQA
group (G = H / H_KV) of one sequence; `kv_split` keys of it are one program of the split-KV decode kernel,
which steps through them `BLOCK_N` keys at a time. The last split of an item to finish combines the item's
splits into the rank's partial (O, LSE); the ranks' partials are then combined, weighted by LSE. Modes:
  fused     the decode kernel pushes each finished group of `items_per_flag` items into every rank's
            inbox with a flag; combine programs of the same launch start on a group when all its
            partials are there (one launch per call);
  pull      as fused, but partials stay in the rank's own symmetric buffer and the combine reads peers'
            over NVLink;
  wait      the decode kernel, then our own all-gather push (`push_programs` programs, a flag per group),
            then a combine that waits per group instead of on a collective;
  baseline  the same decode kernel, NCCL all-gather of the partials, then the combine (the collective path).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from jointtune.errors import SpaceError
from jointtune.search_spaces._collectives import ALL_GATHER, collective_param
from jointtune.search_spaces._family import family_space
from jointtune.search_spaces._params import (
    Constraint,
    Context,
    Value,
    categorical,
    cdiv,
    choice,
    next_pow2,
    pow2,
    when,
)
from jointtune.search_spaces._problem import Problem

HEAD_DIMS = (64, 128, 256)
#: any divisor of G works (the kernel pads a program's heads to 16 rows for the dot): GQA groups of 5 or 7
#: (Qwen2.5's 40/8 and 28/4 heads) read K and V once per kv head, not once per query head
HEADS_PER_PROGRAM = tuple(range(1, 17))
KV_SPLIT_MIN = 64
MODES = ("fused", "pull", "wait", "baseline")
#: the default's pull region: at most this many decode items, keys per rank (measured, see `_default`)
PULL_MAX_ITEMS, PULL_MAX_KEYS = 16, 65536


def _check_problem(problem: Problem) -> None:
    h, h_kv, d, s = problem.dim("H"), problem.dim("H_KV"), problem.dim("D"), problem.dim("S")
    if d not in HEAD_DIMS:
        raise SpaceError(f"shape.D: {d} is not allowed for flash_decode; allowed: {', '.join(map(str, HEAD_DIMS))}")
    if h % h_kv:
        raise SpaceError(f"shape.H_KV: {h_kv} is not allowed for flash_decode; H={h} must be divisible by it")
    if s < problem.world_size:
        raise SpaceError(f"shape.S: {s} is not allowed for world_size={problem.world_size}; every rank needs >= 1 key")


def bucketed_kv_len(s_r: int, world_size: int) -> int:
    """The global kv_len a record of per-rank capacity `s_r` is keyed by: s_r rounded up to a power of two, times
    the world size (one record serves every capacity in (bucket / 2, bucket] per rank)."""
    return (1 << max(s_r - 1, 0).bit_length()) * world_size


def _stored(problem: Problem) -> Problem:
    """Records are keyed by S's bucket (`bucketed_kv_len`), as the family's key reads a call: a config valid for
    one capacity is valid for every capacity of its bucket, and a lookup of any length in it finds the record."""
    W = problem.world_size
    dims = {**problem.dims, "S": bucketed_kv_len(cdiv(problem.dim("S"), W), W)}
    return Problem.of(dims, dtype=problem.dtype, world_size=W)


def _derive(problem: Problem) -> dict[str, int]:
    return {
        "S_r": cdiv(problem.dim("S"), problem.world_size),
        "G": problem.dim("H") // problem.dim("H_KV"),
        "rows": problem.dim("B") * problem.dim("H"),
    }


def _kv_split(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    limit = max(KV_SPLIT_MIN, next_pow2(ctx["S_r"]))
    if cfg["kv_split"] <= limit:
        return None
    return (
        f"kv_split: {cfg['kv_split']} is not allowed for S_r={ctx['S_r']} keys per rank "
        f"(cdiv(S, world_size)); "
        f"allowed: <= max({KV_SPLIT_MIN}, next_pow2(S_r)) = {limit}"
    )


def _block_n(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["BLOCK_N"] <= cfg["kv_split"]:
        return None
    return f"BLOCK_N: {cfg['BLOCK_N']} is not allowed with kv_split={cfg['kv_split']}; allowed: <= kv_split"


def _stages(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    steps = cfg["kv_split"] // cfg["BLOCK_N"]
    if cfg["num_stages"] <= steps:
        return None
    return (
        f"num_stages: {cfg['num_stages']} is not allowed with kv_split={cfg['kv_split']}, "
        f"BLOCK_N={cfg['BLOCK_N']} ({steps} steps per split); allowed: <= kv_split // BLOCK_N = {steps}"
    )


def _warps(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if cfg["num_warps"] * 8 <= cfg["BLOCK_N"]:
        return None
    return (
        f"num_warps: {cfg['num_warps']} is not allowed with BLOCK_N={cfg['BLOCK_N']}; "
        f"allowed: <= BLOCK_N // 8 = {cfg['BLOCK_N'] // 8} (each warp takes >= 8 keys of a block)"
    )


def _smem(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    bn, stages, d, nbytes = cfg["BLOCK_N"], cfg["num_stages"], ctx["D"], ctx["dtype_bytes"]
    need = 2 * bn * d * nbytes * stages
    if need <= ctx["max_shared_mem"]:
        return None
    return (
        f"shared memory: 2 * BLOCK_N * D * dtype_bytes * num_stages = 2 * {bn} * {d} * {nbytes} * {stages} = "
        f"{need} bytes with BLOCK_N={bn}, num_stages={stages} is not allowed; "
        f"allowed: <= max_shared_mem = {ctx['max_shared_mem']}"
    )


def _heads(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if ctx["G"] % cfg["heads_per_program"] == 0:
        return None
    return (
        f"heads_per_program: {cfg['heads_per_program']} is not allowed for a GQA group of G={ctx['G']} "
        f"(H / H_KV); allowed: a divisor of G"
    )


def _items_per_flag(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    items = ctx["rows"] // cfg["heads_per_program"]
    limit = next_pow2(items)
    if cfg["items_per_flag"] <= limit:
        return None
    return (
        f"items_per_flag: {cfg['items_per_flag']} is not allowed for {items} decode items "
        f"(B * H / heads_per_program = {ctx['rows']} / {cfg['heads_per_program']}); "
        f"allowed: <= next_pow2(items) = {limit}"
    )


def _one_program_per_sm(items: int, s_r: int, num_sms: int) -> int:
    """The kv_split (a power of two the space allows) whose program count, items * cdiv(S_r, kv_split), is nearest
    to one per SM by ratio; of two as near, the longer split."""
    splits = [k for k in (KV_SPLIT_MIN << i for i in range(9)) if k <= max(KV_SPLIT_MIN, next_pow2(s_r))]
    return min(reversed(splits), key=lambda k: abs(math.log2(items * cdiv(s_r, k) / num_sms)))


def _default(ctx: Context) -> dict[str, Value]:
    """Valid for any shape, and what measured best (bench/results/flash_decode_kernel_*_1xH200_2026-11-24.json for
    the decode kernel, flash_decode_*_2xH200_2026-11-24.json for the modes): a whole GQA group per program (K and V
    are read once per kv head); splits for about one program per SM, each streaming its keys 128 at a time (64 in
    splits under 1024 keys) through 3 pipeline stages, which keeps enough of HBM's latency covered with one
    program per SM; `pull` where few decode items share a short shard (batch 1 up to 64K keys per rank), else the
    collective path, which the fused modes did not beat once the decode kernel is bound by HBM (batch 8 and 32, or
    batch 1 at 512K)."""
    hpp = max(h for h in HEADS_PER_PROGRAM if ctx["G"] % h == 0)  # the largest divisor of G, at most 16
    items = ctx["B"] * ctx["H_KV"] * (ctx["G"] // hpp)
    kv_split = _one_program_per_sm(items, ctx["S_r"], ctx["num_sms"])
    block_n = min(128 if kv_split >= 1024 else 64, kv_split)
    stages = min(3, kv_split // block_n)

    def smem(bn: int, st: int) -> int:
        return 2 * bn * ctx["D"] * ctx["dtype_bytes"] * st

    while stages > 1 and smem(block_n, stages) > ctx["max_shared_mem"]:
        if block_n > 64:  # shorter steps first: the depth of the pipeline is what covers HBM's latency
            block_n //= 2
        else:
            stages -= 1
    while block_n > 16 and smem(block_n, stages) > ctx["max_shared_mem"]:
        block_n //= 2
    tiles: dict[str, Value] = {
        "kv_split": kv_split,
        "BLOCK_N": block_n,
        "heads_per_program": hpp,
        "num_warps": min(4, block_n // 8),
        "num_stages": stages,
    }
    if ctx["W"] > 1 and items <= PULL_MAX_ITEMS and ctx["S_r"] <= PULL_MAX_KEYS:
        return {"mode": "pull", **tiles, "items_per_flag": 1}
    return {"mode": "baseline", **tiles}


def _starts(ctx: Context) -> list[dict[str, Value]]:
    """One config per mode for a tuner's start: the default's decode tiles under each mode, a flag per decode item
    up to 16 items (else a flag per 4), 8 push programs in wait mode. Not measured per world size."""
    default = _default(ctx)
    tiles = {name: default[name] for name in ("kv_split", "BLOCK_N", "heads_per_program", "num_warps", "num_stages")}
    items = ctx["B"] * ctx["H"] // int(tiles["heads_per_program"])
    per_flag = 1 if items <= PULL_MAX_ITEMS else 4
    return [
        {"mode": "fused", **tiles, "items_per_flag": per_flag},
        {"mode": "pull", **tiles, "items_per_flag": per_flag},
        {"mode": "wait", **tiles, "items_per_flag": per_flag, "push_programs": 8},
        {"mode": "baseline", **tiles},
    ]


_COMM = when(mode=("fused", "pull", "wait"))

FLASH_DECODE = family_space(
    "flash_decode",
    dims=("B", "H", "H_KV", "S", "D"),
    example=(1, 64, 8, 32768, 128),
    stored=_stored,  # batch 1, 64 query heads over 8 KV heads, a 32K cache, head dim 128
    revision=4,  # 2: the kernel's modes (fused, pull, wait, baseline), items_per_flag, push_programs; 3: any divisor
    # of G as heads_per_program, the default's tiles (one program per SM, 128-key steps, 3 stages); 4: the baseline's
    # collective
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        categorical("mode", MODES, doc="how the ranks' partial results meet: fused push, pull, wait, or NCCL"),
        pow2("kv_split", KV_SPLIT_MIN, 16384, doc="keys per program (split-KV over the rank's sequence)"),
        pow2("BLOCK_N", 16, 256, doc="keys per step of a program's loop"),
        choice(
            "heads_per_program",
            HEADS_PER_PROGRAM,
            doc="query heads of one GQA group per program, a divisor of G (K, V read G / this times)",
        ),
        choice("num_warps", (1, 2, 4, 8), doc="warps per decode program"),
        choice("num_stages", (1, 2, 3, 4), doc="software-pipeline depth of the key loop"),
        pow2("items_per_flag", 1, 64, when=_COMM, doc="decode items per flag: the unit that is sent and combined"),
        pow2("push_programs", 1, 32, when=when(mode="wait"), doc="programs of the all-gather push in wait mode"),
        collective_param(ALL_GATHER, "all-gather of the partial results"),
    ],
    constraints=[
        Constraint(
            "kv_split_fits_shard",
            ("kv_split",),
            f"kv_split <= max({KV_SPLIT_MIN}, next_pow2(S_r))",
            _kv_split,
        ),
        Constraint("block_fits_split", ("BLOCK_N", "kv_split"), "BLOCK_N <= kv_split", _block_n),
        Constraint(
            "stages_need_steps",
            ("num_stages", "kv_split", "BLOCK_N"),
            "num_stages <= kv_split // BLOCK_N",
            _stages,
        ),
        Constraint("warps_fit_block", ("num_warps", "BLOCK_N"), "num_warps * 8 <= BLOCK_N", _warps),
        Constraint(
            "shared_memory",
            ("BLOCK_N", "num_stages"),
            "2 * BLOCK_N * D * dtype_bytes * num_stages <= max_shared_mem",
            _smem,
        ),
        Constraint("heads_divide_group", ("heads_per_program",), "G % heads_per_program == 0", _heads),
        Constraint(
            "items_per_flag_fit",
            ("items_per_flag", "heads_per_program"),
            "items_per_flag <= next_pow2(B * H / heads_per_program)",
            _items_per_flag,
        ),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=_default,
    starts=_starts,
)
