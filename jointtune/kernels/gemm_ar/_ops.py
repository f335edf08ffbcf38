"""`torch.ops.jointtune.gemm_ar` and `torch.ops.jointtune.gemm_ar_rmsnorm`: the launchers as torch ops (a schema and
a fake implementation), so torch.compile traces through them with `fullgraph=True` and CUDA graphs capture them.
Worlds travel by name, configs as JSON text (`config_json`), an absent residual as an empty list."""

from __future__ import annotations

import torch

from jointtune.kernels.gemm_ar._launcher import gemm_ar, gemm_ar_rmsnorm
from jointtune.kernels.runtime.calls import parse_config
from jointtune.kernels.runtime.eager_graph import direct_only
from jointtune.kernels.runtime.world import world_named


@torch.library.custom_op("jointtune::gemm_ar", mutates_args=())
def _gemm_ar_op(a: list[torch.Tensor], b: list[torch.Tensor], residual: list[torch.Tensor], world: str,
                config: str) -> list[torch.Tensor]:  # fmt: skip
    """torch.ops.jointtune.gemm_ar(a, b, residual, world_name, config_json) -> the sum per local rank (residual: one
    [M, N] tensor per local rank, or an empty list)."""
    with direct_only():  # torch.compile's CUDA graphs run through here: no graphs of ours (`_eager_graph`)
        return list(gemm_ar(list(a), list(b), world=world_named(world), config=parse_config(config),
                            residual=list(residual) or None))  # fmt: skip


@_gemm_ar_op.register_fake
def _gemm_ar_fake(a: list[torch.Tensor], b: list[torch.Tensor], residual: list[torch.Tensor], world: str,
                  config: str) -> list[torch.Tensor]:  # fmt: skip
    return [x.new_empty((x.shape[0], y.shape[1])) for x, y in zip(a, b)]


@torch.library.custom_op("jointtune::gemm_ar_rmsnorm", mutates_args=())
def _gemm_ar_rmsnorm_op(a: list[torch.Tensor], b: list[torch.Tensor], residual: list[torch.Tensor],
                        weight: list[torch.Tensor], eps: float, world: str,
                        config: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    """torch.ops.jointtune.gemm_ar_rmsnorm(a, b, residual, weight, eps, world_name, config_json) -> (normed,
    new_residual), each one tensor per local rank."""
    with direct_only():
        normed, h = gemm_ar_rmsnorm(list(a), list(b), list(residual) or None, list(weight), eps=eps,
                                    world=world_named(world), config=parse_config(config))  # fmt: skip
    return list(normed), list(h)


@_gemm_ar_rmsnorm_op.register_fake
def _gemm_ar_rmsnorm_fake(a: list[torch.Tensor], b: list[torch.Tensor], residual: list[torch.Tensor],
                          weight: list[torch.Tensor], eps: float, world: str,
                          config: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:  # fmt: skip
    shapes = [(x.shape[0], y.shape[1]) for x, y in zip(a, b)]
    return [x.new_empty(s) for x, s in zip(a, shapes)], [x.new_empty(s) for x, s in zip(a, shapes)]
