"""GEMM+AR's launcher: its two ops (`gemm_ar`, the sum; `gemm_ar_rmsnorm`, the sum + residual, then RMSNorm) over its
plans (`plans`), and their two families: one space (`gemm_ar`), two record keys, since the epilogue changes the output
and the work, so a config tuned for one is not served to the other. The package doc says how it works."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.gemm_ar.args import ArShape, GemmArConfig, Work, kernel_args
from jointtune.kernels.gemm_ar.plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, as_list, config_json, usable
from jointtune.kernels.runtime.family import StandinLaunch, register_family
from jointtune.kernels.runtime.gemm import GemmFamily, GemmInputs, check_gemm_operands
from jointtune.kernels.runtime.op import Args, FusedOp, PerRank, Prepared
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.world import World

__all__ = ["GemmArFamily", "GemmArInputs", "GemmArRmsNormFamily", "PreparedGemmAr", "config_json", "family_name",
           "gemm_ar", "gemm_ar_rmsnorm", "prepare", "reference", "row_parallel", "standin_launches"]  # fmt: skip

#: the norm weight's dtypes besides the input's
WEIGHT_DTYPES = (torch.float32,)
#: the epsilon the family's inputs carry (a layer's own is part of its call, as the model config says)
EPS = 1e-6


def _given(xs: list[Any]) -> bool:
    """Whether an optional per-rank argument was given (absent, it is one None per rank)."""
    return not xs or xs[0] is not None


def _check_like(name: str, xs: list[torch.Tensor], n_local: int, shape: tuple[int, ...],
                dtypes: tuple[torch.dtype, ...], world: World) -> None:  # fmt: skip
    if len(xs) != n_local:
        raise ShapeError(f"{name}: expected one tensor per local rank ({n_local}), got {len(xs)}")
    allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    for i, x in enumerate(xs):
        if tuple(x.shape) != shape or x.dtype not in dtypes or x.device != world.device or not x.is_contiguous():
            raise ShapeError(
                f"{name}: must be a contiguous {list(shape)} {allowed} tensor on {world.device} per local rank; rank "
                f"index {i} has {x.dtype} {list(x.shape)} on {x.device}{'' if x.is_contiguous() else ', strided'}"
            )


class GemmArOp(FusedOp):
    """A_r [M, K_r] times B_r [K_r, N] per rank, summed over the ranks: every rank gets all [M, N] (+ `residual`, the
    same on every rank, where given: one None per rank where not)."""

    name, inputs, bound_in_place = "gemm_ar", ("a", "b", "residual"), ("a",)
    #: whether it runs the RMSNorm epilogue: a `weight` input, an `eps` option, the new residual a second output
    norm = False

    def arguments(self, inputs: Sequence[Any]) -> Args:
        a, b, residual, *weight = (*inputs, None)[: len(self.inputs)]  # the residual may be left out
        a_l = as_list(a)
        return [a_l, as_list(b), [None] * len(a_l) if residual is None else as_list(residual), *map(as_list, weight)]

    def op_inputs(self, lists: Sequence[list[torch.Tensor]]) -> list[Any]:
        a, b, residual, *weight = (list(x) for x in lists)
        return [a, b, residual or None, *weight]  # an empty list: no residual

    def check(self, args: Args, world: World) -> None:
        self._check(args, world)

    def _check(self, args: Args, world: World) -> tuple[int, int, int]:
        """(M, K_r, N) of a call; ShapeError naming the argument otherwise."""
        a, b, res, *weight = args
        M, K_r, N = check_gemm_operands(a, b, world, ("M", "K_r", "N"))
        n_local, dtype = len(world.local_ranks), a[0].dtype
        if _given(res):
            _check_like("residual", res, n_local, (M, N), (dtype,), world)
        if weight:
            _check_like("weight", weight[0], n_local, (N,), (dtype, *WEIGHT_DTYPES), world)
        return M, K_r, N

    def plan_key(self, world: World, args: Args, config: Mapping[str, Any], eps: float = 0.0) -> tuple[Any, Any]:
        """Everything a plan bakes in: config, shapes, dtypes, B's strides, the epilogue (and eps), devices."""
        (a0, *_), (b0, *_), res, *weight = args
        epilogue = (_given(res), (weight[0][0].dtype, float(eps)) if weight else None)
        return ("gemm_ar", config_key(config), a0.shape, b0.shape, a0.dtype, b0.stride(), epilogue, a0.device,
                len(args[0])), None  # fmt: skip

    def build(self, world: World, args: Args, config: Mapping[str, Any], placed: Any, eps: float = 0.0) -> Any:
        M, K_r, N = self._check(args, world)
        a, b, res, *weight = args
        shape = {"M": M, "N": N, "K": K_r * world.world_size}
        cfg = GemmArConfig.of(resolve_config("gemm_ar", config, shape, DTYPES[a[0].dtype], world))
        s = ArShape(world.world_size, M, K_r, N, a[0].dtype, tuple(b[0].stride()), _given(res), bool(weight))
        return build_plan(world, s, cfg, float(eps))

    def readable(self, args: Args, placed: Any) -> Args:
        a, b, res, *weight = args
        return [[usable(x) for x in a], b, [usable(x) for x in res] if _given(res) else res, *weight]

    def out_shape(self, args: Args, world_size: int) -> tuple[int, ...]:
        return (args[0][0].shape[0], args[1][0].shape[1])

    def launch(self, plan: Any, args: Args, outs: Args) -> Any:
        """The plans take (a, b, out, residual, weight, h_out), None for what the call has not."""
        a, b, res, weight = (*args, None)[:4]
        out, h_out = (*outs, None)[:2]
        return plan(a, b, out, res if _given(res) else None, weight, h_out)


class GemmArRmsNormOp(GemmArOp):
    """`GemmArOp`, then RMSNorm of every row with `weight` [N] (the input's dtype or float32): (normed, h)."""

    name, space, inputs, outputs = "gemm_ar_rmsnorm", "gemm_ar", ("a", "b", "residual", "weight"), ("out", "h_out")
    op_options, options_first, norm = (("eps", "float eps"),), True, True

    def options(self, eps: Any = 1e-6) -> dict[str, Any]:
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0):
            raise ShapeError(f"eps: {eps!r} is not allowed; it must be a finite number >= 0")
        return {"eps": float(eps)}


_SUM, _NORM = GemmArOp(), GemmArRmsNormOp()
_SUM.register()
_NORM.register()
#: a `gemm_ar` or `gemm_ar_rmsnorm` call bound to its tensors (`prepare`); `run()` re-issues it and returns its output
#: (with the norm: (normed, h))
PreparedGemmAr = Prepared


def gemm_ar(a: PerRank, b: PerRank, *, world: World, config: Mapping[str, Any], residual: PerRank | None = None,
            out: PerRank | None = None) -> Any:  # fmt: skip
    """Multiply this rank's `a` [M, K_r] by its `b` [K_r, N] and sum over ranks: every rank gets all [M, N] (plus
    `residual` [M, N], the same on every rank, when given).

    On the CUDA world the arguments are this rank's tensors and so is the result; on the local world they are lists
    with one tensor per simulated rank, and so is the result. `out` (optional, row-major) receives it. The config must
    be valid in the `gemm_ar` space for this shape (SpaceError names the fields otherwise).
    """
    return _SUM.call((a, b, residual), world, config, out)


def gemm_ar_rmsnorm(a: PerRank, b: PerRank, residual: PerRank | None, weight: PerRank, *, eps: float = 1e-6,
                    world: World, config: Mapping[str, Any],
                    out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:  # fmt: skip
    """`gemm_ar`, then RMSNorm: h = sum_p A_p @ B_p (+ residual), rounded to the input dtype, and normed = h *
    rsqrt(mean(h^2) + eps) * weight, in float32 and rounded once. Returns (normed, h): the next layer's input and its
    residual. `weight` is [N] (the input's dtype or float32); `out` = (normed, h) tensors to fill (h may be the
    residual itself: the update is then in place, element by element).
    """
    return _NORM.call((a, b, residual, weight), world, config, out, eps=eps)


def row_parallel(x: PerRank, w: PerRank, *, world: World, config: Mapping[str, Any], residual: PerRank | None = None,
                 norm_weight: PerRank | None = None, eps: float = 1e-6) -> Any:  # fmt: skip
    """A row-parallel linear layer with a replicated output, as the standard tensor-parallel layout calls it: `x`
    [T, in/W] and `w` [in/W, out] per rank, the sum over ranks on every rank (+ `residual`). With `norm_weight` the
    RMSNorm epilogue runs too and the result is (normed, new_residual). Its config is tuned under `gemm_ar`, or under
    `gemm_ar_rmsnorm` with the norm (`family_name`)."""
    if norm_weight is None:
        return gemm_ar(x, w, world=world, config=config, residual=residual)
    return gemm_ar_rmsnorm(x, w, residual, norm_weight, eps=eps, world=world, config=config)


def family_name(norm: bool) -> str:
    """The kernel (family) a row-parallel call's configs are tuned and stored under."""
    return (_NORM if norm else _SUM).name


def prepare(a: PerRank, b: PerRank, *, world: World, config: Mapping[str, Any], residual: PerRank | None = None,
            norm_weight: PerRank | None = None, eps: float = 1e-6, out: Any = None,
            h_out: Any = None) -> Prepared:  # fmt: skip
    """Run the call (`gemm_ar`, or `gemm_ar_rmsnorm` with `norm_weight`) once, building its plan, and return it, bound
    to these tensors, to re-issue (`PreparedGemmAr.run`: A must be row-major and 16-byte aligned)."""
    if norm_weight is None:
        return _SUM.prepare(a, b, residual, world=world, config=config, out=out)
    return _NORM.prepare(a, b, residual, norm_weight, world=world, config=config, out=(out, h_out), eps=eps)


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], residual: torch.Tensor | None = None,
              weight: torch.Tensor | None = None, eps: float = 1e-6) -> Any:  # fmt: skip
    """float32 reference: the sum of every rank's partial (+ residual); with `weight`, (normed, h)."""
    h = sum(x.float() @ y.float() for x, y in zip(a, b))
    assert isinstance(h, torch.Tensor)
    if residual is not None:
        h = h + residual.float()
    if weight is None:
        return h
    return h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * weight.float(), h


# ---------------------------------------------------------------------------------------------- families


def standin_launches(cfg: GemmArConfig, *, M: int, N: int, K: int, world_size: int, dtype: torch.dtype,
                     device: torch.device, norm: bool = False) -> list[StandinLaunch]:  # fmt: skip
    """(kernel, arguments, options) of the Triton launch a call of this shape (with the residual + RMSNorm epilogue
    where `norm`) makes on a world whose ranks run at once, with 1-element stand-in tensors and the call's real
    integers (as the plan builds them)."""
    if cfg.mode == "baseline":
        return []
    if cfg.transport in ("barrier", "barrier_push"):
        return _meet_standin(cfg, M=M, N=N, world_size=world_size, dtype=dtype, device=device, norm=norm)
    from jointtune.kernels.gemm_ar.kernel import gemm_ar_kernel
    from jointtune.kernels.runtime.device import num_sms
    from jointtune.kernels.runtime.launch import split_options

    s = ArShape(world_size, M, K // world_size, N, dtype, (N, 1), norm, norm)
    w = Work.of(cfg, s, num_sms(device))
    t = torch.empty(1, dtype=s.dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    two_shot = cfg.mode == "two_shot"
    ll = cfg.transport == "ll"
    inbox = i64 if ll else t  # LL words; two-shot's gathered rows (and with the norm their 1/rms) are words too
    gat, rms = (i64, i64 if norm else f32) if ll and two_shot else (t, f32)
    args = kernel_args(cfg, s, w, a=t, b=t, part=t, res=t, weight=t, out=t, hout=t, send=inbox, send_deltas=i64,
                       recv=inbox, recv_deltas=i64, gat=gat, gat_deltas=i64, rms=rms, rms_deltas=i64, flags_local=i64,
                       flag_ptrs=i64, done=i32, state=i64, ws=f32, counts=i32, half_stride=16, ghalf_stride=16,
                       rhalf_stride=16, rank=0, produce=True, reduce=True, gather=two_shot, epoch=1, grid=w.grid,
                       comm_lo=w.comm_lo, comm=w.comm, eps=EPS)  # fmt: skip
    return [(gemm_ar_kernel, *split_options(args))]


def _meet_standin(cfg: GemmArConfig, *, M: int, N: int, world_size: int, dtype: torch.dtype, device: torch.device,
                  norm: bool) -> list[StandinLaunch]:  # fmt: skip
    """`standin_launches` of transport="barrier" or "barrier_push": the meet launch as `plans.MeetPlan` builds it."""
    from jointtune.kernels.gemm_ar.plans import meet_args

    s = ArShape(world_size, M, 1, N, dtype, (N, 1), norm, norm)
    pushed = cfg.transport == "barrier_push"
    t = torch.empty(1, dtype=dtype, device=device)
    i64 = torch.zeros(1, dtype=torch.int64, device=device)
    args = meet_args(cfg, s, buf=t, deltas=i64, rms=torch.zeros(1, dtype=torch.float32, device=device),
                     rms_deltas=i64, signals=torch.zeros(1, dtype=torch.int32, device=device), signal_deltas=i64,
                     stand_in=t, rank=0, reduce=True, gather=cfg.mode == "two_shot", meet=True, eps=EPS, inbox=t,
                     inbox_deltas=i64, state=i64, slot=16 if pushed else 0, half_stride=16 if pushed else 0,
                     push=pushed, epoch=1 if pushed else 0)  # fmt: skip
    from jointtune.kernels.gemm_ar.meet import gemm_ar_meet_kernel
    from jointtune.kernels.runtime.launch import split_options

    return [(gemm_ar_meet_kernel, *split_options(args))]


@dataclass
class GemmArInputs(GemmInputs):
    """`GemmInputs` (every rank's B too), and the epilogue's residual and weight (the same on every rank, as replicated
    activations are), None without the epilogue."""

    residual: list[torch.Tensor] | None = None
    weight: list[torch.Tensor] | None = None


class GemmArFamily(GemmFamily):
    op, config_type, launches, inputs_type = _SUM, GemmArConfig, staticmethod(standin_launches), GemmArInputs
    split, reference_reads_all_b = ("K",), True  # every rank's sum needs every rank's B

    def shard_shapes(self, M: int, N: int, K: int, world_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (M, K // world_size), (K // world_size, N)

    def call_shape(self, a0: torch.Tensor, b0: torch.Tensor, world_size: int) -> dict[str, int]:
        return {"M": a0.shape[0], "N": b0.shape[1], "K": a0.shape[1] * world_size}

    def more_inputs(self, problem: Any, world: World, gen: torch.Generator) -> dict[str, Any]:
        """With the epilogue: a random residual and a weight near 1, the same on every rank."""
        if not self.op.norm:
            return {}
        M, N = problem.dim("M"), problem.dim("N")
        dtype, dev = getattr(torch, problem.dtype), world.device
        res = torch.randn(M, N, generator=gen).to(dtype).to(dev)
        w = (1.0 + 0.1 * torch.randn(N, generator=gen)).to(dtype).to(dev)
        return {"residual": [res.clone() for _ in world.local_ranks], "weight": [w.clone() for _ in world.local_ranks]}

    def reference(self, inputs: GemmArInputs) -> list[torch.Tensor]:
        """Every local rank's sum; with the epilogue every rank's normed output, then every rank's new residual."""
        n = len(inputs.a)
        if inputs.residual is None or inputs.weight is None:
            return [reference(inputs.all_a, inputs.all_b)] * n
        normed, h = reference(inputs.all_a, inputs.all_b, inputs.residual[0], inputs.weight[0], EPS)
        return [normed] * n + [h] * n


class GemmArRmsNormFamily(GemmArFamily):
    op, launches = _NORM, staticmethod(functools.partial(standin_launches, norm=True))


register_family(GemmArFamily())
register_family(GemmArRmsNormFamily())
