"""What every tensor-parallel module does alike: one tensor per local rank, forward-only, and the one unfused
collective the layers need besides the fused ops (the rows' all-gather at the end of a sequence-parallel stack; the
standard layout's all-reduce is the `gemm_ar` op).

A module's inputs and outputs follow the ops: on the CUDA world one tensor (this rank's), on a local world of
simulated ranks a list with one tensor per rank. Inside, everything is a list.

The all-gather runs through `torch.distributed` on the CUDA world: an NCCL call when eager (or captured into a CUDA
graph), the functional collective while `torch.compile` traces, which it turns into a graph node. On a local world it
is a concatenation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from jointtune.errors import ShapeError


def as_list(x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor (a CUDA rank's) or one per simulated rank, as a list."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def like(given: Any, outs: list[torch.Tensor]) -> Any:
    """`outs` in the form the caller gave its input: a tensor for a tensor, else the list."""
    return outs[0] if isinstance(given, torch.Tensor) else outs


def check_ranks(name: str, xs: list[torch.Tensor], world: Any) -> None:
    """ShapeError naming `name` unless it holds one tensor per local rank of `world`."""
    if len(xs) != len(world.local_ranks):
        raise ShapeError(
            f"{name}: expected one tensor per local rank ({len(world.local_ranks)}), got {len(xs)}; on the CUDA world "
            "pass this rank's tensor, on a local world a list with one per simulated rank"
        )


def refuse_grad(module: str, tensors: Iterable[torch.Tensor]) -> None:
    """ShapeError when grad mode is on and an input or weight requires grad: the layers are forward-only (the ops
    have no backward), so a weight would silently never learn. The same rule the ops apply."""
    if not torch.is_grad_enabled():
        return
    if any(getattr(t, "requires_grad", False) for t in tensors):
        raise ShapeError(
            f"{module}: an input or weight requires grad, and the tensor-parallel layers are forward-only (no "
            "backward); call them under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
        )


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def all_gather_rows(world: Any, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's rows, concatenated in rank order on every rank (the end of a sequence-parallel stack)."""
    if world.kind == "local":
        gathered = torch.cat(xs, dim=0)
        return [gathered for _ in xs]
    (x,) = xs
    if _compiling():
        import torch.distributed._functional_collectives as funcol

        return [funcol.all_gather_tensor(x.contiguous(), 0, world.group)]
    import torch.distributed as dist

    out = torch.empty((x.shape[0] * world.world_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=world.group)
    return [out]


def rows_of_rank(world: Any, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each local rank's contiguous share of replicated rows (rank r: rows [r*T/W, (r+1)*T/W)); no communication."""
    W = world.world_size
    T = xs[0].shape[0]
    if T % W:
        raise ShapeError(f"rows: {T} tokens are not allowed in the sequence-parallel layout with {W} ranks; "
                         "T must be divisible by the world size (run the standard layout)")  # fmt: skip
    R = T // W
    return [x[r * R : (r + 1) * R] for r, x in zip(world.local_ranks, xs)]
