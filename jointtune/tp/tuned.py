"""The fused ops as the tensor-parallel layers call them: through `@joint_autotune`, as any user code does.

Each op (`ag_gemm`, `gemm_rs`, `flash_decode`, and GEMM + all-reduce as `gemm_ar` and `gemm_ar_rmsnorm`) is a
launcher decorated with `@joint_autotune(space=..., kernel=...)`, so a layer's config comes from the decorator's chain
(its cache, the local store, the service, then the miss policy), the same on every rank, timed the way the call runs
(eager, or `graph` while a CUDA graph is captured). `gemm_ar_rmsnorm` searches gemm_ar's space but keeps records of
its own (the epilogue changes the work), and an untuned key of either resolves to the space default, the `baseline`
(cuBLAS + the best unfused all-reduce). Layers with the same `Tuning` share one launcher per op, so eighty layers of
one shape resolve a key once.

`torch.compile` can't trace the decorator (a lookup may open a database). So every eager call also remembers the
config text each policy resolved to, by the call's exact shapes; while `torch.compile` traces, the op is
`torch.ops.jointtune.<op>` with that text as a constant (policy: `Tuning.compiled_timing`, else `graph` where
CUDA graphs exist, else `eager`). A shape first seen while tracing can't be looked up there: run the module once
eagerly at that token count (the layers' `warm`), then compile.

Example:
    >>> op = tuned_op("ag_gemm", Tuning(on_miss="default"))
    >>> world = create_world("local", world_size=2)                                   # doctest: +SKIP
    >>> c = op([a0, a1], [b0, b1], world=world)                                      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import TuningError

_POLICY_ORDER = ("graph", "eager", "gpu")


@dataclass(frozen=True)
class Tuning:
    """How the layers' ops find configs: the arguments they pass to `@joint_autotune` (see its docstring).

    `compiled_timing`: the policy whose config is baked in when `torch.compile` traces a layer (None: `graph` where
    the eager call also resolved one, i.e. on CUDA, else `eager`)."""

    on_miss: str = "nearest"
    db_url: str | None = None
    server: str | None = None
    timing: str | None = None
    timing_fallback: str | None = None
    compiled_timing: str | None = None

    def decorator_options(self) -> dict[str, Any]:
        return {"on_miss": self.on_miss, "db_url": self.db_url, "server": self.server, "timing": self.timing,
                "timing_fallback": self.timing_fallback}  # fmt: skip


def _ag_gemm(a: Any, b: Any, *, world: Any, config: Mapping[str, Any]) -> Any:
    from jointtune import ag_gemm

    return ag_gemm(a, b, world=world, config=config)


def _gemm_rs(a: Any, b: Any, *, world: Any, config: Mapping[str, Any]) -> Any:
    from jointtune import gemm_rs

    return gemm_rs(a, b, world=world, config=config)


def _flash_decode(q: Any, k: Any, v: Any, kv_lens: Any, *, world: Any, config: Mapping[str, Any]) -> Any:
    from jointtune import flash_decode

    return flash_decode(q, k, v, kv_lens, world=world, config=config)


def _gemm_ar(a: Any, b: Any, residual: Any = None, *, world: Any, config: Mapping[str, Any]) -> Any:
    from jointtune import gemm_ar

    return gemm_ar(a, b, world=world, config=config, residual=residual)


def _gemm_ar_rmsnorm(a: Any, b: Any, residual: Any, weight: Any, *, world: Any, config: Mapping[str, Any],
                     eps: float) -> Any:  # fmt: skip
    from jointtune import gemm_ar_rmsnorm

    return gemm_ar_rmsnorm(a, b, residual, weight, eps=eps, world=world, config=config)


#: the ops a layer may call: the three fused families, and GEMM + all-reduce in its two kernels (the sum, and the sum
#: with the residual + RMSNorm epilogue: one space, `gemm_ar`, two record keys)
_RUNNERS = {"ag_gemm": _ag_gemm, "gemm_rs": _gemm_rs, "flash_decode": _flash_decode, "gemm_ar": _gemm_ar,
            "gemm_ar_rmsnorm": _gemm_ar_rmsnorm}  # fmt: skip

Out = list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]


def _as_lists(family: str, out: Any) -> Out:
    """An op's result as per-rank lists: (normed, new residual) for gemm_ar_rmsnorm, else one list."""
    if family == "gemm_ar_rmsnorm":
        normed, h = out
        return list(normed), list(h)
    return list(out)


class TunedOp:
    """One fused op over per-rank lists, its config from `@joint_autotune`; call `op(*tensors, world=world)`.

    The tensors are the family's positional arguments, one list per argument (gemm_ar's residual may be None);
    keyword options the op takes besides (gemm_ar_rmsnorm's `eps`) follow `world`."""

    def __init__(self, family: str, tuning: Tuning) -> None:
        from jointtune import joint_autotune
        from jointtune.kernels import get_family

        if family not in _RUNNERS:
            raise TuningError(f"family: {family!r} is not allowed; allowed: {', '.join(_RUNNERS)}")
        self.family = family
        self.tuning = tuning
        #: the decorated launcher (its `cache` and `sources` say which config each key got, and from where): the
        #: family's space and records (gemm_ar_rmsnorm tunes gemm_ar's space under its own kernel name)
        self.launcher = joint_autotune(space=get_family(family).space, kernel=family,
                                       **tuning.decorator_options())(_RUNNERS[family])  # fmt: skip
        #: exact call (world, shapes, dtype) -> {timing policy: config JSON}, for torch.compile
        self.texts: dict[tuple[Any, ...], dict[str, str]] = {}

    def __call__(self, *tensors: list[torch.Tensor] | None, world: Any, **options: Any) -> Out:
        call = _call_key(world, tensors)
        if torch.compiler.is_compiling():
            return self._traced(call, tensors, world, options)
        out = self.launcher(*tensors, world=world, **options)
        if call not in self.texts:
            self.texts[call] = self._resolved(tensors, world)
        return _as_lists(self.family, out)

    def config_for(self, *tensors: list[torch.Tensor] | None, world: Any) -> dict[str, str]:
        """{timing policy: config JSON} this exact call resolved to (empty before its first eager call)."""
        return dict(self.texts.get(_call_key(world, tensors), {}))

    def _resolved(self, tensors: tuple[Any, ...], world: Any) -> dict[str, str]:
        from jointtune.kernels.runtime.calls import config_json

        launcher = self.launcher
        base = (tuple(launcher.key(*tensors, world=world).items()), launcher.dtype_of(*tensors), world.world_size)
        return {t: config_json(c) for t in _POLICY_ORDER if (c := launcher.cache.get((*base, t))) is not None}

    def _traced(self, call: tuple[Any, ...], tensors: tuple[Any, ...], world: Any, options: dict[str, Any]) -> Out:
        texts = self.texts.get(call)
        if not texts:
            raise TuningError(
                f"{self.family}: no config resolved for {call[1]} before torch.compile traced it; run the module once "
                "eagerly at this token count (or call its warm()) first: the decorator's lookup can't run in a trace"
            )
        policy = self.tuning.compiled_timing
        if policy is None:
            for t in _POLICY_ORDER:
                if t in texts:
                    policy = t
                    break
        text = texts.get(policy)
        if text is None:
            have = ", ".join(sorted(texts))
            raise TuningError(f"{self.family}: compiled_timing {policy!r} resolved no config; resolved: {have}")
        op = getattr(torch.ops.jointtune, self.family)
        if self.family == "gemm_ar":  # the registered op takes an absent residual as an empty list
            a, b, residual = (*tensors, None)[:3]
            return list(op(a, b, residual or [], world.name, text))
        if self.family == "gemm_ar_rmsnorm":
            a, b, residual, weight = tensors
            return _as_lists(self.family, op(a, b, residual or [], weight, float(options["eps"]), world.name, text))
        return list(op(*tensors, world.name, text))


def _call_key(world: Any, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    """The call's world and every argument's shape and dtype (rank 0's: the ops require them alike on every rank;
    None for an absent optional argument)."""
    return (world.name, tuple(None if t is None else (tuple(t[0].shape), t[0].dtype) for t in tensors))


_OPS: dict[tuple[str, Tuning], TunedOp] = {}


def tuned_op(family: str, tuning: Tuning | None = None) -> TunedOp:
    """The shared TunedOp of `family` under `tuning` (one launcher, one cache, for every layer that asks)."""
    tuning = tuning or Tuning()
    op = _OPS.get((family, tuning))
    if op is None:
        op = _OPS[(family, tuning)] = TunedOp(family, tuning)
    return op
