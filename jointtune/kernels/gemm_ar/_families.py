"""The two kernels of the GEMM+AR family as the tuner, the decorator and the benchmarks see them: `gemm_ar` (the sum)
and `gemm_ar_rmsnorm` (the sum + residual, then RMSNorm). One space (`gemm_ar`), two record keys: the epilogue
changes the output and the work, so a config tuned for one is not served to the other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.gemm_ar._args import ArShape, GemmArConfig, Work, kernel_args
from jointtune.kernels.gemm_ar._launcher import gemm_ar, gemm_ar_rmsnorm, reference
from jointtune.kernels.runtime.calls import as_list, first_of
from jointtune.kernels.runtime.family import Family, StandinLaunch, register_family
from jointtune.kernels.runtime.world import World

#: the epsilon the family's inputs carry (a layer's own is part of its call, as the model config says)
EPS = 1e-6


@dataclass
class GemmArInputs:
    """Every local rank's A and B (all ranks' for the reference), and the epilogue's residual and weight (the same
    on every rank, as replicated activations are), None without the epilogue."""

    problem: Any
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    all_a: list[torch.Tensor]
    all_b: list[torch.Tensor]
    residual: list[torch.Tensor] | None
    weight: list[torch.Tensor] | None


class GemmArFamily(Family):
    name = "gemm_ar"
    space = "gemm_ar"
    dims = ("M", "N", "K")
    #: whether calls run the residual + RMSNorm epilogue
    norm = False

    def make_inputs(self, problem: Any, world: World, *, seed: int, symmetric: bool = False) -> GemmArInputs:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W or K % W:
            raise ShapeError(
                f"shape: K={K} must be divisible by world_size={W} (the problem says {problem.world_size})"
            )
        dtype, dev, K_r = getattr(torch, problem.dtype), world.device, K // W
        gen = torch.Generator(device="cpu").manual_seed(seed)
        # every rank draws every shard from one seed, so each can build the reference on its own
        all_a = [(torch.randn(M, K_r, generator=gen) / K**0.25).to(dtype).to(dev) for _ in range(W)]
        all_b = [(torch.randn(K_r, N, generator=gen) / K**0.25).to(dtype).to(dev) for _ in range(W)]
        a = [all_a[r] for r in world.local_ranks]
        if symmetric:
            slots = world.empty((M, K_r), dtype)
            for slot, x in zip(slots, a):
                slot.copy_(x)
            a = slots
        residual = weight = None
        if self.norm:
            res = torch.randn(M, N, generator=gen).to(dtype).to(dev)
            w = (1.0 + 0.1 * torch.randn(N, generator=gen)).to(dtype).to(dev)
            residual, weight = [res.clone() for _ in a], [w.clone() for _ in a]
        return GemmArInputs(problem, a, [all_b[r] for r in world.local_ranks], all_a, all_b, residual, weight)

    def run(self, inputs: GemmArInputs, config: Mapping[str, Any], world: World) -> list[torch.Tensor]:
        """Every local rank's output; with the epilogue every rank's normed output, then every rank's new residual."""
        if not self.norm:
            return list(gemm_ar(inputs.a, inputs.b, world=world, config=config))
        normed, h = gemm_ar_rmsnorm(inputs.a, inputs.b, inputs.residual, inputs.weight, eps=EPS, world=world,
                                    config=config)  # fmt: skip
        return [*normed, *h]

    def reference(self, inputs: GemmArInputs) -> list[torch.Tensor]:
        n = len(inputs.a)
        if not self.norm:
            return [reference(inputs.all_a, inputs.all_b)] * n
        assert inputs.residual is not None and inputs.weight is not None
        normed, h = reference(inputs.all_a, inputs.all_b, inputs.residual[0], inputs.weight[0], EPS)
        return [normed] * n + [h] * n

    def key(self, a: Any, b: Any, *_: Any, world: World, **__: Any) -> dict[str, int]:
        try:  # the decorator's hot path: arguments are checked only when reading them fails
            a0, b0 = as_list(a)[0], as_list(b)[0]
            return {"M": a0.shape[0], "N": b0.shape[1], "K": a0.shape[1] * world.world_size}
        except (AttributeError, IndexError, TypeError, ValueError):
            first_of("a", a, 2), first_of("b", b, 2)  # names the argument, or the original error stands
            raise

    def flops(self, problem: Any) -> float:
        M, N, K = (problem.dim(d) for d in self.dims)
        return 2.0 * M * N * K

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: torch.device) -> list[StandinLaunch]:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = problem.world_size
        s = ArShape(W, M, K // W, N, getattr(torch, problem.dtype), (N, 1), self.norm, self.norm)
        return standin_launches(GemmArConfig.of(dict(config)), s, device)


class GemmArRmsNormFamily(GemmArFamily):
    name = "gemm_ar_rmsnorm"
    norm = True


def standin_launches(cfg: GemmArConfig, s: ArShape, device: torch.device) -> list[StandinLaunch]:
    """(kernel, arguments, options) of the Triton launch a call of this shape makes on a world whose ranks run at
    once, with 1-element stand-in tensors and the call's real integers (as the plan builds them)."""
    if cfg.mode == "baseline":
        return []
    from jointtune.kernels.gemm_ar._kernel import gemm_ar_kernel
    from jointtune.kernels.runtime.device import num_sms
    from jointtune.kernels.runtime.launch import split_options

    w = Work.of(cfg, s, num_sms(device))
    t = torch.empty(1, dtype=s.dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    two_shot = cfg.mode == "two_shot"
    args = kernel_args(cfg, s, w, a=t, b=t, part=t, res=t, weight=t, out=t, hout=t, send=t, send_deltas=i64, recv=t,
                       recv_deltas=i64, gat=t, gat_deltas=i64, rms=f32, rms_deltas=i64, flags_local=i64,
                       flag_ptrs=i64, done=i32, state=i64, ws=f32, counts=i32, half_stride=16, ghalf_stride=16,
                       rhalf_stride=16, rank=0, produce=True, reduce=True, gather=two_shot, epoch=1, grid=w.grid,
                       comm_lo=w.comm_lo, comm=w.comm, eps=EPS)  # fmt: skip
    return [(gemm_ar_kernel, *split_options(args))]


register_family(GemmArFamily())
register_family(GemmArRmsNormFamily())
