"""Flags carried in the data ("low-latency" words, as NCCL's LL protocol): a handoff between ranks with no fence and
no separate flag.

A fenced handoff (`signals`) stores the data, waits at a system-scope fence for those stores to reach the peer, then
writes a flag the reader polls and acquires: at decode sizes that chain is the cost of a fused launch (a flag round
trip over NVLink is 5.2 µs on H100s, bench/README.md's anatomy). Here every 64-bit word carries 32 bits of data and
the low 32 bits of the call's epoch: the writer stores the words and is done; the reader polls the words themselves
until every one carries this call's tag, and then holds the data. No ordering between words is needed (each word
says whether it is fresh), only that an aligned 64-bit store is seen whole, which the GPU gives for a single
store. The price is twice the bytes: LL suits the few kilobytes of a decode-size exchange, not a prefill's.

A tag is the epoch's low 32 bits. A word the reader accepts must have been written at this epoch, or at an epoch an
exact multiple of 2^32 calls before and never since. A family's LL inbox is shared by every shape that uses it (one
buffer per name), so a word may be arbitrarily old; what can't be told apart is only a word last written exactly
k * 2^32 calls of the world ago (at 10 µs a call, 12 hours of calls between two writes, to the call).

Compiled, the writer stores with `st.relaxed.sys` (strong, so the 64-bit word is single-copy atomic under PTX's
model) and the reader polls with volatile (system-scope relaxed) loads; the CPU interpreter has no PTX and uses
plain stores and loads (its ranks share memory). bench/ops/ll_litmus.py checks both halves on GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from jointtune.kernels.runtime.signals import FENCED

if TYPE_CHECKING:
    import torch

    from jointtune.kernels.runtime.world import SymmetricBuffer, World

#: bits of the tag (the epoch's low bits) in every word; the data take the rest
TAG_BITS = 32


@triton.jit
def ll_tag(epoch):
    """The tag words of call `epoch` carry: the epoch's low 32 bits (int64)."""
    return epoch.to(tl.int64) & 0xFFFFFFFF


@triton.jit
def ll_word(data32, tag):
    """One word from 32 data bits (int32 or uint32, any shape) and a tag (`ll_tag`)."""
    return (tag << 32) | (data32.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def ll_data(words):
    """The 32 data bits of words, as int32."""
    return (words & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def ll_store(ptrs, words, mask):
    """Store words (int64) where a reader polls them: each one whole, with no fence (module doc)."""
    if FENCED:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.relaxed.sys.global.b64 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,l,r", [ptrs, words, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
    else:
        tl.store(ptrs, words, mask=mask)


@triton.jit
def ll_wait(ptrs, mask, tag):
    """The words at `ptrs` (int64, any shape; masked-off ones 0) once every one under `mask` carries `tag`. Use what
    it returns: Triton 3.6 fails an assertion compiling the polling loop when its result is unused."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    while tl.min(tl.where(mask & (((words >> 32) & 0xFFFFFFFF) != tag), 0, 1)) == 0:
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    return words


@triton.jit
def ll_pack16(vals, tag, ROWS: tl.constexpr, COLS: tl.constexpr):
    """[ROWS, COLS] 16-bit values (bf16 or fp16) as [ROWS, COLS // 2] words: columns 2j and 2j + 1 in word j's low and
    high data halves."""
    bits = vals.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    lo, hi = tl.split(tl.reshape(bits, (ROWS, COLS // 2, 2)))
    return ll_word(lo | (hi << 16), tag)


@triton.jit
def ll_unpack16(words, ROWS: tl.constexpr, COLS: tl.constexpr, DTYPE: tl.constexpr):
    """`ll_pack16` undone: [ROWS, COLS // 2] words back to [ROWS, COLS] values of DTYPE (a 16-bit float type)."""
    data = ll_data(words)
    lo = (data & 0xFFFF).to(tl.int16)
    hi = ((data >> 16) & 0xFFFF).to(tl.int16)
    bits = tl.reshape(tl.join(lo, hi), (ROWS, COLS))
    return bits.to(DTYPE, bitcast=True)


def word_deltas(world: World, buf: SymmetricBuffer, i: int, extra: int = 0) -> torch.Tensor:
    """`symm.peer_deltas` for a buffer of words (int64), which kernels read at exact offsets (no rounding down to 16
    elements): offsets from local rank index i's buffer to every rank's, plus `extra`, as a device table. Words of
    different ranks need not sit 128 bytes apart (they don't on the CPU world)."""
    own = buf.tensors[i].data_ptr()
    return world.int_table(tuple((buf.peers[i][p].data_ptr() - own) // 8 + extra for p in range(world.world_size)))


__all__ = [
    "TAG_BITS",
    "ll_data",
    "ll_pack16",
    "ll_store",
    "ll_tag",
    "ll_unpack16",
    "ll_wait",
    "ll_word",
    "triton",
    "word_deltas",
]
