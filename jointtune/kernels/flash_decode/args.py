"""Flash-Decode's launch arguments as typed values: the validated config, a call's sizes, and
`flash_decode_kernel`'s arguments by name, built by one function for a plan's launches and for ahead-of-time
compiles (`standin_launches`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton

from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.device import interpreted
from jointtune.kernels.runtime.symm import cdiv, slot_elems

LOG2E = 1.4426950408889634
#: floats of one step of a chunk's merge ([heads, splits, D], see `_send_chunk`) at 4 warps (fewer warps take a
#: proportional share, so a thread holds the same): 16384 read 16 splits of 8 heads at once and took 9.0 / 23.3 us at
#: batch 1, 4K / 16K keys, against 10.4 / 24.8 us at 8192 and 11.6 / 26.2 at 4096
#: (bench/results/flash_decode_kernel_merge*_1xH200_2026-11-24.json)
MERGE_ELEMENTS = 16384


#: what a knob the config's mode doesn't read holds (the knobs are the flash_decode space's)
_DEFAULTS = dict(kv_split=256, BLOCK_N=64, heads_per_program=1, num_warps=4, num_stages=2, items_per_flag=1,
                 push_programs=4)  # fmt: skip


class FlashDecodeConfig(LaunchConfig, space="flash_decode", defaults=_DEFAULTS):
    """A config the flash_decode space validated, typed; knobs the mode doesn't read keep harmless defaults."""


@dataclass(frozen=True)
class DecodeShape:
    """One call's sizes: q [B, H, D], k and v [B, H_KV, S_r, D] per rank, over W ranks, and the strides a plan
    bakes in (q, k, v; out is row-major)."""

    W: int
    B: int
    H: int
    H_KV: int
    S_r: int
    D: int
    dtype: torch.dtype
    q_stride: tuple[int, int, int]
    k_stride: tuple[int, int, int, int]
    v_stride: tuple[int, int, int, int]
    scale: float

    @property
    def G(self) -> int:
        return self.H // self.H_KV

    @property
    def rows(self) -> int:
        """Partial rows per rank: one per (sequence, query head)."""
        return self.B * self.H

    @property
    def PW(self) -> int:
        """Floats per packed partial row: O (D), LSE, padding to 16 bytes."""
        return self.D + 4

    @property
    def slot(self) -> int:
        """Elements of one rank's packed partial rows in a buffer, 16-element aligned."""
        return slot_elems(self.rows, self.PW)


@dataclass(frozen=True)
class Work:
    """How one call's work is cut: items (HPP heads of one sequence), splits per item, chunks (IPF items)."""

    n_items: int
    n_splits: int
    n_chunks: int

    @classmethod
    def of(cls, cfg: FlashDecodeConfig, s: DecodeShape) -> Work:
        n_items = s.rows // cfg.heads_per_program
        ipf = cfg.items_per_flag if cfg.mode != "baseline" else 1
        return cls(n_items, cdiv(max(s.S_r, 1), cfg.kv_split), cdiv(n_items, ipf))

    @property
    def n_decode(self) -> int:
        return self.n_items * self.n_splits


def kernel_args(cfg: FlashDecodeConfig, s: DecodeShape, w: Work, *, q: Any, k: Any, v: Any, lens: Any, out: Any,
                parts: Any, counts: Any, dummy: Any, rank: int, decode: bool, combine: bool, dest: Any = None,
                dest_deltas: Any = None, send_to: int = 1, src: Any = None, src_deltas: Any = None,
                flags_local: Any = None, flag_ptrs: Any = None, state: Any = None,
                ticket: Any = None, signal: bool = False, wait: bool = False, wait_own: bool = True,
                half_own: bool = True, half_stride: int = 0, epoch: int = 0,
                num_programs: int = 1) -> dict[str, Any]:  # fmt: skip
    """`flash_decode_kernel`'s arguments by name (pointers a launch doesn't use point at `dummy`)."""
    hpp = cfg.heads_per_program
    return dict(
        q_ptr=q, k_ptr=k, v_ptr=v, lens_ptr=lens, out_ptr=out, parts_ptr=parts, counts_ptr=counts,
        dest_ptr=_or(dest, dummy), dest_deltas_ptr=_or(dest_deltas, dummy), src_ptr=_or(src, dummy),
        src_deltas_ptr=_or(src_deltas, dummy), flags_ptr=_or(flags_local, dummy), flag_ptrs_ptr=_or(flag_ptrs, dummy),
        state_ptr=_or(state, dummy), ticket_ptr=_or(ticket, dummy),
        sm_scale=s.scale * LOG2E, S_r=s.S_r, n_splits=w.n_splits, n_items=w.n_items, n_chunks=w.n_chunks, rank=rank,
        half_stride=half_stride, num_programs=num_programs, H=s.H, G=s.G,
        stride_qb=s.q_stride[0], stride_qh=s.q_stride[1], stride_kb=s.k_stride[0], stride_kh=s.k_stride[1],
        stride_kn=s.k_stride[2], stride_vb=s.v_stride[0], stride_vh=s.v_stride[1], stride_vn=s.v_stride[2],
        stride_ob=s.H * s.D, stride_oh=s.D, D=s.D, PW=s.PW, HPP=hpp, BLOCK_H=max(16, hpp), BLOCK_N=cfg.BLOCK_N,
        KV_SPLIT=cfg.kv_split, HB=triton.next_power_of_2(hpp), SPLITS=merge_splits(w.n_splits, hpp, s.D, cfg.num_warps),
        IPF=cfg.items_per_flag if cfg.mode != "baseline" else 1, WORLD=s.W, DECODE=decode,
        COMBINE=combine, SEND_TO=send_to, SIGNAL=signal, WAIT=wait, WAIT_OWN=wait_own, HALF_OWN=half_own,
        TICKET=ticket is not None, EPOCH=epoch, UPCAST=interpreted(), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def merge_splits(n_splits: int, hpp: int, D: int, num_warps: int = 4) -> int:
    """Splits per step of a chunk's merge: as many as fit the warps' share of MERGE_ELEMENTS beside the item's heads
    (a power of two; at 1 warp, 16384 floats would be 512 registers a thread, spilled)."""
    budget = MERGE_ELEMENTS * min(num_warps, 4) // 4
    fit = max(1, budget // (triton.next_power_of_2(hpp) * D))
    return min(triton.next_power_of_2(n_splits), 1 << (fit.bit_length() - 1))


def _or(value: Any, dummy: Any) -> Any:
    return dummy if value is None else value


def default_scale(D: int) -> float:
    """Softmax scale of scaled_dot_product_attention: 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(D)
