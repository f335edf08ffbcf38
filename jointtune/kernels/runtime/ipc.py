"""Peer memory for ranks that share one GPU: CUDA IPC handles and a barrier kernel of ours.

torch's symmetric memory refuses two ranks on one device ("allocations from overlapping devices"), and NCCL
refuses them too. Yet `torchrun --nproc-per-node=2` over a gloo group on a one-GPU machine is how a developer
with one GPU runs the multi-rank paths (every mode's flags, epochs and inboxes between processes, graph replays
included): each rank's buffer is an ordinary allocation whose IPC handle goes to every peer through the process
group, and `ipc_barrier_kernel` stands in for symmetric memory's barrier.

The GPU time-slices the processes' contexts, so every wait on a peer costs a slice (about 4 ms per round trip,
measured on one H100): this is for checking correctness, never for timing.

Example (on a GPU, inside `torchrun --nproc-per-node=2` with `init_process_group("gloo")`):
    >>> mine = torch.zeros(4, device="cuda")  # doctest: +SKIP
    >>> peers = exchange(mine, dist.group.WORLD)  # doctest: +SKIP
    >>> peers[dist.get_rank()] is mine  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl


def exchange(tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
    """Every rank's `tensor` (same size on all), mapped into this process: its own where the rank is this one.

    Collective over `group`. The GPU work queued on `tensor` (zeroing) is finished before any peer maps it."""
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.synchronize(tensor.device)
    W, rank = dist.get_world_size(group), dist.get_rank(group)
    # one share per peer: torch counts a shared block's users by shares, and each peer's mapping releases one
    mine = [None if p == rank else reduce_tensor(tensor) for p in range(W)]
    handles: list[Any] = [None] * W
    dist.all_gather_object(handles, mine, group=group)
    return [tensor if p == rank else handles[p][rank][0](*handles[p][rank][1]) for p in range(W)]


@triton.jit(do_not_specialize=["rank"])
def ipc_barrier_kernel(pad_ptrs_ptr, rank, WORLD: tl.constexpr):
    # Every rank's pad holds a slot per peer. Signal: peer p's slot `rank` goes 0 -> 1, waiting while it is still 1
    # (p has not consumed this rank's previous signal yet, so a signal is never lost). Wait: this rank's slot p goes
    # 1 -> 0 for every peer. Nothing is left set between barriers, so a captured graph replays it as often as it likes.
    # Release after a barrier and acquire before one, as every handoff in `signals` (its module doc).
    mine = tl.load(pad_ptrs_ptr + rank).to(tl.pointer_type(tl.int32))
    tl.debug_barrier()
    for j in range(1, WORLD):
        peer = (rank + j) % WORLD
        slot = tl.load(pad_ptrs_ptr + peer).to(tl.pointer_type(tl.int32)) + rank
        while tl.atomic_cas(slot, 0, 1, sem="release", scope="sys") != 0:
            pass
    for j in range(1, WORLD):
        while tl.atomic_cas(mine + (rank + j) % WORLD, 1, 0, sem="acquire", scope="sys") != 1:
            pass
    tl.debug_barrier()


def ipc_barrier(pad_ptrs: torch.Tensor, rank: int, world_size: int) -> None:
    """All ranks reach this point in stream order before any goes on (`pad_ptrs`: every rank's int32 pad of
    `world_size` zeroed slots, from `exchange`). One pad serves every barrier, as every rank issues its barriers in
    one order on one stream; two barriers in flight on different streams at once would take each other's signals."""
    ipc_barrier_kernel[(1,)](pad_ptrs, rank, WORLD=world_size, num_warps=1)
