"""`allgather_push_kernel`'s arguments as a typed value, for every family that gathers rows by pushing them
(AG+GEMM's A, Flash-Decode's packed partials)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: rows x columns of one copy piece of the push (one program's unit of work)
CP_M, CP_K = 32, 256


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
    state_ptr: Any
    entered_ptrs_ptr: Any
    entered_ptr: Any
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
    EPOCH: int
    WAIT_ALL: bool
    ENTER: bool
    num_warps: int

    @classmethod
    def build(cls, W: int, programs: int, num_warps: int, *, src: Any, inbox_base: Any, inbox_deltas: Any, own: Any,
              flag_ptrs: Any, flags_local: Any, done: Any, state: Any, K: int, R: int, slot: int,
              half_stride: int, rank: int, n_chunks: int, chunk_m: int, epoch: int, wait_all: bool = False,
              own_rows: bool = False, enter: tuple[Any, Any] | None = None) -> PushArgs:  # fmt: skip
        """`programs` programs push rows [R, K] of `src` into slot `rank` of every peer's inbox (`own_rows`: and to
        `own`), a flag per `chunk_m` rows; `enter` = (every rank's entry flags, this rank's) to open the call."""
        entered_ptrs, entered = enter if enter is not None else (state, state)
        return cls(
            src_ptr=src, inbox_ptr=inbox_base, inbox_deltas_ptr=inbox_deltas, own_ptr=own, flag_ptrs_ptr=flag_ptrs,
            flags_ptr=flags_local, done_ptr=done, state_ptr=state,
            entered_ptrs_ptr=entered_ptrs, entered_ptr=entered, K=K, R=R, slot=slot, half_stride=half_stride,
            rank=rank, n_chunks=n_chunks, num_programs=programs, WORLD=W, PROGRAMS=programs, CHUNK_M=chunk_m,
            OWN=own_rows, CP_M=CP_M, CP_K=CP_K, EPOCH=epoch,
            WAIT_ALL=wait_all, ENTER=enter is not None, num_warps=num_warps,
        )  # fmt: skip
