"""`mode="barrier", landing="ll"`: the gather with flags carried in the data (`runtime.ll`), then one cuBLAS GEMM.

The barrier landings pay a meeting (a signal each way, 5-8 µs over NVLink at decode sizes) before the gathered rows
may be read. Here a program packs its blocks of this rank's rows into 64-bit words of two values and the call's tag
and stores them into slot `rank` of every peer's word inbox half (halves alternate by the call's epoch), writes the
same blocks into its own gathered buffer, then polls the same blocks of every peer's slot in its own inbox until each
word carries the tag, and unpacks them into the gathered buffer: no fence, no signal, no meeting; twice the bytes.

Why a half is free to be written: a peer writes half h again at epoch e + 2 only after its call at e + 1, which waited
on every rank's words (or flags) of that call; this rank wrote those in a launch that ran after its own call e had
read half h (stream order). The gathered buffer is local and read only by this rank's cuBLAS, later on the stream.
A word left from an earlier call carries another tag (`runtime.ll` on the one case it can't tell apart).

Blocks are flat: value j of this rank's R x K rows goes to word j // 2 (low half when even), the same split on every
rank, so a program reads exactly the words its namesakes wrote. A thread handles words in pairs (four values): compiled,
it stores and polls a pair with one 16-byte access (`_store_pairs`, `_load_pairs`), each 8-byte word of it still
single-copy atomic under PTX's model (a vector access is one access per element), where `runtime.ll.ll_store` takes
one instruction a word. On a world whose ranks launch one after another (`PUSH`, `COPY` as
`runtime.meet.pushed_steps` gives) every rank's words go out before any rank polls.
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.ll import ll_tag, ll_word
from jointtune.kernels.runtime.signals import FENCED, call_epoch_and_half, open_call, publish_call


@triton.jit
def _pairs(rows, tag, BLOCK: tl.constexpr):
    """[BLOCK] 16-bit values as two [BLOCK // 4] word tensors: pair j's first word holds values 4j, 4j + 1 and its
    second 4j + 2, 4j + 3 (`runtime.ll`'s word format, two words at a time)."""
    bits = rows.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    even, odd = tl.split(tl.reshape(bits, (BLOCK // 4, 2, 2)))  # [j, h]: values 4j + 2h and 4j + 2h + 1
    first, second = tl.split(even | (odd << 16))
    return ll_word(first, tag), ll_word(second, tag)


@triton.jit
def _unpairs(first, second, BLOCK: tl.constexpr, DTYPE: tl.constexpr):
    """`_pairs` undone: the [BLOCK] values of DTYPE (a 16-bit float type)."""
    data = tl.join((first & 0xFFFFFFFF).to(tl.int32), (second & 0xFFFFFFFF).to(tl.int32))  # [j, h]
    even = (data & 0xFFFF).to(tl.int16)
    odd = ((data >> 16) & 0xFFFF).to(tl.int16)
    return tl.reshape(tl.join(even, odd), (BLOCK,)).to(DTYPE, bitcast=True)


@triton.jit
def _store_pairs(ptrs, first, second, mask_first, mask_second):
    """Store each pair of words at ptrs, ptrs + 1 where a reader polls them, each word whole and with no fence: one
    16-byte store where both are wanted and the pair is 16-byte aligned, else a store per wanted word."""
    if FENCED:
        tl.inline_asm_elementwise(
            "{ .reg .pred p, q, v, n; .reg .b64 t; setp.ne.b32 p, $4, 0; setp.ne.b32 q, $5, 0; and.b64 t, $1, 15; "
            "setp.eq.and.b64 v, t, 0, q; and.pred v, v, p; not.pred n, v; and.pred p, p, n; and.pred q, q, n; "
            "@v st.relaxed.sys.global.v2.b64 [$1], {$2, $3}; @p st.relaxed.sys.global.b64 [$1], $2; "
            "@q st.relaxed.sys.global.b64 [$1+8], $3; mov.u32 $0, 0; }",
            "=r,l,l,l,r,r", [ptrs, first, second, mask_first.to(tl.int32), mask_second.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)  # fmt: skip
    else:
        tl.store(ptrs, first, mask=mask_first)
        tl.store(ptrs + 1, second, mask=mask_second)


@triton.jit
def _load_pairs(ptrs, mask):
    """The pair of words at ptrs, ptrs + 1 (0, 0 where `mask` is off), read as a poll reads (system-scope relaxed,
    each word whole): one 16-byte load where the pair is 16-byte aligned, else one per word. A pair whose first word
    is wanted lies in the slot (slots are whole 16-word lines), so the second is read too and masked by the caller."""
    if FENCED:
        first, second = tl.inline_asm_elementwise(
            "{ .reg .pred p, v, n; .reg .b64 t; setp.ne.b32 p, $3, 0; and.b64 t, $2, 15; setp.eq.and.b64 v, t, 0, p; "
            "not.pred n, v; and.pred p, p, n; mov.b64 $0, 0; mov.b64 $1, 0; "
            "@v ld.relaxed.sys.global.v2.b64 {$0, $1}, [$2]; @p ld.relaxed.sys.global.b64 $0, [$2]; "
            "@p ld.relaxed.sys.global.b64 $1, [$2+8]; }",
            "=l,=l,l,r", [ptrs, mask.to(tl.int32)], dtype=(tl.int64, tl.int64), is_pure=False, pack=1)  # fmt: skip
    else:
        first = tl.load(ptrs, mask=mask, other=0, volatile=True)
        second = tl.load(ptrs + 1, mask=mask, other=0, volatile=True)
    return first, second


@triton.jit
def _wait_pairs(ptrs, mask_first, mask_second, tag):
    """The pairs at ptrs once every wanted word carries `tag` (`runtime.ll.ll_wait`, two words a thread)."""
    first, second = _load_pairs(ptrs, mask_first)
    stale = (mask_first & (((first >> 32) & 0xFFFFFFFF) != tag)) | (
        mask_second & (((second >> 32) & 0xFFFFFFFF) != tag)
    )
    while tl.max(stale.to(tl.int32)) > 0:
        first, second = _load_pairs(ptrs, mask_first)
        stale = (mask_first & (((first >> 32) & 0xFFFFFFFF) != tag)) | (
            mask_second & (((second >> 32) & 0xFFFFFFFF) != tag)
        )
    return first, second


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
    PAIRS: tl.constexpr = BLOCK // 4
    size = (tl.zeros((), tl.int64) + R) * K  # one rank's rows, flattened (rank is a plain int in the interpreter)
    words = (size + 1) // 2
    slot64 = tl.zeros((), tl.int64) + slot  # W word slots of a half can pass 2**31
    if PUSH:
        own = (tl.zeros((), tl.int64) + rank) * size
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            mask = at < size
            rows = tl.load(a_ptr + at, mask=mask, other=0)
            first, second = _pairs(rows, tag, BLOCK)
            wat = i * (BLOCK // 2) + 2 * tl.arange(0, PAIRS)  # each pair's first word
            for j in tl.static_range(1, WORLD):  # the next rank first
                q = (rank + j) % WORLD
                dst = inbox_ptr + tl.load(inbox_deltas_ptr + q) + half + rank * slot64  # exact word offsets
                _store_pairs(dst + wat, first, second, wat < words, wat + 1 < words)
            tl.store(gat_ptr + own + at, rows, mask=mask)
    if COPY:
        for i in range(pid, tl.cdiv(size, BLOCK), programs):
            at = i * BLOCK + tl.arange(0, BLOCK)
            wat = i * (BLOCK // 2) + 2 * tl.arange(0, PAIRS)
            for j in tl.static_range(1, WORLD):
                p = (rank + j) % WORLD
                first, second = _wait_pairs(inbox_ptr + half + p * slot64 + wat, wat < words, wat + 1 < words, tag)
                rows = _unpairs(first, second, BLOCK, gat_ptr.dtype.element_ty)
                tl.store(gat_ptr + p * size + at, rows, mask=at < size)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, programs)


__all__ = ["ag_gemm_ll_gather_kernel", "triton"]
