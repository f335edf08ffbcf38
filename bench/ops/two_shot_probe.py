"""Is our two-shot exchange slow because of Triton, or because of its shape? A probe: torch's in-place two-shot
all-reduce written in Triton as plainly as it can be, timed beside torch's own on the same symmetric buffer.

Launch on W GPUs (W = 2 or 4, one process each):

    torchrun --nproc-per-node=W bench/ops/two_shot_probe.py --out probe.json

The kernel (`two_shot_inplace`) is the pattern torch's `two_shot_all_reduce_` runs: every program meets its
namesakes on the other ranks (a signal each way, 0 -> 1 by the writer, 1 -> 0 by the reader, at system scope),
reduces its share of this rank's slice of the buffer by reading the W peers' copies straight over NVLink (summed in
rank order in float32), stores the sum into every peer's copy, and meets them again. No flags per tile, no inboxes,
no halves: one pull and one push per element, two barriers per call. `gemm_ar`'s flagged two-shot (cuBLAS, then one
exchange launch) took 22.4 µs at 64 rows of 8192 at W=4 against torch's 13.9 (gemm_ar_anatomy, 2026-11-26): if this
probe lands near torch's, the pattern is what to port; if not, the gap is Triton's.

Per M (default 8, 64, 128, N=8192, bf16): torch's two-shot and the probe at a few program counts and block sizes,
each the max over ranks of the best of three timings of a graph of 4 calls replayed 20 times, the probe's output
checked first against the float32 sum (rank order) bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl
from common.cuda import device_label, init_cuda_world, spin_up
from common.measure import best_graph_us, provenance

N = 8192
CALLS, REPLAYS, ROUNDS = 4, 20, 3
SLOTS = 256  # programs a launch may have: each has a start and an end signal per peer
MAX_PROGRAMS = tl.constexpr(SLOTS)


@triton.jit
def _put_all(sig_ptrs_ptr, slot, rank, WORLD: tl.constexpr):
    # this program's signal `slot` on every rank (this one's too), 0 -> 1, spinning while the last call's is unread
    peers = tl.arange(0, WORLD)
    addrs = tl.load(sig_ptrs_ptr + peers).to(tl.pointer_type(tl.int32)) + slot * WORLD + rank
    done = peers < 0
    while tl.min(done.to(tl.int32)) == 0:
        old = tl.atomic_cas(addrs, tl.where(done, -1, 0), tl.full([WORLD], 1, tl.int32), sem="release", scope="sys")
        done = done | (old == 0)


@triton.jit
def _take_all(sig_ptrs_ptr, slot, rank, WORLD: tl.constexpr):
    # every rank's signal `slot` to this one, 1 -> 0, once each is in
    peers = tl.arange(0, WORLD)
    addrs = tl.load(sig_ptrs_ptr + rank).to(tl.pointer_type(tl.int32)) + slot * WORLD + peers
    done = peers < 0
    while tl.min(done.to(tl.int32)) == 0:
        old = tl.atomic_cas(addrs, tl.where(done, -1, 1), tl.zeros([WORLD], tl.int32), sem="acquire", scope="sys")
        done = done | (old == 1)


@triton.jit
def two_shot_inplace(buf_ptr, deltas_ptr, sig_ptrs_ptr, rank, numel, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    # peer q's copy at buf_ptr + deltas[q] (elements): a base the compiler knows is 16-byte aligned plus a multiple of
    # 16 elements, so it emits 16-byte loads and stores (a pointer loaded from memory would give it none: 2-byte ones)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    _put_all(sig_ptrs_ptr, pid, rank, WORLD)
    _take_all(sig_ptrs_ptr, pid, rank, WORLD)
    tl.debug_barrier()
    chunk = tl.cdiv(tl.cdiv(numel, WORLD), BLOCK) * BLOCK
    lo = rank * chunk
    hi = tl.minimum(numel, lo + chunk)
    for i in range(pid, tl.cdiv(hi - lo, BLOCK), nprog):
        offs = lo + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < hi
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for q in tl.static_range(WORLD):  # rank order: every rank's sum the same bits
            src = buf_ptr + (tl.load(deltas_ptr + q) // 16) * 16
            acc += tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        val = acc.to(buf_ptr.dtype.element_ty)
        for q in tl.static_range(WORLD):
            dst = buf_ptr + (tl.load(deltas_ptr + (rank + q) % WORLD) // 16) * 16
            tl.store(dst + offs, val, mask=mask)
    tl.debug_barrier()
    _put_all(sig_ptrs_ptr, MAX_PROGRAMS + pid, rank, WORLD)
    _take_all(sig_ptrs_ptr, MAX_PROGRAMS + pid, rank, WORLD)


class Probe:
    """One M's symmetric buffer (shared with torch's op), its peers' addresses and the probe's own signals."""

    def __init__(self, world: Any, M: int) -> None:
        self.world, self.M = world, M
        group = dist.group.WORLD.group_name
        self.group = group
        self.buf = symm_mem.empty((M, N), dtype=torch.bfloat16, device="cuda")
        hdl = symm_mem.rendezvous(self.buf, group)
        own = self.buf.data_ptr()
        assert all((p - own) % 32 == 0 for p in hdl.buffer_ptrs), "peer copies not 16-element aligned"
        self.deltas = torch.tensor([(p - own) // 2 for p in hdl.buffer_ptrs], dtype=torch.int64, device="cuda")
        self.sig = symm_mem.empty((2 * SLOTS * world.world_size,), dtype=torch.int32, device="cuda")
        self.sig.zero_()
        sig_hdl = symm_mem.rendezvous(self.sig, group)
        self.sig_ptrs = torch.tensor(sig_hdl.buffer_ptrs, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        dist.barrier()

    def probe(self, programs: int, block: int, warps: int) -> None:
        two_shot_inplace[(programs,)](self.buf, self.deltas, self.sig_ptrs, self.world.rank, self.buf.numel(),
                                      WORLD=self.world.world_size, BLOCK=block, num_warps=warps)  # fmt: skip

    def torch_two_shot(self) -> None:
        torch.ops.symm_mem.two_shot_all_reduce_(self.buf, "sum", self.group)

    def check(self, fn: Any) -> bool:
        """fn's sum of fresh random rows, the same bits as the float32 sum in rank order, on every rank."""
        W, rank = self.world.world_size, self.world.rank
        gen = torch.Generator(device="cuda").manual_seed(7 + self.M)
        every = [torch.randn(self.M, N, generator=gen, device="cuda").bfloat16() for _ in range(W)]
        want = torch.zeros(self.M, N, device="cuda")
        for x in every:
            want += x.float()
        self.buf.copy_(every[rank])
        torch.cuda.synchronize()
        dist.barrier()
        fn()
        torch.cuda.synchronize()
        ok = torch.tensor([float(torch.equal(self.buf, want.bfloat16()))], device="cuda")
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return ok.item() == 1.0


def graph_us(world: Any, fn: Any) -> float:
    return best_graph_us(world, fn, calls=CALLS, replays=REPLAYS, rounds=ROUNDS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8,64,128")
    ap.add_argument("--out", default="two_shot_probe.json")
    args = ap.parse_args()
    world = init_cuda_world()
    started = time.time()
    spin_up(2.0)
    rows = []
    for M in (int(m) for m in args.rows.split(",")):
        p = Probe(world, M)
        row: dict[str, Any] = {"M": M, "N": N}
        fns: dict[str, Any] = {"torch_two_shot": p.torch_two_shot}
        for programs in (8, 16, 32, 64):
            for block, warps in ((1024, 4), (2048, 8), (4096, 8)):
                if M * N // world.world_size >= programs * block or programs == 8:
                    fns[f"probe_p{programs}_b{block}"] = lambda a=programs, b=block, w=warps, p=p: p.probe(a, b, w)
        for name, fn in fns.items():
            try:
                ok = p.check(fn)
                row[name] = {"same_bits_as_reference": ok}
                row[name]["us"] = graph_us(world, fn)
            except Exception as exc:  # an anchor that fails is recorded, and the run goes on
                torch.cuda.synchronize()
                row[name] = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
        probes = {k: v["us"] for k, v in row.items() if k.startswith("probe") and isinstance(v, dict) and "us" in v}
        if probes and "us" in row["torch_two_shot"]:
            best = min(probes, key=probes.get)
            row["best"] = {"probe": best, "probe_us": probes[best], "torch_us": row["torch_two_shot"]["us"],
                           "torch_over_probe": round(row["torch_two_shot"]["us"] / probes[best], 3)}  # fmt: skip
        rows.append(row)
        if world.rank == 0:
            print(json.dumps({"M": M, **row.get("best", {})}), flush=True)
    result = {"device": device_label(world.world_size), "world_size": world.world_size, "torch": torch.__version__,
              "triton": triton.__version__, **provenance(world, "bench/ops/two_shot_probe.py"),
              "method": {"calls_per_graph": CALLS, "replays": REPLAYS, "rounds": ROUNDS},
              "seconds": round(time.time() - started, 1), "rows": rows}  # fmt: skip
    if world.rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out} in {result['seconds']} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
