"""GEMM + All-Reduce for a row-parallel linear layer with a replicated output: out = sum_p A_p @ B_p on every rank.

Rank r holds A_r [M, K_r] and B_r [K_r, N]; every rank gets all M rows of the sum, the same bits on every rank: each
partial is rounded once to the input dtype where it travels (as NCCL's all-reduce of a bf16 GEMM output is), the
own one too, and the W partials are summed in float32 in rank order from those values everywhere. Rounded partials
rather than float32 ones, because at decode sizes the exchange is bound by bytes over NVLink (one-shot moves
(W - 1) * M * N elements out of every rank): float32 would double them for a last bit the bf16 output drops anyway.

The optional epilogue is part of the call, not a knob (it changes the output): `residual` is added to the sum, and
`gemm_ar_rmsnorm` then normalises every row (weight and eps as inputs) and returns (normed, new_residual), the two
tensors a decoder layer's next step reads. RMSNorm needs whole rows while the partial is exchanged in tiles: the
fused modes sum whole rows in their reduce items (one row per item, both passes in one program), which every rank
does for every row in one-shot and each row's owner does in two-shot before handing out the row and its 1/rms.
Row ownership, not a second phase after the exchange: a second phase would need a cross-program reduction per row
and one more grid-wide wait per call (a flag round trip, the dominant cost at decode sizes), while an item that owns
its row reads every tile of it once and normalises in place; two-shot's owners already hold whole rows.

The config's `mode` (see `search_spaces.gemm_ar` and `plans`): `one_shot`, `two_shot` (each with the tile GEMM in
the same launch, or cuBLAS before it; push or pull, or LL words that carry their flag; or, after cuBLAS, `barrier`:
one launch whose programs meet their namesakes on every peer around the exchange (`meet`), and for one-shot
`barrier_push`: pushed into inbox halves before a single meeting) or `baseline` (cuBLAS + the all-reduce variant, then
torch).
Every call of one (world, shapes, dtype, epilogue, config) runs a plan built once, and nothing a later call needs
comes from the host: the op is correct under CUDA-graph capture and replay (capture after one eager call).

Ways in:
    gemm_ar(a, b, world=world, config=cfg, residual=None)                          # -> out
    gemm_ar_rmsnorm(a, b, residual, weight, eps=1e-6, world=world, config=cfg)     # -> (normed, new_residual)
    row_parallel(x, w, world=world, config=cfg, residual=..., norm_weight=..., eps=...)  # the TP layers' call
    torch.ops.jointtune.gemm_ar / gemm_ar_rmsnorm                                  # torch.compile, graphs
    get_family("gemm_ar") / get_family("gemm_ar_rmsnorm")                          # tuner, decorator, benchmarks

Both ops stand on the op skeleton (`runtime.op`) as every family does: `launcher` holds only what is their own (the
checks, plan key and build, and the (normed, new residual) pair); `args` the launch arguments, `plans` the plans,
and `kernel` (with its `exchange` and `reduce` sides) the kernels.
"""

from jointtune.kernels.gemm_ar.launcher import (
    GemmArFamily,
    GemmArInputs,
    GemmArRmsNormFamily,
    PreparedGemmAr,
    config_json,
    family_name,
    gemm_ar,
    gemm_ar_rmsnorm,
    prepare,
    reference,
    row_parallel,
    standin_launches,
)

__all__ = [
    "GemmArFamily",
    "GemmArInputs",
    "GemmArRmsNormFamily",
    "PreparedGemmAr",
    "config_json",
    "family_name",
    "gemm_ar",
    "gemm_ar_rmsnorm",
    "prepare",
    "reference",
    "row_parallel",
    "standin_launches",
]
