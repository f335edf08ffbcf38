"""AG+GEMM's launch plans, one class per mode: built once per (world, shapes, dtype, config), then called.

A plan holds every buffer, view, address table, event and prepared launch (`Launch`) of its mode; a
call binds the caller's A, B and C and issues them. How each mode keeps a captured graph correct:

- baseline: an all-gather (the config's collective variant) into a plan-owned buffer, then cuBLAS. No cross-call
  state. A variant that reads its operands from special memory (an NCCL window) gets A copied in, unless the caller's
  A came from `world.collective_empty` for that variant (as a layer writing into it would).
- pull, ce: A sits in one symmetric buffer (the caller's, or a staging slot) between two barriers:
  peers read it only between them, so the next call may overwrite it. No cross-call state.
- push: Triton all the way; inbox halves alternate by the device epoch (`signals`), flags carry it.
- barrier (`MeetPlan`): one launch pushes this rank's rows into every rank's gathered buffer between two meetings of
  namesake programs (`runtime.meet`; no cross-call state but signals left at 0), or into inbox halves by the device
  epoch before one meeting, then copies them into a local gathered buffer, or (`landing="ll"`) into inbox halves as
  words that carry the call's tag, which the rank polls into its gathered buffer (no meeting); then cuBLAS reads all
  M rows.
- push_cublas: cuBLAS reads the inbox (and the copy engine writes it) at fixed addresses, so the inbox
  has one half and the call opens with the entry handshake: a rank writes into a peer only after the
  peer entered the same call, i.e. finished reading the last one. With SMs pushing all rows for one GEMM
  the push launch opens the call itself; otherwise a one-program kernel does (`open_call_kernel`).
  (Measured on 2x H200: as fast as alternating inbox halves and copying the peers' rows into a fixed
  buffer inside the push launch, the way without a handshake; that way was removed as the longer one.)

On a world whose ranks launch one after another (simulated ranks), every rank's pushes are issued
before any rank's waits.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import triton

from jointtune.kernels.ag_gemm.args import AgGemmConfig, Shape, gemm_args, push_args
from jointtune.kernels.ag_gemm.kernel import ag_gemm_kernel
from jointtune.kernels.ag_gemm.ll_gather import ag_gemm_ll_gather_kernel
from jointtune.kernels.ag_gemm.meet import ag_gemm_inbox_meet_kernel, ag_gemm_meet_kernel
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
from jointtune.kernels.runtime.signals import (
    allgather_push_kernel,
    open_call_kernel,
    release_chunk_kernel,
    wait_chunks_kernel,
)
from jointtune.kernels.runtime.symm import (
    ALIGN,
    Inbox,
    call_state,
    cdiv,
    flags,
    inbox,
    offset,
    peer_deltas,
    slot_elems,
)
from jointtune.kernels.runtime.world import World

# --------------------------------------------------------------------------------------------- modes


class BaselinePlan:
    """An all-gather (NCCL's default kernels or another variant) into a plan-owned buffer, then cuBLAS."""

    def __init__(self, s: Shape, want_gathered: bool, collective: str) -> None:
        self.world, self.want_gathered, self.collective = s.world, want_gathered, collective
        if collective == "nccl":
            out = torch.empty((s.M, s.K), dtype=s.dtype, device=s.world.device)
            self.gathered = [out] * len(s.world.local_ranks)
            self.staged: list[torch.Tensor] | None = None
        else:
            self.gathered = s.world.collective_empty((s.M, s.K), s.dtype, collective)
            self.staged = s.world.collective_empty((s.R, s.K), s.dtype, collective)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.staged is not None and any(self.world.collective_home(x) != self.collective for x in a):
            for st, x in zip(self.staged, a):
                st.copy_(x)
            a = self.staged
        gathered = self.world.all_gather(a, out=self.gathered, collective=self.collective)
        for g, bi, ci in zip(gathered, b, c):
            torch.mm(g, bi, out=ci)
        # the plan's buffer, which the next call rewrites: the caller gets a copy
        return [g.clone() for g in gathered] if self.want_gathered else []


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
            ws, counts = split_k_workspace(world, "ag_gemm", cfg, tiles, i)
            stand = _stand_bc(s)
            args = gemm_args(cfg, s.W, a=self.shared.views[i], b=stand[0], c=stand[1], K=s.K, N_r=s.N_r, R=s.R,
                             rows=s.M, dummy=dummy, src=self.shared.views[i], deltas=self.shared.deltas[i], rank=r,
                             shift=(r * s.R) // cfg.BLOCK_M, ws=ws, counts=counts)  # fmt: skip
            self.launches.append(Launch(ag_gemm_kernel, tiles * cfg.SPLIT_K, args, slots=("a_ptr", "b_ptr", "c_ptr")))

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

    #: a dozen host calls per call (copies, events, barriers, GEMMs): repeat eager calls replay a graph of the call
    #: (`eager_graph`; 1x H100, world size 1, 128x8192x8192: host 77-81 -> 21-24 us, per call 82-86 -> 57 us)
    replay_eagerly = True

    def __init__(self, s: Shape, cfg: AgGemmConfig, owner: Any, owner_offset: int, want_gathered: bool) -> None:
        world = s.world
        self.world, self.s, self.want_gathered = world, s, want_gathered
        self.shared = _SharedA(s, owner, owner_offset)
        self.rows = world.scratch("ag_gemm.ce_rows", s.M * s.K, s.dtype)
        chunk = cdiv(s.R, cfg.ce_chunks)
        # per local rank: (destination rows, peer's rows, first row, rows, event, tile GEMM or None: cuBLAS)
        self.pieces: list[list[tuple[torch.Tensor, torch.Tensor, int, int, Any, Launch | None]]] = []
        self.local_gemm: list[Launch | None] = []  # the local rows' tile GEMM (None: cuBLAS)
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
            gemms = {}
            if cfg.ce_consumer == "triton":
                for row_lo, n in [(r * s.R, s.R)] + [(lo, n) for _, _, lo, n, _ in mine]:
                    tiles = cdiv(n, cfg.BLOCK_M) * cdiv(s.N_r, cfg.BLOCK_N)
                    ws, counts = split_k_workspace(world, "ag_gemm", cfg, tiles, i)
                    bc = _stand_bc(s)
                    args = gemm_args(cfg, s.W, a=g, b=bc[0], c=bc[1], K=s.K, N_r=s.N_r, R=n, rows=n, dummy=dummy,
                                     ws=ws, counts=counts)  # fmt: skip
                    gemms[(row_lo, n)] = Launch(ag_gemm_kernel, tiles * cfg.SPLIT_K, args,
                                                 slots=("a_ptr", "src_ptr", "b_ptr", "c_ptr"))  # fmt: skip
            self.pieces.append([(*piece, gemms.get((piece[2], piece[3]))) for piece in mine])
            self.local_gemm.append(gemms.get((r * s.R, s.R)))

    @staticmethod
    def _consume(gemm: Launch | None, a_rows: torch.Tensor, b: torch.Tensor, c_rows: torch.Tensor) -> None:
        if gemm is None:
            torch.mm(a_rows, b, out=c_rows)
        else:
            gemm(a_rows, a_rows, b, c_rows)

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        world, s = self.world, self.s
        self.shared.enter(world, a)
        gathered = []
        for i, r in enumerate(world.local_ranks):
            with world.side_stream(i):  # copy engine: peers' rows, chunk by chunk, in ring order
                for dst, src, _, _, event, _ in self.pieces[i]:
                    dst.copy_(src, non_blocking=True)
                    world.record_event(event)
            self._consume(self.local_gemm[i], a[i], b[i], c[i][r * s.R : (r + 1) * s.R])  # local rows first
            for dst, _, lo, n, event, gemm in self.pieces[i]:
                world.wait_event(event)
                self._consume(gemm, dst, b[i], c[i][lo : lo + n])
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
        dummy = world.int_table((0,))
        # the interpreter (and any sequential world) runs every rank's producers before any consumer
        # (first program id, programs, EPOCH, ticket takers) of each launch per rank
        phases = [(0, programs, 1, programs)]
        if not world.concurrent:
            phases = [(0, cfg.comm_sms, 1, 0), (cfg.comm_sms, consumers, 2, consumers)]
        self.phases: list[list[Launch]] = [[] for _ in phases]
        for i, r in enumerate(world.local_ranks):
            ws, counts = split_k_workspace(world, "ag_gemm", cfg, tiles, i)
            deltas = world.int_table(tuple(p * self.box.slot for p in range(s.W)))
            for n, (pid_base, grid, epoch, takers) in enumerate(phases):
                push = dict(inbox=self.box.base(i), inbox_deltas=self.box.deltas[i], flags=fl.local(i),
                            flag_ptrs=fl.ptrs(i), tickets=tickets[i], done=done[i],
                            state=self.state.counters[i], slot=self.box.slot, half_stride=self.box.half_stride,
                            n_chunks=n_chunks, comm_sms=cfg.comm_sms, consumers=consumers, pid_base=pid_base,
                            ticket_takers=max(takers, 1), num_programs=grid, own=want_gathered, epoch=epoch,
                            producers_consume=world.concurrent)  # fmt: skip
                bc = _stand_bc(s)
                args = gemm_args(cfg, s.W, a=dummy, b=bc[0], c=bc[1], K=s.K, N_r=s.N_r, R=s.R, rows=s.M,
                                 dummy=dummy, src=self.box.base(i), deltas=deltas, rank=r,
                                 shift=(r * s.R) // cfg.BLOCK_M, push=push, ws=ws, counts=counts)  # fmt: skip
                self.phases[n].append(Launch(ag_gemm_kernel, grid, args, slots=("a_ptr", "b_ptr", "c_ptr")))
        hs = self.box.half_stride
        self.halves = [self.box.base(i)[: 2 * hs].view(2, hs) for i in range(len(world.local_ranks))]

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        for phase in self.phases:
            for launch, ai, bi, ci in zip(phase, a, b, c):
                launch(ai, bi, ci)
        if not self.want_gathered:
            return []
        s = self.s
        out = []
        for i, halves in enumerate(
            self.halves
        ):  # the epoch's half, picked on the device (the call closed: counter = epoch)
            half = torch.index_select(halves, 0, torch.remainder(self.state.counters[i][:1], 2))[0]
            out.append(torch.cat([half[p * self.box.slot : p * self.box.slot + s.R * s.K].view(s.R, s.K)
                                  for p in range(s.W)]))  # fmt: skip
        return out


class PushOpenedPlan:
    """push_cublas with transfers at fixed addresses (copy-engine pushes, or cuBLAS reading chunks of the
    inbox as they land): a one-half inbox, and the call opens with the entry handshake."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, want_gathered: bool) -> None:
        world = s.world
        self.world, self.s, self.want_gathered = world, s, want_gathered
        self.gathered_order = cfg.gemm_order == "gathered"
        self.chunk_m = triton.next_power_of_2(s.R) if self.gathered_order else cfg.chunk_m
        self.box: Inbox = inbox(world, "ag_gemm", s.R, s.K, s.dtype, halves=1)
        self.n_chunks = cdiv(s.R, self.chunk_m)
        self.flags = flags(world, "ag_gemm", self.n_chunks)
        self.state = call_state(world)
        self.own_rows = want_gathered or self.gathered_order
        n_local = len(world.local_ranks)
        st, en = self.state, self.state.entered
        # SMs pushing all rows for one GEMM, ranks at once: the push launch opens the call itself
        self.folded = (cfg.push_by == "sm" and self.gathered_order and world.concurrent and n_local == 1
                       and self.box.slot == s.R * s.K)  # fmt: skip
        #: all but the folded launch issue handshakes, copies or GEMMs per chunk from the host: repeat eager calls
        #: replay a graph of the call (`eager_graph`; 1x H100, world size 1, local_first: per call 87-159 -> 62-64
        #: us). The folded launch stays direct: two host calls, and a replay's copy-out cost it 8 us of GPU time.
        self.replay_eagerly = not self.folded
        steps = [] if self.folded else [(True, True)] if world.concurrent else [(True, False), (False, True)]
        self.open = [[Launch(open_call_kernel, 1, dict(state_ptr=st.counters[i], entered_ptrs_ptr=en.ptrs[i],
                                                        entered_ptr=en.tensors[i], rank=r, WORLD=s.W, SIGNAL=sig,
                                                        WAIT=wait, num_warps=1))
                      for i, r in enumerate(world.local_ranks)] for sig, wait in steps]  # fmt: skip
        # sequential worlds: every rank opens (the steps but the last) before any rank waits
        self.open_before, self.open_last = self.open[:-1], self.open[-1] if self.open else []
        self.fold_wait = self.gathered_order and world.concurrent  # the push launch waits for every peer
        self.push_launch: list[Launch | None] = [None] * n_local
        self.releases: list[list[Launch]] = [[] for _ in range(n_local)]
        self.copies: list[list[list[tuple[torch.Tensor | None, list[torch.Tensor]]]]] = [[] for _ in range(n_local)]
        for i, r in enumerate(world.local_ranks):
            if cfg.push_by == "sm":
                done = world.scratch("ag_gemm.push_done", self.n_chunks, torch.int32)
                args = push_args(cfg, s.W, src=self.box.base(i), inbox_base=self.box.base(i),
                                 inbox_deltas=self.box.deltas[i], own=self.box.rows(i, r, s.R, s.K),
                                 flag_ptrs=self.flags.ptrs(i), flags_local=self.flags.local(i), done=done[i],
                                 state=st.counters[i], K=s.K, R=s.R,
                                 slot=self.box.slot, half_stride=0, rank=r, n_chunks=self.n_chunks,
                                 chunk_m=self.chunk_m, epoch=1 if self.folded else 2,
                                 wait_all=self.fold_wait, own_rows=self.own_rows,
                                 enter=(en.ptrs[i], en.tensors[i]) if self.folded else None)  # fmt: skip
                self.push_launch[i] = Launch(allgather_push_kernel, cfg.comm_sms, args, slots=("src_ptr",))
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
                    self.releases[i].append(Launch(release_chunk_kernel, 1, release))
        # the inbox as cuBLAS reads it: each rank's rows, and all of them as one [M, K] view when contiguous
        self.rows = [[self.box.rows(i, p, s.R, s.K) for p in range(s.W)] for i in range(n_local)]
        self.every = [self.box.all_rows(i, s.W, s.R, s.K) for i in range(n_local)]
        # waits before cuBLAS reads a peer's chunk (all of them at once in the gathered order): the wait,
        # the chunk's rows in the inbox, and the rows of C they give
        self.waits: list[list[tuple[Launch, Any, int, int]]] = []
        for i, r in enumerate(world.local_ranks):
            mine = []
            if self.gathered_order:
                if not self.fold_wait:
                    mine.append((self._wait(i, r, 0, s.W - 1, 0, self.n_chunks - 1), None, 0, 0))
            else:
                for p in [(r + j) % s.W for j in range(1, s.W)]:
                    for ch, lo in enumerate(range(0, s.R, self.chunk_m)):
                        hi = min(s.R, lo + self.chunk_m)
                        rows = self.rows[i][p] if hi - lo == s.R else self.rows[i][p][lo:hi]
                        mine.append((self._wait(i, r, p, p, ch, ch), rows, p * s.R + lo, p * s.R + hi))
            self.waits.append(mine)

    def _wait(self, i: int, r: int, p_lo: int, p_hi: int, c_lo: int, c_hi: int) -> Launch:
        return Launch(wait_chunks_kernel, 1, dict(flags_ptr=self.flags.local(i), state_ptr=self.state.counters[i],
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
        world, s = self.world, self.s
        if self.folded:  # the hot path at decode sizes: one launch, one GEMM (a rank per process)
            self.push_launch[0](a[0])
            torch.mm(self.every[0], b[0], out=c[0])
            return [torch.cat(self.rows[0])] if self.want_gathered else []
        for phase in self.open_before:
            for launch in phase:
                launch()
        for i in range(len(a)):
            self.open_last[i]()
            with contextlib.nullcontext() if self.gathered_order else world.side_stream(i):
                self._push(i, a[i])
        gathered = []
        for i, r in enumerate(world.local_ranks):
            if self.gathered_order:
                for wait, *_ in self.waits[i]:
                    wait()
                if self.every[i] is not None:  # ranks' rows are contiguous: one GEMM, B read once
                    torch.mm(self.every[i], b[i], out=c[i])
                else:
                    for p in range(s.W):
                        torch.mm(self.rows[i][p], b[i], out=c[i][p * s.R : (p + 1) * s.R])
            else:
                torch.mm(a[i], b[i], out=c[i][r * s.R : (r + 1) * s.R])
                for wait, rows, lo, hi in self.waits[i]:
                    wait()
                    torch.mm(rows, b[i], out=c[i][lo:hi])
                world.wait_side_stream()  # the side stream read A: the caller may overwrite it after us
            if self.want_gathered:
                gathered.append(torch.cat(self.rows[i]))
        return gathered


class MeetPlan:
    """barrier: one launch gathers this rank's rows into every rank's gathered buffer, between two meetings of namesake
    programs (`landing="direct"`), through inbox halves by the device epoch, one meeting and a local copy
    (`landing="inbox"`), or as tagged words into inbox halves that the rank polls, meeting no one (`landing="ll"`),
    then cuBLAS multiplies all M rows."""

    def __init__(self, s: Shape, cfg: AgGemmConfig, want_gathered: bool) -> None:
        world = s.world
        self.want_gathered = want_gathered
        signals = signal_buffer(world, "ag_gemm.meet_signals")
        programs = meet_programs(cfg, s)
        stand_in = torch.empty(1, dtype=s.dtype, device=world.device)
        if cfg.landing == "ll":
            self.gathered = [torch.empty((s.M, s.K), dtype=s.dtype, device=world.device) for _ in world.local_ranks]
            # words of two values and the call's tag (`runtime.ll`), zeroed once: a word never written carries tag
            # 0, which only the epochs k * 2**32 expect (the one case `runtime.ll` can't tell apart)
            slot = slot_elems(cdiv(s.R * s.K, 2), 1)
            words = world.symmetric("ag_gemm.ll_inbox", (2 * s.W * slot,), torch.int64, zero=True)
            half_stride = words.numel // 2 // ALIGN * ALIGN
            state = call_state(world)
            steps = pushed_steps(world)  # the consuming step polls the peers' words into the gathered buffer
            self.phases = [[] for _ in steps]
            for i, r in enumerate(world.local_ranks):
                deltas = word_deltas(world, words, i)
                for n, (push, copy, _meet, epoch) in enumerate(steps):  # tags, not meetings, say when rows landed
                    args = ll_gather_args(
                        s.R, s.K, s.W, a=stand_in, gathered=self.gathered[i], inbox=words.tensors[i],
                        inbox_deltas=deltas, state=state.counters[i], rank=r, slot=slot, half_stride=half_stride,
                        push=push, copy=copy, epoch=epoch,
                    )  # fmt: skip
                    self.phases[n].append(Launch(ag_gemm_ll_gather_kernel, programs, args, slots=("a_ptr",)))
            return
        if cfg.landing == "inbox":
            self.gathered = [torch.empty((s.M, s.K), dtype=s.dtype, device=world.device) for _ in world.local_ranks]
            box = inbox(world, "ag_gemm.meet", s.R, s.K, s.dtype, halves=2)
            state = call_state(world)
            steps = pushed_steps(world)  # the consuming step copies the peers' rows into the gathered buffer
            self.phases: list[list[Launch]] = [[] for _ in steps]
            for i, r in enumerate(world.local_ranks):
                for n, (push, copy, meet, epoch) in enumerate(steps):
                    args = inbox_meet_args(
                        s.R, s.K, s.W, a=stand_in, gathered=self.gathered[i], inbox=box.base(i),
                        inbox_deltas=box.deltas[i], signals=signals.tensors[i],
                        signal_deltas=exact_deltas(world, signals, i), state=state.counters[i], rank=r, slot=box.slot,
                        half_stride=box.half_stride, push=push, copy=copy, meet=meet, epoch=epoch,
                    )  # fmt: skip
                    self.phases[n].append(Launch(ag_gemm_inbox_meet_kernel, programs, args, slots=("a_ptr",)))
            return
        gathered = world.symmetric("ag_gemm.meet_gathered", (slot_elems(s.M, s.K),), s.dtype)
        self.gathered = [gathered.view(i, (s.M, s.K)) for i in range(len(world.local_ranks))]
        self.phases: list[list[Launch]] = [[
            Launch(ag_gemm_meet_kernel, programs,
                   meet_args(s.R, s.K, s.W, a=stand_in, gathered=gathered.tensors[i],
                             deltas=peer_deltas(world, gathered, i), signals=signals.tensors[i],
                             signal_deltas=exact_deltas(world, signals, i), rank=r, meet=world.concurrent),
                   slots=("a_ptr",))
            for i, r in enumerate(world.local_ranks)
        ]]  # fmt: skip

    def __call__(self, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> list[torch.Tensor]:
        for phase in self.phases:  # on a sequential world: every rank's rows before any GEMM
            for launch, ai in zip(phase, a):
                launch(ai)
        for g, bi, ci in zip(self.gathered, b, c):
            torch.mm(g, bi, out=ci)
        # the plan's buffer, which the next call rewrites: the caller gets a copy
        return [g.clone() for g in self.gathered] if self.want_gathered else []


def meet_programs(cfg: AgGemmConfig, s: Shape) -> int:
    """The barrier launch's programs: `barrier_sms`, but none without a block of this rank's rows (every rank
    launches as many: namesakes must exist to meet)."""
    return launch_programs(cfg.barrier_sms, cdiv(s.R * s.K, MEET_BLOCK), "barrier_sms", "mode=barrier")


def inbox_meet_args(R: int, K: int, W: int, *, a: Any, gathered: Any, inbox: Any, inbox_deltas: Any, signals: Any,
                    signal_deltas: Any, state: Any, rank: int, slot: int, half_stride: int, push: bool, copy: bool,
                    meet: bool, epoch: int) -> dict[str, Any]:  # fmt: skip
    """`ag_gemm_inbox_meet_kernel`'s arguments by name (R rows of A a rank, K deep, W ranks), with the launch
    options."""
    return dict(
        a_ptr=a, gat_ptr=gathered, inbox_ptr=inbox, inbox_deltas_ptr=inbox_deltas, sig_ptr=signals,
        sig_deltas_ptr=signal_deltas, state_ptr=state, R=R, K=K, rank=rank, slot=slot, half_stride=half_stride,
        WORLD=W, WORLD_P2=world_p2(W), BLOCK=MEET_BLOCK, PUSH=push, COPY=copy, MEET=meet, EPOCH=epoch,
        num_warps=MEET_WARPS, num_stages=1,
    )  # fmt: skip


def ll_gather_args(R: int, K: int, W: int, *, a: Any, gathered: Any, inbox: Any, inbox_deltas: Any, state: Any,
                   rank: int, slot: int, half_stride: int, push: bool, copy: bool,
                   epoch: int) -> dict[str, Any]:  # fmt: skip
    """`ag_gemm_ll_gather_kernel`'s arguments by name (R rows of A a rank, K deep, W ranks; `slot` in words), with the
    launch options (a meeting launch's shape: its blocks split as the other landings')."""
    return dict(
        a_ptr=a, gat_ptr=gathered, inbox_ptr=inbox, inbox_deltas_ptr=inbox_deltas, state_ptr=state, R=R, K=K, rank=rank,
        slot=slot, half_stride=half_stride, WORLD=W, BLOCK=MEET_BLOCK, PUSH=push, COPY=copy, EPOCH=epoch,
        num_warps=MEET_WARPS, num_stages=1,
    )  # fmt: skip


def meet_args(R: int, K: int, W: int, *, a: Any, gathered: Any, deltas: Any, signals: Any, signal_deltas: Any,
              rank: int, meet: bool) -> dict[str, Any]:  # fmt: skip
    """`ag_gemm_meet_kernel`'s arguments by name (R rows of A a rank, K deep, W ranks), with the launch options."""
    return dict(
        a_ptr=a, gat_ptr=gathered, gat_deltas_ptr=deltas, sig_ptr=signals, sig_deltas_ptr=signal_deltas, R=R, K=K,
        rank=rank, WORLD=W, WORLD_P2=world_p2(W), BLOCK=MEET_BLOCK, MEET=meet,
        num_warps=MEET_WARPS, num_stages=1,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- helpers


def _stand_bc(s: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """B- and C-shaped stand-ins for building launch arguments, with the call's strides (C: row-major)."""
    b = torch.empty_strided((1, 1), s.b_stride, dtype=s.dtype, device=s.world.device)
    c = torch.empty_strided((1, 1), (s.N_r, 1), dtype=s.dtype, device=s.world.device)
    return b, c


def build_plan(s: Shape, cfg: AgGemmConfig, owner: Any, owner_offset: int, want_gathered: bool) -> Any:
    """The plan of `cfg`'s mode for shape `s` (A in the caller's symmetric buffer `owner`, or copied)."""
    if cfg.mode == "baseline":
        return BaselinePlan(s, want_gathered, cfg.collective)
    if cfg.mode == "pull":
        return PullPlan(s, cfg, owner, owner_offset, want_gathered)
    if cfg.mode == "ce":
        return CePlan(s, cfg, owner, owner_offset, want_gathered)
    if cfg.mode == "push":
        return PushPlan(s, cfg, want_gathered)
    if cfg.mode == "barrier":
        return MeetPlan(s, cfg, want_gathered)
    return PushOpenedPlan(s, cfg, want_gathered)
