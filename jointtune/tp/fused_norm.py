"""The sequence-parallel layout's residual add and RMSNorm in one pass over each row: (RMSNorm(r + y) * w, r + y).

After GEMM+RS each rank holds its T/W rows of the row-parallel sum; the decoder adds the residual and normalises.
In torch that is two kernels: the add (reads y and r, writes h) and `F.rms_norm` (reads h again, writes the norm).
Here one Triton program per row reads y and r once and writes h and the norm: four row-sized transfers instead of
five, and one launch less. In the standard layout the same epilogue sits inside the fused GEMM + all-reduce
(`gemm_ar_rmsnorm`).

h is rounded to the activations' dtype as `r + y` is (bit for bit on GPUs). The norm is taken from that rounded h in
float32 and rounded once, as `F.rms_norm` with a weight of the activations' dtype does; its sum runs in another order
and its square root is the GPU's fast one, so it lands within one unit in the last place of torch's. A call it can't
serve (other dtypes or layouts, a tensor on another device than the current CUDA one, inputs that need a gradient)
goes to those two torch ops.

The same kernel serves every call it takes, eager or captured, so a captured step gives what its eager warm-up gave.
Under `torch.compile(fullgraph=True)` it is a torch op (`torch.ops.jointtune.add_rms_norm`) the graph keeps whole;
eagerly the kernel is launched directly (the op's dispatch adds 13-14 µs of host time a call). Eagerly, Triton's
launch costs the host about 26 µs a call against about 17 for torch's pair (one H200's host): where the GPU work is
smaller than that (a few hundred rows) an eager caller with nothing else queued waits on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jointtune.errors import ShapeError
from jointtune.kernels.runtime.device import interpreted
from jointtune.tp.functional import rms_norm

#: the longest row one program holds (hidden sizes of the models we ship are 4096-8192)
MAX_ROW = 1 << 16
#: activation dtypes the kernel takes
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
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
    # inputs `_fusable` admits, nothing checked (the eager hot path)
    h = torch.empty_like(y)
    out = torch.empty_like(y)
    rows, n = y.shape
    if rows:
        block = triton.next_power_of_2(n)
        warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
        _add_rms_norm_kernel[(rows,)](y, residual, weight, h, out, n, eps, y.stride(0), residual.stride(0),
                                      h.stride(0), out.stride(0), BLOCK=block, num_warps=warps)  # fmt: skip
    return out, h


@torch.library.custom_op("jointtune::add_rms_norm", mutates_args=())
def _add_rms_norm_op(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    problem = _refusal(y, residual, weight)
    if problem:
        raise ShapeError(f"jointtune::add_rms_norm: {problem}")
    return _launch(y, residual, weight, eps)


@_add_rms_norm_op.register_fake
def _(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(y), torch.empty_like(y)


def _refusal(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, current_device: bool = True) -> str:
    """Why the kernel can't take these inputs (one clause naming the field), or "" when it can. `current_device`:
    also that a CUDA tensor is on the current device (left to the op's own check while torch.compile traces)."""
    if y.dim() != 2:
        return f"y: {y.dim()} dims are not allowed; give [rows, hidden]"
    rows, n = y.shape
    if not 0 < n <= MAX_ROW:
        return f"y: a row of {n} is not allowed; allowed: 1..{MAX_ROW} values"
    if residual.shape != y.shape:
        return f"residual: shape {list(residual.shape)} is not allowed; give y's, {[rows, n]}"
    if weight.shape != (n,):
        return f"weight: shape {list(weight.shape)} is not allowed; give [{n}]"
    if y.dtype not in DTYPES or residual.dtype != y.dtype or weight.dtype != y.dtype:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        return f"dtype: y, residual, weight must share one of {names}"
    if y.stride(1) != 1 or residual.stride(1) != 1 or weight.stride(0) != 1:
        return "layout: y, residual and weight must have unit stride along the hidden dim"
    if y.device != residual.device or y.device != weight.device:
        return "device: y, residual and weight must be on one device"
    if y.is_cuda:
        if current_device and y.device.index != torch.cuda.current_device():
            return f"device: {y.device} is not the current CUDA device (the kernel launches there)"
    elif not (_INTERPRETED and y.device.type == "cpu"):
        return f"device: {y.device} is not allowed; a CUDA tensor, or a CPU one under Triton's interpreter"
    return ""


def _fusable(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, compiling: bool) -> bool:
    if torch.is_grad_enabled() and (y.requires_grad or residual.requires_grad or weight.requires_grad):
        return False  # the kernel has no backward: torch's ops keep the graph
    return not _refusal(y, residual, weight, current_device=not compiling)


def add_rms_norm(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(RMSNorm(residual + y) * weight, residual + y): h rounded as torch's add rounds it, the norm within one unit in
    the last place of `F.rms_norm`'s; one Triton pass where it can (module doc), else those two torch ops."""
    compiling = torch.compiler.is_compiling()
    if _fusable(y, residual, weight, compiling):
        if compiling:
            return torch.ops.jointtune.add_rms_norm(y, residual, weight, eps)
        return _launch(y, residual, weight, eps)
    h = residual + y
    return rms_norm(h, weight, eps), h


__all__ = ["add_rms_norm"]
