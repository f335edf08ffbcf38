"""GEMM+RS's launcher: the entry point and torch op over its plans (`plans`), and its family (the package doc says
what each mode does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.gemm_rs.args import EPI_ATOMIC, EPI_SIGNAL, EPI_STORE, GemmRsConfig, RsShape, kernel_args
from jointtune.kernels.gemm_rs.args import tile_work as _work
from jointtune.kernels.gemm_rs.plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, config_json, usable
from jointtune.kernels.runtime.device import num_sms
from jointtune.kernels.runtime.family import StandinLaunch, register_family
from jointtune.kernels.runtime.gemm import GemmFamily, GemmInputs, check_gemm_operands
from jointtune.kernels.runtime.op import Args, FusedOp, PerRank, Prepared
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.symm import cdiv
from jointtune.kernels.runtime.world import World

__all__ = ["GemmRsFamily", "PreparedGemmRs", "config_json", "gemm_rs", "prepare", "reference"]


class GemmRsOp(FusedOp):
    """A [M, K_r] times B [K_r, N] per rank, summed over the ranks; each rank keeps its M / W rows."""

    name, inputs, bound_in_place = "gemm_rs", ("a", "b"), ("a",)

    def check(self, args: Args, world: World) -> None:
        self._check(args, world)

    def _check(self, args: Args, world: World) -> tuple[int, int, int]:
        """(M, K_r, N) of a call; ShapeError naming the argument otherwise."""
        M, K_r, N = check_gemm_operands(*args, world, ("M", "K_r", "N"))
        W = world.world_size
        if M % W:
            raise ShapeError(f"a: M={M} rows are not allowed with world_size={W}; M must be divisible by world_size")
        return M, K_r, N

    def plan_key(self, world: World, args: Args, config: Mapping[str, Any]) -> tuple[Any, Any]:
        """Everything a plan bakes in: config, shapes, dtypes, B's strides, devices."""
        (a0, *_), (b0, *_) = args
        return ("gemm_rs", config_key(config), a0.shape, b0.shape, a0.dtype, b0.dtype, b0.stride(), a0.device,
                b0.device, len(args[0])), None  # fmt: skip

    def build(self, world: World, args: Args, config: Mapping[str, Any], placed: Any) -> Any:
        M, K_r, N = self._check(args, world)
        a, b = args
        shape = {"M": M, "N": N, "K": K_r * world.world_size}
        cfg = GemmRsConfig.of(resolve_config("gemm_rs", config, shape, DTYPES[a[0].dtype], world))
        return build_plan(world, RsShape(world.world_size, M, K_r, N, a[0].dtype, tuple(b[0].stride())), cfg)

    def readable(self, args: Args, placed: Any) -> Args:
        return [[usable(x) for x in args[0]], args[1]]

    def out_shape(self, args: Args, world_size: int) -> tuple[int, ...]:
        return (args[0][0].shape[0] // world_size, args[1][0].shape[1])

    def issue(self, world: World, key: Any, plan: Any, args: Args, outputs: Args, placed: Any) -> Any:
        a, b = args
        (outs,) = outputs
        replayed = (
            world.concurrent
            and getattr(plan, "replay_eagerly", False)
            and world.eager.call(key, lambda ins, o: plan(ins, b, o), a, b, outs)
        )
        if not replayed:
            plan(a, b, outs)  # most plans; the first call of one that replays, a big one (`eager_graph`)
        return outs


_OP = GemmRsOp()
_OP.register()
#: a `gemm_rs` call bound to its tensors (`prepare`); `run()` re-issues it
PreparedGemmRs = Prepared
#: `prepare(a, b, *, world, config, out=None)`: run `gemm_rs` once (building its plan) and return the call, bound to
#: these tensors, to re-issue (`PreparedGemmRs.run`: A must be row-major and 16-byte aligned)
prepare = _OP.prepare


def gemm_rs(a: PerRank, b: PerRank, *, world: World, config: Mapping[str, Any], out: PerRank | None = None) -> Any:
    """Multiply this rank's `a` [M, K_r] by its `b` [K_r, N], sum over ranks, keep this rank's M/W rows.

    On the CUDA world `a` and `b` are this rank's tensors and the result is its [M/W, N] rows; on the local
    world they are lists with one tensor per simulated rank, and so is the result. `out` (optional,
    row-major [M/W, N] per rank) receives the rows instead of a new tensor. The config must be valid in the
    `gemm_rs` space for this shape (SpaceError names the fields otherwise).
    """
    return _OP.call((a, b), world, config, out)


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """float32 reference: every rank's rows of the sum of all ranks' partials."""
    total = sum(x.float() @ y.float() for x, y in zip(a, b))
    W = len(a)
    R = total.shape[0] // W
    return [total[r * R : (r + 1) * R] for r in range(W)]


# ---------------------------------------------------------------------------------------------- family


def standin_launches(cfg: GemmRsConfig, *, M: int, N: int, K: int, world_size: int, dtype: torch.dtype,
                     device: torch.device) -> list[StandinLaunch]:  # fmt: skip
    """(kernel, arguments, options) of the Triton kernels a call of this shape launches, with 1-element
    stand-in tensors and the call's real integers (as the plans build them)."""
    from jointtune.kernels.gemm_rs.kernel import gemm_rs_kernel
    from jointtune.kernels.runtime.launch import split_options

    W = world_size
    s = RsShape(W, M, K // W, N, dtype, (N, 1))
    if cfg.mode == "barrier":
        from jointtune.kernels.gemm_rs.meet import gemm_rs_meet_kernel, gemm_rs_push_meet_kernel
        from jointtune.kernels.gemm_rs.plans import meet_args, push_meet_args

        t = torch.empty(1, dtype=dtype, device=device)
        i64 = torch.zeros(1, dtype=torch.int64, device=device)
        i32 = torch.zeros(1, dtype=torch.int32, device=device)
        if cfg.transport == "push":
            args = push_meet_args(s, part=t, inbox=t, inbox_deltas=i64, signals=i32, signal_deltas=i64, state=i64,
                                  out=t, rank=0, slot=16, half_stride=16, push=True, total=True, meet=True,
                                  epoch=1)  # fmt: skip
            return [(gemm_rs_push_meet_kernel, *split_options(args))]
        args = meet_args(s, buf=t, deltas=i64, signals=i32, signal_deltas=i64, out=t, rank=0, meet=True)
        return [(gemm_rs_meet_kernel, *split_options(args))]
    R = s.R
    t = torch.empty(1, dtype=dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    ws = f32 if cfg.SPLIT_K > 1 else None
    common = dict(a=t, b=t, out=t, dummy=i64, rank=0, ws=ws, counts=i32 if ws is not None else None)
    launches = []
    if cfg.mode in ("push", "pull", "atomic"):
        chunk_rows = cfg.chunk_rows(R)
        atomic, span = cfg.mode == "atomic", cfg.spans_ranks()
        reduce = cfg.fused_reduce_programs()
        gemm = max(1, min(cfg.fused_tiles(M, R, N) * cfg.SPLIT_K, num_sms(device) - reduce))
        box = f32 if atomic else i64 if cfg.ll() else t  # the accumulator, LL words, or partial rows
        fused = kernel_args(cfg, s, rows=M, seg_rows=R, epi=EPI_ATOMIC if atomic else EPI_SIGNAL, gemm=not span,
                            reduce=reduce > 0, dest=box, dest_deltas=i64, src=box, src_deltas=i64,
                            sources=1 if atomic else W, flags_local=i64, flag_ptrs=i64, done=i32, state=i64,
                            half_stride=16,
                            n_chunks=cfg.fused_flags(M, R, N), chunk_rows=chunk_rows, first_seg=1 % W,
                            gemm_programs=gemm, num_programs=gemm + reduce, stride_dm=N, zero_src=atomic, epoch=1,
                            epi_reduce=cfg.reduces_in_epilogue(), span=span, **common)  # fmt: skip
        launches.append(fused)
    elif cfg.mode == "pull_cublas":
        launches.append(kernel_args(cfg, s, rows=R, seg_rows=R, epi=EPI_STORE, gemm=False, reduce=True, src=t,
                                    src_deltas=i64, sources=W, flags_local=i64, flag_ptrs=i64, state=i64,
                                    n_chunks=1, chunk_rows=R, num_programs=cfg.reduce_sms, wait_own=False, epoch=1,
                                    ready=True, exit_flags=(i64, i64), aligned=(R * N) % 16 == 0,
                                    **common))  # fmt: skip
    elif cfg.mode == "ce":
        chunk_rows = cdiv(R, cfg.ce_chunks)
        if cfg.ce_consumer == "triton":  # the own rows, a chunk, the last (ragged) chunk
            for rows in sorted({R, chunk_rows, R - (cdiv(R, chunk_rows) - 1) * chunk_rows}):
                tiles = _work(cfg, rows, rows, N)
                launches.append(kernel_args(cfg, s, rows=rows, seg_rows=rows, epi=EPI_STORE, gemm=True, reduce=False,
                                            dest=t, gemm_programs=tiles, num_programs=tiles, stride_dm=N,
                                            **common))  # fmt: skip
        reduce = kernel_args(cfg, s, rows=R, seg_rows=R, epi=EPI_STORE, gemm=False, reduce=True, src=t,
                             src_deltas=i64, sources=W, flags_local=i64, state=i64,
                             n_chunks=cdiv(R, chunk_rows), chunk_rows=chunk_rows, num_programs=cfg.reduce_sms,
                             wait_own=False, epoch=2, num_warps=4, **common)  # fmt: skip
        launches.append(reduce)
    out = []
    for args in launches:
        named, options = split_options(args)
        out.append((gemm_rs_kernel, named, options))
    return out


class GemmRsFamily(GemmFamily):
    op, config_type, launches = _OP, GemmRsConfig, staticmethod(standin_launches)
    split, reference_reads_all_b = ("M", "K"), True  # every rank's rows of the sum need every rank's B

    def shard_shapes(self, M: int, N: int, K: int, world_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (M, K // world_size), (K // world_size, N)

    def reference(self, inputs: GemmInputs) -> list[torch.Tensor]:
        every = reference(inputs.all_a, inputs.all_b)
        return [every[r] for r in inputs.ranks]

    def call_shape(self, a0: torch.Tensor, b0: torch.Tensor, world_size: int) -> dict[str, int]:
        return {"M": a0.shape[0], "N": b0.shape[1], "K": a0.shape[1] * world_size}


register_family(GemmRsFamily())
