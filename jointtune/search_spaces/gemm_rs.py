"""`gemm_rs`: GEMM + Reduce-Scatter, row-parallel (the second linear of a tensor-parallel MLP).

Rank r holds A_r[M, K/W] and B_r[K/W, N], computes the partial P_r = A_r @ B_r of [M, N] and
ends with its R = M / W rows of sum_r P_r. Dims M, N, K are global; K_r = K / W. Modes:
  pull      each rank writes its partial into symmetric memory, tiles ordered so the rows of the
            next peer finish first, raising a flag per `chunk_m` rows; then it reduces its own R
            rows by reading the peers' chunks as their flags arrive;
  push      the GEMM raises a flag per finished `chunk_m`-row chunk; `comm_sms` SMs push finished
            chunks into the owner's receive slots while the rest compute; the owner sums its slots;
  ce        a Triton tile GEMM or cuBLAS (`ce_consumer`, named as in ag_gemm) computes each peer's
            rows in `ce_chunks` chunks; the copy engine sends each chunk as it completes;
  baseline  one cuBLAS GEMM, then NCCL reduce_scatter (no knobs: the unfused reference speed).
Tiles are ag_gemm's; `SPLIT_K` splits the local k loop, over K_r (not K), each split at least two
BLOCK_K steps deep.
"""

from __future__ import annotations

from jointtune.search_spaces._gemm import (
    ce_params,
    comm_constraints,
    gemm_default,
    mode_param,
    sharded_problem,
    tile_constraints,
    tile_params,
)
from jointtune.search_spaces._params import pow2, when
from jointtune.search_spaces._space import Space

_check_problem, _derive = sharded_problem("gemm_rs", ("M", "K"), {"R": "M", "K_r": "K"})


GEMM_RS = Space(
    "gemm_rs",
    dims=("M", "N", "K"),
    revision=2,  # 2: SPLIT_K (split-K tiles) and its depth rule
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        mode_param("how partial rows reach their owner: fused pull/push, copy engine, or cuBLAS + NCCL"),
        *ce_params(
            "what computes each chunk of partial rows in ce mode: a Triton tile GEMM or cuBLAS",
            "chunks per destination rank's rows (more chunks = earlier sends, more launches)",
        ),
        *tile_params(),
        pow2(
            "chunk_m",
            16,
            8192,
            when=when(mode=("pull", "push")),
            doc="rows of the partial result per chunk (one flag each)",
        ),
        pow2("comm_sms", 1, 32, when=when(mode="push"), doc="SMs that push finished chunks to their owners"),
    ],
    constraints=[
        *tile_constraints("N", "global columns", "K_r", "K / world_size"),
        *comm_constraints(),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=gemm_default,
)
