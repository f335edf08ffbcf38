"""All-Gather + GEMM for a column-parallel linear layer: C_r = all_gather(A) @ B_r.

Rank r holds A_r [M/W, K] and B_r [K, N/W] and gets C_r [M, N/W] (and, if asked, the gathered A,
as `torch.ops.symm_mem.fused_all_gather_matmul` gives). The config's `mode` picks how A travels:

- pull: the GEMM loads peers' rows straight from their symmetric buffers; no extra kernel.
- push: producer programs inside the GEMM's persistent grid push rows into every peer's inbox.
- push_cublas: the same push as a kernel of its own (or copy-engine copies plus a flag kernel), and
  cuBLAS multiplies: local rows while peers' rows travel, then each chunk after its flag; or all rows
  in one GEMM after the gather. No barrier at all.
- ce: the copy engine pulls peers' rows on a side stream, chunk by chunk; per chunk a Triton tile
  GEMM or cuBLAS consumes it as soon as its event fires. Local rows are multiplied first.
- baseline: NCCL all-gather, then torch.matmul (kept in the space: tuning never loses to it).

A may already live in the world's symmetric memory (`world.empty`, written by the previous
layer: nothing is copied) or be an ordinary tensor (copied into a staging buffer). Staging and
inbox buffers alternate between two halves by call parity, so a peer writing call t+1 never
overwrites what a rank still reads of call t; flags carry epochs, so nothing is reset per call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from jointtune.errors import ShapeError
from jointtune.kernels._ag_gemm_kernel import (
    INTERPRETED,
    ag_gemm_kernel,
    ag_push_kernel,
    ag_signal_kernel,
    ag_wait_kernel,
    compile_options,
)
from jointtune.kernels._family import Family, register_family
from jointtune.kernels.world import World

_DTYPES = (torch.bfloat16, torch.float16)
_ALIGN = 16  # elements; see the kernel's docstring


@dataclass(frozen=True)
class Plan:
    """A config resolved against a call's shape: everything the launch needs, computed once."""

    mode: str
    BLOCK_M: int = 64
    BLOCK_N: int = 64
    BLOCK_K: int = 64
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    comm_sms: int = 0
    chunk_m: int = 0
    ce_consumer: str = "triton"
    ce_chunks: int = 1
    push_by: str = "sm"
    gemm_order: str = "local_first"

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def of(items: tuple[tuple[str, Any], ...]) -> Plan:
        config = dict(items)
        return Plan(**{k: v for k, v in config.items() if k in Plan.__dataclass_fields__})


@functools.lru_cache(maxsize=4096)
def _check_plan(plan: Plan) -> None:
    """The knobs the config's mode reads: a missing count would launch an empty grid and hang its peers."""
    pushes = plan.mode == "push" or (plan.mode == "push_cublas" and plan.push_by == "sm")
    chunks = plan.mode == "push" or (plan.mode == "push_cublas" and plan.gemm_order == "local_first")
    choices = {"push_cublas": {"push_by": ("sm", "ce"), "gemm_order": ("local_first", "gathered")},
               "ce": {"ce_consumer": ("triton", "cublas")}}.get(plan.mode, {})  # fmt: skip
    for name, allowed in choices.items():
        if getattr(plan, name) not in allowed:
            raise ShapeError(f"config.{name}: {getattr(plan, name)!r} is not allowed with mode={plan.mode!r}; "
                             f"choose one of {', '.join(allowed)}")  # fmt: skip
    for name, needed in (("comm_sms", pushes), ("chunk_m", chunks), ("ce_chunks", plan.mode == "ce")):
        if needed and getattr(plan, name) < 1:
            raise ShapeError(f"config.{name}: {getattr(plan, name)} is not allowed with mode={plan.mode!r}; "
                             f"it must be >= 1")  # fmt: skip


def _plan(config: Mapping[str, Any]) -> Plan:
    return Plan.of(tuple(sorted(config.items())))


def _as_list(x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _check(a: list[torch.Tensor], b: list[torch.Tensor], world: World) -> tuple[int, int, int]:
    n_local = len(world.local_ranks)
    if len(a) != n_local or len(b) != n_local:
        raise ShapeError(f"a, b: expected one tensor per local rank ({n_local}), got {len(a)} and {len(b)}")
    R, K = a[0].shape
    N_r = b[0].shape[1]
    for i, (ai, bi) in enumerate(zip(a, b)):
        if ai.dim() != 2 or bi.dim() != 2:
            raise ShapeError(f"a, b: must be 2-D, got a{list(ai.shape)} and b{list(bi.shape)} on rank index {i}")
        if tuple(ai.shape) != (R, K) or bi.shape[0] != K or bi.shape[1] != N_r:
            raise ShapeError(
                f"shapes: a must be [R, K] and b [K, N_r] alike on every rank; rank index {i} has "
                f"a{list(ai.shape)}, b{list(bi.shape)} against a[{R}, {K}], b[{K}, {N_r}]"
            )
        if ai.dtype not in _DTYPES or bi.dtype != ai.dtype:
            raise ShapeError(f"dtype: a {ai.dtype} and b {bi.dtype}; both must be bfloat16 or float16")
        if ai.device != world.device or bi.device != world.device:
            raise ShapeError(f"device: tensors must be on {world.device}, got {ai.device} and {bi.device}")
    return R, K, N_r


def _offset(t: torch.Tensor | int, base: int, elem: int) -> int:
    diff = (t if isinstance(t, int) else t.data_ptr()) - base
    if diff % (elem * _ALIGN):
        raise ShapeError(f"alignment: buffers must be {elem * _ALIGN}-byte aligned relative to each other")
    return diff // elem


def _slot(R: int, K: int) -> int:
    """Elements per rank's rows in a shared buffer, rounded so every rank's slot stays aligned."""
    return triton_cdiv(R * K, _ALIGN) * _ALIGN


def _aligned(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    return x if x.data_ptr() % (x.element_size() * _ALIGN) == 0 else x.clone()


def ag_gemm(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    return_gathered: bool = False,
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Any:
    """All-gather `a` over the world's ranks and multiply by this rank's `b`.

    On the CUDA world `a` and `b` are this rank's tensors and the result is C (or (C, A_gathered));
    on the local world they are lists with one tensor per simulated rank, and so is the result.
    `out` (optional, [M, N_r] per rank) receives C instead of a new tensor.
    """
    a_l, b_l = _as_list(a), _as_list(b)
    R, K, N_r = _check(a_l, b_l, world)
    plan = _plan(config)
    run = _MODES.get(plan.mode)
    if run is None:
        raise ShapeError(f"config.mode: {plan.mode!r} is not allowed; choose one of {', '.join(_MODES)}")
    _check_plan(plan)
    a_l = [x if world.symmetric_of(x) is not None else _aligned(x) for x in a_l]
    M = R * world.world_size
    if out is None:
        c_l = [torch.empty((M, N_r), dtype=x.dtype, device=world.device) for x in a_l]
    else:
        c_l = _as_list(out)
        if len(c_l) != len(a_l) or any(c.shape != (M, N_r) or c.dtype != a_l[0].dtype or c.stride(1) != 1 for c in c_l):
            raise ShapeError(f"out: must be one row-major [{M}, {N_r}] {a_l[0].dtype} tensor per local rank")
    outs, gathered = run(plan, a_l, b_l, c_l, world, R, K, N_r, return_gathered)
    result = list(zip(outs, gathered)) if return_gathered else outs
    return result[0] if isinstance(a, torch.Tensor) else result


# ----------------------------------------------------------------------------------------------
# modes


def _baseline(plan, a, b, c, world, R, K, N_r, want_gathered):
    gathered = world.all_gather(a)
    for g, bi, ci in zip(gathered, b, c):
        torch.matmul(g, bi, out=ci)
    return c, gathered


@contextlib.contextmanager
def _shared_a(a, world, R, K):
    """This rank's A in symmetric memory, readable by every peer for the duration of the block.

    The caller's own buffer (from `world.empty`) or a staging half we copy into (halves alternate by
    call, so a peer still reading call t never sees call t+1's copy). Yields the buffer, this rank's
    [R, K] views and every rank's base address as this rank maps it. Enters with a barrier (every
    rank's A is in place) and, when the caller owns the buffer, leaves with one (peers are done
    reading it before the caller may overwrite it).
    """
    user = [world.symmetric_of(x) for x in a]
    owned = all(u is not None for u in user) and len({id(u) for u in user}) == 1
    if owned:
        buf, views, off = user[0], list(a), 0
    else:
        slot = _slot(R, K)
        buf = world.symmetric("ag_gemm.stage", (2 * slot,), a[0].dtype)
        off = (world.next_epoch("ag_gemm") % 2) * slot
        views = [buf.tensors[i][off : off + R * K].view(R, K) for i in range(len(a))]
        for v, x in zip(views, a):
            v.copy_(x)
    elem = a[0].element_size()
    bases = [[buf.peers[i][p].data_ptr() + off * elem for p in range(world.world_size)] for i in range(len(a))]
    world.barrier(buf)
    yield buf, views, bases
    if owned:
        world.barrier(buf)


def _launch_gemm(plan, world, i, a_view, b, c, K, N_r, *, R, rows, row_lo=0, rank=0, shift=0, src=None,
                 deltas=None, push=None, pid_range=None):  # fmt: skip
    """One launch of the kernel for local rank index `i` (GEMM programs, plus producers under push)."""
    num_tiles = triton_cdiv(rows, plan.BLOCK_M) * triton_cdiv(N_r, plan.BLOCK_N)
    zero = world.int_table((0,) * world.world_size)
    if plan.SPLIT_K > 1:
        ws = world.scratch("ag_gemm.splitk", num_tiles * plan.BLOCK_M * plan.BLOCK_N, torch.float32)[i]
        counts = world.scratch("ag_gemm.splitk_counts", num_tiles, torch.int32)[i]
    else:
        ws, counts = c, zero
    if push is None:
        push = dict(inbox=a_view, inbox_deltas=zero, flags=zero, flag_ptrs=zero, epoch=0, n_chunks=1, slot=0,
                    comm_sms=0, consumers=num_tiles * plan.SPLIT_K, gather_local=False, tickets=zero,
                    done=zero, fence=zero)  # fmt: skip
    lo, hi = pid_range or (0, push["comm_sms"] + push["consumers"])
    args, constexprs = _kernel_args(
        plan, world.world_size, world.kind, a_view, a_view if src is None else src, zero if deltas is None else deltas,
        b, c, ws, counts, push, K, N_r, R, rows, row_lo, rank, shift, lo,
    )  # fmt: skip
    ag_gemm_kernel[(hi - lo,)](*args, **constexprs)


def _kernel_args(plan, world_size, kind, a_view, src, deltas, b, c, ws, counts, push, K, N_r, R, rows, row_lo,
                 rank, shift, pid_base):  # fmt: skip
    """The kernel's arguments and compile-time constants; shared by launches and ahead-of-time compiles."""
    dynamic = push["comm_sms"] > 0
    args = (
        a_view, src, deltas, b, c, push["inbox"], push["inbox_deltas"], push["flags"], push["flag_ptrs"],
        push["tickets"], ws, counts, push["done"], push["fence"], N_r, K, R, push["slot"], row_lo, rows, rank,
        push["epoch"], push["n_chunks"], shift, push["consumers"], pid_base, b.stride(0), b.stride(1), c.stride(0),
        c.stride(1),
    )  # fmt: skip
    constexprs = dict(
        WORLD=world_size, BLOCK_M=plan.BLOCK_M, BLOCK_N=plan.BLOCK_N, BLOCK_K=plan.BLOCK_K, GROUP_M=plan.GROUP_M,
        SPLIT_K=plan.SPLIT_K, COMM_SMS=push["comm_sms"], CHUNK_M=max(plan.chunk_m, 1), WAIT=dynamic,
        GATHER_LOCAL=push["gather_local"], CP_M=32, CP_K=256, DYNAMIC=dynamic,
        PRODUCERS_CONSUME=dynamic and kind == "cuda", UPCAST=INTERPRETED, THREADS=32 * plan.num_warps,
        FENCE=dynamic and not INTERPRETED, **compile_options(plan.__dict__),
    )  # fmt: skip
    return args, constexprs


def triton_cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def _pull(plan, a, b, c_out, world, R, K, N_r, want_gathered):
    M = R * world.world_size
    elem = a[0].element_size()
    gathered = []
    with _shared_a(a, world, R, K) as (buf, views, bases):
        for i, r in enumerate(world.local_ranks):
            src = bases[i][r]
            deltas = world.int_table(tuple(_offset(bases[i][p], src, elem) for p in range(world.world_size)))
            _launch_gemm(plan, world, i, views[i], b[i], c_out[i], K, N_r, R=R, rows=M, rank=r,
                         shift=(r * R) // plan.BLOCK_M, src=views[i], deltas=deltas)  # fmt: skip
            if want_gathered:
                peers = [buf.peers[i][p] for p in range(world.world_size)]
                start = (bases[i][0] - peers[0].data_ptr()) // elem
                gathered.append(torch.cat([p[start : start + R * K].view(R, K) for p in peers]))
    return c_out, gathered


@dataclass(frozen=True)
class _Inboxes:
    """This call's half of the push inboxes and flags, shared by `push` and `push_cublas`.

    Both count calls on one epoch, so the inbox halves alternate across modes as well: a rank writes
    call t+2's rows into a half only after (stream order, through its wait on call t+1's flags) every
    peer finished call t's reads of it.
    """

    epoch: int
    slot: int
    half: int
    n_chunks: int
    inbox: Any
    flags: Any


def _inboxes(world: World, R: int, K: int, chunk_m: int, dtype: torch.dtype) -> _Inboxes:
    W = world.world_size
    epoch = world.next_epoch("ag_gemm.push")
    slot = _slot(R, K)
    inbox = world.symmetric("ag_gemm.inbox", (2 * W * slot,), dtype)
    n_chunks = triton_cdiv(R, chunk_m)
    # Flag (p, c) sits at p * n_chunks + c: one buffer per chunk count, so every flag has one writer
    # (rank p) and its epochs only grow. A shared buffer would let a slot pass between writers as the
    # chunk count changes, and with W > 2 a late write of call t could land after a peer's t+1.
    flags = world.symmetric(f"ag_gemm.flags.{n_chunks}", (W * n_chunks,), torch.int32, zero=True)
    return _Inboxes(epoch, slot, (epoch % 2) * W * slot, n_chunks, inbox, flags)


def _push(plan, a, b, c_out, world, R, K, N_r, want_gathered):
    W = world.world_size
    M = R * W
    box = _inboxes(world, R, K, plan.chunk_m, a[0].dtype)
    work = triton_cdiv(M, plan.BLOCK_M) * triton_cdiv(N_r, plan.BLOCK_N) * plan.SPLIT_K
    consumers = max(1, min(_num_sms(world) - plan.comm_sms, work))
    tickets = world.scratch("ag_gemm.tickets", 1, torch.int32)  # this rank's tile counter
    done = world.scratch("ag_gemm.push_done", box.n_chunks, torch.int32)  # pieces copied per chunk, kept at zero
    fence = world.scratch("ag_gemm.fence", (plan.comm_sms + consumers) * 32 * plan.num_warps, torch.int32)
    views = [_push_views(world, box, i, R, K) for i in range(len(a))]
    launches = []
    for i, r in enumerate(world.local_ranks):
        local_inbox = box.inbox.tensors[i][box.half :]
        deltas = world.int_table(tuple(p * box.slot for p in range(W)))
        push = dict(inbox=local_inbox, inbox_deltas=views[i].deltas, flags=box.flags.tensors[i],
                    flag_ptrs=box.flags.ptrs[i], epoch=box.epoch, n_chunks=box.n_chunks, slot=box.slot,
                    comm_sms=plan.comm_sms, consumers=consumers, gather_local=want_gathered, tickets=tickets[i],
                    done=done[i], fence=fence[i])  # fmt: skip
        launches.append((i, r, local_inbox, deltas, push, c_out[i]))
    # The interpreter runs launches in order: every rank's producers before any rank's consumers.
    phases = [(0, plan.comm_sms), (plan.comm_sms, plan.comm_sms + consumers)] if world.kind == "local" else [None]
    for phase in phases:
        for i, r, local_inbox, deltas, push, c in launches:
            _launch_gemm(plan, world, i, a[i], b[i], c, K, N_r, R=R, rows=M, rank=r, shift=(r * R) // plan.BLOCK_M,
                         src=local_inbox, deltas=deltas, push=push, pid_range=phase)  # fmt: skip
    for counter in tickets:  # the kernel counts tiles up from zero: hand the counter back zeroed
        counter.zero_()
    outs = [entry[-1] for entry in launches]
    gathered = [torch.cat(v.rows) for v in views] if want_gathered else []
    return outs, gathered


def _push_cublas(plan, a, b, c_out, world, R, K, N_r, want_gathered):
    """Pushes as in `push`, but as a kernel (or copy-engine copies) of its own, and cuBLAS multiplies.

    No barrier: a rank reads only its own A and what peers pushed to it, and its next writes into a
    peer wait (in stream order) on that peer's flags of the call before, as `_Inboxes` says.
    Launch work is kept small (it is most of a small-M call's cost on the host): views and address
    tables are built once per inbox half, and on a GPU world a gather-then-GEMM call waits inside
    its push launch instead of launching a wait kernel.
    """
    W = world.world_size
    M = R * W
    gathered_order = plan.gemm_order == "gathered"
    chunk_m = triton.next_power_of_2(R) if gathered_order else plan.chunk_m  # gathered: one chunk per rank
    box = _inboxes(world, R, K, chunk_m, a[0].dtype)
    gather_local = want_gathered or gathered_order
    fold_wait = gathered_order and world.kind == "cuda"  # see ag_push_kernel: not under the interpreter
    views = [_push_views(world, box, i, R, K) for i in range(len(a))]
    # every rank pushes before any rank waits (the interpreter runs launches in order)
    for i, r in enumerate(world.local_ranks):
        with contextlib.nullcontext() if gathered_order else world.side_stream(i):
            if plan.push_by == "sm":
                _launch_push(plan, world, box, i, r, a[i], views[i], K, R, chunk_m, gather_local, fold_wait)
            else:
                _copy_engine_push(world, box, i, r, a[i], views[i], R, chunk_m, gather_local, fold_wait)
    gathered = []
    for i, r in enumerate(world.local_ranks):
        v, flags = views[i], box.flags.tensors[i]
        if gathered_order:
            if not fold_wait:
                ag_wait_kernel[(1,)](flags, 0, M - 1, R, r, box.epoch, box.n_chunks, CHUNK_M=chunk_m)
            if v.all_rows is not None:  # ranks' rows are contiguous: one GEMM, B read once
                torch.mm(v.all_rows, b[i], out=c_out[i])
            else:
                for p in range(W):
                    torch.mm(v.rows[p], b[i], out=c_out[i][p * R : (p + 1) * R])
        else:
            torch.mm(a[i], b[i], out=c_out[i][r * R : (r + 1) * R])
            for p in [(r + j) % W for j in range(1, W)]:
                for lo in range(0, R, chunk_m):
                    hi = min(R, lo + chunk_m)
                    ag_wait_kernel[(1,)](flags, p * R + lo, p * R + hi - 1, R, r, box.epoch, box.n_chunks,
                                         CHUNK_M=chunk_m)  # fmt: skip
                    rows = v.rows[p] if hi - lo == R else v.rows[p][lo:hi]
                    torch.mm(rows, b[i], out=c_out[i][p * R + lo : p * R + hi])
            world.wait_side_stream()  # the side stream read A: the caller may overwrite it after us
        if want_gathered:
            gathered.append(torch.cat(v.rows))
    return c_out, gathered


@dataclass(frozen=True)
class _PushViews:
    """One rank's views of one inbox half (`push` and `push_cublas`), built once: slicing tensors and
    building address tables cost host time on every call."""

    deltas: torch.Tensor  # element offsets of every rank's inbox half from this rank's
    dests: list[torch.Tensor]  # [R, K] where this rank's rows go in rank p's inbox (p's mapping)
    rows: list[torch.Tensor]  # [R, K] rank p's rows in this rank's inbox
    all_rows: torch.Tensor | None  # [M, K] all of them, when the slots are contiguous


def _push_views(world: World, box: _Inboxes, i: int, R: int, K: int) -> _PushViews:
    own = box.inbox.tensors[i]
    # keyed like the inbox (by dtype); the world drops these if a buffer is regrown
    key = ("ag_gemm.push_views", own.dtype, i, box.half, box.slot, R, K)
    views = world.derived.get(key)
    if views is None:
        W, r = world.world_size, world.local_ranks[i]
        half = own[box.half :]
        start = box.half + r * box.slot
        elem = own.element_size()
        deltas = tuple(_offset(box.inbox.peers[i][p][box.half :], half.data_ptr(), elem) for p in range(W))
        views = _PushViews(
            deltas=world.int_table(deltas),
            dests=[box.inbox.peers[i][p][start : start + R * K].view(R, K) for p in range(W)],
            rows=[half[p * box.slot : p * box.slot + R * K].view(R, K) for p in range(W)],
            all_rows=half[: W * R * K].view(W * R, K) if box.slot == R * K else None,
        )
        world.derived[key] = views
    return views


def _launch_push(plan, world, box, i, r, a_i, views, K, R, chunk_m, gather_local, wait_all):
    done = world.scratch("ag_gemm.push_done", box.n_chunks, torch.int32)[i]
    fence = world.scratch("ag_gemm.fence", plan.comm_sms * 32 * plan.num_warps, torch.int32)[i]
    args, constexprs = _push_kernel_args(
        plan, world.world_size, a_i, box.inbox.tensors[i][box.half :], views.deltas, box.flags.ptrs[i],
        box.flags.tensors[i], done, fence, K, R, box.slot, r, box.epoch, box.n_chunks, chunk_m, gather_local,
        wait_all,
    )  # fmt: skip
    ag_push_kernel[(plan.comm_sms,)](*args, **constexprs)


def _push_kernel_args(plan, world_size, a, inbox, inbox_deltas, flag_ptrs, flags, done, fence, K, R, slot, rank,
                      epoch, n_chunks, chunk_m, gather_local, wait_all):  # fmt: skip
    """The push kernel's arguments and constants; shared by launches and ahead-of-time compiles."""
    args = (a, inbox, inbox_deltas, flag_ptrs, flags, done, fence, K, R, slot, rank, epoch, n_chunks)
    constexprs = dict(
        WORLD=world_size, COMM_SMS=plan.comm_sms, CHUNK_M=chunk_m, GATHER_LOCAL=gather_local, CP_M=32, CP_K=256,
        THREADS=32 * plan.num_warps, FENCE=not INTERPRETED, WAIT_ALL=wait_all, num_warps=plan.num_warps,
    )  # fmt: skip
    return args, constexprs


def _copy_engine_push(world, box, i, r, a_i, views, R, chunk_m, gather_local, wait_all):
    """Copy-engine copies of each chunk into every peer's inbox, then one kernel releasing its flags."""
    W = world.world_size
    dests = [views.dests[(r + j) % W] for j in range(1, W)] + ([views.dests[r]] if gather_local else [])
    for c, lo in enumerate(range(0, R, chunk_m)):
        hi = min(R, lo + chunk_m)
        src = a_i if hi - lo == R else a_i[lo:hi]
        for dest in dests:
            (dest if hi - lo == R else dest[lo:hi]).copy_(src, non_blocking=True)
        if W > 1:
            ag_signal_kernel[(1,)](box.flags.ptrs[i], box.flags.tensors[i], r, box.epoch, box.n_chunks, c, R,
                                   WORLD=W, WAIT_ALL=wait_all, CHUNK_M=chunk_m)  # fmt: skip


def _ce(plan, a, b, c_out, world, R, K, N_r, want_gathered):
    W = world.world_size
    M = R * W
    elem = a[0].element_size()
    gathered_buf = world.symmetric("ag_gemm.gathered", (M * K,), a[0].dtype)
    chunk = triton_cdiv(R, plan.ce_chunks)
    gathered = []
    with _shared_a(a, world, R, K) as (buf, views, bases):
        for i, r in enumerate(world.local_ranks):
            g = gathered_buf.tensors[i][: M * K].view(M, K)
            c = c_out[i]
            events = []
            with world.side_stream(i):  # copy engine: peers' rows, chunk by chunk, in ring order
                for p in [(r + j) % W for j in range(1, W)]:
                    peer = buf.peers[i][p]
                    start = (bases[i][p] - peer.data_ptr()) // elem
                    src = peer[start : start + R * K].view(R, K)
                    for lo in range(0, R, chunk):
                        hi = min(R, lo + chunk)
                        g[p * R + lo : p * R + hi].copy_(src[lo:hi], non_blocking=True)
                        events.append((p * R + lo, hi - lo, world.record_event()))
            _consume(plan, world, i, views[i], b[i], c[r * R : (r + 1) * R])  # local rows first
            for row_lo, rows, event in events:
                world.wait_event(event)
                _consume(plan, world, i, g[row_lo : row_lo + rows], b[i], c[row_lo : row_lo + rows])
            world.wait_side_stream()
            if want_gathered:
                g[r * R : (r + 1) * R].copy_(views[i])
                gathered.append(g.clone())
    return c_out, gathered


def _consume(plan, world, i, a_rows, b, c_rows):
    """c_rows = a_rows @ b for contiguous rows: cuBLAS, or the tile kernel with no communication."""
    if plan.ce_consumer == "cublas":
        torch.mm(a_rows, b, out=c_rows)
        return
    rows, K = a_rows.shape
    _launch_gemm(plan, world, i, a_rows, b, c_rows, K, b.shape[1], R=rows, rows=rows)


def _num_sms(world: World) -> int:
    if world.device.type == "cuda":
        return torch.cuda.get_device_properties(world.device).multi_processor_count
    return 132  # the interpreter's nominal Hopper, as DeviceLimits.nominal_hopper


_MODES = {"pull": _pull, "push": _push, "push_cublas": _push_cublas, "ce": _ce, "baseline": _baseline}


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """float32 reference: every rank's C from all ranks' A shards and each rank's B."""
    gathered = torch.cat([x.float() for x in a], dim=0)
    return [gathered @ bi.float() for bi in b]


# ----------------------------------------------------------------------------------------------
# the family: what the tuner and the benchmarks call


@dataclass
class AgGemmInputs:
    """Every local rank's shards, and all ranks' A shards for the reference."""

    problem: Any
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    all_a: list[torch.Tensor]


class AgGemmFamily(Family):
    name = "ag_gemm"
    space = "ag_gemm"
    dims = ("M", "N", "K")
    source_modules = ("jointtune.kernels._ag_gemm_kernel", "jointtune.kernels.world")

    def make_inputs(self, problem: Any, world: World, *, seed: int, symmetric: bool = True) -> AgGemmInputs:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W or M % W or N % W:
            raise ShapeError(
                f"shape: M={M} and N={N} must be divisible by world_size={W} (the problem says {problem.world_size})"
            )
        dtype = getattr(torch, problem.dtype)
        R, N_r = M // W, N // W
        gen = torch.Generator(device="cpu").manual_seed(seed)
        # every rank draws every shard from one seed, so each can build the reference on its own
        all_a = [(torch.randn(R, K, generator=gen) / K**0.25).to(dtype).to(world.device) for _ in range(W)]
        all_b = [(torch.randn(K, N_r, generator=gen) / K**0.25).to(dtype) for _ in range(W)]
        b = [all_b[r].to(world.device) for r in world.local_ranks]
        a = [all_a[r] for r in world.local_ranks]
        if symmetric:
            slots = world.empty((R, K), dtype)
            for s, x in zip(slots, a):
                s.copy_(x)
            a = slots
        return AgGemmInputs(problem, a, b, all_a)

    def run(self, inputs: AgGemmInputs, config: Mapping[str, Any], world: World) -> list[torch.Tensor]:
        return ag_gemm(inputs.a, inputs.b, world=world, config=config)

    def reference(self, inputs: AgGemmInputs) -> list[torch.Tensor]:
        return reference(inputs.all_a, inputs.b)

    def max_error(self, outputs: Any, reference: Any) -> float:
        worst = 0.0
        for out, ref in zip(outputs, reference):
            err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            worst = max(worst, err if err == err else float("inf"))
        return worst

    def flops(self, problem: Any) -> float:
        M, N, K = (problem.dim(d) for d in self.dims)
        return 2.0 * M * N * K

    def precompile(self, config: Mapping[str, Any], problem: Any) -> None:
        """Compile the config's Triton kernel ahead of its trial (tuners call this on a thread pool)."""
        plan = _plan(config)
        if INTERPRETED or not _runs_triton(plan):
            return
        M, N, K = (problem.dim(d) for d in self.dims)
        device = torch.device("cuda", torch.cuda.current_device())
        for kernel, args, constexprs in standin_launches(
            plan, M=M, N=N, K=K, world_size=problem.world_size, dtype=getattr(torch, problem.dtype), device=device
        ):
            warmup = getattr(kernel, "warmup", None)
            if warmup is not None:
                warmup(*args, grid=(1,), **constexprs)


def _runs_triton(plan: Plan) -> bool:
    if plan.mode == "baseline" or (plan.mode == "ce" and plan.ce_consumer == "cublas"):
        return False
    return not (plan.mode == "push_cublas" and plan.push_by == "ce")


def standin_launches(
    plan: Plan, *, M: int, N: int, K: int, world_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """(kernel, arguments, constants) of the big Triton kernel a call of this shape launches.

    1-element stand-in tensors with the call's real dims: compiles specialise on dtypes, on which
    integers are 16-divisible and on pointer alignment, so they compile what the call will launch
    (ahead-of-time compiles). The tiny wait and signal kernels compile on first use.
    """
    R, N_r = M // world_size, N // world_size
    t = torch.empty(1, dtype=dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    if plan.mode == "push_cublas":
        if plan.push_by == "ce":
            return []
        gathered = plan.gemm_order == "gathered"
        chunk_m = triton.next_power_of_2(R) if gathered else plan.chunk_m
        args, constexprs = _push_kernel_args(
            plan, world_size, t, t, i64, i64, i32, i32, i32, K, R, _slot(R, K), 0, 0, 2, chunk_m, gathered, gathered
        )
        return [(ag_push_kernel, args, constexprs)]
    b = torch.empty_strided((1, 1), (N_r, 1), dtype=dtype, device=device)
    c = torch.empty_strided((1, 1), (N_r, 1), dtype=dtype, device=device)
    push = dict(inbox=t, inbox_deltas=i64, flags=i32, flag_ptrs=i64, epoch=0, n_chunks=2, slot=_slot(R, K),
                comm_sms=plan.comm_sms if plan.mode == "push" else 0, consumers=2, gather_local=False, tickets=i32,
                done=i32, fence=i32)  # fmt: skip
    args, constexprs = _kernel_args(
        plan, world_size, "cuda", t, t, i64, b, c, f32 if plan.SPLIT_K > 1 else c, i32, push, K, N_r, R, M, 0, 0, 0, 0
    )
    return [(ag_gemm_kernel, args, constexprs)]


register_family(AgGemmFamily())
