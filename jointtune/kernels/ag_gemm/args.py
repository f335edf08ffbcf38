"""AG+GEMM's launch arguments as typed values: the validated config, a call's sizes, and each kernel's
arguments by name (`GemmArgs` for the tile GEMM, `PushArgs` for the all-gather push), built by the same
functions for a plan's launches and for ahead-of-time compiles (`standin_launches`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.device import interpreted
from jointtune.kernels.runtime.push import CP_K, CP_M, PushArgs
from jointtune.kernels.runtime.symm import cdiv
from jointtune.kernels.runtime.world import World

#: what a knob the config's mode doesn't read holds (the knobs are the ag_gemm space's)
_DEFAULTS = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3, comm_sms=0,
                 chunk_m=0, ce_consumer="triton", ce_chunks=1, push_by="sm", gemm_order="local_first",
                 barrier_sms=1, landing="direct")  # fmt: skip


class AgGemmConfig(LaunchConfig, space="ag_gemm", defaults=_DEFAULTS):
    """A config the ag_gemm space validated, typed; knobs the mode doesn't read keep harmless defaults."""


@dataclass(frozen=True)
class Shape:
    """One call's sizes: R rows of A per rank, K deep, N_r columns of B per rank, on `world`."""

    world: World
    R: int
    K: int
    N_r: int
    dtype: torch.dtype
    b_stride: tuple[int, int]

    @property
    def W(self) -> int:
        return self.world.world_size

    @property
    def M(self) -> int:
        return self.R * self.world.world_size


# ---------------------------------------------------------------------------------------- arguments


@dataclass
class GemmArgs:
    """`ag_gemm_kernel`'s arguments, by name."""

    a_ptr: Any
    src_ptr: Any
    deltas_ptr: Any
    b_ptr: Any
    c_ptr: Any
    inbox_ptr: Any
    inbox_deltas_ptr: Any
    flags_ptr: Any
    flag_ptrs_ptr: Any
    tickets_ptr: Any
    ws_ptr: Any
    counts_ptr: Any
    done_ptr: Any
    state_ptr: Any
    N: int
    K: int
    R: int
    slot: int
    half_stride: int
    row_lo: int
    rows: int
    rank: int
    n_chunks: int
    shift: int
    num_consumers: int
    pid_base: int
    ticket_takers: int
    num_programs: int
    stride_bk: int
    stride_bn: int
    stride_cm: int
    stride_cn: int
    WORLD: int
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    SPLIT_K: int
    COMM_SMS: int
    CHUNK_M: int
    WAIT: bool
    OWN: bool
    CP_M: int
    CP_K: int
    DYNAMIC: bool
    PRODUCERS_CONSUME: bool
    UPCAST: bool
    EPOCH: int
    num_warps: int
    num_stages: int


def gemm_args(cfg: AgGemmConfig, W: int, *, a: Any, b: Any, c: Any, K: int, N_r: int, R: int, rows: int,
              dummy: Any, src: Any = None, deltas: Any = None, row_lo: int = 0, rank: int = 0, shift: int = 0,
              push: dict[str, Any] | None = None, ws: Any = None, counts: Any = None) -> GemmArgs:  # fmt: skip
    """The tile GEMM's arguments; `push` (inbox, flags, counters, epoch) only in push mode."""
    tiles = cdiv(rows, cfg.BLOCK_M) * cdiv(N_r, cfg.BLOCK_N) * cfg.SPLIT_K
    p = push or {}
    comm = p.get("comm_sms", 0)
    dynamic = comm > 0
    consumers = p.get("consumers", tiles)
    return GemmArgs(
        a_ptr=a, src_ptr=a if src is None else src, deltas_ptr=dummy if deltas is None else deltas, b_ptr=b, c_ptr=c,
        inbox_ptr=p.get("inbox", dummy), inbox_deltas_ptr=p.get("inbox_deltas", dummy), flags_ptr=p.get("flags", dummy),
        flag_ptrs_ptr=p.get("flag_ptrs", dummy), tickets_ptr=p.get("tickets", dummy), ws_ptr=c if ws is None else ws,
        counts_ptr=dummy if counts is None else counts, done_ptr=p.get("done", dummy),
        state_ptr=p.get("state", dummy), N=N_r, K=K, R=R, slot=p.get("slot", 0), half_stride=p.get("half_stride", 0),
        row_lo=row_lo, rows=rows, rank=rank, n_chunks=p.get("n_chunks", 1), shift=shift, num_consumers=consumers,
        pid_base=p.get("pid_base", 0), ticket_takers=p.get("ticket_takers", 1), num_programs=p.get("num_programs", 1),
        stride_bk=b.stride(0), stride_bn=b.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1), WORLD=W,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, SPLIT_K=cfg.SPLIT_K,
        COMM_SMS=comm, CHUNK_M=max(cfg.chunk_m, 1), WAIT=dynamic, OWN=p.get("own", False), CP_M=CP_M, CP_K=CP_K,
        DYNAMIC=dynamic, PRODUCERS_CONSUME=p.get("producers_consume", False), UPCAST=interpreted(),
        EPOCH=p.get("epoch", 0), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def push_args(cfg: AgGemmConfig, W: int, *, src: Any, inbox_base: Any, inbox_deltas: Any, own: Any, flag_ptrs: Any,
              flags_local: Any, done: Any, state: Any, K: int, R: int, slot: int, half_stride: int,
              rank: int, n_chunks: int, chunk_m: int, epoch: int, wait_all: bool, own_rows: bool,
              enter: tuple[Any, Any] | None = None) -> PushArgs:  # fmt: skip
    """`allgather_push_kernel`'s arguments; `enter` = (every rank's entry flags, this rank's) to open the call."""
    return PushArgs.build(W, cfg.comm_sms, cfg.num_warps, src=src, inbox_base=inbox_base, inbox_deltas=inbox_deltas,
                          own=own, flag_ptrs=flag_ptrs, flags_local=flags_local, done=done, state=state,
                          K=K, R=R, slot=slot, half_stride=half_stride, rank=rank, n_chunks=n_chunks, chunk_m=chunk_m,
                          epoch=epoch, wait_all=wait_all, own_rows=own_rows, enter=enter)  # fmt: skip
