"""Flash-Decode's launch plan: built once per (world, shapes, dtype, config), then called.

Every mode runs the same decode units (`flash_decode_kernel`); the modes differ in where a chunk's packed partial
rows go and what the combine waits on:

- baseline: decode into a private buffer, NCCL all-gather, combine (three steps, no flags, no epochs).
- wait: decode into a private buffer (opens the call), the runtime's all-gather push (`allgather_push_kernel`:
  `push_programs` programs, a flag per chunk at every peer), then a combine that waits per chunk.
- fused: one launch; a chunk's last split pushes the rows into every rank's inbox (slot = this rank) and flags
  them; combine units of the same launch start on a chunk when all W flags are in.
- pull: one launch; a chunk's last split stores the rows in this rank's own symmetric buffer and flags every rank;
  combine units read each rank's buffer over NVLink.

The symmetric buffers of wait, fused and pull have two halves, picked by epoch parity on the device: a rank writes
call e + 2's rows into a half only after its call e + 1 waited for every peer's flags of e + 1, which each peer
released after its call e (and its reads of that half) ended. This holds across families, since every call that
advances the epoch waits on every peer. On a world whose ranks launch one after another (simulated ranks), the
fused and pull launch is cut in two: every rank's decode units, then every rank's combine units.
"""

from __future__ import annotations

from typing import Any

import torch

from jointtune.kernels.flash_decode.args import DecodeShape, FlashDecodeConfig, Work, kernel_args
from jointtune.kernels.flash_decode.kernel import flash_decode_kernel
from jointtune.kernels.runtime.launch import Launch
from jointtune.kernels.runtime.push import PushArgs
from jointtune.kernels.runtime.signals import allgather_push_kernel
from jointtune.kernels.runtime.symm import ALIGN, call_state, flags, inbox, offset
from jointtune.kernels.runtime.world import World

_SLOTS = ("q_ptr", "k_ptr", "v_ptr", "lens_ptr", "out_ptr")


class DecodePlan:
    """A call of one mode: its launches per local rank, in the order they are issued."""

    def __init__(self, world: World, s: DecodeShape, cfg: FlashDecodeConfig) -> None:
        self.world, self.s, self.cfg = world, s, cfg
        w = self.work = Work.of(cfg, s)
        n_local = len(world.local_ranks)
        one_launch = cfg.mode in ("fused", "pull") and world.concurrent
        self.parts = world.scratch("flash_decode.parts", s.rows * w.n_splits * s.PW, torch.float32)
        self.counts = world.scratch("flash_decode.counts", w.n_chunks, torch.int32)
        self.ticket = world.scratch("flash_decode.ticket", 1, torch.int32)
        self.state = call_state(world)
        self.dummy = world.int_table((0,))
        #: the lengths of a call that passes none: every rank's whole shard
        self.full_lens = torch.full((s.B,), s.S_r, dtype=torch.int32, device=world.device)
        #: per step of a call, per local rank: the step's launches ((kernel launch), or a collective)
        self.steps: list[list[Launch]] = []
        self.gather: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        if cfg.mode in ("fused", "pull"):
            self._build_fused(n_local, one_launch)
        else:
            getattr(self, f"_build_{cfg.mode}")(n_local)

    # ------------------------------------------------------------------------------------------- modes

    def _common(self, i: int) -> dict[str, Any]:
        stand = torch.empty(1, dtype=self.s.dtype, device=self.world.device)
        return dict(q=stand, k=stand, v=stand, lens=self.full_lens, out=stand, parts=self.parts[i],
                    counts=self.counts[i], dummy=self.dummy, rank=self.world.local_ranks[i],
                    state=self.state.counters[i])  # fmt: skip

    def _decode(self, i: int, **extra: Any) -> Launch:
        args = kernel_args(self.cfg, self.s, self.work, **self._common(i), decode=True, combine=False,
                           num_programs=self.work.n_decode, **extra)  # fmt: skip
        return Launch(flash_decode_kernel, self.work.n_decode, args, slots=_SLOTS)

    def _combine(self, i: int, **extra: Any) -> Launch:
        args = kernel_args(self.cfg, self.s, self.work, **self._common(i), decode=False, combine=True,
                           num_programs=self.work.n_chunks, **extra)  # fmt: skip
        return Launch(flash_decode_kernel, self.work.n_chunks, args, slots=_SLOTS)

    def _build_baseline(self, n_local: int) -> None:
        world, s = self.world, self.s
        mine = world.collective_empty((s.slot,), torch.float32, self.cfg.collective)
        every = world.collective_empty((s.W * s.slot,), torch.float32, self.cfg.collective)
        src_deltas = world.int_table(tuple(p * s.slot for p in range(s.W)))
        self.steps.append([self._decode(i, dest=mine[i], dest_deltas=self.dummy) for i in range(n_local)])
        self.gather = (mine, every)
        self.steps.append([self._combine(i, src=every[i], src_deltas=src_deltas) for i in range(n_local)])

    def _build_wait(self, n_local: int) -> None:
        world, s, cfg, w = self.world, self.s, self.cfg, self.work
        box = inbox(world, "flash_decode", s.rows, s.PW, torch.float32, halves=2)
        fl = flags(world, "flash_decode", w.n_chunks)
        mine = [torch.empty(s.slot, dtype=torch.float32, device=world.device) for _ in range(n_local)]
        done = world.scratch("flash_decode.push_done", w.n_chunks, torch.int32)
        decode, push, combine = [], [], []
        for i, r in enumerate(world.local_ranks):
            decode.append(self._decode(i, dest=mine[i], dest_deltas=self.dummy, epoch=1))
            args = PushArgs.build(
                s.W, cfg.push_programs, cfg.num_warps, src=mine[i], inbox_base=box.base(i),
                inbox_deltas=box.deltas[i], own=self.dummy, flag_ptrs=fl.ptrs(i), flags_local=fl.local(i),
                done=done[i], state=self.state.counters[i], K=s.PW, R=s.rows, slot=box.slot,
                half_stride=box.half_stride, rank=r, n_chunks=w.n_chunks,
                chunk_m=cfg.items_per_flag * cfg.heads_per_program, epoch=2,
            )  # fmt: skip
            push.append(Launch(allgather_push_kernel, cfg.push_programs, args))
            own = offset(mine[i].data_ptr(), box.base(i).data_ptr(), 4)
            src_deltas = world.int_table(tuple(own if p == r else p * box.slot for p in range(s.W)))
            combine.append(self._combine(i, src=box.base(i), src_deltas=src_deltas, flags_local=fl.local(i),
                                         wait=True, wait_own=False, half_own=False, half_stride=box.half_stride,
                                         epoch=2))  # fmt: skip
        self.steps += [decode, push, combine]

    def _build_fused(self, n_local: int, one_launch: bool) -> None:
        world, s, w = self.world, self.s, self.work
        fl = flags(world, "flash_decode", w.n_chunks)
        push = self.cfg.mode == "fused"
        if push:  # slot p of a rank's inbox holds rank p's rows (wait mode's inbox: one buffer for both)
            box = inbox(world, "flash_decode", s.rows, s.PW, torch.float32, halves=2)
            buf, half_stride = box.buffer, box.half_stride
        else:  # every rank's own rows
            buf = world.symmetric("flash_decode.partials2", (2 * s.slot,), torch.float32)
            half_stride = buf.numel // 2 // ALIGN * ALIGN
        steps: list[list[Launch]] = [[] for _ in range(1 if one_launch else 2)]
        for i, r in enumerate(world.local_ranks):
            own = buf.tensors[i].data_ptr()
            to_peer = [offset(buf.peers[i][p].data_ptr(), own, 4) for p in range(s.W)]
            if push:
                dest_deltas = world.int_table(tuple(d + r * box.slot for d in to_peer))
                src_deltas = world.int_table(tuple(p * box.slot for p in range(s.W)))
            else:
                dest_deltas, src_deltas = world.int_table((0,)), world.int_table(tuple(to_peer))
            send = dict(dest=buf.tensors[i], dest_deltas=dest_deltas, send_to=s.W if push else 1, signal=True,
                        flag_ptrs=fl.ptrs(i), flags_local=fl.local(i), half_stride=half_stride)  # fmt: skip
            take = dict(src=buf.tensors[i], src_deltas=src_deltas, wait=True, wait_own=True, half_own=True)
            if one_launch:
                args = kernel_args(self.cfg, s, w, **self._common(i), decode=True, combine=True, **send, **take,
                                   ticket=self.ticket[i], epoch=1, num_programs=w.n_decode + w.n_chunks)  # fmt: skip
                steps[0].append(Launch(flash_decode_kernel, w.n_decode + w.n_chunks, args, slots=_SLOTS))
            else:
                steps[0].append(self._decode(i, **send, epoch=1))
                steps[1].append(self._combine(i, **take, flags_local=fl.local(i), half_stride=half_stride, epoch=2))
        self.steps += steps

    # -------------------------------------------------------------------------------------------- call

    def __call__(self, q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor],
                 lens: list[torch.Tensor | None], out: list[torch.Tensor]) -> None:  # fmt: skip
        full = self.full_lens
        for n, step in enumerate(self.steps):
            if self.gather is not None and n == 1:
                self.world.all_gather(*self.gather, collective=self.cfg.collective)
            for launch, qi, ki, vi, li, oi in zip(step, q, k, v, lens, out):
                if launch.kernel is allgather_push_kernel:
                    launch()
                else:
                    launch(qi, ki, vi, full if li is None else li, oi)
