"""What any kernel needs to read a rank's KV shard once: the floor under the per-rank decode kernel.

The issue's HBM bound divides the bytes by the device copy bandwidth of a 4 GiB copy. A decode of a few dozen
MB also pays a launch, the first loads' latency and a tail, which no kernel avoids. These kernels measure that
floor on the same bytes: `read_rows` streams K and V as rows of D elements, each program a contiguous run of
rows in BLOCK_N-row steps (as a decode program streams its split of one KV head), sums them and writes one
float; `empty` is the same grid doing nothing. `floors` times both in graph replay over program counts and
steps and keeps the best, so "decode / read floor" says what the decode's own work costs on top.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def read_rows(k_ptr, v_ptr, out_ptr, rows, rows_per_program, D: tl.constexpr, BLOCK_N: tl.constexpr,
              STAGES: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    acc = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    cols = tl.arange(0, D)
    for start in tl.range(first, last, BLOCK_N, num_stages=STAGES):
        r = start + tl.arange(0, BLOCK_N)
        offs = r[:, None].to(tl.int64) * D + cols[None, :]
        mask = (r < last)[:, None]
        acc += tl.load(k_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def empty(out_ptr):
    pass


def read_launch(k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, programs: int, block_n: int, stages: int):
    """A zero-argument launch of `read_rows` over `programs` programs (out holds at least that many floats)."""
    D = k.shape[-1]
    rows = k.numel() // D
    per = triton.cdiv(rows, programs)

    def launch() -> None:
        read_rows[(programs,)](k, v, out, rows, per, D=D, BLOCK_N=block_n, STAGES=stages, num_warps=4)

    return launch


def read_reference(k: torch.Tensor, v: torch.Tensor, programs: int) -> torch.Tensor:
    """Each program's sum, in float32 (a missing or doubled step changes its program's sum by far more than
    rounding does)."""
    D = k.shape[-1]
    rows = k.numel() // D
    both = k.reshape(rows, D).float() + v.reshape(rows, D).float()
    return torch.stack([c.sum() for c in both.split(triton.cdiv(rows, programs))])


def floors(k: torch.Tensor, v: torch.Tensor, programs: int, time_launch) -> dict:
    """The best read of k and v over program counts around `programs` and 64/128-row steps with 3-4 stages, and
    the empty launch of `programs` programs. `time_launch(fn) -> dict` times a launch (gpu/eager/graph)."""
    sms = torch.cuda.get_device_properties(k.device).multi_processor_count
    out = torch.empty(max(programs, 8 * sms), dtype=torch.float32, device=k.device)
    rows = []
    for p in sorted({programs, sms, 2 * sms, 4 * sms, 8 * sms}):
        for block_n in (64, 128):
            for stages in (3, 4):
                if triton.cdiv(k.numel() // k.shape[-1], p) < block_n:
                    continue
                fn = read_launch(k, v, out, p, block_n, stages)
                out.fill_(float("nan"))
                fn()
                want = read_reference(k, v, p)
                got = out[: want.numel()]
                atol = 1e-2 * (k.numel() / want.numel()) ** 0.5
                if not torch.allclose(got, want, rtol=1e-3, atol=atol):
                    worst = float((got - want).abs().max())
                    raise AssertionError(f"read_rows off by {worst} ({p} programs, {block_n} rows, {stages} stages)")
                rows.append(dict(programs=p, BLOCK_N=block_n, stages=stages, **time_launch(fn)))
    best = min(rows, key=lambda r: r["graph_ms"])

    def empty_launch() -> None:
        empty[(programs,)](out)

    return {"read": best, "read_grid": rows, "empty": dict(programs=programs, **time_launch(empty_launch))}


__all__ = ["floors", "read_launch", "read_rows"]
