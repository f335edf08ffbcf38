"""GEMM+RS's launch arguments: the validated config, a call's sizes, and `gemm_rs_kernel`'s arguments by
name, built by one function for a plan's launches and for ahead-of-time compiles (`standin_launches`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton

from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.device import interpreted
from jointtune.kernels.runtime.gemm import KShardShape
from jointtune.kernels.runtime.symm import cdiv

#: rows x columns of one reduce step (a reduce program's unit of work inside a chunk)
RED_M, RED_N = 32, 256
#: the kernel's epilogues
EPI_STORE, EPI_SIGNAL, EPI_ATOMIC = 0, 1, 2


#: what a knob the config's mode doesn't read holds (the knobs are the gemm_rs space's)
_DEFAULTS = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, SPLIT_K=1, num_warps=4, num_stages=3, chunk_m=0,
                 reduce_sms=1, reduce_by="programs", tile_order="peers_first", ce_consumer="cublas",
                 ce_chunks=1, handoff="flag", transport="pull")  # fmt: skip


class GemmRsConfig(LaunchConfig, space="gemm_rs", defaults=_DEFAULTS):
    """A config the gemm_rs space validated, typed; knobs the mode doesn't read keep harmless defaults."""

    def reduces_in_epilogue(self) -> bool:
        """Whether the own rows' tiles, computed last, sum the peers' chunks (`reduce_by=epilogue`)."""
        return self.mode in ("push", "pull") and self.reduce_by == "epilogue"

    def spans_ranks(self) -> bool:
        """Whether tiles run over every rank's rows (`reduce_by=tile`) rather than one rank's rows at a time."""
        return self.mode in ("push", "pull") and self.reduce_by == "tile"

    def ll(self) -> bool:
        """Whether tiles spanning every rank's rows push LL words (flags carried in the data: `runtime.ll`)."""
        return self.spans_ranks() and self.mode == "push" and self.handoff == "ll"

    def tiles(self, M: int, N: int) -> int:
        """Tiles of a launch whose tiles span every rank's M rows."""
        return cdiv(M, self.BLOCK_M) * cdiv(N, self.BLOCK_N)

    def fused_reduce_programs(self) -> int:
        """Reduce programs beside a fused GEMM: none where the GEMM's own tiles sum (`epilogue`, `tile`)."""
        return 0 if self.reduces_in_epilogue() or self.spans_ranks() else self.reduce_sms

    def fused_tiles(self, M: int, R: int, N: int) -> int:
        """Tiles of a fused launch over M rows, R per rank (over every rank's rows with `reduce_by=tile`)."""
        return self.tiles(M, N) if self.spans_ranks() else tile_work(self, M, R, N) // self.SPLIT_K

    def fused_flags(self, M: int, R: int, N: int) -> int:
        """Flags per rank of a fused launch: one per chunk of rows or, with `reduce_by=tile`, per tile, counted up to
        a power of two (the flag buffer of that size serves every shape up to it: tuning many shapes keeps a few flag
        buffers per world, not one per tile count)."""
        return triton.next_power_of_2(self.tiles(M, N)) if self.spans_ranks() else cdiv(R, self.chunk_rows(R))

    def chunk_rows(self, R: int) -> int:
        """Rows per flag in the fused modes: whole tiles (at least BLOCK_M), at most the segment."""
        return min(max(self.chunk_m, self.BLOCK_M), max(R, 1))


@dataclass(frozen=True)
class RsShape(KShardShape):
    """One call's sizes: out [R, N] with R = M / W."""

    @property
    def R(self) -> int:
        return self.M // self.W


def red_block(s: RsShape) -> tuple[int, int]:
    """The reduce step's [rows, columns], no larger than the call needs."""
    return min(RED_M, triton.next_power_of_2(max(s.R, 1))), min(RED_N, triton.next_power_of_2(s.N))


def kernel_args(cfg: GemmRsConfig, s: RsShape, *, a: Any, b: Any, out: Any, dummy: Any, rank: int, rows: int,
                seg_rows: int, epi: int, gemm: bool, reduce: bool, dest: Any = None, dest_deltas: Any = None,
                src: Any = None, src_deltas: Any = None, sources: int = 1, flags_local: Any = None,
                flag_ptrs: Any = None, done: Any = None, state: Any = None, ws: Any = None,
                counts: Any = None, half_stride: int = 0, n_chunks: int = 1, chunk_rows: int = 1, first_seg: int = 0,
                gemm_programs: int = 0, pid_base: int = 0, num_programs: int = 1, stride_dm: int = 0,
                wait_own: bool = True, zero_src: bool = False, epoch: int = 0, ready: bool = False,
                exit_flags: tuple[Any, Any] | None = None, aligned: bool = True, epi_reduce: bool = False,
                own_tiles: int = 0, span: bool = False, num_warps: int | None = None) -> dict[str, Any]:  # fmt: skip
    """`gemm_rs_kernel`'s arguments by name (pointers not used by this launch point at `dummy`); `exit_flags` =
    (every rank's exit flags, this rank's) ends the call with the exit handshake (pull_cublas)."""
    red_m, red_n = red_block(s)
    warps = num_warps or cfg.num_warps  # a reduce-only launch beside cuBLAS has no tiles of its own: 4 warps
    return dict(
        a_ptr=a, b_ptr=b, out_ptr=out, dest_ptr=dummy if dest is None else dest,
        dest_deltas_ptr=dummy if dest_deltas is None else dest_deltas, src_ptr=dummy if src is None else src,
        src_deltas_ptr=dummy if src_deltas is None else src_deltas, flags_ptr=_or(flags_local, dummy),
        flag_ptrs_ptr=_or(flag_ptrs, dummy), done_ptr=_or(done, dummy),
        state_ptr=_or(state, dummy), ws_ptr=_or(ws, dummy), counts_ptr=_or(counts, dummy),
        exit_ptrs_ptr=exit_flags[0] if exit_flags else dummy, exit_ptr=exit_flags[1] if exit_flags else dummy,
        N=s.N, K=s.K_r, R=seg_rows,
        rows=rows, half_stride=half_stride, rank=rank, n_chunks=n_chunks, chunk_rows=chunk_rows, first_seg=first_seg,
        gemm_programs=gemm_programs, pid_base=pid_base, num_programs=num_programs, stride_am=s.K_r,
        stride_bk=s.b_stride[0], stride_bn=s.b_stride[1], stride_dm=stride_dm, stride_om=s.N, WORLD=s.W,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, SPLIT_K=cfg.SPLIT_K,
        EPI=epi, GEMM=gemm, REDUCE=reduce, SOURCES=sources, WAIT_OWN=wait_own, ZERO_SRC=zero_src, READY=ready,
        EXIT=exit_flags is not None, ALIGNED=aligned, RED_M=red_m,
        RED_N=red_n, UPCAST=interpreted(), EPOCH=epoch,
        EPI_REDUCE=epi_reduce, OWN_TILES=own_tiles, SPAN=span, LL=span and cfg.ll(), num_warps=warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def _or(value: Any, dummy: Any) -> Any:
    return dummy if value is None else value


def tile_work(cfg: GemmRsConfig, rows: int, seg_rows: int, N: int) -> int:
    """GEMM work items of a launch over `rows` rows in segments of `seg_rows`: tiles x splits."""
    return cdiv(rows, seg_rows) * cdiv(seg_rows, cfg.BLOCK_M) * cdiv(N, cfg.BLOCK_N) * cfg.SPLIT_K
