"""GEMM+RS's launch plans, one class per kind of mode: built once per (world, shapes, dtype, config), then called.

- baseline: cuBLAS into a plan-owned partial, then a reduce-scatter (the config's collective variant). No cross-call
  state. A variant that writes into special memory (an NCCL window) reduces into a plan-owned output copied out,
  unless the caller's output came from `world.collective_empty` for that variant.
- push, pull, atomic (`FusedPlan`): one `gemm_rs_kernel` launch per call on a world whose ranks run at
  once (GEMM programs and reduce programs in one grid, or, with `reduce_by=epilogue`, GEMM programs only,
  which sum the own rows' tiles in their epilogue, or with `reduce_by=tile`, tiles over every rank's rows that
  swap rows with the peers' same tile, pushed as LL words with `handoff=ll`); buffers alternate halves by the device
  epoch.
- pull_cublas (`PullCublasPlan`): cuBLAS writes the whole partial into a one-half symmetric buffer; one
  reduce launch releases "ready", pulls and sums this rank's rows, and ends with an exit handshake (every
  peer done reading), so the next call's GEMM may overwrite the partial: two launches, as GEMM + NCCL.
- barrier (`MeetPlan`): cuBLAS writes the whole partial; one launch meets the peers' namesake programs
  (`runtime.meet`). Pulled: from a symmetric partial, it sums this rank's rows in rank order and meets them again (no
  flags, epochs or halves). Pushed: it writes each owner's rows into the owner's inbox half (by the device epoch),
  meets once, and sums its own inbox.
- ce (`CePlan`): per destination rank and chunk, cuBLAS or the tile GEMM computes the partial rows into a
  staging buffer, the copy engine sends them into the owner's inbox slot on a side stream, and a
  one-program kernel releases the chunk's flag behind the copy; the owner's reduce programs sum its slots
  as flags arrive. The copies land at fixed addresses, so the inbox has one half and the call opens with
  the entry handshake (`open_call_kernel`): a rank writes into a peer only after the peer entered the
  same call, i.e. finished reducing the last one.

On a world whose ranks launch one after another (simulated ranks), every rank's sends are issued before
any rank's reduce.
"""

from __future__ import annotations

from typing import Any

import torch

from jointtune.kernels.gemm_rs.args import EPI_ATOMIC, EPI_SIGNAL, EPI_STORE, GemmRsConfig, RsShape, kernel_args
from jointtune.kernels.gemm_rs.args import tile_work as _work
from jointtune.kernels.gemm_rs.kernel import gemm_rs_kernel, release_flag_kernel
from jointtune.kernels.gemm_rs.meet import gemm_rs_meet_kernel, gemm_rs_push_meet_kernel
from jointtune.kernels.runtime.device import num_sms
from jointtune.kernels.runtime.gemm import split_k_workspace
from jointtune.kernels.runtime.launch import Launch
from jointtune.kernels.runtime.ll import word_deltas
from jointtune.kernels.runtime.meet import (
    MEET_BLOCK,
    MEET_WARPS,
    exact_deltas,
    launch_programs,
    pushed_steps,
    signal_buffer,
    world_p2,
)
from jointtune.kernels.runtime.signals import open_call_kernel
from jointtune.kernels.runtime.symm import ALIGN, call_state, cdiv, flags, inbox, peer_deltas, slot_elems
from jointtune.kernels.runtime.world import World


class BaselinePlan:
    """cuBLAS computes the whole partial, a reduce-scatter (NCCL's default kernels or another variant) sums it."""

    def __init__(self, world: World, s: RsShape, collective: str) -> None:
        self.world, self.collective = world, collective
        if collective == "nccl":
            self.partials = [torch.empty((s.M, s.N), dtype=s.dtype, device=world.device) for _ in world.local_ranks]
            self.reduced: list[torch.Tensor] | None = None
        else:
            self.partials = world.collective_empty((s.M, s.N), s.dtype, collective)
            self.reduced = world.collective_empty((s.M // s.W, s.N), s.dtype, collective)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        for ai, bi, pi in zip(a, b, self.partials):
            torch.mm(ai, bi, out=pi)
        direct = self.reduced is None or all(self.world.collective_home(o) == self.collective for o in out)
        target = out if direct else self.reduced
        self.world.reduce_scatter(self.partials, target, collective=self.collective)
        if not direct:
            for o, r in zip(out, target):
                o.copy_(r)


def _stand_in(world: World, s: RsShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A-, B- and out-shaped stand-ins for building launch arguments, with the call's strides."""
    dev = world.device
    a = torch.empty((1, 1), dtype=s.dtype, device=dev)
    b = torch.empty_strided((1, 1), s.b_stride, dtype=s.dtype, device=dev)
    return a, b, torch.empty((1, 1), dtype=s.dtype, device=dev)


class FusedPlan:
    """push, pull or atomic: the GEMM's epilogue sends each tile towards its owner, reduce programs sum."""

    def __init__(self, world: World, s: RsShape, cfg: GemmRsConfig) -> None:
        W, R, N = s.W, s.R, s.N
        self.world = world
        span = cfg.spans_ranks()
        chunk_rows = cfg.chunk_rows(R)
        n_chunks = cfg.fused_flags(s.M, R, N)
        fl = flags(world, "gemm_rs", n_chunks)
        state = call_state(world)
        slot = slot_elems(R, N)
        if cfg.mode == "atomic":  # every rank's fp32 accumulator, two halves, zero between calls
            buf = world.symmetric("gemm_rs.acc", (2 * slot,), torch.float32, zero=True)
        elif cfg.ll():  # inbox of LL words (`runtime.ll`): slot p holds rank p's rows of mine, two values a word;
            # zeroed once (no word carries a call's tag before that call writes it)
            slot = slot_elems(R, cdiv(N, 2))
            buf = world.symmetric("gemm_rs.ll_inbox", (2 * W * slot,), torch.int64, zero=True)
        elif cfg.mode == "push":  # inbox: slot p holds rank p's partial of my rows
            buf = world.symmetric("gemm_rs.inbox2", (2 * W * slot,), s.dtype)
        else:  # pull: my partial of every rank's rows, slot p for rank p's
            buf = world.symmetric("gemm_rs.partials", (2 * W * slot,), s.dtype)
        half_stride = buf.numel // 2 // ALIGN * ALIGN
        tiles = cfg.fused_tiles(s.M, R, N)
        epi_reduce = cfg.reduces_in_epilogue()
        reduce = cfg.fused_reduce_programs()
        gemm = max(1, min(tiles * cfg.SPLIT_K, num_sms(world.device) - reduce))
        done = world.scratch("gemm_rs.done", W * n_chunks, torch.int32)
        dummy = world.int_table((0,))
        sources, zero = (1, True) if cfg.mode == "atomic" else (W, False)
        # (program base, grid, GEMM, REDUCE, EPOCH, num_programs, OWN_TILES) of each launch per rank
        phases = [(0, gemm + reduce, True, reduce > 0, 1, gemm + reduce, 0)]
        if not world.concurrent and not reduce:  # every rank's tiles for others, then every rank's own rows
            phases = [(0, gemm, True, False, 1, gemm, 1), (0, gemm, True, False, 2, gemm, 2)]
        elif not world.concurrent:
            phases = [(0, gemm, True, False, 1, gemm, 0), (gemm, reduce, False, True, 2, gemm + reduce, 0)]
        self.phases: list[list[Launch]] = [[] for _ in phases]
        for i, r in enumerate(world.local_ranks):
            if cfg.mode == "atomic":
                dest_deltas = peer_deltas(world, buf, i)
                src_deltas = world.int_table((0,))
            elif cfg.ll():  # words, read at exact offsets
                dest_deltas = word_deltas(world, buf, i, r * slot)
                src_deltas = world.int_table(tuple(p * slot for p in range(W)))
            elif cfg.mode == "push":
                dest_deltas = peer_deltas(world, buf, i, r * slot)
                src_deltas = world.int_table(tuple(p * slot for p in range(W)))
            else:
                dest_deltas = world.int_table(tuple(p * slot for p in range(W)))
                src_deltas = peer_deltas(world, buf, i, r * slot)
            ws, counts = split_k_workspace(world, "gemm_rs", cfg, tiles, i)
            a, b, out = _stand_in(world, s)
            first = (r + 1) % W if epi_reduce or cfg.tile_order == "peers_first" else r
            for n, (base, grid, has_gemm, has_reduce, epoch, programs, own_tiles) in enumerate(phases):
                args = kernel_args(
                    cfg, s, a=a, b=b, out=out, dummy=dummy, rank=r, rows=s.M, seg_rows=R, reduce=has_reduce,
                    epi=EPI_ATOMIC if cfg.mode == "atomic" else EPI_SIGNAL, gemm=has_gemm and not span,
                    dest=buf.tensors[i], dest_deltas=dest_deltas, src=buf.tensors[i], src_deltas=src_deltas,
                    sources=sources, flags_local=fl.local(i), flag_ptrs=fl.ptrs(i), done=done[i],
                    state=state.counters[i], ws=ws, counts=counts, half_stride=half_stride, n_chunks=n_chunks,
                    chunk_rows=chunk_rows, first_seg=first, gemm_programs=gemm, pid_base=base, num_programs=programs,
                    stride_dm=N, wait_own=True, zero_src=zero, epoch=epoch, epi_reduce=epi_reduce, own_tiles=own_tiles,
                    span=span,
                )  # fmt: skip
                self.phases[n].append(Launch(gemm_rs_kernel, grid, args, slots=("a_ptr", "b_ptr", "out_ptr")))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        for phase in self.phases:
            for launch, ai, bi, oi in zip(phase, a, b, out):
                launch(ai, bi, oi)


class CePlan:
    """Per destination and chunk: a GEMM into staging, a copy-engine send into the owner's inbox, a flag."""

    #: host calls per chunk and destination (GEMM, copy, flag): repeat eager calls replay a graph of the call, as
    #: AG+GEMM's ce plan does (`eager_graph`)
    replay_eagerly = True

    def __init__(self, world: World, s: RsShape, cfg: GemmRsConfig) -> None:
        W, R, N = s.W, s.R, s.N
        self.world, self.s = world, s
        self.box = inbox(world, "gemm_rs", R, N, s.dtype, halves=1)
        chunk_rows = cdiv(R, cfg.ce_chunks)
        n_chunks = cdiv(R, chunk_rows)
        fl = flags(world, "gemm_rs", n_chunks)
        state = call_state(world)
        en = state.entered
        staging = world.scratch("gemm_rs.ce_stage", s.M * N, s.dtype)
        dummy = world.int_table((0,))
        steps = [(True, True)] if world.concurrent else [(True, False), (False, True)]
        self.open = [[Launch(open_call_kernel, 1, dict(state_ptr=state.counters[i], entered_ptrs_ptr=en.ptrs[i],
                                                        entered_ptr=en.tensors[i], rank=r, WORLD=W, SIGNAL=sig,
                                                        WAIT=wait, num_warps=1))
                      for i, r in enumerate(world.local_ranks)] for sig, wait in steps]  # fmt: skip
        # per local rank: (A's first row, rows, staging rows, owner's inbox rows, release, tile GEMM or None)
        self.sends: list[list[tuple[int, int, torch.Tensor, torch.Tensor, Launch, Launch | None]]] = []
        self.own: list[tuple[torch.Tensor, Launch | None]] = []
        self.reduce: list[Launch] = []
        a0, b0, out0 = _stand_in(world, s)
        for i, r in enumerate(world.local_ranks):
            stage = staging[i][: s.M * N].view(s.M, N)
            mine = []
            for p in [(r + j) % W for j in range(1, W)]:
                dest = self.box.dest(i, p, r, R, N)
                for c, lo in enumerate(range(0, R, chunk_rows)):
                    hi = min(R, lo + chunk_rows)
                    release_args = dict(flag_ptrs_ptr=fl.ptrs(i), state_ptr=state.counters[i], owner=p,
                                        index=r * n_chunks + c, num_warps=1)  # fmt: skip
                    release = Launch(release_flag_kernel, 1, release_args)
                    gemm = self._tile_gemm(world, cfg, s, hi - lo, dummy, i) if cfg.ce_consumer == "triton" else None
                    mine.append((p * R + lo, hi - lo, stage[p * R + lo : p * R + hi], dest[lo:hi], release, gemm))
            self.sends.append(mine)
            own_gemm = self._tile_gemm(world, cfg, s, R, dummy, i) if cfg.ce_consumer == "triton" else None
            self.own.append((self.box.rows(i, r, R, N), own_gemm))
            slots = world.int_table(tuple(p * self.box.slot for p in range(W)))
            args = kernel_args(
                cfg, s, a=a0, b=b0, out=out0, dummy=dummy, rank=r, rows=R, seg_rows=R, epi=EPI_STORE, gemm=False,
                reduce=True, src=self.box.base(i), src_deltas=slots, sources=W, flags_local=fl.local(i),
                state=state.counters[i], n_chunks=n_chunks, chunk_rows=chunk_rows, num_programs=cfg.reduce_sms,
                wait_own=False, epoch=2, num_warps=4,
            )  # fmt: skip
            self.reduce.append(Launch(gemm_rs_kernel, cfg.reduce_sms, args, slots=("out_ptr",)))

    @staticmethod
    def _tile_gemm(world: World, cfg: GemmRsConfig, s: RsShape, rows: int, dummy: torch.Tensor, i: int) -> Launch:
        tiles = _work(cfg, rows, rows, s.N) // cfg.SPLIT_K
        ws, counts = split_k_workspace(world, "gemm_rs", cfg, tiles, i)
        a, b, out = _stand_in(world, s)
        work = tiles * cfg.SPLIT_K
        args = kernel_args(cfg, s, a=a, b=b, out=out, dummy=dummy, rank=0, rows=rows, seg_rows=rows, epi=EPI_STORE,
                           gemm=True, reduce=False, dest=out, dest_deltas=dummy, ws=ws, counts=counts,
                           gemm_programs=work, num_programs=work, stride_dm=s.N)  # fmt: skip
        return Launch(gemm_rs_kernel, work, args, slots=("a_ptr", "b_ptr", "dest_ptr"))

    @staticmethod
    def _gemm(gemm: Launch | None, a_rows: torch.Tensor, b: torch.Tensor, c_rows: torch.Tensor) -> None:
        if gemm is None:
            torch.mm(a_rows, b, out=c_rows)
        else:
            gemm(a_rows, b, c_rows)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        world, R = self.world, self.s.R
        for step in self.open:
            for launch in step:
                launch()
        for i, r in enumerate(world.local_ranks):
            for lo, n, stage, dest, release, gemm in self.sends[i]:
                self._gemm(gemm, a[i][lo : lo + n], b[i], stage)
                with world.side_stream(i):  # after the GEMM above (the side stream waits for this one)
                    dest.copy_(stage, non_blocking=True)
                    release()
            own_rows, own_gemm = self.own[i]
            self._gemm(own_gemm, a[i][r * R : (r + 1) * R], b[i], own_rows)
        for i in range(len(world.local_ranks)):
            self.reduce[i](out[i])
            world.wait_side_stream()  # staging is rewritten by the next call only after its copies


class PullCublasPlan:
    """cuBLAS writes the whole partial into this rank's symmetric buffer; one reduce launch tells every peer it
    is ready, pulls this rank's rows from every peer and sums them, and ends with the exit handshake."""

    def __init__(self, world: World, s: RsShape, cfg: GemmRsConfig) -> None:
        W, R, N = s.W, s.R, s.N
        self.world = world
        buf = world.symmetric("gemm_rs.partials1", (s.M * N,), s.dtype)
        self.partials = [buf.tensors[i][: s.M * N].view(s.M, N) for i in range(len(world.local_ranks))]
        ready = flags(world, "gemm_rs", 1)
        done = flags(world, "gemm_rs.exit", 1)
        state = call_state(world)
        dummy = world.int_table((0,))
        red = cfg.reduce_sms
        # (grid, READY, REDUCE, EXIT, EPOCH): one launch where ranks run at once; on a sequential world every
        # rank's "ready" first, then every rank's reduce (and no exit: nothing runs beside it)
        steps = [(red, True, True, True, 1)]
        if not world.concurrent:
            steps = [(1, True, False, False, 1), (red, False, True, False, 2)]
        self.phases: list[list[Launch]] = [[] for _ in steps]
        for i, r in enumerate(world.local_ranks):
            src_deltas = peer_deltas(world, buf, i, r * R * N)
            a, b, out = _stand_in(world, s)
            for n, (grid, has_ready, has_reduce, has_exit, epoch) in enumerate(steps):
                args = kernel_args(
                    cfg, s, a=a, b=b, out=out, dummy=dummy, rank=r, rows=R, seg_rows=R, epi=EPI_STORE, gemm=False,
                    reduce=has_reduce, src=buf.tensors[i], src_deltas=src_deltas, sources=W, flags_local=ready.local(i),
                    flag_ptrs=ready.ptrs(i), state=state.counters[i], n_chunks=1, chunk_rows=R,
                    num_programs=grid, wait_own=False, epoch=epoch, ready=has_ready,
                    exit_flags=(done.ptrs(i), done.local(i)) if has_exit else None, aligned=(R * N) % ALIGN == 0,
                )  # fmt: skip
                self.phases[n].append(Launch(gemm_rs_kernel, grid, args, slots=("out_ptr",)))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        for ai, bi, pi in zip(a, b, self.partials):
            torch.mm(ai, bi, out=pi)
        for phase in self.phases:
            for launch, oi in zip(phase, out):
                launch(oi)


class MeetPlan:
    """barrier: cuBLAS writes this rank's whole partial; one launch exchanges it between meetings of namesake programs
    (`meet`). transport="pull": the partial is in symmetric memory; meet, sum this rank's rows from every rank's
    partial, meet again. transport="push": the partial is local; write every owner's rows into its inbox (two halves,
    by the call's epoch), meet once, sum the own inbox's slots."""

    def __init__(self, world: World, s: RsShape, cfg: GemmRsConfig) -> None:
        self.push = cfg.transport == "push"
        signals = signal_buffer(world, "gemm_rs.meet_signals")
        programs = meet_programs(cfg, s)
        stand_in = torch.empty(1, dtype=s.dtype, device=world.device)
        steps = pushed_steps(world)  # the consuming step sums the own inbox
        self.phases: list[list[Launch]] = [[] for _ in (steps if self.push else [None])]
        if self.push:
            self.partials = [torch.empty((s.M, s.N), dtype=s.dtype, device=world.device) for _ in world.local_ranks]
            box = inbox(world, "gemm_rs.meet", s.R, s.N, s.dtype, halves=2)
            state = call_state(world)
            for i, r in enumerate(world.local_ranks):
                for n, (push, total, meet, epoch) in enumerate(steps):
                    args = push_meet_args(
                        s, part=self.partials[i], inbox=box.base(i), inbox_deltas=box.deltas[i],
                        signals=signals.tensors[i], signal_deltas=exact_deltas(world, signals, i),
                        state=state.counters[i], out=stand_in, rank=r, slot=box.slot, half_stride=box.half_stride,
                        push=push, total=total, meet=meet, epoch=epoch,
                    )  # fmt: skip
                    self.phases[n].append(Launch(gemm_rs_push_meet_kernel, programs, args, slots=("out_ptr",)))
            return
        data = world.symmetric("gemm_rs.meet_partial", (slot_elems(s.M, s.N),), s.dtype)
        self.partials = [data.view(i, (s.M, s.N)) for i in range(len(world.local_ranks))]
        for i, r in enumerate(world.local_ranks):
            args = meet_args(s, buf=data.tensors[i], deltas=peer_deltas(world, data, i), signals=signals.tensors[i],
                             signal_deltas=exact_deltas(world, signals, i), out=stand_in, rank=r,
                             meet=world.concurrent)  # fmt: skip
            self.phases[0].append(Launch(gemm_rs_meet_kernel, programs, args, slots=("out_ptr",)))

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        for ai, bi, pi in zip(a, b, self.partials):
            torch.mm(ai, bi, out=pi)
        for phase in self.phases:  # on a sequential world: after every rank's cuBLAS, no meeting
            for launch, oi in zip(phase, out):
                launch(oi)


def meet_programs(cfg: GemmRsConfig, s: RsShape) -> int:
    """The barrier launch's programs: `reduce_sms`, but none without a block of this rank's rows to sum (every rank
    launches as many: namesakes must exist to meet)."""
    return launch_programs(cfg.reduce_sms, cdiv(s.R * s.N, MEET_BLOCK), "reduce_sms", "mode=barrier")


def push_meet_args(s: RsShape, *, part: Any, inbox: Any, inbox_deltas: Any, signals: Any, signal_deltas: Any,
                   state: Any, out: Any, rank: int, slot: int, half_stride: int, push: bool, total: bool, meet: bool,
                   epoch: int) -> dict[str, Any]:  # fmt: skip
    """`gemm_rs_push_meet_kernel`'s arguments by name, with the launch options."""
    return dict(
        part_ptr=part, inbox_ptr=inbox, inbox_deltas_ptr=inbox_deltas, sig_ptr=signals, sig_deltas_ptr=signal_deltas,
        state_ptr=state, out_ptr=out, R=s.R, N=s.N, rank=rank, slot=slot, half_stride=half_stride, WORLD=s.W,
        WORLD_P2=world_p2(s.W), BLOCK=MEET_BLOCK, PUSH=push, SUM=total, MEET=meet, EPOCH=epoch,
        num_warps=MEET_WARPS, num_stages=1,
    )  # fmt: skip


def meet_args(s: RsShape, *, buf: Any, deltas: Any, signals: Any, signal_deltas: Any, out: Any, rank: int,
              meet: bool) -> dict[str, Any]:  # fmt: skip
    """`gemm_rs_meet_kernel`'s arguments by name, with the launch options."""
    return dict(
        buf_ptr=buf, deltas_ptr=deltas, sig_ptr=signals, sig_deltas_ptr=signal_deltas, out_ptr=out, R=s.R, N=s.N,
        rank=rank, WORLD=s.W, WORLD_P2=world_p2(s.W), BLOCK=MEET_BLOCK, MEET=meet,
        num_warps=MEET_WARPS, num_stages=1,
    )  # fmt: skip


def build_plan(world: World, s: RsShape, cfg: GemmRsConfig) -> Any:
    """The plan of `cfg`'s mode for shape `s` on `world`."""
    if cfg.mode == "baseline":
        return BaselinePlan(world, s, cfg.collective)
    if cfg.mode == "ce":
        return CePlan(world, s, cfg)
    if cfg.mode == "pull_cublas":
        return PullCublasPlan(world, s, cfg)
    if cfg.mode == "barrier":
        return MeetPlan(world, s, cfg)
    return FusedPlan(world, s, cfg)
