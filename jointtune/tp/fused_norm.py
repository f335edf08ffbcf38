"""The sequence-parallel layout's residual add and RMSNorm in one pass over each row: (RMSNorm(r + y) * w, r + y).

After GEMM+RS each rank holds its T/W rows of the row-parallel sum; the decoder adds the residual and normalises.
In torch that is two kernels: the add (reads y and r, writes h) and `F.rms_norm` (reads h again, writes the norm).
Here one Triton program per row reads y and r once, writes h and the norm: a quarter less memory traffic and one
launch less. In the standard layout the same epilogue sits inside the fused GEMM + all-reduce (`gemm_ar_rmsnorm`).

Rounding is torch's: h is rounded to the activations' dtype (as `r + y` is), and the norm is taken from that rounded h
in float32 and rounded once (as `F.rms_norm` with a weight of the activations' dtype is). A call it can't serve (other
dtypes or layouts, a CPU tensor without Triton's interpreter) goes to those two torch ops.

Under `torch.compile(fullgraph=True)` it is a torch op (`torch.ops.jointtune.add_rms_norm`) the graph keeps whole;
eagerly the kernel is launched directly (the op's dispatch adds 13-14 µs of host time a call), and only where the
rows are many enough to pay for Triton's launch (`EAGER_MIN_ELEMENTS`); captured in a CUDA graph, always.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jointtune.kernels.runtime.device import interpreted
from jointtune.tp.functional import rms_norm

#: the longest row one program holds (hidden sizes of the models we ship are 4096-8192)
MAX_ROW = 1 << 16
#: Eagerly, the elements from which the one launch beats torch's two: Triton's launch costs the host about 26 µs a
#: call against 17 for torch's pair, so below this a call is host-bound (one H200, eager µs per call: 1024 x 5120 ours
#: 26.9, torch 18.1; 1024 x 8192 28.2 and 29.4; 2048 x 8192 39.9 and 53.8; bench/results/add_rms_norm_1xH200_*).
#: Captured in a CUDA graph only GPU time counts, and the one launch always wins (1.3-3.6x): it is taken at any size.
EAGER_MIN_ELEMENTS = 1 << 23
#: Triton runs in the CPU interpreter (fixed per process, before Triton's import): CPU tensors can take the kernel too
_INTERPRETED = interpreted()


@triton.jit
def _add_rms_norm_kernel(y_ptr, r_ptr, w_ptr, h_ptr, out_ptr, N, eps, stride_y, stride_r, stride_h, stride_o,
                         BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    h = (r + y).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (hf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    h = torch.empty_like(y)
    out = torch.empty_like(y)
    rows, n = y.shape
    if rows:
        block = triton.next_power_of_2(n)
        warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
        _add_rms_norm_kernel[(rows,)](y, residual, weight, h, out, n, eps, y.stride(0), residual.stride(0),
                                      h.stride(0), out.stride(0), BLOCK=block, num_warps=warps)  # fmt: skip
    return out, h


_add_rms_norm_op = torch.library.custom_op("jointtune::add_rms_norm", _launch, mutates_args=())


@_add_rms_norm_op.register_fake
def _(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(y), torch.empty_like(y)


def _fusable(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        y.dim() == 2
        and residual.shape == y.shape
        and weight.shape == (y.shape[1],)
        and y.dtype == residual.dtype == weight.dtype
        and y.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and y.device == residual.device == weight.device
        and (y.is_cuda or _INTERPRETED)
        and 0 < y.shape[1] <= MAX_ROW
        and y.stride(1) == residual.stride(1) == weight.stride(0) == 1
    )


def add_rms_norm(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(RMSNorm(residual + y) * weight, residual + y), rounded as torch's add then `F.rms_norm` round them: one
    Triton pass where it can (module doc), else those two torch ops."""
    if _fusable(y, residual, weight):
        if torch.compiler.is_compiling():
            return torch.ops.jointtune.add_rms_norm(y, residual, weight, eps)
        if not y.is_cuda or y.numel() >= EAGER_MIN_ELEMENTS or torch.cuda.is_current_stream_capturing():
            return _launch(y, residual, weight, eps)
    h = residual + y
    return rms_norm(h, weight, eps), h


__all__ = ["add_rms_norm"]
