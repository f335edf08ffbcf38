"""Text checks of compiled kernels (TTGIR) for the ordering rules of `ordering_probe.py`: plain functions of the
text, importable without touching the interpreter setting, so the checks themselves are tested on the CPU."""

from __future__ import annotations

import re

_ZERO_CONST = re.compile(r"^\s*(%[\w.]+) = arith\.constant dense<0\.000000e\+00> : tensor<[\dx]+xf32")
_STORE = re.compile(r"^\s*tt\.store (%[\w.]+), (%[\w.]+)")
_BARRIER = re.compile(r"\b(gpu\.barrier|ttg\.barrier)\b")  # `tl.debug_barrier()` in Triton 3.6 / 3.9
_F32_READ = re.compile(r"tt\.(load|atomic_rmw)\b.*tensor<[\dx]+x!tt\.ptr<f32>")
_SCALAR_RMW = re.compile(r"tt\.atomic_(rmw|cas)\b[^:]*\b(release|acq_rel|acquire)\b.*: \(!tt\.ptr<")
#: a system-scope fence in inline asm (`signals.release_ranks`: one fence, then relaxed flag writes)
_FENCE = re.compile(r"tt\.elementwise_inline_asm\b.*\bfence\.(acq_rel|sc)\.sys\b")
#: a relaxed system-scope flag write: a handoff only behind a fence
_RELAXED_FLAG = re.compile(r"tt\.atomic_rmw exch, relaxed, sys\b[^:]*: \(!tt\.ptr<")
_TENSOR_WRITE = re.compile(r"(tt\.store\b.*: tensor<|tt\.atomic_(rmw|cas)\b.*: \(tensor<|tt\.descriptor_store\b)")
#: a tile's loads: plain, pipelined into shared memory (the GEMM K loops' cp.async), or by TMA descriptor
_TENSOR_READ = re.compile(
    r"(tt\.load\b.*: tensor<|ttg\.async_copy_global_to_local\b|tt\.descriptor_load\b"
    r"|ttng\.async_tma_copy_global_to_local\b)"
)


def unfenced_zeroing(ttgir: str) -> list[str]:
    """Stores of an fp32 zeros constant whose nearest earlier fp32 tensor read (in program text) comes
    after the nearest barrier, i.e. a zeroing that may overtake another thread's read."""
    lines = ttgir.splitlines()
    zeros = {m.group(1) for line in lines if (m := _ZERO_CONST.match(line))}
    bad = []
    for i, line in enumerate(lines):
        store = _STORE.match(line)
        if not store or store.group(2) not in zeros:
            continue
        for earlier in reversed(lines[:i]):
            if _BARRIER.search(earlier):
                break
            if _F32_READ.search(earlier):
                bad.append(line.strip()[:160])
                break
    return bad


def unbarriered_handoffs(ttgir: str) -> list[str]:
    """Scalar releases (and system-scope fences) whose nearest earlier tensor write (in program text) comes after the
    nearest barrier, and scalar acquires whose nearest later tensor load comes before the next barrier: a handoff that
    speaks for one thread only. Program text, not control flow: a loop's back edge is not followed."""
    lines = ttgir.splitlines()
    bad = []
    for i, line in enumerate(lines):
        rmw = _SCALAR_RMW.search(line)
        fence = _FENCE.search(line)
        if not rmw and not fence:
            continue
        if fence or rmw.group(2) in ("release", "acq_rel"):
            for earlier in reversed(lines[:i]):
                if _BARRIER.search(earlier):
                    break
                if _TENSOR_WRITE.search(earlier):
                    bad.append("release after " + earlier.strip()[:140])
                    break
        if rmw and rmw.group(2) in ("acquire", "acq_rel"):
            for later in lines[i + 1 :]:
                if _BARRIER.search(later):
                    break
                if _TENSOR_READ.search(later):
                    bad.append("load after acquire: " + later.strip()[:140])
                    break
    return bad


def unfenced_flag_writes(ttgir: str) -> list[str]:
    """Relaxed system-scope flag writes with no fence between them and the nearest earlier barrier or tensor write (in
    program text): the write would publish nothing (PTX's release pattern is a fence, then the strong write)."""
    lines = ttgir.splitlines()
    bad = []
    for i, line in enumerate(lines):
        if not _RELAXED_FLAG.search(line):
            continue
        for earlier in reversed(lines[:i]):
            if _FENCE.search(earlier):
                break
            if _BARRIER.search(earlier) or _TENSOR_WRITE.search(earlier):
                bad.append("relaxed flag write without a fence: " + line.strip()[:140])
                break
        else:
            bad.append("relaxed flag write without a fence: " + line.strip()[:140])
    return bad


__all__ = ["unbarriered_handoffs", "unfenced_flag_writes", "unfenced_zeroing"]
