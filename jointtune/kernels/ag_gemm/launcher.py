"""AG+GEMM's launcher: the entry point and torch op over its plans (`plans`), and its family (the package doc says
what each mode does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton

from jointtune.kernels.ag_gemm.args import AgGemmConfig, Shape, gemm_args, push_args
from jointtune.kernels.ag_gemm.plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, usable
from jointtune.kernels.runtime.calls import config_json as config_json  # the op's config text, as users import it here
from jointtune.kernels.runtime.family import StandinLaunch, register_family
from jointtune.kernels.runtime.gemm import GemmFamily, GemmInputs, check_gemm_operands
from jointtune.kernels.runtime.launch import split_options
from jointtune.kernels.runtime.op import Args, FusedOp, PerRank, Prepared
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.symm import slot_elems
from jointtune.kernels.runtime.world import World

__all__ = ["AgGemmFamily", "PreparedAgGemm", "ag_gemm", "config_json", "prepare", "reference"]

_OWNED_MODES = ("pull", "ce")  # modes whose plan reads A from the caller's symmetric buffer in place


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


class AgGemmOp(FusedOp):
    """A [R, K] per rank gathered over the ranks, times this rank's B [K, N_r]: C [M, N_r], M = R * W."""

    name, inputs, outputs, bound_in_place = "ag_gemm", ("a", "b"), ("c",), ("a",)

    def check(self, args: Args, world: World) -> None:
        check_gemm_operands(*args, world, ("R", "K", "N_r"))

    def plan_key(self, world: World, args: Args, config: Mapping[str, Any],
                 return_gathered: bool = False) -> tuple[Any, Any]:  # fmt: skip
        """Everything a plan bakes in: config, shapes, dtypes, B's strides, devices, and for the modes that read A in
        place, the caller's symmetric buffer holding it (placed: that buffer and A's offset in it, or None)."""
        a, b = args
        ckey = config_key(config)  # a config that is no mapping is refused here, by name
        owner, off = _owner(world, a) if config.get("mode") in _OWNED_MODES else (None, 0)
        a0, b0 = a[0], b[0]
        # the buffer by name: `world.empty` names buffers in call order, the same on every rank (`World.plan`
        # checks that all ranks build the same key)
        key = ("ag_gemm", ckey, a0.shape, b0.shape, a0.dtype, b0.dtype, b0.stride(), a0.device, b0.device,
               len(a), return_gathered, None if owner is None else owner.name, off)  # fmt: skip
        return key, None if owner is None else (owner, off)

    def build(self, world: World, args: Args, config: Mapping[str, Any], placed: Any,
              return_gathered: bool = False) -> Any:  # fmt: skip
        a, b = args
        R, K, N_r = check_gemm_operands(a, b, world, ("R", "K", "N_r"))
        shape = {"M": R * world.world_size, "N": N_r * world.world_size, "K": K}
        cfg = AgGemmConfig.of(resolve_config("ag_gemm", config, shape, DTYPES[a[0].dtype], world))
        s = Shape(world, R, K, N_r, a[0].dtype, tuple(b[0].stride()))
        owner, off = placed or (None, 0)
        return build_plan(s, cfg, owner, off, return_gathered)

    def readable(self, args: Args, placed: Any) -> Args:
        return args if placed is not None else [[usable(x) for x in args[0]], args[1]]

    def out_shape(self, args: Args, world_size: int) -> tuple[int, ...]:
        return (args[0][0].shape[0] * world_size, args[1][0].shape[1])

    def issue(self, world: World, key: Any, plan: Any, args: Args, outputs: Args, placed: Any,
              return_gathered: bool = False) -> Any:  # fmt: skip
        a, b = args
        (outs,) = outputs
        if world.concurrent and not return_gathered and getattr(plan, "replay_eagerly", False):  # (`eager_graph`)
            copied, in_place = ([], [*a, *b]) if placed is not None else (a, b)  # an owner's A is read in place
            if world.eager.call(key, lambda ins, o: plan(ins or a, b, o), copied, in_place, outs):
                return outs
        gathered = plan(a, b, outs)
        return list(zip(outs, gathered)) if return_gathered else outs


_OP = AgGemmOp()
_OP.register()
#: an `ag_gemm` call bound to its tensors (`prepare`); `run()` re-issues it
PreparedAgGemm = Prepared
#: `prepare(a, b, *, world, config, out=None)`: run `ag_gemm` once (building its plan) and return the call, bound to
#: these tensors, to re-issue (`PreparedAgGemm.run`: A must be row-major and 16-byte aligned)
prepare = _OP.prepare


def ag_gemm(a: PerRank, b: PerRank, *, world: World, config: Mapping[str, Any], return_gathered: bool = False,
            out: PerRank | None = None) -> Any:  # fmt: skip
    """All-gather `a` over the world's ranks and multiply by this rank's `b`.

    On the CUDA world `a` and `b` are this rank's tensors and the result is C (or (C, A_gathered));
    on the local world they are lists with one tensor per simulated rank, and so is the result.
    `out` (optional, row-major [M, N_r] per rank) receives C instead of a new tensor. The config must
    be valid in the `ag_gemm` space for this shape (SpaceError names the fields otherwise).
    """
    return _OP.call((a, b), world, config, out, return_gathered=return_gathered)


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """float32 reference: every rank's C from all ranks' A shards and each rank's B."""
    gathered = torch.cat([x.float() for x in a], dim=0)
    return [gathered @ bi.float() for bi in b]


# ---------------------------------------------------------------------------------------------- family


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
    if cfg.mode == "barrier":
        from jointtune.kernels.ag_gemm.ll_gather import ag_gemm_ll_gather_kernel
        from jointtune.kernels.ag_gemm.meet import ag_gemm_inbox_meet_kernel, ag_gemm_meet_kernel
        from jointtune.kernels.ag_gemm.plans import inbox_meet_args, ll_gather_args, meet_args

        if cfg.landing == "ll":
            args = ll_gather_args(R, K, W, a=t, gathered=t, inbox=i64, inbox_deltas=i64, state=i64, rank=0, slot=16,
                                  half_stride=16, push=True, copy=True, epoch=1)  # fmt: skip
            return [_split(ag_gemm_ll_gather_kernel, args)]
        if cfg.landing == "inbox":
            args = inbox_meet_args(R, K, W, a=t, gathered=t, inbox=t, inbox_deltas=i64, signals=i32, signal_deltas=i64,
                                   state=i64, rank=0, slot=16, half_stride=16, push=True, copy=True, meet=True,
                                   epoch=1)  # fmt: skip
            return [_split(ag_gemm_inbox_meet_kernel, args)]
        args = meet_args(R, K, W, a=t, gathered=t, deltas=i64, signals=i32, signal_deltas=i64, rank=0, meet=True)
        return [_split(ag_gemm_meet_kernel, args)]
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


class AgGemmFamily(GemmFamily):
    op, config_type, launches = _OP, AgGemmConfig, staticmethod(standin_launches)
    split, symmetric_inputs = ("M", "N"), True  # A where the layer before leaves it, in symmetric memory

    def shard_shapes(self, M: int, N: int, K: int, world_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (M // world_size, K), (K, N // world_size)

    def reference(self, inputs: GemmInputs) -> list[torch.Tensor]:
        return reference(inputs.all_a, inputs.b)

    def call_shape(self, a0: torch.Tensor, b0: torch.Tensor, world_size: int) -> dict[str, int]:
        return {"M": a0.shape[0] * world_size, "N": b0.shape[1] * world_size, "K": a0.shape[1]}


register_family(AgGemmFamily())
