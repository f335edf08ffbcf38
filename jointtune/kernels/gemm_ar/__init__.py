"""GEMM + All-Reduce: the row-parallel linear layer with a replicated output, and its residual + RMSNorm epilogue
(`_launcher` says how it works). Importing the package registers its kernels (`gemm_ar`, `gemm_ar_rmsnorm`) and
their torch ops."""

from jointtune.kernels.gemm_ar._families import GemmArFamily, GemmArInputs, GemmArRmsNormFamily, standin_launches
from jointtune.kernels.gemm_ar._launcher import (
    PreparedGemmAr,
    family_name,
    gemm_ar,
    gemm_ar_rmsnorm,
    prepare,
    reference,
    row_parallel,
)
from jointtune.kernels.gemm_ar._ops import _gemm_ar_op, _gemm_ar_rmsnorm_op  # noqa: F401 (registers the torch ops)
from jointtune.kernels.runtime.calls import config_json

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
