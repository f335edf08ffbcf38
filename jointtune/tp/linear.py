"""Column- and row-parallel linear layers over a world, in either tensor-parallel layout.

Two layouts of the activations between layers (`layout.py` chooses one per token count):
- `sp` (sequence parallel): each rank holds T/W rows of the hidden state. The column-parallel layer all-gathers
  them inside its GEMM (`ag_gemm`), the row-parallel layer reduce-scatters its output back to T/W rows
  (`gemm_rs`): no collective outside the fused ops.
- `standard`: every rank holds all T rows. The column-parallel layer is a local GEMM; the row-parallel one is GEMM +
  all-reduce in one tuned op (`gemm_ar`), whose `baseline` mode is cuBLAS + the best unfused all-reduce (what a store
  with no tuned record serves). Every rank gets the same bits, so replicated activations never drift apart.

The row-parallel layer takes the decoder's epilogue as part of the call: `residual` is added to the sum, and with
`norm_weight` the sum is RMS-normalised too, returning (normed, new residual). In the standard layout that is the
fused `gemm_ar_rmsnorm` kernel (records of its own: the epilogue changes the work); in `sp`, one pass over each
rank's rows after `gemm_rs` (`fused_norm.add_rms_norm`: the add and the norm in one kernel).

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
    >>> normed, h = down(up(x, layout="standard"), layout="standard", residual=x, norm_weight=[torch.ones(32)] * 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from jointtune.errors import ShapeError
from jointtune.tp._ranks import as_list, check_ranks, like, refuse_grad
from jointtune.tp.functional import rms_norm
from jointtune.tp.fused_norm import add_rms_norm
from jointtune.tp.tuned import Tuning, tuned_op

SP, STANDARD = "sp", "standard"
LAYOUTS = (SP, STANDARD)


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ShapeError(f"layout: {layout!r} is not allowed; allowed: {', '.join(LAYOUTS)}")


def _params(tensors: Sequence[torch.Tensor]) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(t.contiguous(), requires_grad=False) for t in tensors])


def _mine(world: Any, shards: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The shards of the ranks this process drives, on the world's device."""
    return [shards[r].to(world.device) for r in world.local_ranks]


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
    rank gets all T rows from GEMM + all-reduce (`gemm_ar`, or `gemm_ar_rmsnorm` with the norm epilogue)."""

    def __init__(self, world: Any, shards: Sequence[torch.Tensor], *, tuning: Tuning | None = None) -> None:
        super().__init__()
        from jointtune.kernels.gemm_ar import family_name

        self.world = world
        check_ranks("shards", list(shards), world)
        self.weight = _params(shards)
        self.op = tuned_op("gemm_rs", tuning)
        #: the standard layout's ops: the sum (+ residual), and the sum + residual + RMSNorm
        self.ar_op = tuned_op(family_name(False), tuning)
        self.ar_norm_op = tuned_op(family_name(True), tuning)

    @classmethod
    def from_weight(cls, world: Any, weight: torch.Tensor, **kwargs: Any) -> RowParallelLinear:
        """From an unsharded HF-layout weight [out, in]: rank r keeps input columns r*in/W.."""
        W = world.world_size
        if weight.dim() != 2 or weight.shape[1] % W:
            raise ShapeError(f"weight: {list(weight.shape)} is not allowed; give [out, in] with in divisible by {W}")
        k = weight.shape[1] // W
        shards = [weight[:, r * k : (r + 1) * k].t().contiguous() for r in range(W)]
        return cls(world, _mine(world, shards), **kwargs)

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor], *, layout: str,
                residual: torch.Tensor | Sequence[torch.Tensor] | None = None,
                norm_weight: torch.Tensor | Sequence[torch.Tensor] | None = None,
                eps: float = 1e-6) -> Any:  # fmt: skip
        """The sum over ranks (+ `residual`: the layout's rows, as the output's); with `norm_weight` ([out] per local
        rank) also RMSNorm(h) with `eps`, returning (normed, h) where h = sum + residual."""
        xs, ws = as_list(x), list(self.weight)
        check_ranks("x", xs, self.world)
        res = None if residual is None else [r.contiguous() for r in as_list(residual)]
        norm = None if norm_weight is None else as_list(norm_weight)
        if not torch.compiler.is_compiling():  # the eager call before compiling checked; dynamo can't unpack these
            refuse_grad("RowParallelLinear", [*xs, *ws, *(res or []), *(norm or [])])
            for name, given in (("residual", res), ("norm_weight", norm)):
                if given is not None:
                    check_ranks(name, given, self.world)
        if layout == SP:
            ys = self.op(xs, ws, world=self.world)
            if norm is None:
                return like(x, ys if res is None else [r + y for r, y in zip(res, ys)])
            if res is None:
                return like(x, [rms_norm(y, w, eps) for y, w in zip(ys, norm)]), like(x, ys)
            normed, hs = zip(*(add_rms_norm(y, r, w, eps) for y, r, w in zip(ys, res, norm)))
            return like(x, list(normed)), like(x, list(hs))
        check_layout(layout)
        if norm is None:
            return like(x, self.ar_op(xs, ws, res, world=self.world))
        normed, hs = self.ar_norm_op(xs, ws, res, norm, world=self.world, eps=eps)
        return like(x, normed), like(x, hs)
