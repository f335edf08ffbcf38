"""Symmetric-memory pieces every fused family builds its plans from: the call state, flags and inboxes.

- `CallState`: per rank, the device counter that epochs come from ([epoch, arrivals], private int64)
  and the entry flags (`entered[p]`, symmetric int64: the last call rank p opened). One per world,
  shared by every family, so epochs only grow whatever mix of ops and graphs runs.
- `Flags`: one symmetric buffer per (family, chunk count) of `world_size * n_chunks` int64 flags; flag
  (p, c) is written only by rank p, at its call's epoch.
- `Inbox`: slots of rows every rank pushes into (slot p holds rank p's rows). With two halves the
  kernels pick a half by epoch parity: a rank writes call e + 2's rows into a half only after it waited
  for every peer's flags of call e + 1, which each peer released after finishing its reads of call e.
  With one half (for transfers at fixed addresses: the copy engine, or a library GEMM reading the inbox)
  a call opens with the entry handshake instead (`open_call_kernel`).

All of them are built once per world and key and never regrown under a plan: a larger call gets a new
buffer, and plans built on the old one keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from jointtune.errors import ShapeError

if TYPE_CHECKING:
    from jointtune.kernels.runtime.world import SymmetricBuffer, World

#: elements every slot and buffer offset is a multiple of (16-byte vector loads for 1-byte dtypes too)
ALIGN = 16


def cdiv(x: int, y: int) -> int:
    return -(-x // y)


def slot_elems(rows: int, cols: int) -> int:
    """Elements of one rank's rows in a shared buffer, rounded so every rank's slot stays aligned."""
    return cdiv(rows * cols, ALIGN) * ALIGN


def offset(ptr: int, base: int, elem: int) -> int:
    """Element offset of address `ptr` from `base`; both must be 16-element aligned to each other."""
    diff = ptr - base
    if diff % (elem * ALIGN):
        raise ShapeError(f"alignment: buffers must be {elem * ALIGN}-byte aligned relative to each other")
    return diff // elem


def peer_deltas(world: World, buf: SymmetricBuffer, i: int, extra: int = 0) -> torch.Tensor:
    """Element offsets from local rank index i's buffer to every rank's, plus `extra`, as a device table: how a kernel
    reaches every peer's copy of `buf` from its own pointer."""
    own, elem = buf.tensors[i].data_ptr(), buf.tensors[i].element_size()
    return world.int_table(
        tuple(offset(buf.peers[i][p].data_ptr(), own, elem) + extra for p in range(world.world_size))
    )


@dataclass(frozen=True)
class CallState:
    counters: list[torch.Tensor]  # per local rank: int64 [epoch, arrivals]
    entered: SymmetricBuffer  # int64 [world_size]: entered[p] = last call rank p opened (`.ptrs`: every rank's)

    def epoch(self, i: int = 0) -> int:
        """The last epoch local rank index `i` opened (host read: for tests and diagnostics only)."""
        return int(self.counters[i][0].item())


def call_state(world: World) -> CallState:
    def build() -> CallState:
        counters = [torch.zeros(2, dtype=torch.int64, device=world.device) for _ in world.local_ranks]
        entered = world.symmetric("jointtune.entered", (world.world_size,), torch.int64, zero=True)
        return CallState(counters, entered)

    return world.plan(("call_state",), build)


@dataclass(frozen=True)
class Flags:
    buffer: SymmetricBuffer
    n_chunks: int

    def local(self, i: int) -> torch.Tensor:
        return self.buffer.tensors[i]

    def ptrs(self, i: int) -> torch.Tensor:
        return self.buffer.ptrs[i]


def flags(world: World, family: str, n_chunks: int) -> Flags:
    """The flags of `family` for calls cut into `n_chunks` chunks per rank (zeroed once)."""
    buf = world.symmetric(f"{family}.flags.{n_chunks}", (world.world_size * n_chunks,), torch.int64, zero=True)
    return Flags(buf, n_chunks)


@dataclass(frozen=True)
class Inbox:
    buffer: SymmetricBuffer
    slot: int  # elements per rank's slot
    halves: int
    deltas: list[torch.Tensor]  # per local rank: element offsets of every rank's inbox from its own

    @property
    def half_stride(self) -> int:
        """Elements from one half to the next (0 with one half): kernels add `(epoch % 2) * half_stride`."""
        return 0 if self.halves == 1 else self.buffer.numel // 2 // ALIGN * ALIGN

    def base(self, i: int) -> torch.Tensor:
        return self.buffer.tensors[i]

    def rows(self, i: int, p: int, rows: int, cols: int) -> torch.Tensor:
        """Rank p's rows in local rank index i's inbox (first half)."""
        return self.buffer.tensors[i][p * self.slot : p * self.slot + rows * cols].view(rows, cols)

    def all_rows(self, i: int, world_size: int, rows: int, cols: int) -> torch.Tensor | None:
        """Every rank's rows as one [world_size * rows, cols] view, when the slots are contiguous."""
        if self.slot != rows * cols:
            return None
        return self.buffer.tensors[i][: world_size * rows * cols].view(world_size * rows, cols)

    def dest(self, i: int, p: int, rank: int, rows: int, cols: int) -> torch.Tensor:
        """Where local rank index i's rows go in rank p's inbox (first half), as i maps p's memory."""
        return self.buffer.peers[i][p][rank * self.slot : rank * self.slot + rows * cols].view(rows, cols)


def inbox(world: World, family: str, rows: int, cols: int, dtype: torch.dtype, *, halves: int) -> Inbox:
    """The inbox of `family` for [rows, cols] per rank, `halves` of them (1 or 2)."""
    W = world.world_size
    slot = slot_elems(rows, cols)
    half = W * slot
    buf = world.symmetric(f"{family}.inbox{halves}", (halves * half,), dtype)
    elem = buf.tensors[0].element_size()
    deltas = []
    for i in range(len(world.local_ranks)):
        own = buf.tensors[i].data_ptr()
        deltas.append(world.int_table(tuple(offset(buf.peers[i][p].data_ptr(), own, elem) for p in range(W))))
    # a larger buffer than asked (grown by an earlier, larger call) keeps its halves at the middle
    return Inbox(buf, slot, halves, deltas)
