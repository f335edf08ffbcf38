"""Flash-Decode's launcher: the entry point and torch op over its plan (`plans`), and its family (the package doc
says what each mode does)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jointtune.errors import ShapeError
from jointtune.kernels.flash_decode.args import DecodeShape, FlashDecodeConfig, Work, default_scale, kernel_args
from jointtune.kernels.flash_decode.plans import DecodePlan
from jointtune.kernels.runtime.calls import DTYPES, as_list, config_json, first_of
from jointtune.kernels.runtime.family import StandinLaunch, register_family
from jointtune.kernels.runtime.op import Args, FusedOp, OpFamily, PerRank, Prepared
from jointtune.kernels.runtime.plan import config_key, resolve_config
from jointtune.kernels.runtime.world import World
from jointtune.search_spaces.flash_decode import bucketed_kv_len

__all__ = ["FlashDecodeFamily", "PreparedFlashDecode", "config_json", "flash_decode", "prepare", "reference"]

_LEN_DTYPES = (torch.int32, torch.int64)


def _check(q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor], lens: list[torch.Tensor | None],
           world: World) -> None:  # fmt: skip
    """ShapeError naming the argument for anything a plan can't run."""
    n_local = len(world.local_ranks)
    if not len(q) == len(k) == len(v) == len(lens) == n_local:
        raise ShapeError(
            f"q, k, v, kv_lens: expected one tensor per local rank ({n_local}), "
            f"got {len(q)}, {len(k)}, {len(v)} and {len(lens)}"
        )
    for i, (qi, ki, vi) in enumerate(zip(q, k, v)):
        if not all(isinstance(x, torch.Tensor) for x in (qi, ki, vi)):
            raise ShapeError(
                f"q, k, v: must be tensors; rank index {i} has {', '.join(type(x).__name__ for x in (qi, ki, vi))}"
            )
        if qi.dim() != 3 or ki.dim() != 4 or vi.dim() != 4:
            raise ShapeError(
                f"q, k, v: q must be [B, H, D] and k, v [B, H_KV, S_r, D]; rank index {i} has "
                f"q{list(qi.shape)}, k{list(ki.shape)}, v{list(vi.shape)}"
            )
        B, H, D = qi.shape
        if ki.shape != vi.shape or ki.shape[0] != B or ki.shape[3] != D or min(B, H, D, *ki.shape) < 1:
            raise ShapeError(
                f"k, v: must both be [B={B}, H_KV, S_r, D={D}] (all sizes >= 1) with q [B, H, D]; rank index {i} has "
                f"k{list(ki.shape)}, v{list(vi.shape)}"
            )
        if H % ki.shape[1]:
            raise ShapeError(f"k: H_KV={ki.shape[1]} kv heads are not allowed with H={H}; H must be a multiple of H_KV")
        if (qi.shape, ki.shape) != (q[0].shape, k[0].shape):
            raise ShapeError(f"q, k, v: shapes must match on every rank; rank index {i} differs from rank index 0")
        if qi.dtype not in DTYPES or ki.dtype != qi.dtype or vi.dtype != qi.dtype:
            raise ShapeError(f"dtype: q {qi.dtype}, k {ki.dtype}, v {vi.dtype}; all must be bfloat16 or float16")
        if any(x.stride(-1) != 1 for x in (qi, ki, vi)):
            raise ShapeError("q, k, v: the head dim must be contiguous (stride 1)")
        if (qi.stride(), ki.stride(), vi.stride()) != (q[0].stride(), k[0].stride(), v[0].stride()):
            raise ShapeError(f"q, k, v: strides must match on every rank; rank index {i} differs from rank index 0")
        if any(x.device != world.device for x in (qi, ki, vi)):
            raise ShapeError(f"device: tensors must be on {world.device}, got {qi.device}, {ki.device}, {vi.device}")
    _check_lens(lens, q[0].shape[0], world)


def _lens_ok(lens: list[torch.Tensor | None], B: int, world: World) -> bool:
    """Whether every entry is a tensor the kernel reads as it is: [B], int32/int64, unit stride, on the device."""
    return all(isinstance(x, torch.Tensor) and x.shape == (B,) and x.dtype in _LEN_DTYPES
               and (B == 1 or x.stride(0) == 1) and x.device == world.device for x in lens)  # fmt: skip


def _check_lens(lens: list[torch.Tensor | None], B: int, world: World) -> None:
    if all(x is None for x in lens) or _lens_ok(lens, B, world):
        return
    for i, x in enumerate(lens):
        got = (f"{x.dtype}{list(x.shape)} with stride {tuple(x.stride())} on {x.device}"
               if isinstance(x, torch.Tensor) else type(x).__name__)  # fmt: skip
        if not _lens_ok([x], B, world):
            raise ShapeError(
                f"kv_lens: must be None, or one [{B}] int32 or int64 tensor per local rank, contiguous, on "
                f"{world.device} (this rank's valid keys per sequence); rank index {i} has {got}"
            )


class FlashDecodeOp(FusedOp):
    """q [B, H, D] on every rank, attending over every rank's K, V [B, H_KV, S_r, D] (`kv_lens` valid per sequence)."""

    name, inputs = "flash_decode", ("q", "k", "v", "kv_lens")
    op_options = (("scale", "float? scale=None"),)
    exact_out_strides = False

    def arguments(self, inputs: Sequence[Any]) -> Args:
        q, k, v, kv_lens = (*inputs, None)[:4]  # kv_lens may be left out
        q_l = as_list(q)
        return [q_l, as_list(k), as_list(v), [None] * len(q_l) if kv_lens is None else as_list(kv_lens)]

    def options(self, scale: Any = None) -> dict[str, Any]:
        return {"scale": _scale(scale)}

    def check(self, args: Args, world: World) -> None:
        _check(*args, world)

    def recheck(self, args: Args, world: World) -> None:
        lens, B = args[3], args[0][0].shape[0]
        if not _lens_ok(lens, B, world):
            _check_lens(lens, B, world)  # lengths are not part of the plan: checked on every call

    def plan_key(self, world: World, args: Args, config: Mapping[str, Any], scale: float | None) -> tuple[Any, Any]:
        """Everything a plan bakes in: config, shapes, dtypes, strides, devices, scale (a call that differs in any of
        them builds, and checks, a plan of its own)."""
        (q0, *_), (k0, *_), (v0, *_), _ = args
        return ("flash_decode", config_key(config), q0.shape, k0.shape, v0.shape, q0.dtype, k0.dtype, v0.dtype,
                q0.stride(), k0.stride(), v0.stride(), q0.device, k0.device, v0.device, len(args[0]),
                scale), None  # fmt: skip

    def build(self, world: World, args: Args, config: Mapping[str, Any], placed: Any, scale: float | None) -> Any:
        _check(*args, world)
        q, k, v, _ = args
        s = _shape(q[0], k[0], v[0], world.world_size, scale)
        cfg = FlashDecodeConfig.of(resolve_config("flash_decode", config, problem_shape(s), DTYPES[q[0].dtype], world))
        return DecodePlan(world, s, cfg)

    def out_shape(self, args: Args, world_size: int) -> tuple[int, ...]:
        return tuple(args[0][0].shape)

    def op_inputs(self, lists: Sequence[list[torch.Tensor]]) -> list[Any]:
        q, k, v, kv_lens = (list(x) for x in lists)
        return [q, k, v, kv_lens or None]  # an empty list: whole shards


_OP = FlashDecodeOp()
_OP.register()
#: a `flash_decode` call bound to its tensors (`prepare`); `run()` re-issues it
PreparedFlashDecode = Prepared
#: `prepare(q, k, v, kv_lens=None, *, world, config, out=None, scale=None)`: run `flash_decode` once (building its
#: plan) and return the call, bound to these tensors, to re-issue (`PreparedFlashDecode.run`)
prepare = _OP.prepare


def flash_decode(q: PerRank, k: PerRank, v: PerRank, kv_lens: PerRank | None = None, *, world: World,
                 config: Mapping[str, Any], out: PerRank | None = None, scale: float | None = None) -> Any:  # fmt: skip
    """Attention of `q` [B, H, D] over every rank's `k`, `v` [B, H_KV, S_r, D] (the first `kv_lens[b]` positions of
    sequence b on each rank; all S_r if None), softmax scale `scale` (default 1/sqrt(D)).

    On the CUDA world the arguments are this rank's tensors and the result is its [B, H, D] output; on the local
    world they are lists with one tensor per simulated rank, and so is the result. `out` (optional, row-major
    [B, H, D] per rank) receives it instead of a new tensor. The config must be valid in the `flash_decode` space
    for this shape (SpaceError names the fields otherwise).
    """
    return _OP.call((q, k, v, kv_lens), world, config, out, scale=scale)


def _scale(scale: Any) -> float | None:
    """The softmax scale as a plain float (a plan bakes it in), or None for 1/sqrt(D)."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ShapeError(f"scale: {scale!r} is not allowed; give a finite real number (or None for 1/sqrt(D))")
    return float(scale)


def _shape(q0: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, W: int, scale: float | None) -> DecodeShape:
    B, H, D = q0.shape
    return DecodeShape(W, B, H, k0.shape[1], k0.shape[2], D, q0.dtype, tuple(q0.stride()), tuple(k0.stride()),
                       tuple(v0.stride()), default_scale(D) if scale is None else scale)  # fmt: skip


def problem_shape(s: DecodeShape) -> dict[str, int]:
    """The space's dims of a call: S is the global KV capacity, S_r per rank times the world size."""
    return {"B": s.B, "H": s.H, "H_KV": s.H_KV, "S": s.S_r * s.W, "D": s.D}


def reference(q: Sequence[torch.Tensor], k: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
              kv_lens: Sequence[torch.Tensor] | None = None, scale: float | None = None) -> torch.Tensor:  # fmt: skip
    """float32 reference from every rank's tensors: scaled_dot_product_attention of q (rank 0's) over the union of
    every rank's valid keys, sequence by sequence; zeros for a sequence without keys."""
    q0 = q[0].float()
    B, H, D = q0.shape
    H_KV, S_r = k[0].shape[1], k[0].shape[2]
    out = torch.zeros(B, H, D, dtype=torch.float32, device=q0.device)
    for b in range(B):
        ks, vs = [], []
        for r in range(len(k)):
            n = S_r if kv_lens is None else min(max(int(kv_lens[r][b]), 0), S_r)
            ks.append(k[r][b, :, :n].float())
            vs.append(v[r][b, :, :n].float())
        kb, vb = torch.cat(ks, dim=1), torch.cat(vs, dim=1)  # [H_KV, L, D]
        if kb.shape[1] == 0:
            continue
        kb, vb = kb.repeat_interleave(H // H_KV, dim=0), vb.repeat_interleave(H // H_KV, dim=0)
        out[b] = torch.nn.functional.scaled_dot_product_attention(q0[b][:, None], kb, vb, scale=scale)[:, 0]
    return out


# ---------------------------------------------------------------------------------------------- family


@dataclass
class FlashDecodeInputs:
    """Every local rank's q (the same on all ranks), its own K, V shard and lengths, and the world they live in: the
    reference is computed shard by shard and combined across ranks, so no rank ever holds another's cache."""

    problem: Any
    world: World
    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    kv_lens: list[torch.Tensor]


class FlashDecodeFamily(OpFamily):
    op = _OP
    dims = ("B", "H", "H_KV", "S", "D")

    def make_inputs(self, problem: Any, world: World, *, seed: int, ragged: bool = False) -> FlashDecodeInputs:
        """Random q (one seed: the same on every rank) and each rank's own K, V shard (a seed per rank), drawn on the
        device; lengths are whole shards, or with `ragged` random per sequence and rank (zero included)."""
        B, H, H_KV, S, D = (problem.dim(d) for d in self.dims)
        W = world.world_size
        if problem.world_size != W:
            raise ShapeError(f"world_size: the problem says {problem.world_size}, the world has {W}")
        S_r = -(-S // W)
        dtype = getattr(torch, problem.dtype)
        dev = world.device
        q = torch.randn(B, H, D, generator=torch.Generator(device=dev).manual_seed(seed), device=dev).to(dtype)
        k, v, lens = [], [], []
        for r in world.local_ranks:
            gen = torch.Generator(device=dev).manual_seed(seed * 7919 + 1 + r)
            shards = []
            for _ in range(2):  # K then V, a sequence at a time (the largest caches are GBs per tensor)
                x = torch.empty(B, H_KV, S_r, D, dtype=dtype, device=dev)
                for b in range(B):
                    x[b].copy_(torch.randn(H_KV, S_r, D, generator=gen, device=dev))
                shards.append(x)
            k.append(shards[0])
            v.append(shards[1])
            full = torch.full((B,), S_r, dtype=torch.int32, device=dev)
            lens.append(torch.randint(0, S_r + 1, (B,), generator=gen, device=dev, dtype=torch.int32) if ragged
                        else full)  # fmt: skip
        return FlashDecodeInputs(problem, world, [q.clone() for _ in world.local_ranks], k, v, lens)

    def baseline(self, inputs: FlashDecodeInputs, world: World) -> list[torch.Tensor]:
        """Our decode kernel + NCCL all-gather + combine, with the space default's decode tiles."""
        from jointtune.kernels.runtime.device import device_limits
        from jointtune.search_spaces import get_space

        return self.run(inputs, get_space(self.space).baseline(inputs.problem, device_limits(world.device)), world)

    def reference(self, inputs: FlashDecodeInputs) -> list[torch.Tensor]:
        """float32 attention over every rank's valid keys: each rank's exact softmax statistics over its own shard
        (torch matmuls, no kernel of ours), all-gathered with the world's collective and combined by LSE."""
        B, H, D = inputs.q[0].shape
        H_KV, S_r = inputs.k[0].shape[1], inputs.k[0].shape[2]
        G, W = H // H_KV, inputs.world.world_size
        scale = default_scale(D)
        pos = torch.arange(S_r, device=inputs.q[0].device)
        packed = []
        for q, k, v, lens in zip(inputs.q, inputs.k, inputs.v, inputs.kv_lens):
            mine = torch.empty(B, H, D + 1, dtype=torch.float32, device=q.device)
            for b in range(B):
                s = torch.matmul(q[b].float().view(H_KV, G, D), k[b].float().transpose(-1, -2)) * scale
                s = s.masked_fill((pos >= lens[b])[None, None, :], float("-inf"))
                lse = torch.logsumexp(s, dim=-1)  # [H_KV, G]; -inf where the shard has no valid key
                p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
                mine[b, :, :D] = torch.matmul(p, v[b].float()).view(H, D)
                mine[b, :, D] = lse.view(H)
            packed.append(mine.view(-1))
        every = [torch.empty(W * B * H * (D + 1), dtype=torch.float32, device=x.device) for x in packed]
        inputs.world.all_gather(packed, every)
        out = []
        for e in every:
            parts = e.view(W, B, H, D + 1)
            lse = parts[..., D]
            weight = torch.exp(lse - lse.max(0).values.nan_to_num(neginf=0.0))  # 0 for a shard without keys
            total = weight.sum(0).clamp_min(1e-30)
            out.append((weight[..., None] * parts[..., :D]).sum(0) / total[..., None])
        return out

    def key(self, q: Any, k: Any, v: Any, kv_lens: Any = None, *, world: World, **_: Any) -> dict[str, int]:
        """S is bucketed: the per-rank capacity S_r rounded up to a power of two, times the world size, so one record
        serves every cache whose per-rank capacity lies in (S_r / 2, S_r] (a config valid for one is valid for all)."""
        try:  # the decorator's hot path: arguments are checked only when reading them fails
            q0, k0 = as_list(q)[0], as_list(k)[0]
            B, H, D = q0.shape
            S = bucketed_kv_len(int(k0.shape[2]), world.world_size)
            return {"B": B, "H": H, "H_KV": k0.shape[1], "S": S, "D": D}
        except (AttributeError, IndexError, TypeError, ValueError):
            first_of("q", q, 3), first_of("k", k, 4)  # names the argument, or the original error stands
            raise

    def flops(self, problem: Any) -> float:
        B, H, _, S, D = (problem.dim(d) for d in self.dims)
        return 4.0 * B * H * S * D

    def standin_launches(self, config: Mapping[str, Any], problem: Any, device: torch.device) -> list[StandinLaunch]:
        B, H, H_KV, S, D = (problem.dim(d) for d in self.dims)
        W = problem.world_size
        S_r = -(-S // W)
        dtype = getattr(torch, problem.dtype)
        s = DecodeShape(W, B, H, H_KV, S_r, D, dtype, (H * D, D, 1), (H_KV * S_r * D, S_r * D, D, 1),
                        (H_KV * S_r * D, S_r * D, D, 1), default_scale(D))  # fmt: skip
        return standin_launches(FlashDecodeConfig.of(dict(config)), s, device)


def standin_launches(cfg: FlashDecodeConfig, s: DecodeShape, device: torch.device) -> list[StandinLaunch]:
    """(kernel, arguments, options) of the Triton launches a call of this shape makes, with 1-element stand-in
    tensors and the call's real integers (as the plan builds them)."""
    from jointtune.kernels.flash_decode.kernel import flash_decode_kernel
    from jointtune.kernels.runtime.launch import split_options
    from jointtune.kernels.runtime.push import PushArgs
    from jointtune.kernels.runtime.signals import allgather_push_kernel

    w = Work.of(cfg, s)
    t = torch.empty(1, dtype=s.dtype, device=device)
    i64, i32, f32 = (torch.zeros(1, dtype=d, device=device) for d in (torch.int64, torch.int32, torch.float32))
    common = dict(q=t, k=t, v=t, lens=i32, out=t, parts=f32, counts=i32, dummy=i64, rank=0, state=i64)
    launches = []
    if cfg.mode in ("fused", "pull"):  # one launch where ranks run at once
        push = cfg.mode == "fused"
        launches.append(kernel_args(cfg, s, w, **common, decode=True, combine=True, dest=f32, dest_deltas=i64,
                                    send_to=s.W if push else 1, signal=True, flag_ptrs=i64, flags_local=i64, src=f32,
                                    src_deltas=i64, wait=True, ticket=i32, half_stride=16, epoch=1,
                                    num_programs=w.n_decode + w.n_chunks))  # fmt: skip
    else:
        wait = cfg.mode == "wait"
        launches.append(kernel_args(cfg, s, w, **common, decode=True, combine=False, dest=f32, dest_deltas=i64,
                                    epoch=1 if wait else 0, num_programs=w.n_decode))  # fmt: skip
        launches.append(kernel_args(cfg, s, w, **common, decode=False, combine=True, src=f32, src_deltas=i64,
                                    flags_local=i64, wait=wait, wait_own=not wait, half_own=not wait,
                                    half_stride=16 if wait else 0, epoch=2 if wait else 0,
                                    num_programs=w.n_chunks))  # fmt: skip
    out = [(flash_decode_kernel, *split_options(args)) for args in launches]
    if cfg.mode == "wait":
        push = PushArgs.build(s.W, cfg.push_programs, cfg.num_warps, src=f32, inbox_base=f32, inbox_deltas=i64,
                              own=i64, flag_ptrs=i64, flags_local=i64, done=i32, state=i64, K=s.PW,
                              R=s.rows, slot=s.slot, half_stride=16, rank=0, n_chunks=w.n_chunks,
                              chunk_m=cfg.items_per_flag * cfg.heads_per_program, epoch=2)  # fmt: skip
        out.append((allgather_push_kernel, *split_options(push)))
    return out


register_family(FlashDecodeFamily())
