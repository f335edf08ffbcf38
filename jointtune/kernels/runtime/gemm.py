"""What the GEMM families (AG+GEMM, GEMM+RS, GEMM+AR) share on the host: their operands' checks, the sizes of a call
whose K is sharded over the ranks, and their family's dims, inputs, FLOP count and ahead-of-time compiles (the Triton
tile pieces they share are in `tiles`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.runtime.calls import DTYPES, as_list, first_of
from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.family import StandinLaunch
from jointtune.kernels.runtime.op import OpFamily


def check_gemm_operands(a: list[torch.Tensor], b: list[torch.Tensor], world: Any,
                        dims: tuple[str, str, str]) -> tuple[int, int, int]:  # fmt: skip
    """(rows, depth, columns) of a GEMM family's per-rank A [rows, depth] and B [depth, columns], alike on every rank
    this process drives; ShapeError naming the argument otherwise (`dims`: the family's names of the three sizes)."""
    n_local = len(world.local_ranks)
    if len(a) != n_local or len(b) != n_local:
        raise ShapeError(f"a, b: expected one tensor per local rank ({n_local}), got {len(a)} and {len(b)}")
    rows, depth = a[0].shape if a[0].dim() == 2 else (0, 0)
    cols = b[0].shape[1] if b[0].dim() == 2 else 0
    r, d, c = dims
    for i, (ai, bi) in enumerate(zip(a, b)):
        if ai.dim() != 2 or bi.dim() != 2:
            raise ShapeError(f"a, b: must be 2-D, got a{list(ai.shape)} and b{list(bi.shape)} on rank index {i}")
        if tuple(ai.shape) != (rows, depth) or tuple(bi.shape) != (depth, cols) or min(rows, depth, cols) < 1:
            raise ShapeError(
                f"shapes: a must be [{r}, {d}] and b [{d}, {c}] alike on every rank, all sizes >= 1; rank index {i} "
                f"has a{list(ai.shape)}, b{list(bi.shape)} against a[{rows}, {depth}], b[{depth}, {cols}]"
            )
        if ai.dtype not in DTYPES or bi.dtype != ai.dtype:
            raise ShapeError(f"dtype: a {ai.dtype} and b {bi.dtype}; both must be bfloat16 or float16")
        if ai.device != world.device or bi.device != world.device:
            raise ShapeError(f"device: tensors must be on {world.device}, got {ai.device} and {bi.device}")
        if bi.stride() != b[0].stride():
            raise ShapeError(f"b: strides must match on every rank; rank index {i} has {bi.stride()}")
    return rows, depth, cols


@dataclass(frozen=True)
class KShardShape:
    """One call's sizes where K is sharded over the W ranks (the row-parallel layer): A_r [M, K_r] and B_r [K_r, N]
    per rank (B's strides), each rank's partial product [M, N]."""

    W: int
    M: int
    K_r: int
    N: int
    dtype: torch.dtype
    b_stride: tuple[int, int]


@dataclass
class GemmInputs:
    """Every local rank's A and B, and what the family's reference needs of all ranks' (`all_a`; `all_b` where the
    reference sums over every rank's B, else None), drawn for one problem."""

    problem: Any
    a: list[torch.Tensor]
    b: list[torch.Tensor]
    all_a: list[torch.Tensor]
    all_b: list[torch.Tensor] | None = None
    ranks: tuple[int, ...] = ()


def split_k_workspace(world: Any, family: str, cfg: Any, tiles: int, i: int) -> tuple[Any, Any]:
    """(fp32 workspace, per-tile counters) of local rank index `i` where `cfg` splits K, else (None, None): scratch
    the world keeps per family, grown to the largest call, and left zeroed by every call (`tiles.merge_split_k`)."""
    if cfg.SPLIT_K == 1:
        return None, None
    ws = world.scratch(f"{family}.splitk", tiles * cfg.BLOCK_M * cfg.BLOCK_N, torch.float32)[i]
    counts = world.scratch(f"{family}.splitk_counts", tiles, torch.int32)[i]
    return ws, counts


class GemmFamily(OpFamily):
    """A GEMM family: problem M x N x K (global), 2MNK FLOPs, and the Triton launches of a config compiled ahead of
    its first call from the family's `launches(cfg, M=, N=, K=, world_size=, dtype=, device=)`."""

    dims = ("M", "N", "K")
    #: the family's typed launch config
    config_type: ClassVar[type[LaunchConfig]]
    #: (kernel, arguments, options) of each Triton launch a call makes, with 1-element stand-in tensors
    launches: ClassVar[Callable[..., list[StandinLaunch]]]

    def key(self, a: Any, b: Any, *_: Any, world: Any, **__: Any) -> dict[str, int]:
        try:  # the decorator's hot path: arguments are checked only when reading them fails
            return self.call_shape(as_list(a)[0], as_list(b)[0], world.world_size)
        except (AttributeError, IndexError, TypeError, ValueError):
            first_of("a", a, 2), first_of("b", b, 2)  # names the argument, or the original error stands
            raise

    @abstractmethod
    def call_shape(self, a0: torch.Tensor, b0: torch.Tensor, world_size: int) -> dict[str, int]:
        """The problem shape (global M, N, K) of a call from its first rank's A and B."""

    #: the dims a problem splits over the ranks (AG+GEMM: M and N; GEMM+RS: M and K; GEMM+AR: K)
    split: ClassVar[tuple[str, ...]]
    #: whether a tuner's inputs put A in symmetric memory unless it says (as the layer before would leave it)
    symmetric_inputs: ClassVar[bool] = False
    #: whether the reference reads every rank's B (kept on the device in `GemmInputs.all_b`), or only the local ones
    reference_reads_all_b: ClassVar[bool] = False
    #: what `make_inputs` returns (a `GemmInputs`, with the fields of `more_inputs` where a family adds some)
    inputs_type: ClassVar[type[GemmInputs]] = GemmInputs

    @abstractmethod
    def shard_shapes(self, M: int, N: int, K: int, world_size: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(A's, B's) shape on one rank."""

    def make_inputs(self, problem: Any, world: Any, *, seed: int, symmetric: bool | None = None) -> GemmInputs:
        """Every rank's A and B shards, fresh random and scaled by K^-1/4, all drawn from one seed on the CPU, so each
        rank can build the reference on its own (then any `more_inputs`, from the same draws); ShapeError unless the
        `split` dims divide by the world size."""
        M, N, K = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W or any(problem.dim(d) % W for d in self.split):
            dims = " and ".join(f"{d}={problem.dim(d)}" for d in self.split)
            raise ShapeError(
                f"shape: {dims} must be divisible by world_size={W} (the problem says {problem.world_size})"
            )
        a_shape, b_shape = self.shard_shapes(M, N, K, W)
        dtype = getattr(torch, problem.dtype)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        all_a = [(torch.randn(*a_shape, generator=gen) / K**0.25).to(dtype).to(world.device) for _ in range(W)]
        all_b = [(torch.randn(*b_shape, generator=gen) / K**0.25).to(dtype) for _ in range(W)]
        a = [all_a[r] for r in world.local_ranks]
        if self.symmetric_inputs if symmetric is None else symmetric:
            a = self.in_symmetric(world, a)
        if self.reference_reads_all_b:
            every_b: list[torch.Tensor] | None = [x.to(world.device) for x in all_b]
            b, ranks = [every_b[r] for r in world.local_ranks], world.local_ranks
        else:
            every_b, b, ranks = None, [all_b[r].to(world.device) for r in world.local_ranks], ()
        return self.inputs_type(problem, a, b, all_a, every_b, ranks, **self.more_inputs(problem, world, gen))

    def more_inputs(self, problem: Any, world: Any, gen: torch.Generator) -> dict[str, Any]:
        """The family's inputs besides A and B (an epilogue's operands), by field of `inputs_type`, drawn after them
        from the generator that drew them; none by default."""
        return {}

    @staticmethod
    def in_symmetric(world: Any, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of every local rank's tensor in the world's symmetric memory (as a previous layer would leave A)."""
        slots = world.empty(tuple(tensors[0].shape), tensors[0].dtype)
        for slot, x in zip(slots, tensors):
            slot.copy_(x)
        return slots

    def flops(self, problem: Any) -> float:
        M, N, K = (problem.dim(d) for d in self.dims)
        return 2.0 * M * N * K

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: torch.device) -> list[StandinLaunch]:
        M, N, K = (problem.dim(d) for d in self.dims)
        return self.launches(self.config_type.of(dict(config)), M=M, N=N, K=K, world_size=problem.world_size,
                                   dtype=getattr(torch, problem.dtype), device=device)  # fmt: skip
