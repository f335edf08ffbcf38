"""AG+GEMM's launch plans, one class per mode: built once per (world, shapes, dtype, config), then called.

A plan holds every buffer, view, address table, event and prepared launch (`Launch`) of its mode; a
call binds the caller's A, B and C and issues them. How each mode keeps a captured graph correct:

- baseline: NCCL all-gather into a plan-owned buffer, then cuBLAS. No cross-call state.
- pull, ce: A sits in one symmetric buffer (the caller's, or a staging slot) between two barriers:
  peers read it only between them, so the next call may overwrite it. No cross-call state.
- push: Triton all the way; inbox halves alternate by the device epoch (`_signals`), flags carry it.
- push_cublas, SMs pushing, gathered order: the push kernel pushes into the epoch's inbox half, waits
  for every peer's chunks and copies them into one fixed [M, K] buffer that cuBLAS reads at the same
  address every call. No barrier, no handshake.
- push_cublas otherwise (copy-engine pushes, or cuBLAS reading chunks of the inbox as they arrive):
  transfers at fixed addresses into a one-half inbox, so the call opens with the entry handshake
  (`open_call_kernel`): a rank writes into a peer only after the peer entered the same call.

On a world whose ranks launch one after another (simulated ranks), every rank's pushes are issued
before any rank's waits.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any

import torch
import triton

from jointtune.kernels._ag_gemm_kernel import ag_gemm_kernel
from jointtune.kernels._launch import Launch
from jointtune.kernels._runtime import interpreted, num_sms
from jointtune.kernels._signals import (
    allgather_push_kernel,
    open_call_kernel,
    release_chunk_kernel,
    wait_chunks_kernel,
)
from jointtune.kernels._symm import Inbox, call_state, cdiv, flags, inbox, offset, slot_elems
from jointtune.kernels.world import World

#: rows x columns of one copy piece of the push (one program's unit of work)
CP_M, CP_K = 32, 256


@dataclass(frozen=True)
class AgGemmConfig:
    """A config the ag_gemm space validated; knobs the mode doesn't read keep harmless defaults."""

    mode: str
    BLOCK_M: int = 64
    BLOCK_N: int = 64
    BLOCK_K: int = 64
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    comm_sms: int = 0
    chunk_m: int = 0
    ce_consumer: str = "triton"
    ce_chunks: int = 1
    push_by: str = "sm"
    gemm_order: str = "local_first"

    @classmethod
    def of(cls, canonical: dict[str, Any]) -> AgGemmConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in canonical.items() if k in names})

    @property
    def d2d_chunk(self) -> int:
        """Rows per pushed chunk of push_cublas (one chunk per rank in the gathered order)."""
        return 0 if self.mode != "push_cublas" or self.gemm_order == "gathered" else self.chunk_m


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
    fence_ptr: Any
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
    THREADS: int
    FENCE: bool
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
        counts_ptr=dummy if counts is None else counts, done_ptr=p.get("done", dummy), fence_ptr=p.get("fence", dummy),
        state_ptr=p.get("state", dummy), N=N_r, K=K, R=R, slot=p.get("slot", 0), half_stride=p.get("half_stride", 0),
        row_lo=row_lo, rows=rows, rank=rank, n_chunks=p.get("n_chunks", 1), shift=shift, num_consumers=consumers,
        pid_base=p.get("pid_base", 0), ticket_takers=p.get("ticket_takers", 1), num_programs=p.get("num_programs", 1),
        stride_bk=b.stride(0), stride_bn=b.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1), WORLD=W,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, SPLIT_K=cfg.SPLIT_K,
        COMM_SMS=comm, CHUNK_M=max(cfg.chunk_m, 1), WAIT=dynamic, OWN=p.get("own", False), CP_M=CP_M, CP_K=CP_K,
        DYNAMIC=dynamic, PRODUCERS_CONSUME=p.get("producers_consume", False), UPCAST=interpreted(),
        THREADS=32 * cfg.num_warps, FENCE=dynamic and not interpreted(), EPOCH=p.get("epoch", 0),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


@dataclass
class PushArgs:
    """`allgather_push_kernel`'s arguments, by name."""

    src_ptr: Any
    inbox_ptr: Any
    inbox_deltas_ptr: Any
    own_ptr: Any
    flag_ptrs_ptr: Any
    flags_ptr: Any
    done_ptr: Any
    fence_ptr: Any
    state_ptr: Any
    gathered_ptr: Any
    K: int
    R: int
    slot: int
    half_stride: int
    rank: int
    n_chunks: int
    num_programs: int
    WORLD: int
    PROGRAMS: int
    CHUNK_M: int
    OWN: bool
    CP_M: int
    CP_K: int
    THREADS: int
    FENCE: bool
    EPOCH: int
    PUSH: bool
    RECEIVE: bool
    WAIT_ALL: bool
    num_warps: int


def push_args(cfg: AgGemmConfig, W: int, *, src: Any, inbox_base: Any, inbox_deltas: Any, own: Any, flag_ptrs: Any,
              flags_local: Any, done: Any, fence: Any, state: Any, gathered: Any, K: int, R: int, slot: int,
              half_stride: int, rank: int, n_chunks: int, chunk_m: int, epoch: int, push: bool, receive: bool,
              wait_all: bool, own_rows: bool) -> PushArgs:  # fmt: skip
    return PushArgs(
        src_ptr=src, inbox_ptr=inbox_base, inbox_deltas_ptr=inbox_deltas, own_ptr=own, flag_ptrs_ptr=flag_ptrs,
        flags_ptr=flags_local, done_ptr=done, fence_ptr=fence, state_ptr=state, gathered_ptr=gathered, K=K, R=R,
        slot=slot, half_stride=half_stride, rank=rank, n_chunks=n_chunks, num_programs=cfg.comm_sms, WORLD=W,
        PROGRAMS=cfg.comm_sms, CHUNK_M=chunk_m, OWN=own_rows, CP_M=CP_M, CP_K=CP_K, THREADS=32 * cfg.num_warps,
        FENCE=not interpreted(), EPOCH=epoch, PUSH=push, RECEIVE=receive, WAIT_ALL=wait_all, num_warps=cfg.num_warps,
    )  # fmt: skip


def _launch(kernel: Any, grid: int, args: Any, *, slots: tuple[str, ...] = ()) -> Launch:
    return Launch(kernel, (grid,), args, slots=slots)


# --------------------------------------------------------------------------------------------- modes


class BaselinePlan:
    """NCCL all-gather into a plan-owned buffer, then cuBLAS."""

    def __init__(self, s: Shape) -> None:
        self.world = s.world
        out = torch.empty((s.M, s.K), dtype=s.dtype, device=s.world.device)
        self.gathered = [out] * len(s.world.local_ranks)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        gathered = self.world.all_gather(a, out=self.gathered)
        for g, bi, ci in zip(gathered, b, c):
            torch.mm(g, bi, out=ci)
        return gathered


class _SharedA:
    """This rank's A in one symmetric buffer that peers read between two barriers: the caller's own
    (from `world.empty`: no copy) or a staging slot (A copied in)."""

    def __init__(self, s: Shape, owner: Any, owner_offset: int) -> None:
        world = s.world
        self.owned = owner is not None
        if self.owned:
            buf, off = owner, owner_offset
        else:
            buf, off = world.symmetric("ag_gemm.stage", (slot_elems(s.R, s.K),), s.dtype), 0
        self.buf = buf
        self.views = [buf.tensors[i][off : off + s.R * s.K].view(s.R, s.K) for i in range(len(world.local_ranks))]
        elem = self.views[0].element_size()
        self.peer_views = [
            [buf.peers[i][p][off : off + s.R * s.K].view(s.R, s.K) for p in range(s.W)] for i in range(len(self.views))
        ]
        self.deltas = [
            world.int_table(tuple(offset(v.data_ptr(), self.views[i].data_ptr(), elem) for v in self.peer_views[i]))
            for i in range(len(self.views))
        ]

    def enter(self, world: World, a: list[torch.Tensor]) -> None:
        if not self.owned:
            for v, x in zip(self.views, a):
                v.copy_(x)
        world.barrier(self.buf)

    def leave(self, world: World) -> None:
        world.barrier(self.buf)  # peers are done reading before anyone writes the buffer again


class PullPlan:
    """The tile GEMM loads peers' rows straight from their symmetric buffers."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, owner: Any, owner_offset: int, want_gathered: bool) -> None:
        world = s.world
        self.world, self.want_gathered = world, want_gathered
        self.shared = _SharedA(s, owner, owner_offset)
        dummy = world.int_table((0,))
        self.launches = []
        for i, r in enumerate(world.local_ranks):
            tiles = cdiv(s.M, cfg.BLOCK_M) * cdiv(s.N_r, cfg.BLOCK_N)
            ws, counts = _split_k_workspace(world, cfg, tiles, i)
            stand = _stand_bc(s)
            args = gemm_args(cfg, s.W, a=self.shared.views[i], b=stand[0], c=stand[1], K=s.K, N_r=s.N_r, R=s.R,
                             rows=s.M, dummy=dummy, src=self.shared.views[i], deltas=self.shared.deltas[i], rank=r,
                             shift=(r * s.R) // cfg.BLOCK_M, ws=ws, counts=counts)  # fmt: skip
            self.launches.append(_launch(ag_gemm_kernel, tiles * cfg.SPLIT_K, args, slots=("a_ptr", "b_ptr", "c_ptr")))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        self.shared.enter(self.world, a)
        for launch, ai, bi, ci in zip(self.launches, a, b, c):
            launch(ai, bi, ci)
        gathered = [torch.cat(p) for p in self.shared.peer_views] if self.want_gathered else []
        self.shared.leave(self.world)
        return gathered


class CePlan:
    """The copy engine pulls peers' rows chunk by chunk on a side stream; per chunk, once its event
    fires, cuBLAS or the tile GEMM multiplies it. Local rows first."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, owner: Any, owner_offset: int, want_gathered: bool) -> None:
        world = s.world
        self.world, self.cfg, self.s, self.want_gathered = world, cfg, s, want_gathered
        self.shared = _SharedA(s, owner, owner_offset)
        self.rows = world.scratch("ag_gemm.ce_rows", s.M * s.K, s.dtype)
        chunk = cdiv(s.R, cfg.ce_chunks)
        self.pieces: list[list[tuple[torch.Tensor, torch.Tensor, int, int, Any]]] = []
        self.gemms: list[dict[tuple[int, int], Launch]] = []
        dummy = world.int_table((0,))
        for i, r in enumerate(world.local_ranks):
            g = self.rows[i][: s.M * s.K].view(s.M, s.K)
            mine = []
            for p in [(r + j) % s.W for j in range(1, s.W)]:
                for lo in range(0, s.R, chunk):
                    hi = min(s.R, lo + chunk)
                    event = torch.cuda.Event() if world.device.type == "cuda" else None
                    mine.append((g[p * s.R + lo : p * s.R + hi], self.shared.peer_views[i][p][lo:hi], p * s.R + lo,
                                 hi - lo, event))  # fmt: skip
            self.pieces.append(mine)
            gemms = {}
            if cfg.ce_consumer == "triton":
                for row_lo, n in [(r * s.R, s.R)] + [(lo, n) for _, _, lo, n, _ in mine]:
                    tiles = cdiv(n, cfg.BLOCK_M) * cdiv(s.N_r, cfg.BLOCK_N)
                    ws, counts = _split_k_workspace(world, cfg, tiles, i)
                    bc = _stand_bc(s)
                    args = gemm_args(cfg, s.W, a=g, b=bc[0], c=bc[1], K=s.K, N_r=s.N_r, R=n, rows=n, dummy=dummy,
                                     ws=ws, counts=counts)  # fmt: skip
                    gemms[(row_lo, n)] = _launch(ag_gemm_kernel, tiles * cfg.SPLIT_K, args,
                                                 slots=("a_ptr", "src_ptr", "b_ptr", "c_ptr"))  # fmt: skip
            self.gemms.append(gemms)

    def _consume(self, i: int, a_rows: torch.Tensor, b: torch.Tensor, c_rows: torch.Tensor, key: tuple) -> None:
        if self.cfg.ce_consumer == "cublas":
            torch.mm(a_rows, b, out=c_rows)
        else:
            self.gemms[i][key](a_rows, a_rows, b, c_rows)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        world, s = self.world, self.s
        self.shared.enter(world, a)
        gathered = []
        for i, r in enumerate(world.local_ranks):
            with world.side_stream(i):  # copy engine: peers' rows, chunk by chunk, in ring order
                for dst, src, _, _, event in self.pieces[i]:
                    dst.copy_(src, non_blocking=True)
                    world.record_event(event)
            self._consume(i, a[i], b[i], c[i][r * s.R : (r + 1) * s.R], (r * s.R, s.R))  # local rows first
            for dst, _, lo, n, event in self.pieces[i]:
                world.wait_event(event)
                self._consume(i, dst, b[i], c[i][lo : lo + n], (lo, n))
            world.wait_side_stream()
            if self.want_gathered:
                g = self.rows[i][: s.M * s.K].view(s.M, s.K).clone()
                g[r * s.R : (r + 1) * s.R].copy_(a[i])
                gathered.append(g)
        self.shared.leave(world)
        return gathered


class PushPlan:
    """`comm_sms` producer programs inside the tile GEMM's persistent grid push A's rows into every peer's
    inbox (the epoch's half); tiles wait on the flags of the chunks they read."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, want_gathered: bool) -> None:
        world = s.world
        self.world, self.s, self.want_gathered = world, s, want_gathered
        self.box = inbox(world, "ag_gemm", s.R, s.K, s.dtype, halves=2)
        n_chunks = cdiv(s.R, cfg.chunk_m)
        fl = flags(world, "ag_gemm", n_chunks)
        self.state = call_state(world)
        tiles = cdiv(s.M, cfg.BLOCK_M) * cdiv(s.N_r, cfg.BLOCK_N)
        consumers = max(1, min(num_sms(world.device) - cfg.comm_sms, tiles * cfg.SPLIT_K))
        programs = cfg.comm_sms + consumers
        tickets = world.scratch("ag_gemm.tickets", 1, torch.int32)
        done = world.scratch("ag_gemm.push_done", n_chunks, torch.int32)
        fence = world.scratch("ag_gemm.fence", programs * 32 * cfg.num_warps, torch.int32)
        dummy = world.int_table((0,))
        # the interpreter (and any sequential world) runs every rank's producers before any consumer
        # (first program id, programs, EPOCH, ticket takers) of each launch per rank
        phases = [(0, programs, 1, programs)]
        if not world.concurrent:
            phases = [(0, cfg.comm_sms, 1, 0), (cfg.comm_sms, consumers, 2, consumers)]
        self.phases: list[list[Launch]] = [[] for _ in phases]
        for i, r in enumerate(world.local_ranks):
            ws, counts = _split_k_workspace(world, cfg, tiles, i)
            deltas = world.int_table(tuple(p * self.box.slot for p in range(s.W)))
            for n, (pid_base, grid, epoch, takers) in enumerate(phases):
                push = dict(inbox=self.box.base(i), inbox_deltas=self.box.deltas[i], flags=fl.local(i),
                            flag_ptrs=fl.ptrs(i), tickets=tickets[i], done=done[i], fence=fence[i],
                            state=self.state.counters[i], slot=self.box.slot, half_stride=self.box.half_stride,
                            n_chunks=n_chunks, comm_sms=cfg.comm_sms, consumers=consumers, pid_base=pid_base,
                            ticket_takers=max(takers, 1), num_programs=grid, own=want_gathered, epoch=epoch,
                            producers_consume=world.concurrent)  # fmt: skip
                bc = _stand_bc(s)
                args = gemm_args(cfg, s.W, a=dummy, b=bc[0], c=bc[1], K=s.K, N_r=s.N_r, R=s.R, rows=s.M,
                                 dummy=dummy, src=self.box.base(i), deltas=deltas, rank=r,
                                 shift=(r * s.R) // cfg.BLOCK_M, push=push, ws=ws, counts=counts)  # fmt: skip
                self.phases[n].append(_launch(ag_gemm_kernel, grid, args, slots=("a_ptr", "b_ptr", "c_ptr")))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        for phase in self.phases:
            for launch, ai, bi, ci in zip(phase, a, b, c):
                launch(ai, bi, ci)
        if not self.want_gathered:
            return []
        s, hs = self.s, self.box.half_stride
        out = []
        for i in range(len(a)):  # the epoch's half, picked on the device (the call closed: counter = epoch)
            halves = self.box.base(i)[: 2 * hs].view(2, hs)
            half = torch.index_select(halves, 0, torch.remainder(self.state.counters[i][:1], 2))[0]
            out.append(torch.cat([half[p * self.box.slot : p * self.box.slot + s.R * s.K].view(s.R, s.K)
                                  for p in range(s.W)]))  # fmt: skip
        return out


class PushGatheredPlan:
    """push_cublas, SMs pushing, gathered order: push into the epoch's inbox half, receive every peer's rows
    into one fixed [M, K] buffer inside the same kernel, then one cuBLAS GEMM over all M rows (B read once)."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, want_gathered: bool) -> None:
        world = s.world
        self.world, self.want_gathered = world, want_gathered
        box = inbox(world, "ag_gemm", s.R, s.K, s.dtype, halves=2)
        chunk_m = triton.next_power_of_2(s.R)
        fl = flags(world, "ag_gemm", 1)
        state = call_state(world)
        rows = world.scratch("ag_gemm.rows", s.M * s.K, s.dtype)
        done = world.scratch("ag_gemm.push_done", 1, torch.int32)
        fence = world.scratch("ag_gemm.fence", cfg.comm_sms * 32 * cfg.num_warps, torch.int32)
        self.gathered = [rows[i][: s.M * s.K].view(s.M, s.K) for i in range(len(world.local_ranks))]
        # one kernel per rank where ranks run at once; else every rank's push, then every rank's receive
        steps = [(True, True, 1)] if world.concurrent else [(True, False, 1), (False, True, 2)]
        self.phases: list[list[Launch]] = [[] for _ in steps]
        for i, r in enumerate(world.local_ranks):
            for n, (push, receive, epoch) in enumerate(steps):
                args = push_args(cfg, s.W, src=self.gathered[i], inbox_base=box.base(i), inbox_deltas=box.deltas[i],
                                 own=self.gathered[i][r * s.R :], flag_ptrs=fl.ptrs(i), flags_local=fl.local(i),
                                 done=done[i], fence=fence[i], state=state.counters[i], gathered=self.gathered[i],
                                 K=s.K, R=s.R, slot=box.slot, half_stride=box.half_stride, rank=r, n_chunks=1,
                                 chunk_m=chunk_m, epoch=epoch, push=push, receive=receive, wait_all=False,
                                 own_rows=push)  # fmt: skip
                self.phases[n].append(_launch(allgather_push_kernel, cfg.comm_sms, args, slots=("src_ptr",)))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        for phase in self.phases:
            for launch, ai in zip(phase, a):
                launch(ai)
        for g, bi, ci in zip(self.gathered, b, c):
            torch.mm(g, bi, out=ci)
        return [g.clone() for g in self.gathered] if self.want_gathered else []


class PushOpenedPlan:
    """push_cublas with transfers at fixed addresses (copy-engine pushes, or cuBLAS reading chunks of the
    inbox as they land): a one-half inbox, and the call opens with the entry handshake."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, want_gathered: bool) -> None:
        world = s.world
        self.world, self.s, self.cfg, self.want_gathered = world, s, cfg, want_gathered
        self.gathered_order = cfg.gemm_order == "gathered"
        self.chunk_m = triton.next_power_of_2(s.R) if self.gathered_order else cfg.chunk_m
        self.box: Inbox = inbox(world, "ag_gemm", s.R, s.K, s.dtype, halves=1)
        self.n_chunks = cdiv(s.R, self.chunk_m)
        self.flags = flags(world, "ag_gemm", self.n_chunks)
        self.state = call_state(world)
        self.own_rows = want_gathered or self.gathered_order
        n_local = len(world.local_ranks)
        st, en = self.state, self.state.entered
        steps = [(True, True)] if world.concurrent else [(True, False), (False, True)]
        self.open = [[_launch(open_call_kernel, 1, dict(state_ptr=st.counters[i], entered_ptrs_ptr=st.entered_ptrs[i],
                                                        entered_ptr=en.tensors[i], rank=r, WORLD=s.W, SIGNAL=sig,
                                                        WAIT=wait, num_warps=1))
                      for i, r in enumerate(world.local_ranks)] for sig, wait in steps]  # fmt: skip
        self.fold_wait = self.gathered_order and world.concurrent  # the push launch waits for every peer
        self.push_launch: list[Launch | None] = [None] * n_local
        self.releases: list[list[Launch]] = [[] for _ in range(n_local)]
        self.copies: list[list[list[tuple[torch.Tensor | None, list[torch.Tensor]]]]] = [[] for _ in range(n_local)]
        for i, r in enumerate(world.local_ranks):
            if cfg.push_by == "sm":
                done = world.scratch("ag_gemm.push_done", self.n_chunks, torch.int32)
                fence = world.scratch("ag_gemm.fence", cfg.comm_sms * 32 * cfg.num_warps, torch.int32)
                args = push_args(cfg, s.W, src=self.box.base(i), inbox_base=self.box.base(i),
                                 inbox_deltas=self.box.deltas[i], own=self.box.rows(i, r, s.R, s.K),
                                 flag_ptrs=self.flags.ptrs(i), flags_local=self.flags.local(i), done=done[i],
                                 fence=fence[i], state=st.counters[i], gathered=self.box.base(i), K=s.K, R=s.R,
                                 slot=self.box.slot, half_stride=0, rank=r, n_chunks=self.n_chunks,
                                 chunk_m=self.chunk_m, epoch=2, push=True, receive=False, wait_all=self.fold_wait,
                                 own_rows=self.own_rows)  # fmt: skip
                self.push_launch[i] = _launch(allgather_push_kernel, cfg.comm_sms, args, slots=("src_ptr",))
            else:
                dests = [self.box.dest(i, (r + j) % s.W, r, s.R, s.K) for j in range(1, s.W)]
                if self.own_rows:
                    dests.append(self.box.rows(i, r, s.R, s.K))
                for ch, lo in enumerate(range(0, s.R, self.chunk_m)):
                    hi = min(s.R, lo + self.chunk_m)
                    self.copies[i].append([(lo, hi), [d[lo:hi] for d in dests]])
                    release = dict(flag_ptrs_ptr=self.flags.ptrs(i), flags_ptr=self.flags.local(i),
                                   state_ptr=st.counters[i], rank=r, n_chunks=self.n_chunks, chunk=ch, WORLD=s.W,
                                   WAIT_ALL=self.fold_wait, num_warps=1)  # fmt: skip
                    self.releases[i].append(_launch(release_chunk_kernel, 1, release))
        # waits before cuBLAS reads a peer's chunk (all of them at once in the gathered order)
        self.waits: list[list[tuple[Launch, int, int, int]]] = []
        for i, r in enumerate(world.local_ranks):
            mine = []
            if self.gathered_order:
                if not self.fold_wait:
                    mine.append((self._wait(i, r, 0, s.W - 1, 0, self.n_chunks - 1), 0, 0, 0))
            else:
                for p in [(r + j) % s.W for j in range(1, s.W)]:
                    for ch, lo in enumerate(range(0, s.R, self.chunk_m)):
                        hi = min(s.R, lo + self.chunk_m)
                        mine.append((self._wait(i, r, p, p, ch, ch), p, lo, hi))
            self.waits.append(mine)

    def _wait(self, i: int, r: int, p_lo: int, p_hi: int, c_lo: int, c_hi: int) -> Launch:
        return _launch(wait_chunks_kernel, 1, dict(flags_ptr=self.flags.local(i), state_ptr=self.state.counters[i],
                                                   rank=r, n_chunks=self.n_chunks, p_lo=p_lo, p_hi=p_hi, c_lo=c_lo,
                                                   c_hi=c_hi, num_warps=1))  # fmt: skip

    def _push(self, i: int, a_i: torch.Tensor) -> None:
        launch = self.push_launch[i]
        if launch is not None:
            launch(a_i)
            return
        for ((lo, hi), dests), release in zip(self.copies[i], self.releases[i]):
            src = a_i if hi - lo == a_i.shape[0] else a_i[lo:hi]
            for d in dests:
                d.copy_(src, non_blocking=True)
            release()

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        world, s, box = self.world, self.s, self.box
        for phase in self.open[:-1]:  # sequential worlds: every rank opens before any waits
            for launch in phase:
                launch()
        for i in range(len(a)):
            self.open[-1][i]()
            with contextlib.nullcontext() if self.gathered_order else world.side_stream(i):
                self._push(i, a[i])
        gathered = []
        for i, r in enumerate(world.local_ranks):
            if self.gathered_order:
                for wait, *_ in self.waits[i]:
                    wait()
                every = box.all_rows(i, s.W, s.R, s.K)
                if every is not None:  # ranks' rows are contiguous: one GEMM, B read once
                    torch.mm(every, b[i], out=c[i])
                else:
                    for p in range(s.W):
                        torch.mm(box.rows(i, p, s.R, s.K), b[i], out=c[i][p * s.R : (p + 1) * s.R])
            else:
                torch.mm(a[i], b[i], out=c[i][r * s.R : (r + 1) * s.R])
                for wait, p, lo, hi in self.waits[i]:
                    wait()
                    rows = box.rows(i, p, s.R, s.K)
                    torch.mm(rows if hi - lo == s.R else rows[lo:hi], b[i], out=c[i][p * s.R + lo : p * s.R + hi])
                world.wait_side_stream()  # the side stream read A: the caller may overwrite it after us
            if self.want_gathered:
                gathered.append(torch.cat([box.rows(i, p, s.R, s.K) for p in range(s.W)]))
        return gathered


# ------------------------------------------------------------------------------------------- helpers


def _split_k_workspace(world: World, cfg: AgGemmConfig, tiles: int, i: int) -> tuple[Any, Any]:
    if cfg.SPLIT_K == 1:
        return None, None
    ws = world.scratch("ag_gemm.splitk", tiles * cfg.BLOCK_M * cfg.BLOCK_N, torch.float32)[i]
    counts = world.scratch("ag_gemm.splitk_counts", tiles, torch.int32)[i]
    return ws, counts


def _stand_bc(s: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """B- and C-shaped stand-ins for building launch arguments, with the call's strides (C: row-major)."""
    b = torch.empty_strided((1, 1), s.b_stride, dtype=s.dtype, device=s.world.device)
    c = torch.empty_strided((1, 1), (s.N_r, 1), dtype=s.dtype, device=s.world.device)
    return b, c


def build_plan(s: Shape, cfg: AgGemmConfig, owner: Any, owner_offset: int, want_gathered: bool) -> Any:
    """The plan of `cfg`'s mode for shape `s` (A in the caller's symmetric buffer `owner`, or copied)."""
    if cfg.mode == "baseline":
        return BaselinePlan(s)
    if cfg.mode == "pull":
        return PullPlan(s, cfg, owner, owner_offset, want_gathered)
    if cfg.mode == "ce":
        return CePlan(s, cfg, owner, owner_offset, want_gathered)
    if cfg.mode == "push":
        return PushPlan(s, cfg, want_gathered)
    if cfg.push_by == "sm" and cfg.gemm_order == "gathered":
        return PushGatheredPlan(s, cfg, want_gathered)
    return PushOpenedPlan(s, cfg, want_gathered)
