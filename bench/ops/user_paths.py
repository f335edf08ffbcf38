"""What a user writes without jointtune: the unfused paths a benchmark must beat, built from torch's public ops.

GEMM + all-reduce's is the standard layout's row-parallel linear as a user writes it: cuBLAS writes each rank's partial
straight into the all-reduce's buffer (in the variant's own memory: an NCCL window or torch's symmetric memory), the
all-reduce sums it in place, and the sum is the output, or `sum + residual` and torch's fused `F.rms_norm` of it are:
no copy into a caller's buffer, which our op's `baseline` mode pays (it writes into the op's outputs).

Flash-Decode's is context-parallel decode as a careful user writes it: each rank runs SDPA over its own slice of the
KV cache (a GQA group's query heads become the query rows of their KV head, so no K/V is expanded), keeps the
log-sum-exp, sends its partial output (in q's dtype) and LSE (float32) in one all-gather (one buffer: the LSE's bytes
ride behind the output's), and every rank combines the W partials by their LSEs in float32. Every rank's KV slice is
taken whole (the benchmark's caches are full); per-sequence lengths are not part of this path.
"""

from __future__ import annotations

from typing import Any

import torch

from jointtune.tp.functional import rms_norm


def sdpa_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, H, D] in q's dtype, lse [B, H] float32) of q [B, H, D] over this rank's k, v [B, H_KV, S, D].

    On CUDA, torch's flash-attention kernel (it returns the LSE that the public SDPA call drops); elsewhere the math
    in float32, for tests."""
    B, H, D = q.shape
    H_KV = k.shape[1]
    rows = q.view(B, H_KV, H // H_KV, D)  # [B, H_KV, G, D]: the group's heads as query rows
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(rows, k, v, 0.0, False, False, scale=scale)[:2]
        return out.view(B, H, D), lse.view(B, H)
    s = torch.matmul(rows.float(), k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    out = torch.matmul(torch.softmax(s, dim=-1), v.float())
    return out.to(q.dtype).view(B, H, D), lse.view(B, H)


class SdpaGatherCombine:
    """The whole unfused decode: SDPA partial, one all-gather of (out, lse) in the `collective` variant, LSE combine.

    Takes one q, k, v per local rank (one on CUDA). Buffers come from `world.collective_empty`, so the
    symmetric-memory variants read and write their own windows."""

    def __init__(self, world: Any, q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor], scale: float,
                 collective: str) -> None:  # fmt: skip
        B, H, D = q[0].shape
        if (B * H * D * q[0].element_size()) % 4:
            raise ValueError(f"q: B*H*D={B * H * D} must be even for the float32 LSE to follow the output")
        self.world, self.q, self.k, self.v, self.scale, self.collective = world, q, k, v, scale, collective
        self.n_out = B * H * D
        per_rank = self.n_out + B * H * 4 // q[0].element_size()  # the LSE's float32 bytes, counted in q's dtype
        self.send = world.collective_empty((per_rank,), q[0].dtype, collective)
        self.every = world.collective_empty((world.world_size * per_rank,), q[0].dtype, collective)
        self.out = [torch.empty_like(x) for x in q]

    def __call__(self) -> list[torch.Tensor]:
        B, H, D = self.q[0].shape
        for q, k, v, send in zip(self.q, self.k, self.v, self.send):
            out, lse = sdpa_partial(q, k, v, self.scale)
            send[: self.n_out].view(B, H, D).copy_(out)
            send[self.n_out :].view(torch.float32).view(B, H).copy_(lse)
        self.world.all_gather(self.send, out=self.every, collective=self.collective)
        for every, out in zip(self.every, self.out):
            parts = every.view(self.world.world_size, -1)
            outs = parts[:, : self.n_out].reshape(-1, B, H, D).float()
            lses = parts[:, self.n_out :].contiguous().view(torch.float32).view(-1, B, H)
            out.copy_(torch.sum(torch.softmax(lses, dim=0)[..., None] * outs, dim=0))
        return self.out


class MmAllReduceNorm:
    """The whole unfused GEMM + all-reduce (module doc), with the residual add and RMSNorm where `weight` is given.

    Takes one A, B (and residual, weight) per local rank; returns what the family's reference holds: every rank's sum
    (+ residual), or every rank's normed rows, then every rank's new residual."""

    def __init__(self, world: Any, a: list[torch.Tensor], b: list[torch.Tensor], collective: str,
                 residual: list[torch.Tensor] | None = None, weight: list[torch.Tensor] | None = None,
                 eps: float = 1e-6) -> None:  # fmt: skip
        self.world, self.a, self.b, self.collective = world, a, b, collective
        self.residual, self.weight, self.eps = residual, weight, eps
        self.sums = world.collective_empty((a[0].shape[0], b[0].shape[1]), a[0].dtype, collective)

    def __call__(self) -> list[torch.Tensor]:
        for a, b, s in zip(self.a, self.b, self.sums):
            torch.mm(a, b, out=s)
        self.world.all_reduce(self.sums, collective=self.collective)
        hs = list(self.sums) if self.residual is None else [s + r for s, r in zip(self.sums, self.residual)]
        if self.weight is None:
            return hs
        return [rms_norm(h, w, self.eps) for h, w in zip(hs, self.weight)] + hs
