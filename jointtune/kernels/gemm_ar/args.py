"""GEMM+AR's launch arguments: the validated config, a call's sizes and epilogue, the work a fused launch cuts the call
into (`Work`), and `gemm_ar_kernel`'s arguments by name, built by one function for a plan's launches and for
ahead-of-time compiles (`standin_launches`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton

from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.device import interpreted
from jointtune.kernels.runtime.gemm import KShardShape
from jointtune.kernels.runtime.symm import cdiv
from jointtune.search_spaces.gemm_ar import copy_tile

#: columns of one reduce item without the norm (a [RED_M, RED_N] block); and per thread, columns of one step along a
#: normed row. A step is a dependent round of loads (and, with LL, of polls) by the row's one program, so steps are
#: made as wide as registers allow: 32 float32 values a thread (4096 columns at 4 warps, two steps for a row of 8192)
#: compile for sm_90 with no spills (ptxas: 167 registers, LL and flagged alike; 64 a thread spills). They were 1024
#: columns: eight rounds a row.
RED_N, NORM_PER_THREAD = 256, 32
#: rows of one reduce item without the norm, at most (and at most BLOCK_M: an item lies in one row tile)
RED_M = 16
#: the kernel's produce phases
PRODUCE_NONE, PRODUCE_GEMM, PRODUCE_COPY = 0, 1, 2


class GemmArConfig(LaunchConfig, space="gemm_ar", defaults=dict(
        gemm="triton", transport="push", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, SPLIT_K=1, num_warps=4,
        num_stages=3, tiles_per_flag=1, comm_sms=0)):  # fmt: skip
    """A config the gemm_ar space validated; knobs the mode doesn't read keep harmless defaults."""


@dataclass(frozen=True)
class ArShape(KShardShape):
    """One call's sizes (every output [M, N]) and the epilogue it runs."""

    residual: bool = False
    norm: bool = False

    @property
    def rows_per_owner(self) -> int:
        """Two-shot: rank o owns rows [o * rows_per_owner, (o + 1) * rows_per_owner) (the last ones may own none)."""
        return cdiv(self.M, self.W)


@dataclass(frozen=True)
class Work:
    """How a fused call is cut: the partial's tiles and their flags, the reduce items, and the programs."""

    block_m: int
    block_n: int
    group_m: int
    split_k: int
    n_tiles: int
    n_chunks: int
    red_m: int
    red_n: int
    n_items: int  # two-shot: items (gather flags) per owner, at most
    flag_stride: int  # flags per writer in the flag buffer (a power of two: buffers are shared by size)
    wait_c: int
    produce: int  # programs that produce
    comm: int  # programs that reduce and gather
    comm_lo: int  # the first of them
    grid: int

    @classmethod
    def of(cls, cfg: GemmArConfig, s: ArShape, num_sms: int) -> Work:
        M, N, W = s.M, s.N, s.W
        if cfg.gemm == "triton":
            bm, bn, group, split = cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M, cfg.SPLIT_K
        else:
            (bm, bn), group, split = copy_tile(M, N), 1, 1
        tiles_n = cdiv(N, bn)
        n_tiles = cdiv(M, bm) * tiles_n
        n_chunks = cdiv(n_tiles, cfg.tiles_per_flag)
        warps = cfg.num_warps if cfg.gemm == "triton" else 4
        red_m = min(RED_M, bm)
        red_n = min(NORM_PER_THREAD * 32 * warps if s.norm else RED_N, max(16, triton.next_power_of_2(N)))
        n_items = 0
        if cfg.mode == "two_shot":
            rpo = s.rows_per_owner
            n_items = max(_owner_items(o * rpo, min(M, o * rpo + rpo), red_m, red_n, N, s.norm) for o in range(W))
        flag_stride = triton.next_power_of_2(n_chunks + n_items)
        # a reduce item's waits: [sources, WAIT_C column tiles] flags at a time, one per thread (a vector of exactly the
        # program's threads: no thread holds two flags, so each flag it polls is the one it acquires)
        wait_c = max(2, 32 * warps // max(2, triton.next_power_of_2(W)))
        if cfg.gemm == "triton":
            produce = max(1, min(n_tiles * split, num_sms - cfg.comm_sms))
            comm = cfg.comm_sms or produce
            comm_lo = produce if cfg.comm_sms else 0
            grid = produce + cfg.comm_sms
        else:
            produce, comm, comm_lo, grid = min(n_tiles, cfg.comm_sms), cfg.comm_sms, 0, cfg.comm_sms
        return cls(bm, bn, group, split, n_tiles, n_chunks, red_m, red_n, n_items, flag_stride, wait_c, produce, comm,
                   comm_lo, grid)  # fmt: skip


def _owner_items(lo: int, hi: int, red_m: int, red_n: int, N: int, norm: bool) -> int:
    """Reduce items of the rows [lo, hi) an owner sums: one per row with the norm, else [red_m, red_n] blocks of row
    blocks aligned to red_m (as the kernel counts them)."""
    if hi <= lo:
        return 0
    if norm:
        return hi - lo
    return ((hi - 1) // red_m - lo // red_m + 1) * cdiv(N, red_n)


def kernel_args(cfg: GemmArConfig, s: ArShape, w: Work, *, a: Any, b: Any, part: Any, res: Any, weight: Any,
                out: Any, hout: Any, send: Any, send_deltas: Any, recv: Any, recv_deltas: Any, gat: Any,
                gat_deltas: Any, rms: Any, rms_deltas: Any, flags_local: Any, flag_ptrs: Any, done: Any, state: Any,
                ws: Any, counts: Any, half_stride: int, ghalf_stride: int, rhalf_stride: int, rank: int,
                produce: bool, reduce: bool, gather: bool, epoch: int, grid: int, comm_lo: int,
                comm: int, eps: float = 1e-6) -> dict[str, Any]:  # fmt: skip
    """`gemm_ar_kernel`'s arguments by name, with the launch options."""
    if not produce:
        kind = 0
    else:
        kind = PRODUCE_GEMM if cfg.gemm == "triton" else PRODUCE_COPY
    warps, stages = (cfg.num_warps, cfg.num_stages) if cfg.gemm == "triton" else (4, 2)
    return dict(
        a_ptr=a, b_ptr=b, part_ptr=part, res_ptr=res, w_ptr=weight, out_ptr=out, hout_ptr=hout, send_ptr=send,
        send_deltas_ptr=send_deltas, recv_ptr=recv, recv_deltas_ptr=recv_deltas, gat_ptr=gat,
        gat_deltas_ptr=gat_deltas, rms_ptr=rms, rms_deltas_ptr=rms_deltas, flags_ptr=flags_local,
        flag_ptrs_ptr=flag_ptrs, done_ptr=done, state_ptr=state, ws_ptr=ws, counts_ptr=counts,
        M=s.M, N=s.N, K=s.K_r, eps=float(eps), half_stride=half_stride, ghalf_stride=ghalf_stride,
        rhalf_stride=rhalf_stride, rank=rank, rows_per_owner=s.rows_per_owner, flag_stride=w.flag_stride,
        n_chunks=w.n_chunks, n_items=max(1, w.n_items), produce_programs=w.produce if produce else 0,
        comm_lo=comm_lo, comm_programs=comm, num_programs=grid, pid_base=0, stride_am=s.K_r,
        stride_bk=s.b_stride[0], stride_bn=s.b_stride[1], WORLD=s.W, WORLD_P2=max(2, triton.next_power_of_2(s.W)),
        BLOCK_M=w.block_m, BLOCK_N=w.block_n, BLOCK_K=cfg.BLOCK_K, GROUP_M=w.group_m, SPLIT_K=w.split_k,
        TILES_PER_FLAG=cfg.tiles_per_flag, PRODUCE=kind, REDUCE=reduce, GATHER=gather,
        TWO_SHOT=cfg.mode == "two_shot", PUSH=cfg.transport in ("push", "ll"), LL=cfg.transport == "ll",
        RESIDUAL=s.residual, NORM=s.norm,
        RED_M=w.red_m, RED_N=w.red_n, WAIT_C=w.wait_c, UPCAST=interpreted(), EPOCH=epoch,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
