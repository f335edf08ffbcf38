"""GEMM + Reduce-Scatter for a row-parallel linear layer: out_r = rows r of sum_p A_p @ B_p.

Rank r holds A_r [M, K_r] and B_r [K_r, N] and gets rows [r*M/W, (r+1)*M/W) of the sum over ranks, shape
[M/W, N]. Partials are rounded once to the input dtype where they travel (as NCCL's reduce-scatter of a
bf16 GEMM output is) and summed in float32. The config's `mode` picks how partial rows reach their owner:

- push: the tile GEMM's epilogue stores each finished tile into its owner's inbox slot for this rank and
  releases a flag per chunk of rows; the owner's reduce programs sum its slots as the flags arrive.
- pull: the epilogue stores into this rank's own partial buffer and releases the owner's flag; the
  owner's reduce programs read peers' tiles over NVLink.
- push and pull with `reduce_by=epilogue`: no reduce programs, every SM runs the GEMM; the epilogue of each
  tile of the own rows (computed last) waits for the peers' chunk and sums it there, over the own tile's
  float32 accumulator (never rounded), as the reduce programs would (same sources, same order).
- push and pull with `reduce_by=tile` (for few rows): tiles run over every rank's rows, so B is read once; each
  finished tile sends the rows other ranks own, then waits for the peers' same tile and sums its own rows.
- atomic: the epilogue adds float32 tiles atomically into the owner's accumulator; the reduce programs
  cast and clear it. The order of the adds varies from call to call, so results may differ in the last
  bits between identical calls: the tuner offers it only where the caller allows non-determinism.
- pull_cublas: cuBLAS computes the whole partial into symmetric memory; one launch pulls this rank's rows
  from every peer and sums them (two launches per call, as GEMM + NCCL, with a lighter collective).
- ce: cuBLAS or the tile GEMM computes each destination's rows chunk by chunk; the copy engine sends each
  chunk into the owner's inbox on a side stream; the owner's reduce programs sum.
- baseline: cuBLAS, then NCCL reduce_scatter (kept in the space: tuning never loses to it).

Tiles are computed starting at the next rank's rows and ending with the rank's own (`tile_order`; always so
with `reduce_by=epilogue`; with `reduce_by=tile` they run over all rows in the same order on every rank). A and
B are only read by their own rank, so they may live in symmetric memory or be ordinary tensors. Every call
of one (world, shapes, dtype, config) runs a launch plan built once (`plans`), and nothing a later
call needs comes from the host: the op is correct under CUDA-graph capture and replay (capture after one
eager warm-up call).

Three ways in:
    gemm_rs(a, b, world=world, config=cfg)                           # eager, the cheapest host path
    torch.ops.jointtune.gemm_rs([a], [b], world.name, cfg_json)      # torch.compile / graphs
    get_family("gemm_rs")                                            # tuner, decorator and benchmarks
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.gemm_rs.args import EPI_ATOMIC, EPI_SIGNAL, EPI_STORE, GemmRsConfig, RsShape, kernel_args
from jointtune.kernels.gemm_rs.args import tile_work as _work
from jointtune.kernels.gemm_rs.plans import build_plan
from jointtune.kernels.runtime.calls import DTYPES, as_list, config_json, first_of, forward_only, parse_config, usable
from jointtune.kernels.runtime.device import num_sms
from jointtune.kernels.runtime.eager_graph import direct_only
from jointtune.kernels.runtime.family import Family, StandinLaunch, register_family
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.symm import cdiv
from jointtune.kernels.runtime.world import World, world_named

__all__ = ["GemmRsFamily", "PreparedGemmRs", "config_json", "gemm_rs", "prepare", "reference"]


def _check(a: list[torch.Tensor], b: list[torch.Tensor], world: World) -> tuple[int, int, int]:
    """(M, K_r, N) of a call; ShapeError naming the argument otherwise."""
    n_local, W = len(world.local_ranks), world.world_size
    if len(a) != n_local or len(b) != n_local:
        raise ShapeError(f"a, b: expected one tensor per local rank ({n_local}), got {len(a)} and {len(b)}")
    M, K_r = a[0].shape if a[0].dim() == 2 else (0, 0)
    N = b[0].shape[1] if b[0].dim() == 2 else 0
    for i, (ai, bi) in enumerate(zip(a, b)):
        if ai.dim() != 2 or bi.dim() != 2:
            raise ShapeError(f"a, b: must be 2-D, got a{list(ai.shape)} and b{list(bi.shape)} on rank index {i}")
        if tuple(ai.shape) != (M, K_r) or tuple(bi.shape) != (K_r, N) or min(M, K_r, N) < 1:
            raise ShapeError(
                f"shapes: a must be [M, K_r] and b [K_r, N] alike on every rank, all sizes >= 1; rank index {i} has "
                f"a{list(ai.shape)}, b{list(bi.shape)} against a[{M}, {K_r}], b[{K_r}, {N}]"
            )
        if ai.dtype not in DTYPES or bi.dtype != ai.dtype:
            raise ShapeError(f"dtype: a {ai.dtype} and b {bi.dtype}; both must be bfloat16 or float16")
        if ai.device != world.device or bi.device != world.device:
            raise ShapeError(f"device: tensors must be on {world.device}, got {ai.device} and {bi.device}")
        if bi.stride() != b[0].stride():
            raise ShapeError(f"b: strides must match on every rank; rank index {i} has {bi.stride()}")
    if M % W:
        raise ShapeError(f"a: M={M} rows are not allowed with world_size={W}; M must be divisible by world_size")
    return M, K_r, N


def gemm_rs(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> Any:
    """Multiply this rank's `a` [M, K_r] by its `b` [K_r, N], sum over ranks, keep this rank's M/W rows.

    On the CUDA world `a` and `b` are this rank's tensors and the result is its [M/W, N] rows; on the local
    world they are lists with one tensor per simulated rank, and so is the result. `out` (optional,
    row-major [M/W, N] per rank) receives the rows instead of a new tensor. The config must be valid in the
    `gemm_rs` space for this shape (SpaceError names the fields otherwise).
    """
    a_l, b_l = as_list(a), as_list(b)
    forward_only("gemm_rs", a=a_l, b=b_l)
    if len(a_l) != 1 or len(b_l) != 1 or len(world.local_ranks) != 1:
        _check(a_l, b_l, world)  # simulated ranks: every rank's tensors, every call (the CPU's path)
    a0, b0 = a_l[0], b_l[0]
    key = _plan_key(a_l, b_l, config)
    plan = world.plans.get(key)
    if plan is None:
        plan = world.plan(key, functools.partial(_build, world, a_l, b_l, config))
    a_l = [usable(x) for x in a_l]
    R, N = a0.shape[0] // world.world_size, b0.shape[1]
    if out is None:
        o_l = [torch.empty((R, N), dtype=a0.dtype, device=world.device) for _ in a_l]
    else:
        o_l = as_list(out)
        if len(o_l) != len(a_l) or any(o.shape != (R, N) or o.dtype != a0.dtype or o.stride() != (N, 1)
                                       or o.device != world.device for o in o_l):  # fmt: skip
            raise ShapeError(f"out: must be one row-major [{R}, {N}] {a0.dtype} tensor per local rank")
    replayed = (
        world.concurrent
        and getattr(plan, "replay_eagerly", False)
        and world.eager.call(key, lambda ins, outs: plan(ins, b_l, outs), a_l, b_l, o_l)
    )
    if not replayed:
        plan(a_l, b_l, o_l)  # most plans; the first call of one that replays, a big one (`eager_graph`)
    return o_l[0] if isinstance(a, torch.Tensor) else o_l


class PreparedGemmRs:
    """One call with its tensors bound: `run()` issues the same launches again, reading whatever the bound
    A and B hold now and writing the bound out, as a CUDA graph replay of the call would."""

    def __init__(self, plan: Any, a: list[torch.Tensor], b: list[torch.Tensor], out: list[torch.Tensor]) -> None:
        self._plan, self.a, self.b, self.out = plan, a, b, out

    def run(self) -> list[torch.Tensor]:
        self._plan(self.a, self.b, self.out)
        return self.out


def prepare(
    a: torch.Tensor | Sequence[torch.Tensor],
    b: torch.Tensor | Sequence[torch.Tensor],
    *,
    world: World,
    config: Mapping[str, Any],
    out: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> PreparedGemmRs:
    """Run `gemm_rs` once (building its plan) and return the call, bound to these tensors, to re-issue."""
    a_l, b_l = as_list(a), as_list(b)
    if any(not x.is_contiguous() or x.data_ptr() % 16 for x in a_l):
        raise ShapeError("a: must be row-major and 16-byte aligned to be bound to a prepared call")
    o_l = as_list(gemm_rs(a_l, b_l, world=world, config=config, out=out))
    return PreparedGemmRs(world.plans[_plan_key(a_l, b_l, config)], a_l, b_l, o_l)


def _plan_key(a: list[torch.Tensor], b: list[torch.Tensor], config: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything a plan bakes in: config, shapes, dtypes, B's strides, devices."""
    a0, b0 = a[0], b[0]
    return ("gemm_rs", config_key(config), a0.shape, b0.shape, a0.dtype, b0.dtype, b0.stride(), a0.device, b0.device,
            len(a))  # fmt: skip


def _build(world: World, a: list[torch.Tensor], b: list[torch.Tensor], config: Mapping[str, Any]) -> Any:
    M, K_r, N = _check(a, b, world)
    shape = {"M": M, "N": N, "K": K_r * world.world_size}
    cfg = GemmRsConfig.of(resolve_config("gemm_rs", config, shape, DTYPES[a[0].dtype], world))
    return build_plan(world, RsShape(world.world_size, M, K_r, N, a[0].dtype, tuple(b[0].stride())), cfg)


def reference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """float32 reference: every rank's rows of the sum of all ranks' partials."""
    total = sum(x.float() @ y.float() for x, y in zip(a, b))
    W = len(a)
    R = total.shape[0] // W
    return [total[r * R : (r + 1) * R] for r in range(W)]


# ---------------------------------------------------------------------------------------------- op


@torch.library.custom_op("jointtune::gemm_rs", mutates_args=())
def _gemm_rs_op(a: list[torch.Tensor], b: list[torch.Tensor], world: str, config: str) -> list[torch.Tensor]:
    """torch.ops.jointtune.gemm_rs(a, b, world_name, config_json) -> this rank's rows per local rank."""
    with direct_only():  # torch.compile's CUDA graphs run through here: no graphs of ours (`eager_graph`)
        return list(gemm_rs(list(a), list(b), world=world_named(world), config=parse_config(config)))


@_gemm_rs_op.register_fake
def _gemm_rs_fake(a: list[torch.Tensor], b: list[torch.Tensor], world: str, config: str) -> list[torch.Tensor]:
    W = world_named(world).world_size
    return [x.new_empty((x.shape[0] // W, y.shape[1])) for x, y in zip(a, b)]


# ---------------------------------------------------------------------------------------------- family


@dataclass
class GemmRsInputs:
    """Every local rank's A and B, and all ranks' for the reference."""

    problem: Any
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    all_a: list[torch.Tensor]
    all_b: list[torch.Tensor]
    ranks: tuple[int, ...]


class GemmRsFamily(Family):
    name = "gemm_rs"
    space = "gemm_rs"
    dims = ("M", "N", "K")

    def make_inputs(self, problem: Any, world: World, *, seed: int, symmetric: bool = False) -> GemmRsInputs:
        M, N, K = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W or M % W or K % W:
            raise ShapeError(
                f"shape: M={M} and K={K} must be divisible by world_size={W} (the problem says {problem.world_size})"
            )
        dtype = getattr(torch, problem.dtype)
        K_r = K // W
        gen = torch.Generator(device="cpu").manual_seed(seed)
        # every rank draws every shard from one seed, so each can build the reference on its own
        all_a = [(torch.randn(M, K_r, generator=gen) / K**0.25).to(dtype).to(world.device) for _ in range(W)]
        all_b = [(torch.randn(K_r, N, generator=gen) / K**0.25).to(dtype).to(world.device) for _ in range(W)]
        a = [all_a[r] for r in world.local_ranks]
        if symmetric:
            slots = world.empty((M, K_r), dtype)
            for slot, x in zip(slots, a):
                slot.copy_(x)
            a = slots
        return GemmRsInputs(problem, a, [all_b[r] for r in world.local_ranks], all_a, all_b, world.local_ranks)

    def run(self, inputs: GemmRsInputs, config: Mapping[str, Any], world: World) -> list[torch.Tensor]:
        return gemm_rs(inputs.a, inputs.b, world=world, config=config)

    def reference(self, inputs: GemmRsInputs) -> list[torch.Tensor]:
        every = reference(inputs.all_a, inputs.all_b)
        return [every[r] for r in inputs.ranks]

    def key(self, a: Any, b: Any, *, world: World, **_: Any) -> dict[str, int]:
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
        return standin_launches(GemmRsConfig.of(dict(config)), M=M, N=N, K=K, world_size=problem.world_size,
                                dtype=getattr(torch, problem.dtype), device=device)  # fmt: skip


def standin_launches(cfg: GemmRsConfig, *, M: int, N: int, K: int, world_size: int, dtype: torch.dtype,
                     device: torch.device) -> list[StandinLaunch]:  # fmt: skip
    """(kernel, arguments, options) of the Triton kernels a call of this shape launches, with 1-element
    stand-in tensors and the call's real integers (as the plans build them)."""
    from jointtune.kernels.gemm_rs.kernel import gemm_rs_kernel
    from jointtune.kernels.runtime.launch import split_options

    W = world_size
    s = RsShape(W, M, K // W, N, dtype, (N, 1))
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
        fused = kernel_args(cfg, s, rows=M, seg_rows=R, epi=EPI_ATOMIC if atomic else EPI_SIGNAL, gemm=not span,
                            reduce=reduce > 0, dest=f32 if atomic else t, dest_deltas=i64,
                            src=f32 if atomic else t, src_deltas=i64, sources=1 if atomic else W, flags_local=i64,
                            flag_ptrs=i64, done=i32, state=i64, half_stride=16,
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


register_family(GemmRsFamily())
