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
- barrier: cuBLAS computes the whole partial; one launch whose programs meet their namesakes on every peer
  (`runtime.meet`) pushes each owner's rows into its inbox half (by the device epoch) before one meeting and sums the
  own inbox, or pulls and sums the own rows between two meetings.
- ce: cuBLAS or the tile GEMM computes each destination's rows chunk by chunk; the copy engine sends each
  chunk into the owner's inbox on a side stream; the owner's reduce programs sum.
- baseline: cuBLAS, then NCCL reduce_scatter (kept in the space: tuning never loses to it).

Tiles are computed starting at the next rank's rows and ending with the rank's own (`tile_order`; always so
with `reduce_by=epilogue`; with `reduce_by=tile` they run over all rows in the same order on every rank). A and
B are only read by their own rank, so they may live in symmetric memory or be ordinary tensors. Every call
of one (world, shapes, dtype, config) runs a launch plan built once (`_gemm_rs_plans`), and nothing a later
call needs comes from the host: the op is correct under CUDA-graph capture and replay (capture after one
eager warm-up call).

Three ways in:
    gemm_rs(a, b, world=world, config=cfg)                           # eager, the cheapest host path
    torch.ops.jointtune.gemm_rs([a], [b], world.name, cfg_json)      # torch.compile / graphs
    get_family("gemm_rs")                                            # tuner, decorator and benchmarks
"""

from jointtune.kernels.gemm_rs.launcher import (
    GemmRsFamily,
    PreparedGemmRs,
    config_json,
    gemm_rs,
    prepare,
    reference,
)

__all__ = ["GemmRsFamily", "PreparedGemmRs", "config_json", "gemm_rs", "prepare", "reference"]
