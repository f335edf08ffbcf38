"""Where peer memory lives: one interface over CUDA symmetric memory and W simulated ranks.

Kernels see peers only through tables of addresses: a `SymmetricBuffer` gives, for every rank
this process drives, its own tensor and a device tensor of all ranks' base addresses. On the
CUDA world those come from `torch.distributed._symmetric_memory` (one process per GPU, NVLink
peer mappings); on the local world they are ordinary tensors of one process, which Triton's
interpreter follows like device pointers, so every mode and every launch path runs on the CPU.

Buffers are allocated once per name and grown to the largest size asked for (a collective on the
CUDA world: every rank asks in the same order, which holds since every rank runs the same ops). A
grown buffer replaces the old one for new plans only: plans (and CUDA graphs that captured them) keep
the buffers they were built on alive. Nothing that changes from call to call lives on the host: the
call counter that epochs and inbox halves come from is device memory (`call_state`, see `signals`).
Every world has a `name`, by which torch ops (which take no Python objects) find it.

Example:
    >>> world = create_world("local", world_size=2)
    >>> buf = world.symmetric("inbox", (4, 8), torch.float32)  # flat, at least 4 * 8 elements, one per rank
    >>> [t.shape for t in buf.tensors]
    [torch.Size([32]), torch.Size([32])]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from jointtune.errors import KernelError
from jointtune.kernels.runtime.collectives import CudaCollectives, refuse_on_gloo
from jointtune.kernels.runtime.device import capturing, refuse_during_capture
from jointtune.kernels.runtime.eager_graph import EagerGraphs

T = TypeVar("T")

# Multicast stays off on the shared NVLink machines; we never need it.
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")


@dataclass
class SymmetricBuffer:
    """One named buffer on every rank: `tensors[i]` belongs to `local_ranks[i]`.

    `ptrs` is an int64 device tensor of the base address of every rank's buffer (indexed by rank);
    `peer(i, p)` is rank p's buffer as rank `local_ranks[i]` sees it (a peer mapping on CUDA).
    """

    name: str
    numel: int
    dtype: torch.dtype
    tensors: list[torch.Tensor]
    ptrs: list[torch.Tensor]
    peers: list[list[torch.Tensor]]
    handle: Any = None

    def view(self, i: int, shape: Sequence[int], *, peer: int | None = None) -> torch.Tensor:
        """Rank `local_ranks[i]`'s buffer (or its mapping of `peer`'s) viewed as `shape`."""
        flat = self.tensors[i] if peer is None else self.peers[i][peer]
        n = 1
        for s in shape:
            n *= s
        return flat[:n].view(*shape)


_WORLDS: weakref.WeakValueDictionary[str, World] = weakref.WeakValueDictionary()
_NAMES = itertools.count()


def world_named(name: str) -> World:
    """The live world called `name` (torch ops carry worlds by name)."""
    world = _WORLDS.get(name)
    if world is None:
        live = ", ".join(sorted(_WORLDS)) or "none"
        raise KernelError(f"world: {name!r} is not a live world; live worlds: {live}")
    return world


class World(ABC):
    """The ranks of one tensor-parallel group, as this process sees them."""

    kind: str
    world_size: int
    rank: int
    device: torch.device
    #: launches of different ranks may run at the same time (one process per GPU). When False, the
    #: process issues every rank's launches one after another on one stream (simulated ranks), so a
    #: launcher must order them such that no program waits on a flag only a later launch sets.
    concurrent: bool

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], SymmetricBuffer] = {}
        self._tables: dict[tuple[int, ...], torch.Tensor] = {}
        self._scratch: dict[tuple[str, torch.dtype], list[torch.Tensor]] = {}
        self._user_views: dict[int, SymmetricBuffer] = {}  # data_ptr of a tensor `empty` handed out
        self._homes: dict[int, str] = {}  # data_ptr of a tensor `collective_empty` handed out -> its variant
        #: launch plans and communication state, built once per key and kept for the world's life:
        #: a CUDA graph that captured a plan's launches holds its buffers' addresses, not references
        self.plans: dict[tuple[Any, ...], Any] = {}
        self._eager: EagerGraphs | None = None
        self.name = f"{self.kind}-{next(_NAMES)}"
        _WORLDS[self.name] = self

    @property
    @abstractmethod
    def local_ranks(self) -> tuple[int, ...]:
        """Ranks this process drives: all of them on the local world, one on CUDA."""

    @property
    def eager(self) -> EagerGraphs:
        """Eager calls replayed from CUDA graphs of themselves, by call site (`eager_graph`)."""
        if self._eager is None:
            self._eager = EagerGraphs(self.device, on_failed_capture=self._after_failed_capture)
        return self._eager

    def _after_failed_capture(self) -> None:
        """Host state a call sets and unsets, put back after a capture that raised part way through a call."""
        return None

    def plan(self, key: tuple[Any, ...], build: Callable[[], T]) -> T:
        """The plan under `key`, built on first use (never during CUDA graph capture)."""
        plan = self.plans.get(key)
        if plan is None:
            refuse_during_capture(self.device, f"{key[0]}: building a launch plan")
            self._check_same_plan(key)
            plan = build()
            self.plans[key] = plan
        return plan

    def _check_same_plan(self, key: tuple[Any, ...]) -> None:
        """Ranks that build different plans for one call (A in symmetric memory on one rank, a plain tensor
        on another) would allocate alone or read peers' stale memory: checked where ranks run apart (a
        simulated world builds one plan for all its ranks from one call, so there is nothing to compare)."""
        return None

    def int_table(self, values: tuple[int, ...]) -> torch.Tensor:
        """A device int64 tensor holding `values`, made once: no host-to-device copy on the hot path."""
        table = self._tables.get(values)
        if table is None:
            refuse_during_capture(self.device, "an address table")
            table = torch.tensor(values, dtype=torch.int64, device=self.device)
            self._tables[values] = table
        return table

    def scratch(self, name: str, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """Zeroed private memory per local rank that kernels hand back zeroed (split-K slots, counters)."""
        key = (name, dtype)
        bufs = self._scratch.get(key)
        if bufs is None or bufs[0].numel() < numel:
            refuse_during_capture(self.device, f"scratch buffer {name!r}")
            bufs = [torch.zeros(max(numel, 1), dtype=dtype, device=self.device) for _ in self.local_ranks]
            self._scratch[key] = bufs
        return bufs

    def held(self, name: str, dtype: torch.dtype) -> SymmetricBuffer | None:
        """The symmetric buffer `name` of `dtype` as the world holds it now, or None; allocates nothing (unlike
        `symmetric`): for diagnostics that read what a call left in a family's buffer."""
        return self._buffers.get((name, dtype))

    def held_scratch(self, name: str, dtype: torch.dtype) -> list[torch.Tensor] | None:
        """The scratch buffer `name` of `dtype` per local rank as the world holds it now, or None (see `held`)."""
        return self._scratch.get((name, dtype))

    def symmetric(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, zero: bool = False) -> SymmetricBuffer:
        """The buffer `name`, at least `prod(shape)` elements, reused across calls."""
        numel = 1
        for s in shape:
            numel *= int(s)
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel < numel:
            refuse_during_capture(self.device, f"symmetric buffer {name!r}")
            buf = self._allocate(name, max(numel, 1), dtype, zero=zero)
            self._buffers[key] = buf
        return buf

    @abstractmethod
    def _allocate(self, name: str, numel: int, dtype: torch.dtype, *, zero: bool) -> SymmetricBuffer: ...

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> list[torch.Tensor]:
        """Tensors in symmetric memory for a producer to write into (one per local rank).

        A fused op reading them needs no copy-in; each call allocates a new buffer, so keep and
        reuse what it returns (it is the input slot of the next layer, not scratch).
        """
        refuse_during_capture(self.device, "world.empty")
        name = f"user-{len(self._buffers)}"
        buf = self._allocate(name, max(1, _prod(shape)), dtype, zero=False)
        self._buffers[(name, dtype)] = buf
        views = [buf.view(i, shape) for i in range(len(self.local_ranks))]
        for v in views:
            self._user_views[v.data_ptr()] = buf
        return views

    def symmetric_of(self, tensor: torch.Tensor) -> SymmetricBuffer | None:
        """The symmetric buffer `tensor` starts, if it came from `empty` (else None: copy it in)."""
        return self._user_views.get(tensor.data_ptr())

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def barrier(self, buffer: SymmetricBuffer | None = None) -> None:
        """All ranks reach this point (in stream order on CUDA) before any goes on."""

    @abstractmethod
    def all_gather(
        self, shards: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None, collective: str = "nccl"
    ) -> list[torch.Tensor]:
        """The baseline collective: an all-gather on CUDA (NCCL's default kernels, or the `collective` variant of
        `search_spaces._collectives`, its operands from `collective_empty`), a concatenation on the local world.

        `out` (one [W * rows, ...] tensor per local rank) receives the result instead of new tensors.
        """

    @abstractmethod
    def reduce_scatter(
        self, partials: Sequence[torch.Tensor], out: Sequence[torch.Tensor], collective: str = "nccl"
    ) -> None:
        """The baseline collective: rank r's `out` := rows [r*R, (r+1)*R) of the sum of every rank's [W*R, ...]
        partial (a reduce-scatter on CUDA, variant `collective`; on the local world a float32 sum in rank order)."""

    @abstractmethod
    def all_reduce(self, tensors: Sequence[torch.Tensor], collective: str = "nccl") -> None:
        """In place: every rank's tensor := the sum of all ranks' (variant `collective` on CUDA; on the local world
        a float32 sum in rank order, the same bits on every rank)."""

    def collective_empty(self, shape: Sequence[int], dtype: torch.dtype, collective: str) -> list[torch.Tensor]:
        """Tensors (one per local rank) that the baseline's `collective` variant reads and writes without a copy:
        in an NCCL symmetric window (nccl_symm, nccl_ce), torch's symmetric memory (torch_*), or plain (nccl)."""
        refuse_during_capture(self.device, f"a buffer of the {collective} collective")
        out = self._collective_tensors(tuple(int(s) for s in shape), dtype, collective)
        for t in out:
            self._homes[t.data_ptr()] = collective
        return out

    def _collective_tensors(self, shape: tuple[int, ...], dtype: torch.dtype, collective: str) -> list[torch.Tensor]:
        """The tensors `collective_empty` hands out: plain ones where ranks are simulated (every variant is one
        collective there)."""
        return [torch.empty(shape, dtype=dtype, device=self.device) for _ in self.local_ranks]

    def collective_home(self, tensor: torch.Tensor) -> str | None:
        """The variant whose buffer `tensor` starts, if `collective_empty` made it (else None: it is copied in)."""
        return self._homes.get(tensor.data_ptr())

    def side_stream(self, i: int) -> contextlib.AbstractContextManager[Any]:
        """Context in which copy-engine work of local rank index `i` is issued."""
        return contextlib.nullcontext()

    def record_event(self, event: Any = None) -> Any:
        """Record `event` (or a new one) on the current stream; None where streams don't exist."""
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def wait_side_stream(self) -> None:
        return None

    def close(self) -> None:
        if self._eager is not None:
            self._eager.clear()
        self._buffers.clear()
        self.plans.clear()
        _WORLDS.pop(self.name, None)


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


@dataclass
class LocalWorld(World):
    """W simulated ranks in one process over ordinary tensors (CPU interpreter, or one GPU for debugging).

    Triton's interpreter runs a grid's programs one after another and our launches one rank after
    another, so launchers order their launches such that no program waits on a flag that only a
    later program sets (push: every rank's producers before any rank's consumers).
    """

    world_size: int = 2
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    kind: str = "local"
    rank: int = 0
    concurrent = False  # not a field: simulated ranks always launch one after another

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise KernelError(f"world_size: {self.world_size} is not allowed; it must be >= 1")
        World.__init__(self)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.world_size))

    def _allocate(self, name: str, numel: int, dtype: torch.dtype, *, zero: bool) -> SymmetricBuffer:
        alloc = torch.zeros if zero else torch.empty
        tensors = [alloc(numel, dtype=dtype, device=self.device) for _ in range(self.world_size)]
        table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=self.device)
        return SymmetricBuffer(
            name, numel, dtype, tensors, ptrs=[table] * self.world_size, peers=[tensors] * self.world_size
        )

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self, buffer: SymmetricBuffer | None = None) -> None:
        return None  # launches of all simulated ranks are already ordered

    def all_gather(
        self, shards: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None, collective: str = "nccl"
    ) -> list[torch.Tensor]:
        if out is None:
            gathered = torch.cat(list(shards), dim=0)
            return [gathered] * self.world_size
        torch.cat(list(shards), dim=0, out=out[0])
        for o in out[1:]:
            if o is not out[0]:
                o.copy_(out[0])
        return list(out)

    def reduce_scatter(
        self, partials: Sequence[torch.Tensor], out: Sequence[torch.Tensor], collective: str = "nccl"
    ) -> None:
        rows = out[0].shape[0]
        for r, o in zip(self.local_ranks, out):
            total = partials[0][r * rows : (r + 1) * rows].float()
            for p in partials[1:]:
                total = total + p[r * rows : (r + 1) * rows].float()
            o.copy_(total)

    def all_reduce(self, tensors: Sequence[torch.Tensor], collective: str = "nccl") -> None:
        total = tensors[0].float()
        for t in tensors[1:]:
            total = total + t.float()
        for t in tensors:
            t.copy_(total)


class CudaWorld(World):
    """One rank per process over NVLink, through PyTorch's symmetric memory.

    Needs `torch.distributed` initialised with NCCL and the current CUDA device set. A side
    stream carries copy-engine work; events order it against the compute stream. Ranks that share
    one GPU (a gloo group) get peer memory through CUDA IPC instead (`ipc`): for checking, not timing.
    """

    kind = "cuda"
    concurrent = True

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise KernelError("world: torch.distributed is not initialised; call init_process_group('nccl') first")
        super().__init__()
        self.group = group or dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self._local_ranks = (self.rank,)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._side = torch.cuda.Stream(device=self.device)
        #: work was issued on the side stream since the last join (a join without a fork would make a captured
        #: stream wait on one outside the capture, which invalidates the capture: a world of one rank sends nothing)
        self._side_used = False
        self._group_name = self.group.group_name
        #: two ranks on one device (a gloo group on a one-GPU machine): peer memory through CUDA IPC handles and
        #: our barrier kernel, where symmetric memory (and NCCL) refuse; for checking, not timing (`ipc`)
        self.shared_gpu = self._ranks_share_a_gpu()
        self._ipc_pads: SymmetricBuffer | None = None
        self._ipc_kept: list[SymmetricBuffer] = []
        #: the baseline's collective variants: their groups, window buffers and calls
        self.collectives = CudaCollectives(
            self.group,
            self.device,
            lambda numel, dtype: self._allocate("collective", numel, dtype, zero=False).tensors[0],
        )

    def _torch_symmetric(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of torch's symmetric memory, rendezvoused over the group (torch's own all-reduces read one)."""
        return self._allocate("collective", numel, dtype, zero=False).tensors[0]

    def _ranks_share_a_gpu(self) -> bool:
        import torch.distributed as dist

        if self.world_size == 1:
            return False
        uuids: list[Any] = [None] * self.world_size
        dist.all_gather_object(uuids, str(torch.cuda.get_device_properties(self.device).uuid), group=self.group)
        return len(set(uuids)) < self.world_size

    @property
    def local_ranks(self) -> tuple[int, ...]:
        return self._local_ranks

    def _check_same_plan(self, key: tuple[Any, ...]) -> None:
        import hashlib

        import torch.distributed as dist

        if self.world_size == 1:
            return
        text = repr(_rank_independent(key))
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")
        mine = torch.tensor([digest], dtype=torch.int64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        ranks = [r for r, t in enumerate(every) if int(t.item()) != digest]
        if ranks:
            raise KernelError(
                f"{key[0]}: ranks {ranks} call it differently from rank {self.rank} (shapes, dtypes, config, or A in "
                f"symmetric memory on some ranks only: {text[:300]}); every rank must make the same call"
            )

    def _allocate(self, name: str, numel: int, dtype: torch.dtype, *, zero: bool) -> SymmetricBuffer:
        if self.shared_gpu:
            from jointtune.kernels.runtime.ipc import exchange

            tensor = (torch.zeros if zero else torch.empty)(numel, dtype=dtype, device=self.device)
            peers = exchange(tensor, self.group)  # waits for the zeroing before any peer maps it
            table = torch.tensor([t.data_ptr() for t in peers], dtype=torch.int64, device=self.device)
            buf = SymmetricBuffer(name, numel, dtype, [tensor], ptrs=[table], peers=[peers])
            # Kept for the world's life: plans hold address tables, and a peer mapping closes with its last tensor
            # (symmetric memory ties the mappings to the allocation instead), as a peer may still write here.
            self._ipc_kept.append(buf)
            return buf
        import torch.distributed._symmetric_memory as symm_mem

        tensor = symm_mem.empty(numel, dtype=dtype, device=self.device)
        if zero:
            tensor.zero_()
        handle = symm_mem.rendezvous(tensor, self._group_name)
        table = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=self.device)
        peers = [tensor if p == self.rank else handle.get_buffer(p, (numel,), dtype, 0) for p in range(self.world_size)]
        handle.barrier(channel=0)  # every rank's zeroing is done before anyone signals into it
        torch.cuda.synchronize(self.device)
        return SymmetricBuffer(name, numel, dtype, [tensor], ptrs=[table], peers=[peers], handle=handle)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def barrier(self, buffer: SymmetricBuffer | None = None) -> None:
        if self.shared_gpu:
            from jointtune.kernels.runtime.ipc import ipc_barrier

            if self._ipc_pads is None:  # kept whole: its tensors and peer mappings must outlive every launch
                refuse_during_capture(self.device, "the first barrier (its pads)")
                self._ipc_pads = self._allocate("ipc.barrier", self.world_size, torch.int32, zero=True)
            ipc_barrier(self._ipc_pads.ptrs[0], self.rank, self.world_size)
            return
        if buffer is None:
            buffer = self.symmetric("barrier", (1,), torch.int32, zero=True)
        buffer.handle.barrier(channel=0)

    def all_gather(
        self, shards: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None, collective: str = "nccl"
    ) -> list[torch.Tensor]:
        (shard,) = shards
        if out is None:
            shape = (shard.shape[0] * self.world_size, *shard.shape[1:])
            target = torch.empty(shape, dtype=shard.dtype, device=shard.device)
        else:
            (target,) = out
        self._refuse_gloo_capture("the baseline's all-gather", collective)
        self.collectives.all_gather(target, shard.contiguous(), collective)
        return [target]

    def reduce_scatter(
        self, partials: Sequence[torch.Tensor], out: Sequence[torch.Tensor], collective: str = "nccl"
    ) -> None:
        ((partial,), (target,)) = partials, out
        self._refuse_gloo_capture("the baseline's reduce-scatter", collective)
        self.collectives.reduce_scatter(target, partial, collective)

    def all_reduce(self, tensors: Sequence[torch.Tensor], collective: str = "nccl") -> None:
        (tensor,) = tensors
        self._refuse_gloo_capture("an all-reduce", collective)
        self.collectives.all_reduce(tensor, collective)

    def _collective_tensors(self, shape: tuple[int, ...], dtype: torch.dtype, collective: str) -> list[torch.Tensor]:
        if self.shared_gpu:
            refuse_on_gloo(collective)
        return [self.collectives.empty(shape, dtype, collective)]

    def _after_failed_capture(self) -> None:
        self._side_used = False  # a later capture must not join a side stream it never forked

    def close(self) -> None:
        torch.cuda.synchronize(self.device)  # this rank's kernels are done with what is dropped below
        self._ipc_kept.clear()
        self._ipc_pads = None
        super().close()

    def _refuse_gloo_capture(self, what: str, collective: str = "nccl") -> None:
        if self.shared_gpu:
            refuse_on_gloo(collective)
        if self.shared_gpu and capturing(self.device):  # NCCL refuses ranks on one device, and gloo can't be captured
            raise KernelError(
                f"{what} during CUDA graph capture: ranks sharing one GPU run it over gloo, which a graph can't hold; "
                "capture a mode other than baseline there, or give each rank its own GPU (NCCL)"
            )

    def side_stream(self, i: int) -> contextlib.AbstractContextManager[Any]:
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        self._side_used = True
        return torch.cuda.stream(self._side)

    def record_event(self, event: Any = None) -> Any:
        event = event or torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait_event(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def wait_side_stream(self) -> None:
        if self._side_used:
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            self._side_used = False


def _rank_independent(value: Any) -> Any:
    """`value` with what differs between ranks of one call taken out: devices by type (cuda:0 on one rank,
    cuda:1 on another), sets sorted (their order follows per-process string hashing)."""
    if isinstance(value, torch.device):
        return value.type
    if isinstance(value, (set, frozenset)):
        return tuple(sorted((_rank_independent(v) for v in value), key=repr))
    if isinstance(value, (tuple, list)):
        return tuple(_rank_independent(v) for v in value)
    return value


def create_world(kind: str = "auto", world_size: int | None = None, *, group: Any = None) -> World:
    """`auto`: CUDA world when torch.distributed runs on GPUs, else a local world of `world_size` ranks."""
    if kind not in ("auto", "local", "cuda"):
        raise KernelError(f"world kind: {kind!r} is not allowed; choose auto, local or cuda")
    if world_size is not None and (type(world_size) is not int or world_size < 1):
        raise KernelError(f"world_size: {world_size!r} is not allowed; give an integer >= 1, or None (2 when local)")
    if kind == "auto":
        import torch.distributed as dist

        use_cuda = torch.cuda.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl"
        kind = "cuda" if use_cuda else "local"
    if kind == "cuda":
        world = CudaWorld(group)
        if world_size is not None and world_size != world.world_size:
            raise KernelError(f"world_size: {world_size} does not match the process group's {world.world_size}")
        return world
    return LocalWorld(world_size=2 if world_size is None else world_size)


def iter_local(world: World) -> Iterator[tuple[int, int]]:
    """(index into per-rank lists, rank) for every rank this process drives."""
    yield from enumerate(world.local_ranks)
