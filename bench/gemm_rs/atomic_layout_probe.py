"""Does Triton's tensor `tl.atomic_add` of a tl.dot accumulator add every element once? A probe without jointtune:
one program per output tile computes C = A @ B, then adds the fp32 tile atomically into a zeroed buffer and also
stores it plainly; the two buffers must agree. GEMM+RS atomic mode summed wrong with 8-warp tiles even on one GPU
(`bench/gemm_rs/gemm_rs_atomic.py`); this asks whether the fault is in that lowering, and which variants avoid it.

Launch: `python bench/gemm_rs/atomic_layout_probe.py --out probe.json` (one GPU).

Per (tile, warps, variant): elements whose atomic sum is 0 where the stored value is not (missed), is twice it
(added twice), or differs otherwise, over the whole [M, N] output, and the row/column residues (mod 16) that the
wrong elements fall on.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton
import triton.language as tl


@triton.jit
def probe_kernel(a_ptr, b_ptr, atom_ptr, store_ptr, delta_ptr, fence_ptr, count_ptr, M, N, K, n_programs,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, VARIANT: tl.constexpr,
                 DELTA: tl.constexpr, FENCES: tl.constexpr, PERSIST: tl.constexpr, I64: tl.constexpr,
                 THREADS: tl.constexpr):  # fmt: skip
    # DELTA: the atomic's pointer moved by a loaded offset (alignment unknown: scalar atomics, as GEMM+RS's);
    # FENCES: GEMM+RS's epilogue after the adds (fence.acq_rel.sys per thread, a per-thread acq_rel atomic, a
    # barrier, one counting atomic); PERSIST: n_programs programs walk the tiles (GEMM+RS's grid), else one per tile;
    # I64: the atomic's offsets in int64 with a runtime row stride (GEMM+RS's destination pointers)
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    step = n_programs if PERSIST else n_tiles
    for tile in range(pid, n_tiles, step):
        rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
            b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
            acc = tl.dot(a, b, acc)
        ptrs = rm[:, None] * N + rn[None, :]
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(store_ptr + ptrs, acc, mask=mask)
        if I64:
            ptrs = rm[:, None].to(tl.int64) * N + rn[None, :]
        base = atom_ptr
        if DELTA:
            base = atom_ptr + tl.load(delta_ptr)
        if VARIANT == 0:  # what GEMM+RS atomic mode does: masked, relaxed, system scope
            tl.atomic_add(base + ptrs, acc, mask=mask, sem="relaxed", scope="sys")
        elif VARIANT == 1:  # no mask
            tl.atomic_add(base + ptrs, acc, sem="relaxed", scope="sys")
        elif VARIANT == 2:  # GPU scope, the default semantics
            tl.atomic_add(base + ptrs, acc, mask=mask)
        elif VARIANT == 3:  # the tile through a reshape to one dimension first (a different register layout)
            flat = tl.reshape(acc, (BLOCK_M * BLOCK_N,))
            fptrs = tl.reshape(base + ptrs, (BLOCK_M * BLOCK_N,))
            tl.atomic_add(fptrs, flat, sem="relaxed", scope="sys")
        else:  # two adds of half the value each
            tl.atomic_add(base + ptrs, acc * 0.5, mask=mask, sem="relaxed", scope="sys")
            tl.atomic_add(base + ptrs, acc * 0.5, mask=mask, sem="relaxed", scope="sys")
        if FENCES:
            tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, $1;", "=r,r", [tl.arange(0, THREADS)],
                                      dtype=tl.int32, is_pure=False, pack=1)  # fmt: skip
            tl.atomic_add(fence_ptr + pid * THREADS + tl.arange(0, THREADS), 0, sem="acq_rel", scope="sys")
            tl.debug_barrier()
            tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="sys")


VARIANTS = {0: "masked relaxed sys (GEMM+RS)", 1: "no mask", 2: "gpu scope, acq_rel", 3: "reshaped to 1-D",
            4: "two half-value adds"}  # fmt: skip


def probe(M: int, N: int, K: int, bm: int, bn: int, bk: int, warps: int, stages: int, variant: int,
          delta: bool = False, fences: bool = False, persist: bool = False, i64: bool = False) -> dict:  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(bm * 7 + bn + warps + variant)
    a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    b = torch.randn(K, N, device="cuda", generator=gen).bfloat16()
    atom = torch.zeros(M, N, device="cuda")
    stored = torch.full((M, N), float("nan"), device="cuda")
    zero = torch.zeros(1, dtype=torch.int64, device="cuda")
    n_tiles = (M // bm) * (N // bn)
    programs = min(n_tiles, torch.cuda.get_device_properties(0).multi_processor_count) if persist else n_tiles
    fence = torch.zeros(programs * 32 * warps, dtype=torch.int32, device="cuda")
    count = torch.zeros(n_tiles, dtype=torch.int32, device="cuda")
    probe_kernel[(programs,)](a, b, atom, stored, zero, fence, count, M, N, K, programs, BLOCK_M=bm, BLOCK_N=bn,
                              BLOCK_K=bk, VARIANT=variant, DELTA=delta, FENCES=fences, PERSIST=persist, I64=i64,
                              THREADS=32 * warps, num_warps=warps, num_stages=stages)  # fmt: skip
    torch.cuda.synchronize()
    real = stored.abs() > 1e-2  # away from zero, where "missed" and "twice" can be told apart
    missed = (atom == 0) & real
    twice = ((atom - 2 * stored).abs() <= 1e-3 * stored.abs()) & real
    wrong = (atom != stored) & ~missed & ~twice
    bad = (missed | twice | wrong).nonzero()
    rows = sorted({int(r) % 16 for r in bad[:4096, 0]}) if len(bad) else []
    cols = sorted({int(c) % 16 for c in bad[:4096, 1]}) if len(bad) else []
    n = M * N
    counted = sorted(set(count.tolist())) if fences else None  # each tile's counting atomic: once, so [1]
    return {"tile": [bm, bn, bk], "num_warps": warps, "num_stages": stages, "variant": VARIANTS[variant],
            "tile_counts_seen": counted, "delta": delta, "fences": fences, "persistent": persist, "int64_offsets": i64,
            "missed": missed.sum().item() / n, "added_twice": twice.sum().item() / n, "other": wrong.sum().item() / n,
            "bad_row_residues_mod16": rows, "bad_col_residues_mod16": cols}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="atomic_layout_probe.json")
    args = ap.parse_args()
    M, N, K = 1024, 1024, 512
    result = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "command": f"python bench/gemm_rs/atomic_layout_probe.py --out {args.out}",
        "shape": [M, N, K],
        "cases": [],
    }
    plain = [(v, False, False, False, False) for v in VARIANTS]
    closer = [
        (0, d, f, p, i) for d in (False, True) for f in (False, True) for p in (False, True) for i in (False, True)
    ]
    for bm, bn, warps in ((64, 128, 4), (128, 128, 4), (128, 128, 8), (128, 256, 8)):
        for variant, delta, fences, persist, i64 in plain + closer[1:]:
            try:
                case = probe(M, N, K, bm, bn, 64, warps, 3, variant, delta, fences, persist, i64)
            except Exception as exc:
                case = {"tile": [bm, bn, 64], "num_warps": warps, "variant": VARIANTS[variant],
                        "failure": f"{type(exc).__name__}: {exc}"[:300]}  # fmt: skip
            result["cases"].append(case)
            print(json.dumps(case), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
