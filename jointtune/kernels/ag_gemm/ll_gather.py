"""`mode="barrier", landing="ll"`: the gather with flags carried in the data (`runtime.ll`), then one cuBLAS GEMM.

The barrier landings pay a meeting (a signal each way between namesake programs) before the gathered rows may be
read. Here a program packs its blocks of this rank's rows into 64-bit words of two values and the call's tag
and stores them into slot `rank` of every peer's word inbox half (halves alternate by the call's epoch), writes the
same blocks into its own gathered buffer, then polls the same blocks of every peer's slot in its own inbox until each
word carries the tag, and unpacks them into the gathered buffer: no fence, no signal, no meeting; twice the bytes.
On 4x H100 that is ahead of the inbox landing only while few values travel (bench/README.md: 0.8-2.0 µs up to 2**17
values sent a rank, behind from 3 x 2**17), which is where the space's default takes it.

Why a half is free to be written: a peer writes half h again at epoch e + 2 only after its call at e + 1, which waited
on every rank's words (or flags) of that call; this rank wrote those in a launch that ran after its own call e had
read half h (stream order). The gathered buffer is local and read only by this rank's cuBLAS, later on the stream.
A word left from an earlier call carries another tag (`runtime.ll` on the one case it can't tell apart).

Blocks are flat: element j of this rank's R x K rows goes to word j // 2 (low half when even), the same split on every
rank, so a program reads exactly the words its namesakes wrote. On a world whose ranks launch one after another
(`PUSH`, `COPY` as `runtime.meet.pushed_steps` gives) every rank's words go out before any rank polls.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_pack16, ll_store, ll_tag, ll_unpack16, ll_wait
from jointtune.kernels.runtime.signals import call_epoch_and_half, open_call, publish_call


@triton.jit(do_not_specialize=["rank"])
def ag_gemm_ll_gather_kernel(
    a_ptr,
    gat_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    state_ptr,
    R,
    K,
    rank,
    slot,
    half_stride,
    WORLD: tl.constexpr,
    BLOCK: tl.constexpr,
    PUSH: tl.constexpr,
    COPY: tl.constexpr,
    EPOCH: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    tag = ll_tag(epoch)
    WORDS: tl.constexpr = BLOCK // 2
    size = (tl.zeros((), tl.int64) + R) * K  # one rank's rows, flattened (rank is a plain int in the interpreter)
    words = (size + 1) // 2
    slot64 = tl.zeros((), tl.int64) + slot  # W word slots of a half can pass 2**31
    if PUSH:
        own = (tl.zeros((), tl.int64) + rank) * size
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            wat = i * WORDS + tl.arange(0, WORDS)
            mask = at < size
            rows = tl.load(a_ptr + at, mask=mask, other=0)
            packed = ll_pack16(tl.reshape(rows, (1, BLOCK)), tag, 1, BLOCK)
            wmask = (wat < words)[None, :]
            for j in tl.static_range(1, WORLD):  # the next rank first
                q = (rank + j) % WORLD
                dst = inbox_ptr + tl.load(inbox_deltas_ptr + q) + half + rank * slot64  # exact word offsets
                ll_store(dst + wat[None, :], packed, wmask)
            tl.store(gat_ptr + own + at, rows, mask=mask)
    if COPY:
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            wat = i * WORDS + tl.arange(0, WORDS)
            wmask = (wat < words)[None, :]
            for j in tl.static_range(1, WORLD):
                p = (rank + j) % WORLD
                got = ll_wait(inbox_ptr + half + p * slot64 + wat[None, :], wmask, tag)
                rows = ll_unpack16(got, 1, BLOCK, gat_ptr.dtype.element_ty)
                tl.store(gat_ptr + p * size + at[None, :], rows, mask=(at < size)[None, :])
    if EPOCH == 1:
        publish_call(state_ptr, epoch, programs)


__all__ = ["ag_gemm_ll_gather_kernel", "triton"]
