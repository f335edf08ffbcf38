"""`ag_gemm`: All-Gather + GEMM, column-parallel (the first linear of a tensor-parallel MLP).

Rank r holds A_r[M/W, K] and B_r[K, N/W] and computes C_r = all_gather(A) @ B_r of [M, N/W].
Dims M, N, K are global; R = M / W rows per rank, N_r = N / W columns per rank. Modes:
  pull      every program reads A's rows straight from the owning peer (waits on its flag);
  push      `comm_sms` SMs copy the local A shard to every peer in `chunk_m`-row chunks, raising a
            flag per chunk, while the other SMs run the tile GEMM on chunks as they arrive;
  ce        the copy engine gathers A in `ce_chunks` chunks per peer shard; a Triton tile GEMM or
            cuBLAS (`ce_consumer`) consumes each chunk after it lands;
  baseline  NCCL all_gather, then one cuBLAS GEMM (no knobs: the unfused reference speed).
Tiles (BLOCK_M/N/K, GROUP_M, num_warps, num_stages, SPLIT_K) exist wherever a Triton GEMM runs;
`SPLIT_K` splits the k loop over the global K, each split at least two BLOCK_K steps deep.
The ag_gemm kernel is written against exactly these names, values and meanings.
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

_check_problem, _derive = sharded_problem("ag_gemm", ("M", "N"), {"R": "M", "N_r": "N"})


AG_GEMM = Space(
    "ag_gemm",
    dims=("M", "N", "K"),
    revision=2,  # 2: SPLIT_K (split-K tiles) and its depth rule
    doc=__doc__.split("\n\n")[0] if __doc__ else "",
    params=[
        mode_param("how A's shards reach the GEMM: fused pull/push, copy engine, or NCCL + cuBLAS"),
        *ce_params(
            "what multiplies each gathered chunk in ce mode: a Triton tile GEMM or cuBLAS",
            "copy-engine chunks per peer shard (more chunks = earlier start, more launches)",
        ),
        *tile_params(),
        pow2("comm_sms", 1, 32, when=when(mode="push"), doc="SMs that push A chunks to peers"),
        pow2("chunk_m", 16, 8192, when=when(mode="push"), doc="rows of A per pushed chunk (one flag each)"),
    ],
    constraints=[
        *tile_constraints("N_r", "N / world_size", "K", "global depth"),
        *comm_constraints(),
    ],
    derive=_derive,
    check_problem=_check_problem,
    default=gemm_default,
)
