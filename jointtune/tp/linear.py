"""Column- and row-parallel linear layers over a world, in either tensor-parallel layout.

Two layouts of the activations between layers (`layout.py` chooses one per token count):
- `sp` (sequence parallel): each rank holds T/W rows of the hidden state. The column-parallel layer all-gathers
  them inside its GEMM (`ag_gemm`), the row-parallel layer reduce-scatters its output back to T/W rows
  (`gemm_rs`): no collective outside the fused ops.
- `standard`: every rank holds all T rows. The column-parallel layer is a local GEMM; the row-parallel one a
  GEMM whose partial sums are all-reduced. That op is `RowParallelLinear.standard`, any `RowOp`: by default
  `MatmulAllReduce` (cuBLAS, then the unfused all-reduce), to be swapped for a fused GEMM + all-reduce.

Weights are kept per local rank as the ops read them, row-major: a column-parallel shard is [in, out/W]
(the transpose of the HF weight's rows of that rank), a row-parallel shard [in/W, out]. They are parameters that
don't require grad: the layers are forward-only and refuse grad as the ops do.

Example:
    >>> from jointtune import create_world
    >>> world = create_world("local", world_size=2)
    >>> up = ColumnParallelLinear.from_weight(world, torch.randn(64, 32, dtype=torch.bfloat16))  # HF: [out, in]
    >>> down = RowParallelLinear.from_weight(world, torch.randn(32, 64, dtype=torch.bfloat16))
    >>> x = [torch.randn(8, 32, dtype=torch.bfloat16) for _ in range(2)]  # standard layout: all 8 rows on each rank
    >>> [tuple(y.shape) for y in down(up(x, layout="standard"), layout="standard")]
    [(8, 32), (8, 32)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from jointtune.errors import ShapeError
from jointtune.tp._ranks import all_reduce, as_list, check_ranks, like, refuse_grad
from jointtune.tp.tuned import Tuning, tuned_op

SP, STANDARD = "sp", "standard"
LAYOUTS = (SP, STANDARD)

#: the standard layout's row-parallel op: (per-rank inputs [T, in/W], per-rank weights [in/W, out], world) -> per-rank
#: [T, out], summed over ranks
RowOp = Callable[[list[torch.Tensor], list[torch.Tensor], Any], list[torch.Tensor]]


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ShapeError(f"layout: {layout!r} is not allowed; allowed: {', '.join(LAYOUTS)}")


def _params(tensors: Sequence[torch.Tensor]) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(t.contiguous(), requires_grad=False) for t in tensors])


def _mine(world: Any, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The shards of the ranks this process drives, on the world's device."""
    return [shards[r].to(world.device) for r in world.local_ranks]


class MatmulAllReduce:
    """The standard layout's row-parallel op before a fused one exists: a GEMM per rank, then the all-reduce
    (NCCL on the CUDA world)."""

    def __call__(self, xs: list[torch.Tensor], ws: list[torch.Tensor], world: Any) -> list[torch.Tensor]:
        return all_reduce(world, [x @ w for x, w in zip(xs, ws)])


class ColumnParallelLinear(nn.Module):
    """y = x @ W^T with W's output rows split over the ranks: every rank gets all T rows of its out/W columns.

    `sp`: the input is each rank's T/W rows, gathered inside the GEMM (`ag_gemm`); `standard`: all T rows."""

    def __init__(self, world: Any, shards: Sequence[torch.Tensor], *, bias: Sequence[torch.Tensor] | None = None,
                 tuning: Tuning | None = None) -> None:  # fmt: skip
        super().__init__()
        self.world = world
        check_ranks("shards", list(shards), world)
        self.weight = _params(shards)
        self.bias = _params(bias) if bias is not None else None
        self.op = tuned_op("ag_gemm", tuning)

    @classmethod
    def from_weight(cls, world: Any, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    **kwargs: Any) -> ColumnParallelLinear:  # fmt: skip
        """From an unsharded HF-layout weight [out, in] (and bias [out]): rank r keeps output rows r*out/W.."""
        W = world.world_size
        if weight.dim() != 2 or weight.shape[0] % W:
            raise ShapeError(f"weight: {list(weight.shape)} is not allowed; give [out, in] with out divisible by {W}")
        n = weight.shape[0] // W
        shards = [weight[r * n : (r + 1) * n].t().contiguous() for r in range(W)]
        biases = None if bias is None else [bias[r * n : (r + 1) * n] for r in range(W)]
        return cls(world, _mine(world, shards), bias=None if biases is None else _mine(world, biases), **kwargs)

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor], *, layout: str) -> Any:
        xs, ws = as_list(x), list(self.weight)
        check_ranks("x", xs, self.world)
        if not torch.compiler.is_compiling():  # the eager call before compiling checked; dynamo can't unpack these
            refuse_grad("ColumnParallelLinear", [*xs, *ws, *(self.bias or [])])
        if layout == SP:
            ys = self.op(xs, ws, world=self.world)
        else:
            check_layout(layout)
            ys = [xi @ wi for xi, wi in zip(xs, ws)]
        if self.bias is not None:
            ys = [y + b for y, b in zip(ys, self.bias)]
        return like(x, ys)


class RowParallelLinear(nn.Module):
    """y = x @ W^T with W's input columns split over the ranks: the partial products are summed over ranks.

    `sp`: the sum is reduce-scattered inside the GEMM (`gemm_rs`), each rank gets its T/W rows; `standard`: every
    rank gets all T rows from `standard` (default `MatmulAllReduce`)."""

    def __init__(self, world: Any, shards: Sequence[torch.Tensor], *, tuning: Tuning | None = None,
                 standard: RowOp | None = None) -> None:  # fmt: skip
        super().__init__()
        self.world = world
        check_ranks("shards", list(shards), world)
        self.weight = _params(shards)
        self.op = tuned_op("gemm_rs", tuning)
        self.standard: RowOp = standard or MatmulAllReduce()

    @classmethod
    def from_weight(cls, world: Any, weight: torch.Tensor, **kwargs: Any) -> RowParallelLinear:
        """From an unsharded HF-layout weight [out, in]: rank r keeps input columns r*in/W.."""
        W = world.world_size
        if weight.dim() != 2 or weight.shape[1] % W:
            raise ShapeError(f"weight: {list(weight.shape)} is not allowed; give [out, in] with in divisible by {W}")
        k = weight.shape[1] // W
        shards = [weight[:, r * k : (r + 1) * k].t().contiguous() for r in range(W)]
        return cls(world, _mine(world, shards), **kwargs)

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor], *, layout: str) -> Any:
        xs, ws = as_list(x), list(self.weight)
        check_ranks("x", xs, self.world)
        if not torch.compiler.is_compiling():  # the eager call before compiling checked; dynamo can't unpack these
            refuse_grad("RowParallelLinear", [*xs, *ws])
        if layout == SP:
            ys = self.op(xs, ws, world=self.world)
        else:
            check_layout(layout)
            ys = self.standard(xs, ws, self.world)
        return like(x, ys)
