"""GEMM + All-Reduce for a row-parallel linear layer with a replicated output: out = sum_p A_p @ B_p on every rank.

Rank r holds A_r [M, K_r] and B_r [K_r, N]; every rank gets all M rows of the sum, the same bits on every rank: each
partial is rounded once to the input dtype where it travels (as NCCL's all-reduce of a bf16 GEMM output is), the
own one too, and the W partials are summed in float32 in rank order from those values everywhere. Rounded partials
rather than float32 ones, because at decode sizes the exchange is bound by bytes over NVLink (one-shot moves
(W - 1) * M * N elements out of every rank): float32 would double them for a last bit the bf16 output drops anyway.

The optional epilogue is part of the call, not a knob (it changes the output): `residual` is added to the sum, and
`gemm_ar_rmsnorm` then normalises every row (weight and eps as inputs) and returns (normed, new_residual), the two
tensors a decoder layer's next step reads. RMSNorm needs whole rows while the partial is exchanged in tiles: the
fused modes sum whole rows in their reduce items (one row per item, both passes in one program), which every rank
does for every row in one-shot and each row's owner does in two-shot before handing out the row and its 1/rms.
Row ownership, not a second phase after the exchange: a second phase would need a cross-program reduction per row
and one more grid-wide wait per call (a flag round trip, the dominant cost at decode sizes), while an item that owns
its row reads every tile of it once and normalises in place; two-shot's owners already hold whole rows.

The config's `mode` (see `search_spaces.gemm_ar` and `_plans`): `one_shot`, `two_shot` (each with the tile GEMM in
the same launch, or cuBLAS before it; push or pull) or `baseline` (cuBLAS + the all-reduce variant, then torch).
Every call of one (world, shapes, dtype, epilogue, config) runs a plan built once, and nothing a later call needs
comes from the host: the op is correct under CUDA-graph capture and replay (capture after one eager call).

Ways in:
    gemm_ar(a, b, world=world, config=cfg, residual=None)                          # -> out
    gemm_ar_rmsnorm(a, b, residual, weight, eps=1e-6, world=world, config=cfg)     # -> (normed, new_residual)
    row_parallel(x, w, world=world, config=cfg, residual=..., norm_weight=..., eps=...)  # the TP layers' call
    torch.ops.jointtune.gemm_ar / gemm_ar_rmsnorm                                  # torch.compile, graphs
    get_family("gemm_ar") / get_family("gemm_ar_rmsnorm")                          # tuner, decorator, benchmarks
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.gemm_ar._args import ArShape, GemmArConfig
from jointtune.kernels.gemm_ar._plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, as_list, forward_only, usable
from jointtune.kernels.runtime.gemm import check_gemm_operands
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.world import World

Tensors = list[torch.Tensor]
#: the norm weight's dtypes besides the input's
WEIGHT_DTYPES = (torch.float32,)


def _check(a: Tensors, b: Tensors, res: Tensors | None, weight: Tensors | None, eps: float,
           world: World) -> tuple[int, int, int]:  # fmt: skip
    """(M, K_r, N) of a call; ShapeError naming the argument otherwise."""
    M, K_r, N = check_gemm_operands(a, b, world, ("M", "K_r", "N"))
    n_local = len(world.local_ranks)
    dtype = a[0].dtype
    if res is not None:
        _check_like("residual", res, n_local, (M, N), (dtype,), world)
    if weight is not None:
        _check_like("weight", weight, n_local, (N,), (dtype, *WEIGHT_DTYPES), world)
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0):
            raise ShapeError(f"eps: {eps!r} is not allowed; it must be a finite number >= 0")
    return M, K_r, N


def _check_like(name: str, xs: Tensors, n_local: int, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
                world: World) -> None:  # fmt: skip
    if len(xs) != n_local:
        raise ShapeError(f"{name}: expected one tensor per local rank ({n_local}), got {len(xs)}")
    allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    for i, x in enumerate(xs):
        if tuple(x.shape) != shape or x.dtype not in dtypes or x.device != world.device or not x.is_contiguous():
            raise ShapeError(
                f"{name}: must be a contiguous {list(shape)} {allowed} tensor on {world.device} per local rank; rank "
                f"index {i} has {x.dtype} {list(x.shape)} on {x.device}{'' if x.is_contiguous() else ', strided'}"
            )


def _outputs(name: str, given: Any, like: torch.Tensor, n_local: int, M: int, N: int, world: World) -> Tensors:
    if given is None:
        return [torch.empty((M, N), dtype=like.dtype, device=world.device) for _ in range(n_local)]
    outs = as_list(given)
    if len(outs) != n_local or any(o.shape != (M, N) or o.dtype != like.dtype or o.stride() != (N, 1)
                                   or o.device != world.device for o in outs):  # fmt: skip
        raise ShapeError(f"{name}: must be one row-major [{M}, {N}] {like.dtype} tensor per local rank")
    return outs


def _plan_key(a: Tensors, b: Tensors, res: Tensors | None, weight: Tensors | None, eps: float,
              config: Mapping[str, Any]) -> tuple[Any, ...]:  # fmt: skip
    """Everything a plan bakes in: config, shapes, dtypes, B's strides, the epilogue (and eps), devices."""
    a0, b0 = a[0], b[0]
    epilogue = (res is not None, None if weight is None else (weight[0].dtype, float(eps)))
    return ("gemm_ar", config_key(config), a0.shape, b0.shape, a0.dtype, b0.stride(), epilogue, a0.device, len(a))


def _build(world: World, a: Tensors, b: Tensors, res: Tensors | None, weight: Tensors | None, eps: float,
           config: Mapping[str, Any]) -> Any:  # fmt: skip
    M, K_r, N = _check(a, b, res, weight, eps, world)
    shape = {"M": M, "N": N, "K": K_r * world.world_size}
    cfg = GemmArConfig.of(resolve_config("gemm_ar", config, shape, DTYPES[a[0].dtype], world))
    s = ArShape(world.world_size, M, K_r, N, a[0].dtype, tuple(b[0].stride()), res is not None, weight is not None)
    return build_plan(world, s, cfg, float(eps))


def _call(a: Tensors, b: Tensors, res: Tensors | None, weight: Tensors | None, eps: float, world: World,
          config: Mapping[str, Any], out: Any, h_out: Any) -> tuple[Any, Tensors, Tensors | None]:  # fmt: skip
    """(plan, out, h_out) of one call, issued."""
    forward_only("gemm_ar", a=a, b=b, residual=res or [], weight=weight or [])
    if len(a) != 1 or len(b) != 1 or len(world.local_ranks) != 1:
        _check(a, b, res, weight, eps, world)  # simulated ranks: every rank's tensors, every call (the CPU's path)
    key = _plan_key(a, b, res, weight, eps, config)
    plan = world.plans.get(key)
    if plan is None:
        plan = world.plan(key, functools.partial(_build, world, a, b, res, weight, eps, config))
    a = [usable(x) for x in a]
    if res is not None:
        res = [usable(x) for x in res]
    M, N = a[0].shape[0], b[0].shape[1]
    o_l = _outputs("out", out, a[0], len(a), M, N, world)
    h_l = _outputs("h_out", h_out, a[0], len(a), M, N, world) if weight is not None else None
    plan(a, b, o_l, res, weight, h_l)
    return plan, o_l, h_l


def gemm_ar(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    residual: torch.Tensor | Sequence[torch.Tensor] | None = None,
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Any:
    """Multiply this rank's `a` [M, K_r] by its `b` [K_r, N] and sum over ranks: every rank gets all [M, N] (plus
    `residual` [M, N], the same on every rank, when given).

    On the CUDA world the arguments are this rank's tensors and so is the result; on the local world they are lists
    with one tensor per simulated rank, and so is the result. `out` (optional, row-major) receives it. The config must
    be valid in the `gemm_ar` space for this shape (SpaceError names the fields otherwise).
    """
    res = None if residual is None else as_list(residual)
    _, o_l, _ = _call(as_list(a), as_list(b), res, None, 0.0, world, config, out, None)
    return o_l[0] if isinstance(a, torch.Tensor) else o_l


def gemm_ar_rmsnorm(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    residual: torch.Tensor | Sequence[torch.Tensor] | None,
    weight: torch.Tensor | Sequence[torch.Tensor],
    *,
    eps: float = 1e-6,
    world: World,
    config: Mapping[str, Any],
    out: tuple[Any, Any] | None = None,
) -> tuple[Any, Any]:
    """`gemm_ar`, then RMSNorm: h = sum_p A_p @ B_p (+ residual), rounded to the input dtype, and normed = h *
    rsqrt(mean(h^2) + eps) * weight, in float32 and rounded once. Returns (normed, h): the next layer's input and its
    residual. `weight` is [N] (the input's dtype or float32); `out` = (normed, h) tensors to fill (h may be the
    residual itself: the update is then in place, element by element).
    """
    res = None if residual is None else as_list(residual)
    normed, h = out if out is not None else (None, None)
    _, o_l, h_l = _call(as_list(a), as_list(b), res, as_list(weight), eps, world, config, normed, h)
    assert h_l is not None
    return (o_l[0], h_l[0]) if isinstance(a, torch.Tensor) else (o_l, h_l)


def row_parallel(
    x: torch.Tensor | Sequence[torch.Tensor],
    w: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    residual: torch.Tensor | Sequence[torch.Tensor] | None = None,
    norm_weight: torch.Tensor | Sequence[torch.Tensor] | None = None,
    eps: float = 1e-6,
) -> Any:
    """A row-parallel linear layer with a replicated output, as the standard tensor-parallel layout calls it: `x`
    [T, in/W] and `w` [in/W, out] per rank, the sum over ranks on every rank (+ `residual`). With `norm_weight` the
    RMSNorm epilogue runs too and the result is (normed, new_residual). Its config is tuned under `gemm_ar`, or under
    `gemm_ar_rmsnorm` with the norm (`family_name`)."""
    if norm_weight is None:
        return gemm_ar(x, w, world=world, config=config, residual=residual)
    return gemm_ar_rmsnorm(x, w, residual, norm_weight, eps=eps, world=world, config=config)


def family_name(norm: bool) -> str:
    """The kernel (family) a row-parallel call's configs are tuned and stored under."""
    return "gemm_ar_rmsnorm" if norm else "gemm_ar"


class PreparedGemmAr:
    """One call with its tensors bound: `run()` issues the same launches again, reading whatever the bound inputs hold
    now and writing the bound outputs, as a CUDA graph replay of the call would."""

    def __init__(self, plan: Any, a: Tensors, b: Tensors, res: Tensors | None, weight: Tensors | None, out: Tensors,
                 h_out: Tensors | None) -> None:  # fmt: skip
        self._plan, self.a, self.b, self.res, self.weight, self.out, self.h_out = plan, a, b, res, weight, out, h_out

    def run(self) -> Tensors | tuple[Tensors, Tensors]:
        self._plan(self.a, self.b, self.out, self.res, self.weight, self.h_out)
        return self.out if self.h_out is None else (self.out, self.h_out)


def prepare(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    residual: torch.Tensor | Sequence[torch.Tensor] | None = None,
    norm_weight: torch.Tensor | Sequence[torch.Tensor] | None = None,
    eps: float = 1e-6,
    out: Any = None,
    h_out: Any = None,
) -> PreparedGemmAr:
    """Run the call once (building its plan) and return it, bound to these tensors, to re-issue."""
    a_l, b_l = as_list(a), as_list(b)
    if any(not x.is_contiguous() or x.data_ptr() % 16 for x in a_l):
        raise ShapeError("a: must be row-major and 16-byte aligned to be bound to a prepared call")
    res = None if residual is None else as_list(residual)
    weight = None if norm_weight is None else as_list(norm_weight)
    plan, o_l, h_l = _call(a_l, b_l, res, weight, eps, world, config, out, h_out)
    return PreparedGemmAr(plan, a_l, b_l, res, weight, o_l, h_l)


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
