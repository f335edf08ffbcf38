"""All-Gather + GEMM for a column-parallel linear layer: C_r = all_gather(A) @ B_r.

Rank r holds A_r [M/W, K] and B_r [K, N/W] and gets C_r [M, N/W] (and, if asked, the gathered A,
as `torch.ops.symm_mem.fused_all_gather_matmul` gives). The config's `mode` picks how A travels:

- pull: the GEMM loads peers' rows straight from their symmetric buffers; no extra kernel.
- push: producer programs inside the GEMM's persistent grid push rows into every peer's inbox.
- push_cublas: the same push as a kernel of its own (or copy-engine copies plus a flag kernel), and
  cuBLAS multiplies: local rows while peers' rows travel, then each chunk after its flag; or all rows
  in one GEMM after the gather.
- barrier: one launch pushes this rank's rows to every rank, its programs meeting their namesakes on every peer
  (`runtime.meet`: into inbox halves by the device epoch before one meeting, then a local copy; or straight into the
  buffer cuBLAS reads, between two meetings; or, meeting no one, as words that carry the call's tag, `runtime.ll`),
  then one cuBLAS GEMM of all rows.
- ce: the copy engine pulls peers' rows on a side stream, chunk by chunk; per chunk a Triton tile
  GEMM or cuBLAS consumes it as soon as its event fires. Local rows are multiplied first.
- baseline: NCCL all-gather, then torch.matmul (kept in the space: tuning never loses to it).

A may already live in the world's symmetric memory (`world.empty`, written by the previous layer:
nothing is copied) or be an ordinary tensor. Every call of one (world, shapes, dtype, config) runs a
launch plan built once (`_ag_gemm_plans`), and nothing a later call needs comes from the host, so the
op is correct under CUDA-graph capture and replay (capture after one eager warm-up call).

Three ways in:
    ag_gemm(a, b, world=world, config=cfg)                         # eager, the cheapest host path
    torch.ops.jointtune.ag_gemm([a], [b], world.name, cfg_json)    # torch.compile / graphs (`config_json`)
    get_family("ag_gemm")                                          # tuner, decorator and benchmarks
"""

from jointtune.kernels.ag_gemm.launcher import (
    AgGemmFamily,
    PreparedAgGemm,
    ag_gemm,
    config_json,
    prepare,
    reference,
)

__all__ = ["AgGemmFamily", "PreparedAgGemm", "ag_gemm", "config_json", "prepare", "reference"]
