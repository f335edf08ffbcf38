"""The baseline's collectives on CUDA, in every variant a user could pick (`search_spaces._collectives`).

NCCL runs its symmetric kernels (`ncclSymk*`) only on buffers registered with the communicator as a symmetric window,
and silently falls back to its default kernels otherwise. We register a memory pool of NCCL's allocator per buffer
(torch's `ProcessGroupNCCL.register_mem_pool(pool, symm=True)`), once and for the process's life: a captured graph
holds the window, so it is never deregistered, and one pool per buffer means no re-registration when a later plan
allocates.
This needs no `symm_mem.set_backend("NCCL")`, which would take torch's symmetric memory away from our own kernels
(seen on 2x H200: every fused mode then failed with `NYI`); both live in one process (bench/results/collectives_*).

NCCL's copy-engine all-gather (`nccl_ce`) runs on a second communicator of the same ranks whose config asks for no
CTAs (NCCL 2.28's zero-CTA policy), on buffers in that communicator's windows. torch's symmetric-memory all-reduces
(`torch_two_shot`, `torch_one_shot`) read a buffer of torch's symmetric memory, which the world allocates.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from jointtune.errors import KernelError

#: NCCL's zero-CTA policy (ncclConfig_t.CTAPolicy = NCCL_CTA_POLICY_ZERO): collectives on the copy engine
CTA_POLICY_ZERO = 2
#: the variants that need their operands in an NCCL window, and those in torch's symmetric memory
WINDOWED = ("nccl_symm", "nccl_ce")
TORCH_SYMMETRIC = ("torch_two_shot", "torch_one_shot")


class CudaCollectives:
    """One world's collective variants: the groups they run on, the window buffers they read, and the calls."""

    def __init__(self, group: Any, device: torch.device, symmetric: Any) -> None:
        self.group, self.device = group, device
        #: allocates a buffer of torch's symmetric memory (the world's own `_allocate`)
        self._symmetric = symmetric
        self._ce_group: Any = None

    def group_of(self, collective: str) -> Any:
        if collective != "nccl_ce":
            return self.group
        if self._ce_group is None:
            import torch.distributed as dist

            options = dist.ProcessGroupNCCL.Options()
            options.config.cta_policy = CTA_POLICY_ZERO
            ranks = dist.get_process_group_ranks(self.group)
            self._ce_group = dist.new_group(ranks, backend="nccl", pg_options=options, device_id=self.device)
        return self._ce_group

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, collective: str) -> torch.Tensor:
        """A tensor the variant reads without a copy: in a registered NCCL window, torch's symmetric memory, or
        plain memory."""
        numel = 1
        for s in shape:
            numel *= int(s)
        if collective in WINDOWED:
            backend = self.group_of(collective)._get_backend(self.device)
            pool = torch.cuda.MemPool(backend.mem_allocator)
            with torch.cuda.use_mem_pool(pool):
                tensor = torch.empty(max(numel, 1), dtype=dtype, device=self.device)
            torch.cuda.synchronize(self.device)
            backend.register_mem_pool(pool, symm=True)  # collective: every rank's plan allocates alike
            _outlive_the_process(pool)
        elif collective in TORCH_SYMMETRIC:
            tensor = self._symmetric(max(numel, 1), dtype)
        else:
            tensor = torch.empty(max(numel, 1), dtype=dtype, device=self.device)
        return tensor[:numel].view(shape)

    def all_gather(self, target: torch.Tensor, shard: torch.Tensor, collective: str) -> None:
        import torch.distributed as dist

        dist.all_gather_into_tensor(target, shard, group=self.group_of(collective))

    def reduce_scatter(self, target: torch.Tensor, partial: torch.Tensor, collective: str) -> None:
        import torch.distributed as dist

        dist.reduce_scatter_tensor(target, partial, group=self.group_of(collective))

    def all_reduce(self, tensor: torch.Tensor, collective: str) -> None:
        """In place."""
        if collective == "torch_two_shot":
            torch.ops.symm_mem.two_shot_all_reduce_(tensor, "sum", self.group.group_name)
        elif collective == "torch_one_shot":
            tensor.copy_(torch.ops.symm_mem.one_shot_all_reduce(tensor, "sum", self.group.group_name))
        else:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group_of(collective))


def _outlive_the_process(pool: Any) -> None:
    """Never destroy `pool`: a MemPool of NCCL's allocator frees through its communicator, and at interpreter exit the
    communicator is gone (after `destroy_process_group`), so its destructor aborts the process (`NCCL communicator was
    aborted`, SIGABRT, seen on 4x H200 with torch 2.11). The driver takes the memory back when the process ends."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pool))


def refuse_on_gloo(collective: str) -> None:
    """Ranks sharing a GPU talk over gloo: only the default variant exists there."""
    if collective != "nccl":
        raise KernelError(
            f'collective: "{collective}" needs one rank per GPU over NCCL; ranks sharing a GPU (a gloo group) run only '
            '"nccl" (a gloo collective there)'
        )
