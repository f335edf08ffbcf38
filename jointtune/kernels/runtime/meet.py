"""Meeting namesake programs on every rank: the barrier of the `barrier` exchanges (GEMM + all-reduce's
`transport="barrier"`, GEMM + reduce-scatter's and AG + GEMM's `mode="barrier"`).

Program p of a launch meets program p of the same launch on every other rank: it sets its signal at each rank (0 -> 1
at system scope, with release, waiting while the previous one is still unread) and takes each rank's signal to it
(1 -> 0, with acquire, once it is in). A meeting orders every thread's stores before it (on any rank) before every
thread's loads after it (on any rank) for the programs that met, and leaves every signal at 0: a meeting keeps nothing
across calls, so a captured call replays correctly. An exchange that meets before and after it needs no epoch or
buffer half either; one that meets once (the pushed forms) writes into buffer halves by the device epoch. A launch
meets twice at most, at slots `pid` and `SLOTS + pid`: a signal buffer holds `2 * SLOTS * world_size` int32s
(`signal_buffer`). A signal left at 1 by a launch killed mid-meeting would let a later meeting pass alone: a world
whose launch was killed is not reused (as after any collective that did not finish).

Meeting only namesakes, not the whole grid, is enough when every program's work is the same function of its id on
every rank (item i goes to program i % programs), so every exchange that uses it launches the same grid on every rank.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jointtune.errors import SpaceError
from jointtune.kernels.runtime.world import SymmetricBuffer, World

#: programs one launch may have: each owns two signal slots (two meetings) per source rank
SLOTS = 256
MEET_SLOTS = tl.constexpr(SLOTS)
#: a meeting launch's program: warps, and values a thread per block (one 16-byte vector of 16-bit values from each
#: source: bench/ops/two_shot_probe.py's best block at 64 and 128 rows of 8192 was 2048 or 4096 values)
MEET_WARPS, MEET_VALUES = 8, 8
MEET_BLOCK = 32 * MEET_WARPS * MEET_VALUES


@triton.jit
def _put_all(sig_ptr, sig_deltas_ptr, slot, rank, WORLD: tl.constexpr, WORLD_P2: tl.constexpr):
    # this program's signal `slot` from this rank on every rank (itself too), 0 -> 1, waiting while the last one is
    # unread (lanes past WORLD repeat rank WORLD - 1's address and are done from the start)
    lanes = tl.arange(0, WORLD_P2)
    peers = tl.minimum(lanes, WORLD - 1)
    addrs = sig_ptr + tl.load(sig_deltas_ptr + peers) + slot * WORLD + rank
    done = lanes >= WORLD
    while tl.min(done.to(tl.int32)) == 0:
        old = tl.atomic_cas(addrs, tl.where(done, -1, 0), tl.full([WORLD_P2], 1, tl.int32), sem="release",
                            scope="sys")  # fmt: skip
        done = done | (old == 0)


@triton.jit
def _take_all(sig_ptr, slot, WORLD: tl.constexpr, WORLD_P2: tl.constexpr):
    # every rank's signal `slot` to this rank, 1 -> 0, once each is in
    lanes = tl.arange(0, WORLD_P2)
    addrs = sig_ptr + slot * WORLD + tl.minimum(lanes, WORLD - 1)
    done = lanes >= WORLD
    while tl.min(done.to(tl.int32)) == 0:
        old = tl.atomic_cas(addrs, tl.where(done, -1, 1), tl.zeros([WORLD_P2], tl.int32), sem="acquire",
                            scope="sys")  # fmt: skip
        done = done | (old == 1)


@triton.jit
def meet(sig_ptr, sig_deltas_ptr, slot, rank, WORLD: tl.constexpr, WORLD_P2: tl.constexpr):
    """Meet this program's namesakes at signal `slot` (< 2 * SLOTS): returns once every rank's reached it."""
    tl.debug_barrier()  # every thread's stores before the signal
    _put_all(sig_ptr, sig_deltas_ptr, slot, rank, WORLD, WORLD_P2)
    _take_all(sig_ptr, slot, WORLD, WORLD_P2)
    tl.debug_barrier()  # every thread's reads after it


@triton.jit
def inbox_slot(inbox_ptr, inbox_deltas_ptr, q, half, slot64, rank):
    """Slot `rank` of rank q's inbox half: where this rank's pushed rows for q land (the delta rounded to 16 elements,
    as every slot is aligned: 16-byte stores)."""
    return inbox_ptr + (tl.load(inbox_deltas_ptr + q) // 16) * 16 + half + rank * slot64


def pushed_steps(world: World) -> list[tuple[bool, bool, bool, int]]:
    """(PUSH, CONSUME, MEET, EPOCH) of each launch a pushed exchange issues per rank: one launch that pushes, meets
    once and consumes its inbox where the ranks run at once; on a sequential world (one process drives every rank)
    a push launch on every rank, then a consuming one on every rank, meeting no one."""
    if world.concurrent:
        return [(True, True, True, 1)]
    return [(True, False, False, 1), (False, True, False, 2)]


def launch_programs(wanted: int, items: int, field: str, mode: str) -> int:
    """A meeting launch's programs: `wanted` (the config's `field`), but none without an item of its own (one that
    would only meet); every rank launches as many, so namesakes exist to meet. SpaceError past the signal slots."""
    if wanted > SLOTS:
        raise SpaceError(f"{field}: {wanted} is not allowed with {mode}; allowed: <= {SLOTS} (the launch's signal "
                         "slots)")  # fmt: skip
    return max(1, min(wanted, items))


def world_p2(world_size: int) -> int:
    """`meet`'s WORLD_P2: the lanes of a signal vector (a power of two, at least 2)."""
    return max(2, triton.next_power_of_2(world_size))


def signal_buffer(world: World, name: str) -> SymmetricBuffer:
    """The zeroed signals of one exchange's launches (meetings leave them at 0)."""
    return world.symmetric(name, (2 * SLOTS * world.world_size,), torch.int32, zero=True)


def exact_deltas(world: World, buf: SymmetricBuffer, i: int) -> torch.Tensor:
    """Element offsets from local rank index i's copy of `buf` to every rank's, unrounded (signals: no vectors)."""
    own, elem = buf.tensors[i].data_ptr(), buf.tensors[i].element_size()
    return world.int_table(tuple((buf.peers[i][p].data_ptr() - own) // elem for p in range(world.world_size)))


__all__ = [
    "MEET_BLOCK",
    "MEET_SLOTS",
    "MEET_VALUES",
    "MEET_WARPS",
    "SLOTS",
    "exact_deltas",
    "inbox_slot",
    "launch_programs",
    "meet",
    "pushed_steps",
    "signal_buffer",
    "triton",
    "world_p2",
]
