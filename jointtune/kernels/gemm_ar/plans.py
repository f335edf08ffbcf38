"""GEMM+AR's launch plans, built once per (world, shapes, dtype, epilogue, config), then called with the call's tensors
`(a, b, out, residual, weight, h_out)` per local rank (residual, weight and h_out None where the call has none).

- baseline (`BaselinePlan`): cuBLAS into a plan-owned partial (in the memory the config's all-reduce variant reads
  without a copy), the all-reduce in place, then the epilogue in torch: the residual add, and RMSNorm in float32. No
  cross-call state.
- one_shot, two_shot (`FusedPlan`): one `gemm_ar_kernel` launch per call on a world whose ranks run at once (the tile
  GEMM, the exchange and the epilogue), or cuBLAS into a private partial and one launch that copies its tiles out and
  does the rest (`gemm=cublas`). Its buffers alternate halves by the device epoch, so nothing is handed back between
  calls and a captured call replays correctly. On a world whose ranks launch one after another, every rank's produce
  launch comes before any rank's reduce launch, and every reduce before any gather (two-shot).
- `transport="barrier"` (`MeetPlan`): cuBLAS straight into a symmetric partial, then one `gemm_ar_meet_kernel` launch
  that meets the peers, sums (and hands out, two-shot) and meets them again (`meet`): no halves, no epochs; on a world
  whose ranks launch one after another, every rank's reduce launch before any rank's gather launch.
  `transport="barrier_push"` (one-shot): cuBLAS into a local partial; the launch pushes it into every rank's inbox half
  (by the device epoch), meets once and sums its own inbox; on a sequential world every rank's push launch first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton

from jointtune.errors import SpaceError
from jointtune.kernels.gemm_ar.args import NORM_PER_THREAD, ArShape, GemmArConfig, Work, kernel_args
from jointtune.kernels.gemm_ar.kernel import gemm_ar_kernel
from jointtune.kernels.gemm_ar.meet import gemm_ar_meet_kernel
from jointtune.kernels.runtime.device import num_sms
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
from jointtune.kernels.runtime.symm import ALIGN, call_state, cdiv, flags, inbox, peer_deltas, slot_elems
from jointtune.kernels.runtime.world import SymmetricBuffer, World

Tensors = list[torch.Tensor]
# the barrier exchange runs `runtime.meet`'s launch shape (MEET_WARPS, MEET_BLOCK); with the norm a row step is
# NORM_PER_THREAD values a thread, so 8 warps take a row of 8192 in one step (two owners' rows a program is all
# two-shot has at W=4 and 32-64 rows: each step is a dependent round trip)


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of every row of `h` in float32, rounded once to h's dtype, as the fused epilogue computes it: torch's
    own `F.rms_norm`, the strongest unfused norm a user has (one fused kernel on CUDA in the torch 2.11 we run). A
    float32 weight with bf16 rows (the op allows it) is applied unrounded, as the epilogue does."""
    if weight.dtype == h.dtype:
        return F.rms_norm(h, (h.shape[-1],), weight, eps)
    return F.rms_norm(h.float(), (h.shape[-1],), weight.float(), eps).to(h.dtype)


class BaselinePlan:
    """cuBLAS computes the whole partial, an all-reduce (NCCL's default kernels or another variant) sums it in place,
    torch adds the residual and normalises."""

    def __init__(self, world: World, s: ArShape, collective: str, eps: float) -> None:
        self.world, self.collective, self.s, self.eps = world, collective, s, eps
        #: where the sum is formed when it can't be formed in the caller's output (an epilogue follows, or the variant
        #: reads its operand from special memory the output is not in)
        self.sums = world.collective_empty((s.M, s.N), s.dtype, collective)

    def __call__(self, a: Tensors, b: Tensors, out: Tensors, res: Tensors | None, weight: Tensors | None,
                 h_out: Tensors | None) -> None:  # fmt: skip
        home = self.collective == "nccl" or all(self.world.collective_home(o) == self.collective for o in out)
        sums = out if home and res is None and weight is None else self.sums
        for ai, bi, si in zip(a, b, sums):
            torch.mm(ai, bi, out=si)
        self.world.all_reduce(sums, collective=self.collective)
        for i, (si, oi) in enumerate(zip(sums, out)):
            if weight is None:
                if res is not None:
                    torch.add(si, res[i], out=oi)
                elif si is not oi:
                    oi.copy_(si)
                continue
            assert h_out is not None
            if res is None:
                h_out[i].copy_(si)
            else:
                torch.add(si, res[i], out=h_out[i])  # elementwise: h_out may be the residual itself
            oi.copy_(rms_norm(h_out[i], weight[i], self.eps))


def _halved(world: World, name: str, slot: int, dtype: torch.dtype, *,
            zero: bool = False) -> tuple[SymmetricBuffer, int]:  # fmt: skip
    """A two-half symmetric buffer of `slot` elements per half, and its half stride (a larger buffer grown by an
    earlier call keeps its halves at the middle)."""
    buf = world.symmetric(name, (2 * slot,), dtype, zero=zero)
    return buf, buf.numel // 2 // ALIGN * ALIGN


class FusedPlan:
    """one_shot or two_shot: the partial's tiles exchanged as they are produced, summed in rank order on every rank
    (one_shot) or by their owner and handed out (two_shot), in one launch per call (plus cuBLAS with gemm=cublas)."""

    def __init__(self, world: World, s: ArShape, cfg: GemmArConfig, eps: float) -> None:
        W, M, N = s.W, s.M, s.N
        self.world = world
        w = Work.of(cfg, s, num_sms(world.device))
        two_shot, push = cfg.mode == "two_shot", cfg.transport in ("push", "ll")
        dev = world.device
        ll = cfg.transport == "ll"
        if ll:  # an inbox of words that carry their flag (`runtime.ll`): two values a word, zeroed once (no word
            # carries a call's tag before that call writes it); slot p holds rank p's partial (two-shot: of the
            # owner's rows only)
            slot = slot_elems(s.rows_per_owner if two_shot else M, cdiv(N, 2))
            buf, half_stride = _halved(world, "gemm_ar.ll_inbox", W * slot, torch.int64, zero=True)
        elif push:  # inbox: slot p holds rank p's partial (two-shot: of the owner's rows only)
            slot = slot_elems(s.rows_per_owner if two_shot else M, N)
            buf, half_stride = _halved(world, "gemm_ar.inbox", W * slot, s.dtype)
        else:  # this rank's own partial, read by the others
            slot = slot_elems(M, N)
            buf, half_stride = _halved(world, "gemm_ar.partial", slot, s.dtype)
        gather = rms = None
        ghalf = rhalf = 0
        if two_shot and ll:  # the owners' rows as words (and each row's 1/rms as one word: its float32 bits)
            gather, ghalf = _halved(world, "gemm_ar.ll_gather", slot_elems(M, cdiv(N, 2)), torch.int64, zero=True)
            if s.norm:
                rms, rhalf = _halved(world, "gemm_ar.ll_rms", slot_elems(M, 1), torch.int64, zero=True)
        elif two_shot:
            gather, ghalf = _halved(world, "gemm_ar.gather", slot_elems(M, N), s.dtype)
            if s.norm:
                rms, rhalf = _halved(world, "gemm_ar.rms", slot_elems(M, 1), torch.float32)
        fl = flags(world, "gemm_ar", w.flag_stride)
        state = call_state(world)
        self.cublas = cfg.gemm == "cublas"
        self.partials = [torch.empty((M, N), dtype=s.dtype, device=dev) for _ in world.local_ranks] if self.cublas \
            else None  # fmt: skip
        dummy = world.int_table((0,))
        # (PRODUCE, REDUCE, GATHER, EPOCH, grid, first comm program, comm programs) of each launch per rank
        steps = [(True, True, two_shot, 1, w.grid, w.comm_lo, w.comm)]
        if not world.concurrent:
            steps = [(True, False, False, 1, w.produce, 0, w.comm), (False, True, False, 2, w.comm, 0, w.comm)]
            if two_shot:
                steps.append((False, False, True, 2, w.comm, 0, w.comm))
        self.slots = ("a_ptr", "b_ptr", "out_ptr", *(("res_ptr",) if s.residual else ()),
                      *(("w_ptr", "hout_ptr") if s.norm else ()))  # fmt: skip
        self.phases: list[list[Launch]] = [[] for _ in steps]
        for i, r in enumerate(world.local_ranks):
            stand_in = torch.empty(1, dtype=s.dtype, device=dev)
            a = torch.empty((1, 1), dtype=s.dtype, device=dev)
            b = torch.empty_strided((1, 1), s.b_stride, dtype=s.dtype, device=dev)
            if ll:  # words, read at exact offsets
                send_deltas = word_deltas(world, buf, i, r * slot)
                recv_deltas = world.int_table(tuple(p * slot for p in range(W)))
            elif push:
                send_deltas = peer_deltas(world, buf, i, r * slot)
                recv_deltas = world.int_table(tuple(p * slot for p in range(W)))
            else:
                send_deltas, recv_deltas = dummy, peer_deltas(world, buf, i)
            ws, counts = self._split_k(world, w, i)
            deltas = word_deltas if ll else peer_deltas  # the owners' words are written at exact offsets
            gat_deltas = deltas(world, gather, i) if gather else dummy
            rms_deltas = deltas(world, rms, i) if rms else dummy
            done = world.scratch("gemm_ar.done", w.n_chunks, torch.int32)[i]
            for n, (produce, reduce, gathers, epoch, grid, comm_lo, comm) in enumerate(steps):
                args = kernel_args(
                    cfg, s, w, a=a, b=b, part=self.partials[i] if self.cublas else stand_in, res=stand_in,
                    weight=stand_in, out=stand_in, hout=stand_in, send=buf.tensors[i], send_deltas=send_deltas,
                    recv=buf.tensors[i], recv_deltas=recv_deltas, gat=gather.tensors[i] if gather else stand_in,
                    gat_deltas=gat_deltas, rms=rms.tensors[i] if rms else stand_in.float(), rms_deltas=rms_deltas,
                    flags_local=fl.local(i), flag_ptrs=fl.ptrs(i), done=done, state=state.counters[i], ws=ws,
                    counts=counts, half_stride=half_stride, ghalf_stride=ghalf, rhalf_stride=rhalf, rank=r,
                    produce=produce, reduce=reduce, gather=gathers, epoch=epoch, grid=grid, comm_lo=comm_lo,
                    comm=comm, eps=eps,
                )  # fmt: skip
                self.phases[n].append(Launch(gemm_ar_kernel, grid, args, slots=self.slots))

    @staticmethod
    def _split_k(world: World, w: Work, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The split-K workspace and arrival counters (zero at rest: the last split hands them back so)."""
        if w.split_k == 1:
            dummy = world.scratch("gemm_ar.no_split", 1, torch.float32)[i]
            return dummy, world.scratch("gemm_ar.no_split_counts", 1, torch.int32)[i]
        ws = world.scratch("gemm_ar.splitk", w.n_tiles * w.block_m * w.block_n, torch.float32)[i]
        return ws, world.scratch("gemm_ar.splitk_counts", w.n_tiles, torch.int32)[i]

    def __call__(self, a: Tensors, b: Tensors, out: Tensors, res: Tensors | None, weight: Tensors | None,
                 h_out: Tensors | None) -> None:  # fmt: skip
        if self.partials is not None:
            for ai, bi, pi in zip(a, b, self.partials):
                torch.mm(ai, bi, out=pi)
        for phase in self.phases:
            for i, launch in enumerate(phase):
                values: list[Any] = [a[i], b[i], out[i]]
                if res is not None:
                    values.append(res[i])
                if weight is not None and h_out is not None:
                    values += [weight[i], h_out[i]]
                launch(*values)


class MeetPlan:
    """transport="barrier": cuBLAS writes this rank's partial into its symmetric buffer; one launch meets the peers,
    sums every rank's partial of this rank's rows (two-shot) or of every row (one-shot), and meets them again.
    transport="barrier_push" (one-shot): cuBLAS writes a local partial; one launch pushes it into slot `rank` of every
    rank's inbox half (by the device epoch), meets once, and sums its own inbox."""

    def __init__(self, world: World, s: ArShape, cfg: GemmArConfig, eps: float) -> None:
        M, N = s.M, s.N
        two_shot, pushed = cfg.mode == "two_shot", cfg.transport == "barrier_push"
        if two_shot and pushed:  # the space refuses it too (barrier_push_one_shot): this plan has no pushed two-shot
            raise SpaceError('transport: "barrier_push" is not allowed with mode="two_shot"; allowed: mode="one_shot"')
        stand_in = torch.empty(1, dtype=s.dtype, device=world.device)
        dummy = world.int_table((0,))
        if pushed:
            self.partials = [torch.empty((M, N), dtype=s.dtype, device=world.device) for _ in world.local_ranks]
            box = inbox(world, "gemm_ar.meet", M, N, s.dtype, halves=2)
            state = call_state(world)
            data = None
        else:
            data = world.symmetric("gemm_ar.meet_partial", (slot_elems(M, N),), s.dtype)
            self.partials = [data.view(i, (M, N)) for i in range(len(world.local_ranks))]
        rms = world.symmetric("gemm_ar.meet_rms", (slot_elems(M, 1),), torch.float32) if two_shot and s.norm \
            else None  # fmt: skip
        signals = signal_buffer(world, "gemm_ar.meet_signals")
        programs = meet_programs(cfg, s)
        # (PUSH, REDUCE, GATHER, MEET, EPOCH) of each launch per rank; a sequential world runs every rank's push (or
        # reduce) launch before any rank's reduce (or gather) launch, and meets no one
        if pushed:  # the consuming step reduces the own inbox
            steps = [(push, reduce, False, meet, epoch) for push, reduce, meet, epoch in pushed_steps(world)]
        else:
            steps = [(False, True, two_shot, True, 0)]
            if not world.concurrent:
                steps = [(False, True, False, False, 0)] + ([(False, False, True, False, 0)] if two_shot else [])
        self.slots = ("out_ptr", *(("res_ptr",) if s.residual else ()), *(("w_ptr", "hout_ptr") if s.norm else ()))
        self.phases: list[list[Launch]] = [[] for _ in steps]
        for i, r in enumerate(world.local_ranks):
            for n, (push, reduce, gathers, meet, epoch) in enumerate(steps):
                args = meet_args(
                    cfg, s, buf=self.partials[i] if pushed else data.tensors[i],
                    deltas=dummy if pushed else peer_deltas(world, data, i),
                    rms=rms.tensors[i] if rms else stand_in.float(),
                    rms_deltas=peer_deltas(world, rms, i) if rms else dummy, signals=signals.tensors[i],
                    signal_deltas=exact_deltas(world, signals, i), stand_in=stand_in, rank=r, reduce=reduce,
                    gather=gathers, meet=meet, eps=eps, inbox=box.base(i) if pushed else stand_in,
                    inbox_deltas=box.deltas[i] if pushed else dummy,
                    state=state.counters[i] if pushed else dummy, slot=box.slot if pushed else 0,
                    half_stride=box.half_stride if pushed else 0, push=push, epoch=epoch,
                )  # fmt: skip
                self.phases[n].append(Launch(gemm_ar_meet_kernel, programs, args, slots=self.slots))

    def __call__(self, a: Tensors, b: Tensors, out: Tensors, res: Tensors | None, weight: Tensors | None,
                 h_out: Tensors | None) -> None:  # fmt: skip
        for ai, bi, pi in zip(a, b, self.partials):
            torch.mm(ai, bi, out=pi)
        for phase in self.phases:
            for i, launch in enumerate(phase):
                values: list[Any] = [out[i]]
                if res is not None:
                    values.append(res[i])
                if weight is not None and h_out is not None:
                    values += [weight[i], h_out[i]]
                launch(*values)


def meet_programs(cfg: GemmArConfig, s: ArShape) -> int:
    """The exchange launch's programs: `comm_sms`, but none without an item of its own (one that would only meet).

    An item is a row with the norm, else a BLOCK-element block of the rows one rank sums (two-shot: the most any rank
    owns, `rows_per_owner`, so every rank launches as many: namesakes must exist to meet)."""
    rows = s.rows_per_owner if cfg.mode == "two_shot" else s.M
    items = rows if s.norm else cdiv(rows * s.N, MEET_BLOCK)
    return launch_programs(cfg.comm_sms, items, "comm_sms", f'transport="{cfg.transport}"')


def meet_args(cfg: GemmArConfig, s: ArShape, *, buf: Any, deltas: Any, rms: Any, rms_deltas: Any, signals: Any,
              signal_deltas: Any, stand_in: Any, rank: int, reduce: bool, gather: bool, meet: bool, eps: float,
              inbox: Any, inbox_deltas: Any, state: Any, slot: int, half_stride: int, push: bool,
              epoch: int) -> dict[str, Any]:  # fmt: skip
    """`gemm_ar_meet_kernel`'s arguments by name, with the launch options (the call's tensors as `stand_in`); the
    inbox, its deltas, the call state, slot and half stride are barrier_push's (stand-ins and zeros otherwise)."""
    return dict(
        buf_ptr=buf, deltas_ptr=deltas, rms_ptr=rms, rms_deltas_ptr=rms_deltas, sig_ptr=signals,
        sig_deltas_ptr=signal_deltas, res_ptr=stand_in, w_ptr=stand_in, out_ptr=stand_in, hout_ptr=stand_in, M=s.M,
        N=s.N, eps=float(eps), rank=rank, rows_per_owner=s.rows_per_owner, WORLD=s.W,
        WORLD_P2=world_p2(s.W), TWO_SHOT=cfg.mode == "two_shot", RESIDUAL=s.residual,
        NORM=s.norm, BLOCK=MEET_BLOCK,
        RED_N=min(NORM_PER_THREAD * 32 * MEET_WARPS, max(16, triton.next_power_of_2(s.N))), REDUCE=reduce,
        GATHER=gather, MEET=meet, inbox_ptr=inbox, inbox_deltas_ptr=inbox_deltas, state_ptr=state, slot=slot,
        half_stride=half_stride, PUSHED=cfg.transport == "barrier_push", PUSH=push, EPOCH=epoch, num_warps=MEET_WARPS,
        num_stages=1,
    )  # fmt: skip


def build_plan(world: World, s: ArShape, cfg: GemmArConfig, eps: float) -> BaselinePlan | FusedPlan | MeetPlan:
    """The plan of `cfg`'s mode for shape `s` (and its epilogue) on `world`."""
    if cfg.mode == "baseline":
        return BaselinePlan(world, s, cfg.collective, eps)
    if cfg.transport in ("barrier", "barrier_push"):
        return MeetPlan(world, s, cfg, eps)
    return FusedPlan(world, s, cfg, eps)
