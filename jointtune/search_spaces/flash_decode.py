"""`flash_decode`: decode attention over a KV cache sharded by sequence across ranks.

Dims: B (batch), H (query heads), H_KV (kv heads), S (total KV length), D (head dim). Rank r holds
S_r = cdiv(S, W) keys; each program handles `heads_per_program` query heads of one GQA group
(G = H / H_KV) over `kv_split` keys in `BLOCK_N`-key steps, producing a partial output and its
log-sum-exp; the ranks' partials (B*H rows) are exchanged and combined. Modes:
  pull      each rank reads its peers' partials in `combine_chunks` chunks as their flags arrive;
  push      each rank writes its partials into every peer in `combine_chunks` chunks with a flag each;
  baseline  torch attention per rank, NCCL all_gather of the partials, torch combine (no knobs).
"""

from __future__ import annotations

from collections.abc import Mapping

from jointtune.errors import SpaceError
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
from jointtune.search_spaces._space import Space

HEAD_DIMS = (64, 128, 256)
KV_SPLIT_MIN = 256


def _check_problem(problem: Problem) -> None:
    h, h_kv, d, s = problem.dim("H"), problem.dim("H_KV"), problem.dim("D"), problem.dim("S")
    if d not in HEAD_DIMS:
        raise SpaceError(f"shape.D: {d} is not allowed for flash_decode; allowed: {', '.join(map(str, HEAD_DIMS))}")
    if h % h_kv:
        raise SpaceError(f"shape.H_KV: {h_kv} is not allowed for flash_decode; H={h} must be divisible by it")
    if s < problem.world_size:
        raise SpaceError(f"shape.S: {s} is not allowed for world_size={problem.world_size}; every rank needs >= 1 key")


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


def _combine(cfg: Mapping[str, Value], ctx: Context) -> str | None:
    if ctx["rows"] % cfg["combine_chunks"] == 0:
        return None
    return (
        f"combine_chunks: {cfg['combine_chunks']} is not allowed for rows={ctx['rows']} "
        f"partial rows (B * H); "
        f"allowed: a divisor of rows"
    )


_KERNEL = when(mode=("pull", "push"))

FLASH_DECODE = Space(
    "flash_decode",
    dims=("B", "H", "H_KV", "S", "D"),
    revision=1,
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        categorical("mode", ("pull", "push", "baseline"), doc="how partial results are exchanged"),
        pow2("kv_split", 256, 16384, when=_KERNEL, doc="keys per program (split-K over the sequence)"),
        pow2("BLOCK_N", 16, 256, when=_KERNEL, doc="keys per step of a program's loop"),
        pow2("heads_per_program", 1, 16, when=_KERNEL, doc="query heads of one GQA group per program"),
        choice("num_warps", (1, 2, 4, 8), when=_KERNEL, doc="warps per program"),
        choice("num_stages", (1, 2, 3, 4), when=_KERNEL, doc="software-pipeline depth of the key loop"),
        pow2("combine_chunks", 1, 16, when=_KERNEL, doc="chunks the partial results are exchanged in"),
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
        Constraint("chunks_divide_rows", ("combine_chunks",), "rows % combine_chunks == 0", _combine),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=lambda ctx: {"mode": "baseline"},
)
