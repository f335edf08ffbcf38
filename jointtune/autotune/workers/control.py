"""Control traffic between the ranks of one tuning group: configs out, timings back.

Rank 0 talks to Optuna; every other rank only follows. Control messages go over a gloo process
group, which works on CPU-only machines and next to the NCCL group the kernels use on GPUs; a
group of one process (the local world, which simulates all ranks itself) needs no messages.

Example:
    >>> control = SoloControl()
    >>> control.broadcast({"op": "stop"}), control.all_reduce_max([1.0, 2.0])
    ({'op': 'stop'}, [1.0, 2.0])
"""

from __future__ import annotations

import datetime
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

#: Followers wait in a broadcast while rank 0 waits for work (other groups' trials to finish or go
#: stale), so collectives must outlive any such wait; a dead peer still fails them at once.
CONTROL_TIMEOUT = datetime.timedelta(hours=24)


class Control(ABC):
    """Collectives over the ranks of one group (rank 0 is the coordinator)."""

    rank: int = 0
    size: int = 1

    @abstractmethod
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (the argument is ignored elsewhere)."""

    @abstractmethod
    def all_reduce_max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over ranks."""

    @abstractmethod
    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, indexed by rank."""

    @abstractmethod
    def barrier(self) -> None: ...

    def close(self) -> None:
        return None


class SoloControl(Control):
    """One process drives every rank (the local world): collectives are identities."""

    def broadcast(self, obj: Any) -> Any:
        return obj

    def all_reduce_max(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None


class GlooControl(Control):
    """Collectives over a gloo process group of one process per rank."""

    def __init__(self, group: Any = None, *, owns_default_group: bool = False) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = group
        self._owns = owns_default_group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def broadcast(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def all_reduce_max(self, values: Sequence[float]) -> list[float]:
        import torch

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX, group=self._group)
        return tensor.tolist()

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def close(self) -> None:
        if self._owns and self._dist.is_initialized():
            self._dist.destroy_process_group()


def init_control(*, use_cuda: bool, device_index: int | None = None) -> Control:
    """Join the group named by the environment (torchrun or our supervisor set RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT). On GPUs the default group is NCCL (for the kernels' world) and a
    gloo group carries control; on CPUs one gloo group does both. A CPU group of one process
    needs no process group at all.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1 and not use_cuda:
        return SoloControl()
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if use_cuda:
        torch.cuda.set_device(device_index if device_index is not None else int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=CONTROL_TIMEOUT)
        return GlooControl(dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT), owns_default_group=True)
    dist.init_process_group("gloo", timeout=CONTROL_TIMEOUT)
    return GlooControl(None, owns_default_group=True)
