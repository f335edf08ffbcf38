"""All-Gather + GEMM for a column-parallel linear layer: C_r = all_gather(A) @ B_r.

Rank r holds A_r [M/W, K] and B_r [K, N/W] and gets C_r [M, N/W] (and, if asked, the gathered A,
as `torch.ops.symm_mem.fused_all_gather_matmul` gives). The config's `mode` picks how A travels:

- pull: the GEMM loads peers' rows straight from their symmetric buffers; no extra kernel.
- push: producer programs inside the GEMM's persistent grid push rows into every peer's inbox.
- push_cublas: the same push as a kernel of its own (or copy-engine copies plus a flag kernel), and
  cuBLAS multiplies: local rows while peers' rows travel, then each chunk after its flag; or all rows
  in one GEMM after the gather.
- ce: the copy engine pulls peers' rows on a side stream, chunk by chunk; per chunk a Triton tile
  GEMM or cuBLAS consumes it as soon as its event fires. Local rows are multiplied first.
- baseline: NCCL all-gather, then torch.matmul (kept in the space: tuning never loses to it).

A may already live in the world's symmetric memory (`world.empty`, written by the previous layer:
nothing is copied) or be an ordinary tensor. Every call of one (world, shapes, dtype, config) runs a
launch plan built once (`plans`), and nothing a later call needs comes from the host, so the
op is correct under CUDA-graph capture and replay (capture after one eager warm-up call).

Three ways in:
    ag_gemm(a, b, world=world, config=cfg)                         # eager, the cheapest host path
    torch.ops.jointtune.ag_gemm([a], [b], world.name, cfg_json)    # torch.compile / graphs (`config_json`)
    get_family("ag_gemm")                                          # tuner, decorator and benchmarks
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

from jointtune.errors import ShapeError
from jointtune.kernels.ag_gemm.args import AgGemmConfig, Shape, gemm_args, push_args
from jointtune.kernels.ag_gemm.plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, as_list, first_of, forward_only, parse_config, usable
from jointtune.kernels.runtime.calls import (
    config_json as config_json,  # the op's config text, as users import it from here
)
from jointtune.kernels.runtime.eager_graph import direct_only
from jointtune.kernels.runtime.family import Family, StandinLaunch, register_family
from jointtune.kernels.runtime.launch import split_options
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.symm import slot_elems
from jointtune.kernels.runtime.world import World, world_named

_OWNED_MODES = ("pull", "ce")  # modes whose plan reads A from the caller's symmetric buffer in place


def _check(a: list[torch.Tensor], b: list[torch.Tensor], world: World) -> tuple[int, int, int]:
    n_local = len(world.local_ranks)
    if len(a) != n_local or len(b) != n_local:
        raise ShapeError(f"a, b: expected one tensor per local rank ({n_local}), got {len(a)} and {len(b)}")
    R, K = a[0].shape if a[0].dim() == 2 else (0, 0)
    N_r = b[0].shape[1] if b[0].dim() == 2 else 0
    for i, (ai, bi) in enumerate(zip(a, b)):
        if ai.dim() != 2 or bi.dim() != 2:
            raise ShapeError(f"a, b: must be 2-D, got a{list(ai.shape)} and b{list(bi.shape)} on rank index {i}")
        if tuple(ai.shape) != (R, K) or bi.shape[0] != K or bi.shape[1] != N_r or min(R, K, N_r) < 1:
            raise ShapeError(
                f"shapes: a must be [R, K] and b [K, N_r] alike on every rank, all sizes >= 1; rank index {i} has "
                f"a{list(ai.shape)}, b{list(bi.shape)} against a[{R}, {K}], b[{K}, {N_r}]"
            )
        if ai.dtype not in DTYPES or bi.dtype != ai.dtype:
            raise ShapeError(f"dtype: a {ai.dtype} and b {bi.dtype}; both must be bfloat16 or float16")
        if ai.device != world.device or bi.device != world.device:
            raise ShapeError(f"device: tensors must be on {world.device}, got {ai.device} and {bi.device}")
        if bi.stride() != b[0].stride():
            raise ShapeError(f"b: strides must match on every rank; rank index {i} has {bi.stride()}")
    return R, K, N_r


def _owner(world: World, a: list[torch.Tensor]) -> tuple[Any, int]:
    """The caller's symmetric buffer holding every local rank's A at one offset, or (None, 0)."""
    buf = world.symmetric_of(a[0])
    if buf is None or not a[0].is_contiguous():
        return None, 0
    off = (a[0].data_ptr() - buf.tensors[0].data_ptr()) // a[0].element_size()
    for i, x in enumerate(a):
        if world.symmetric_of(x) is not buf or x.data_ptr() != buf.tensors[i].data_ptr() + off * x.element_size():
            return None, 0
    return buf, off


def ag_gemm(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    return_gathered: bool = False,
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Any:
    """All-gather `a` over the world's ranks and multiply by this rank's `b`.

    On the CUDA world `a` and `b` are this rank's tensors and the result is C (or (C, A_gathered));
    on the local world they are lists with one tensor per simulated rank, and so is the result.
    `out` (optional, row-major [M, N_r] per rank) receives C instead of a new tensor. The config must
    be valid in the `ag_gemm` space for this shape (SpaceError names the fields otherwise).
    """
    a_l, b_l = as_list(a), as_list(b)
    forward_only("ag_gemm", a=a_l, b=b_l)
    if len(a_l) != 1 or len(b_l) != 1 or len(world.local_ranks) != 1:
        _check(a_l, b_l, world)  # simulated ranks: every rank's tensors, every call (the CPU's path)
    a0, b0 = a_l[0], b_l[0]
    key, owner, off = _plan_key(world, a_l, b_l, config, return_gathered)
    plan = world.plans.get(key)
    if plan is None:
        plan = world.plan(key, functools.partial(_build, world, a_l, b_l, config, owner, off, return_gathered))
    if owner is None:
        a_l = [usable(x) for x in a_l]
    R, N_r = a0.shape[0], b0.shape[1]
    M = R * world.world_size
    if out is None:
        c_l = [torch.empty((M, N_r), dtype=a0.dtype, device=world.device) for _ in a_l]
    else:
        c_l = as_list(out)
        if len(c_l) != len(a_l) or any(c.shape != (M, N_r) or c.dtype != a0.dtype or c.stride() != (N_r, 1)
                                       or c.device != world.device for c in c_l):  # fmt: skip
            raise ShapeError(f"out: must be one row-major [{M}, {N_r}] {a0.dtype} tensor per local rank")
    if world.concurrent and not return_gathered and getattr(plan, "replay_eagerly", False):  # (`eager_graph`)
        copied, in_place = ([], [*a_l, *b_l]) if owner is not None else (a_l, b_l)  # an owner's A is read in place
        if world.eager.call(key, lambda ins, outs: plan(ins or a_l, b_l, outs), copied, in_place, c_l):
            return c_l[0] if isinstance(a, torch.Tensor) else c_l
    gathered = plan(a_l, b_l, c_l)
    result = list(zip(c_l, gathered)) if return_gathered else c_l
    return result[0] if isinstance(a, torch.Tensor) else result


class PreparedAgGemm:
    """One call with its tensors bound: `run()` issues the same launches again, reading whatever the
    bound A and B hold now and writing the bound C, exactly as a CUDA graph replay of the call would
    (the CPU interpreter's stand-in for one). The cheapest repeat call there is: no key, no checks."""

    def __init__(self, plan: Any, a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor]) -> None:
        self._plan, self.a, self.b, self.c = plan, a, b, c

    def run(self) -> list[torch.Tensor]:
        self._plan(self.a, self.b, self.c)
        return self.c


def prepare(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> PreparedAgGemm:
    """Run `ag_gemm` once (building its plan) and return the call, bound to these tensors, to re-issue."""
    a_l, b_l = as_list(a), as_list(b)
    c_l = as_list(ag_gemm(a_l, b_l, world=world, config=config, out=out))
    a_l = [x if x.is_contiguous() and x.data_ptr() % 16 == 0 else None for x in a_l]
    if any(x is None for x in a_l):
        raise ShapeError("a: must be row-major and 16-byte aligned to be bound to a prepared call")
    key, _, _ = _plan_key(world, a_l, b_l, config, False)
    return PreparedAgGemm(world.plans[key], a_l, b_l, c_l)


def _plan_key(world: World, a: list[torch.Tensor], b: list[torch.Tensor], config: Mapping[str, Any],
              want_gathered: bool) -> tuple[tuple[Any, ...], Any, int]:  # fmt: skip
    """Everything a plan bakes in: config, shapes, dtypes, B's strides, devices, and for the modes that
    read A in place, the caller's symmetric buffer holding it."""
    ckey = config_key(config)  # a config that is no mapping is refused here, by name
    owner, off = _owner(world, a) if config.get("mode") in _OWNED_MODES else (None, 0)
    a0, b0 = a[0], b[0]
    # the buffer by name: `world.empty` names buffers in call order, the same on every rank (`World.plan`
    # checks that all ranks build the same key)
    key = ("ag_gemm", ckey, a0.shape, b0.shape, a0.dtype, b0.dtype, b0.stride(), a0.device, b0.device,
           len(a), want_gathered, None if owner is None else owner.name, off)  # fmt: skip
    return key, owner, off


def _build(world: World, a: list[torch.Tensor], b: list[torch.Tensor], config: Mapping[str, Any], owner: Any,
           off: int, want_gathered: bool) -> Any:  # fmt: skip
    R, K, N_r = _check(a, b, world)
    shape = {"M": R * world.world_size, "N": N_r * world.world_size, "K": K}
    cfg = AgGemmConfig.of(resolve_config("ag_gemm", config, shape, DTYPES[a[0].dtype], world))
    s = Shape(world, R, K, N_r, a[0].dtype, tuple(b[0].stride()))
    return build_plan(s, cfg, owner, off, want_gathered)


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """float32 reference: every rank's C from all ranks' A shards and each rank's B."""
    gathered = torch.cat([x.float() for x in a], dim=0)
    return [gathered @ bi.float() for bi in b]


# ---------------------------------------------------------------------------------------------- op


@torch.library.custom_op("jointtune::ag_gemm", mutates_args=())
def _ag_gemm_op(a: list[torch.Tensor], b: list[torch.Tensor], world: str, config: str) -> list[torch.Tensor]:
    """torch.ops.jointtune.ag_gemm(a, b, world_name, config_json) -> C per local rank."""
    with direct_only():  # torch.compile's CUDA graphs run through here: no graphs of ours (`eager_graph`)
        return list(ag_gemm(list(a), list(b), world=world_named(world), config=parse_config(config)))


@_ag_gemm_op.register_fake
def _ag_gemm_fake(a: list[torch.Tensor], b: list[torch.Tensor], world: str, config: str) -> list[torch.Tensor]:
    W = world_named(world).world_size
    return [x.new_empty((x.shape[0] * W, y.shape[1])) for x, y in zip(a, b)]


# ---------------------------------------------------------------------------------------------- family


@dataclass
class AgGemmInputs:
    """Every local rank's shards, and all ranks' A shards for the reference."""

    problem: Any
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    all_a: list[torch.Tensor]


class AgGemmFamily(Family):
    name = "ag_gemm"
    space = "ag_gemm"
    dims = ("M", "N", "K")

    def make_inputs(self, problem: Any, world: World, *, seed: int, symmetric: bool = True) -> AgGemmInputs:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W or M % W or N % W:
            raise ShapeError(
                f"shape: M={M} and N={N} must be divisible by world_size={W} (the problem says {problem.world_size})"
            )
        dtype = getattr(torch, problem.dtype)
        R, N_r = M // W, N // W
        gen = torch.Generator(device="cpu").manual_seed(seed)
        # every rank draws every shard from one seed, so each can build the reference on its own
        all_a = [(torch.randn(R, K, generator=gen) / K**0.25).to(dtype).to(world.device) for _ in range(W)]
        all_b = [(torch.randn(K, N_r, generator=gen) / K**0.25).to(dtype) for _ in range(W)]
        b = [all_b[r].to(world.device) for r in world.local_ranks]
        a = [all_a[r] for r in world.local_ranks]
        if symmetric:
            slots = world.empty((R, K), dtype)
            for s, x in zip(slots, a):
                s.copy_(x)
            a = slots
        return AgGemmInputs(problem, a, b, all_a)

    def run(self, inputs: AgGemmInputs, config: Mapping[str, Any], world: World) -> list[torch.Tensor]:
        return ag_gemm(inputs.a, inputs.b, world=world, config=config)

    def reference(self, inputs: AgGemmInputs) -> list[torch.Tensor]:
        return reference(inputs.all_a, inputs.b)

    def key(self, a: Any, b: Any, *, world: World, **_: Any) -> dict[str, int]:
        try:  # the decorator's hot path: arguments are checked only when reading them fails
            a0, b0 = as_list(a)[0], as_list(b)[0]
            W = world.world_size
            return {"M": a0.shape[0] * W, "N": b0.shape[1] * W, "K": a0.shape[1]}
        except (AttributeError, IndexError, TypeError, ValueError):
            first_of("a", a, 2), first_of("b", b, 2)  # names the argument, or the original error stands
            raise

    def flops(self, problem: Any) -> float:
        M, N, K = (problem.dim(d) for d in self.dims)
        return 2.0 * M * N * K

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: torch.device) -> list[StandinLaunch]:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = problem.world_size
        dtype = getattr(torch, problem.dtype)
        cfg = AgGemmConfig.of(dict(config))
        return standin_launches(cfg, M=M, N=N, K=K, world_size=W, dtype=dtype, device=device)


def standin_launches(cfg: AgGemmConfig, *, M: int, N: int, K: int, world_size: int, dtype: torch.dtype,
                     device: torch.device) -> list[StandinLaunch]:  # fmt: skip
    """(kernel, arguments, options) of the big Triton kernel a call of this shape launches, with
    1-element stand-in tensors and the call's real integers (as `ag_gemm`'s plans build them)."""
    from jointtune.kernels.ag_gemm.kernel import ag_gemm_kernel
    from jointtune.kernels.runtime.signals import allgather_push_kernel

    W, R, N_r = world_size, M // world_size, N // world_size
    t = torch.empty(1, dtype=dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    slot = slot_elems(R, K)
    if cfg.mode == "push_cublas":
        if cfg.push_by != "sm":
            return []
        gathered = cfg.gemm_order == "gathered"  # then a plan on a world whose ranks run at once folds the open
        chunk = triton.next_power_of_2(R) if gathered else cfg.chunk_m
        args = push_args(cfg, W, src=t, inbox_base=t, inbox_deltas=i64, own=t, flag_ptrs=i64, flags_local=i64,
                         done=i32, state=i64, K=K, R=R, slot=slot, half_stride=0, rank=0,
                         n_chunks=-(-R // chunk), chunk_m=chunk, epoch=1 if gathered else 2, wait_all=gathered,
                         own_rows=gathered, enter=(i64, i64) if gathered else None)  # fmt: skip
        return [_split(allgather_push_kernel, args)]
    if cfg.mode not in ("pull", "push") and not (cfg.mode == "ce" and cfg.ce_consumer == "triton"):
        return []
    b = torch.empty_strided((1, 1), (N_r, 1), dtype=dtype, device=device)
    c = torch.empty_strided((1, 1), (N_r, 1), dtype=dtype, device=device)
    push = None
    if cfg.mode == "push":
        push = dict(inbox=t, inbox_deltas=i64, flags=i64, flag_ptrs=i64, tickets=i32, done=i32, state=i64,
                    slot=slot, half_stride=W * slot, n_chunks=2, comm_sms=cfg.comm_sms, consumers=2, pid_base=0,
                    ticket_takers=2, num_programs=2, own=False, epoch=1, producers_consume=True)  # fmt: skip
    rows = M if cfg.mode != "ce" else -(-R // cfg.ce_chunks)
    split = f32 if cfg.SPLIT_K > 1 else None
    args = gemm_args(cfg, W, a=t, b=b, c=c, K=K, N_r=N_r, R=R if cfg.mode != "ce" else rows, rows=rows, dummy=i64,
                     src=t, deltas=i64, push=push, ws=split, counts=i32 if split is not None else None)  # fmt: skip
    return [_split(ag_gemm_kernel, args)]


def _split(kernel: Any, args: Any) -> StandinLaunch:
    return (kernel, *split_options(args))


register_family(AgGemmFamily())
