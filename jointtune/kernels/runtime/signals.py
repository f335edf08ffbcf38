"""Communication pieces every fused family shares, in Triton: push rows to peers, release and wait for
flags, and the call's epoch, which lives on the device.

Cross-call state never comes from the host. Each world keeps a per-rank counter in device memory
(`CallState`): the number of fused calls this rank has opened. A call's epoch is that counter + 1.
Either one small kernel opens the call (`open_call_kernel`: counter += 1, then every kernel of the call
reads the counter), or the call's first kernel reads counter + 1 and publishes it once every one of its
programs has read it (`open_call`: each program arrives on a counter as it starts, without waiting;
`publish_call`: the launch's last program collects the arrivals at its end and publishes). Flags carry
epochs, so a flag written at call e means "ready for call e" and nothing is ever reset; inbox halves are
picked by epoch parity in the kernel. A CUDA graph that captured a call therefore replays it correctly
forever: every replay advances the counter on the device, exactly as an eager call does.

Epochs and flags are int64: at one call per microsecond they would take 290,000 years to wrap.

Layout conventions (all families): a flag buffer per (family, chunk count) holds `world_size * n_chunks`
int64 flags; flag (p, c) at `p * n_chunks + c` is written only by rank p (one writer per flag). A
rank's entry flags (`entered[p]`) are written only by rank p.

Handing data between programs (here or on a peer) is per program, not per thread, as CUDA's grid sync and
NCCL's protocols do it. The writer: every thread stores, a barrier, then one thread's release (the flag, or a
counter whose last arrival releases the flag). The reader: one thread acquires the flag (Triton broadcasts its
value through shared memory behind a barrier), a barrier, then every thread loads. PTX's memory model makes
causality transitive through the CTA barrier (morally strong at CTA scope) and the system-scope release and
acquire, so each thread's stores are visible to each reading thread, past any stale L1 line. `release_flag`
and `wait_flag` take their barriers themselves; a kernel that releases through a counter puts one before it.
`bench/ops/handoff_litmus.py` checks the pattern on a GPU (and that a reader without the acquire reads stale data).
"""

from __future__ import annotations

import triton
import triton.language as tl

from jointtune.kernels.runtime.device import interpreted

#: How compiled code releases a flag to several ranks: a barrier, one system-scope fence, then a relaxed system-scope
#: write per rank (PTX's release pattern: a fence.acq_rel followed by a strong write). A release exchange per rank is a
#: fence of its own, each waiting for the previous one's write to reach its peer, so W flags cost W fences' round trips;
#: this costs one. The CPU interpreter runs no PTX (no fence): there it keeps a release exchange per rank. Fixed per
#: process (`device.interpreted`, chosen before Triton is imported); a global constexpr, so compiled kernels key on it.
FENCED = tl.constexpr(not interpreted())

# ---- the call's epoch ---------------------------------------------------------------------------
# EPOCH (constexpr) of a kernel: 1 = this launch opens the call (reads counter + 1, `open_call` at the start of
# every program, `publish_call` at the end), 2 = the call is already open (the counter is the epoch).


@triton.jit
def call_epoch(state_ptr, EPOCH: tl.constexpr):
    return tl.load(state_ptr) + EPOCH % 2


@triton.jit
def call_epoch_and_half(state_ptr, half_stride, EPOCH: tl.constexpr):
    # (the call's epoch, the offset of its half of a two-half buffer: halves alternate by epoch parity); EPOCH 0,
    # a launch with no cross-call state: (0, 0)
    if EPOCH > 0:
        epoch = call_epoch(state_ptr, EPOCH)
        half = (epoch % 2) * half_stride
    else:
        epoch = 0
        half = 0
    return epoch, half


@triton.jit
def open_call(state_ptr):
    # At the start of every program of a launch that opens the call, right after `call_epoch`: once all its threads
    # hold the epoch (the barrier), the program arrives on the launch's counter. The result is not used, so nothing
    # waits for the round trip; `publish_call` collects the arrivals.
    tl.debug_barrier()
    tl.atomic_add(state_ptr + 1, 1, sem="release", scope="gpu")


@triton.jit
def publish_call(state_ptr, epoch, num_programs):
    # At the end of the launch's last program (by id: the last to start, and where programs run one after another
    # the last to run): once every program has arrived, hence read the epoch, publish it and hand the counter back at
    # zero. None of this launch reads the new value; later kernels on the stream do. Nothing waits on this program,
    # so its wait ends whatever the grid and residency.
    if tl.program_id(0) == num_programs - 1:
        wait_flag(state_ptr + 1, num_programs)
        tl.store(state_ptr + 1, 0)
        tl.atomic_xchg(state_ptr, epoch, sem="release", scope="gpu")


@triton.jit
def sys_fence(value):
    """`value` back, after a system-scope acq_rel fence (compiled code only: the interpreter has no PTX). The value
    passes through the fence, so what is computed from it (a flag's value) can't be hoisted above it."""
    return tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.b64 $0, $1;", "=l,l", [value], dtype=tl.int64,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def release_ranks(flag_ptrs_ptr, index, epoch, first, last, skip):
    """Flag `index` := `epoch` at ranks `first`..`last` but `skip` (-1: none), publishing this program's earlier
    writes, all threads' (system scope): a barrier, then in compiled code (`FENCED`) one fence and a relaxed write per
    rank, in the interpreter a release exchange per rank. `flag_ptrs_ptr`: every rank's flag buffer address, by rank."""
    tl.debug_barrier()
    if FENCED:
        value = sys_fence(epoch.to(tl.int64))
        for p in range(first, last + 1):
            if p != skip:
                flags = tl.load(flag_ptrs_ptr + p).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(flags + index, value, sem="relaxed", scope="sys")
    else:
        for p in range(first, last + 1):
            if p != skip:
                flags = tl.load(flag_ptrs_ptr + p).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(flags + index, epoch, sem="release", scope="sys")


@triton.jit
def release_flag(flag_ptrs_ptr, rank, index, epoch, WORLD: tl.constexpr):
    """Flag `index` (this rank's) at every peer := `epoch`, publishing this program's earlier writes (all threads'):
    `release_ranks` to every rank but this one. The writer's half of every handoff between ranks (module doc);
    bench/ops/handoff_litmus.py checks it on GPUs."""
    release_ranks(flag_ptrs_ptr, index, epoch, 0, WORLD - 1, rank)


@triton.jit
def wait_flag(flag_ptr, epoch):
    """Wait until the flag at `flag_ptr` reaches `epoch`; what its writer released before it (`release_flag`) is then
    visible to every thread of this program. The reader's half of every handoff (module doc)."""
    # Poll with plain volatile loads (no read-modify-write for the writer's atomic to queue behind), then
    # acquire once: what the writer released before the flag is visible to this program after it. The
    # acquiring read's value must be used: Triton (3.6 to 3.9) folds away a scalar `atomic_add(p, 0)` whose
    # result is unused, acquire or not, which left every wait without its acquire (tests/kernels/
    # test_kernel_ordering.py checks the compiled PTX).
    # The barrier after hands the acquire to every thread of the program (module doc).
    while tl.load(flag_ptr, volatile=True) < epoch:
        pass
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys") < epoch:
        pass
    tl.debug_barrier()


@triton.jit
def wait_chunks(flags_ptr, epoch, rank, n_chunks, p_lo, p_hi, c_lo, c_hi):
    # acquire chunks [c_lo, c_hi] of every source rank in [p_lo, p_hi] but this one
    for p in range(p_lo, p_hi + 1):
        if p != rank:
            for c in range(c_lo, c_hi + 1):
                wait_flag(flags_ptr + p * n_chunks + c, epoch)


# ---- all-gather by pushing: rows [R, K] of every rank land in slot `rank` of every peer's inbox ----


@triton.jit
def push_rows(
    src_ptr,
    dest_ptr,
    dest_deltas_ptr,
    own_ptr,
    flag_ptrs_ptr,
    done_ptr,
    pid,
    K,
    R,
    slot,
    rank,
    epoch,
    n_chunks,
    WORLD: tl.constexpr,
    PROGRAMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    OWN: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
):
    # All PROGRAMS programs share every chunk, piece by piece ([CP_M, CP_K] blocks; piece g of the call
    # goes to program g % PROGRAMS), so the copy runs on all of them whatever the chunk size. `dest_ptr`
    # is this call's inbox (half) base as this rank maps it; rank p's is at `dest_deltas[p]` elements
    # from it. OWN: this rank's rows also go to `own_ptr`. After its last piece of a chunk a program adds its
    # piece count to the chunk's counter (after a barrier, with acq_rel: the counter carries every thread's
    # stores of every program); the one completing the count (and leaving it at zero for the next call)
    # releases the chunk's flag to every peer.
    k_pieces = tl.cdiv(K, CP_K)
    pieces = tl.cdiv(CHUNK_M, CP_M) * k_pieces
    for c in range(0, n_chunks):
        first = (pid - (c * pieces) % PROGRAMS + PROGRAMS) % PROGRAMS
        for q in range(first, pieces, PROGRAMS):
            rows = c * CHUNK_M + (q // k_pieces) * CP_M + tl.arange(0, CP_M)
            ks = (q % k_pieces) * CP_K + tl.arange(0, CP_K)
            mask = (rows[:, None] < tl.minimum(c * CHUNK_M + CHUNK_M, R)) & (ks[None, :] < K)
            offs = rows[:, None].to(tl.int64) * K + ks[None, :]
            x = tl.load(src_ptr + offs, mask=mask)
            dst = dest_ptr + rank.to(tl.int64) * slot + offs
            for j in range(1, WORLD):
                peer = (rank + j) % WORLD
                delta = (tl.load(dest_deltas_ptr + peer) // 16) * 16
                tl.store(dst + delta, x, mask=mask)
            if OWN:
                tl.store(own_ptr + offs, x, mask=mask)
        mine = tl.cdiv(pieces - first, PROGRAMS)
        if mine > 0:
            tl.debug_barrier()
            done = tl.atomic_add(done_ptr + c, mine, sem="acq_rel", scope="sys")
            if done + mine == pieces:
                tl.store(done_ptr + c, 0)
                release_flag(flag_ptrs_ptr, rank, rank * n_chunks + c, epoch, WORLD)


# ---- kernels ------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["rank"])
def open_call_kernel(state_ptr, entered_ptrs_ptr, entered_ptr, rank, WORLD: tl.constexpr, SIGNAL: tl.constexpr,
                     WAIT: tl.constexpr):  # fmt: skip
    # Opens a call whose transfers write at fixed addresses (the copy engine, or inboxes a library GEMM
    # reads): counter += 1, then tell every peer "I entered call e" (so I am done reading what they
    # sent me in call e - 1), and wait until every peer said the same before anyone writes into it.
    # On a world whose ranks launch one after another, SIGNAL and WAIT are two launches per rank.
    if SIGNAL:
        epoch = tl.load(state_ptr) + 1
        tl.store(state_ptr, epoch)
        release_flag(entered_ptrs_ptr, rank, rank, epoch, WORLD)
    else:
        epoch = tl.load(state_ptr)
    if WAIT:
        for j in range(1, WORLD):
            wait_flag(entered_ptr + (rank + j) % WORLD, epoch)


# Integers that may be 1 stay runtime values: Triton would make them constants and compile per rank.
@triton.jit(do_not_specialize=["rank", "n_chunks", "num_programs"])
def allgather_push_kernel(
    src_ptr,
    inbox_ptr,
    inbox_deltas_ptr,
    own_ptr,
    flag_ptrs_ptr,
    flags_ptr,
    done_ptr,
    state_ptr,
    entered_ptrs_ptr,
    entered_ptr,
    K,
    R,
    slot,
    half_stride,
    rank,
    n_chunks,
    num_programs,
    WORLD: tl.constexpr,
    PROGRAMS: tl.constexpr,
    CHUNK_M: tl.constexpr,
    OWN: tl.constexpr,
    CP_M: tl.constexpr,
    CP_K: tl.constexpr,
    EPOCH: tl.constexpr,
    WAIT_ALL: tl.constexpr,
    ENTER: tl.constexpr,
):
    # This rank's rows go to every peer (and OWN: to `own_ptr`), a flag per chunk. WAIT_ALL: program 0
    # then waits for every peer's chunks, so the next kernel on the stream reads them. `half_stride` > 0:
    # inboxes alternate halves by epoch parity. ENTER (a one-half inbox a library GEMM reads): this launch
    # opens the call as `open_call_kernel` does, program 0 telling every peer it entered, every program
    # waiting until each peer entered before writing into it. Pushing waits on nothing else, and the grid
    # (<= num_sms / 4) is resident, so every wait ends: deadlock-free. A world whose ranks launch one after
    # another opens its calls with `open_call_kernel` and waits with `wait_chunks_kernel` instead.
    pid = tl.program_id(0)
    epoch, half = call_epoch_and_half(state_ptr, half_stride, EPOCH)
    if EPOCH == 1:
        open_call(state_ptr)
    if ENTER:
        if pid == 0:
            release_flag(entered_ptrs_ptr, rank, rank, epoch, WORLD)
        for j in range(1, WORLD):  # every thread's stores into a peer come after the acquire of its entry
            wait_flag(entered_ptr + (rank + j) % WORLD, epoch)
    push_rows(
        src_ptr, inbox_ptr + half, inbox_deltas_ptr, own_ptr, flag_ptrs_ptr, done_ptr, pid, K, R, slot, rank, epoch,
        n_chunks, WORLD, PROGRAMS, CHUNK_M, OWN, CP_M, CP_K,
    )  # fmt: skip
    if WAIT_ALL:  # noqa: SIM102 (constexpr: without it no wait code at all)
        if pid == 0:
            wait_chunks(flags_ptr, epoch, rank, n_chunks, 0, WORLD - 1, 0, n_chunks - 1)
    if EPOCH == 1:
        publish_call(state_ptr, epoch, num_programs)


@triton.jit(do_not_specialize=["rank", "n_chunks", "chunk"])
def release_chunk_kernel(flag_ptrs_ptr, flags_ptr, state_ptr, rank, n_chunks, chunk, WORLD: tl.constexpr,
                         WAIT_ALL: tl.constexpr):  # fmt: skip
    """One program that raises this rank's flag of `chunk` at every peer (epoch from the call state at `state_ptr`).
    Queued behind the copy engine's copies of `chunk` into every peer: stream order puts them before this kernel,
    the system-scope release publishes them with the flag. WAIT_ALL: then wait for every peer's chunks (a
    gather-then-GEMM call on a world whose ranks run at once). bench/ag_gemm/ag_gemm_anatomy.py times it alone."""
    epoch = tl.load(state_ptr)
    release_flag(flag_ptrs_ptr, rank, rank * n_chunks + chunk, epoch, WORLD)
    if WAIT_ALL:
        wait_chunks(flags_ptr, epoch, rank, n_chunks, 0, WORLD - 1, 0, n_chunks - 1)


@triton.jit(do_not_specialize=["rank", "n_chunks", "p_lo", "p_hi", "c_lo", "c_hi"])
def wait_chunks_kernel(flags_ptr, state_ptr, rank, n_chunks, p_lo, p_hi, c_lo, c_hi):
    """One program that waits for chunks [c_lo, c_hi] of peers [p_lo, p_hi] (offsets from `rank`) of this call:
    the stream's next kernel (a library GEMM) starts only after they arrived. bench/ag_gemm/ag_gemm_anatomy.py and
    ag_gemm_host.py time it alone."""
    wait_chunks(flags_ptr, tl.load(state_ptr), rank, n_chunks, p_lo, p_hi, c_lo, c_hi)


__all__ = [
    "FENCED",
    "allgather_push_kernel",
    "call_epoch",
    "call_epoch_and_half",
    "open_call",
    "open_call_kernel",
    "publish_call",
    "push_rows",
    "release_chunk_kernel",
    "release_flag",
    "release_ranks",
    "sys_fence",
    "triton",
    "wait_chunks",
    "wait_chunks_kernel",
    "wait_flag",
]
