"""Can a kernel that waits (as AG+GEMM's barrier gather waits for the peers' rows) pull the GEMM's weight into L2
meanwhile, so that the cuBLAS GEMM after it reads B from L2 instead of HBM? One GPU, CUDA graphs, bf16, µs per call.

Each call is `wait(T µs)` then `torch.mm(A[M, K], B[K, N])`; the wait is a kernel of `programs` programs that spin on
the global timer (the gather's meeting, simulated). With `prefetch`, the same programs first issue bulk L2 prefetches
(`cp.async.bulk.prefetch.L2`, sm_90) of B's bytes, split among them. A graph holds `CALLS` calls on distinct B copies
(more bytes than L2 holds), so no call finds its B left in L2 by the call before it. Prints one JSON line per case.
Run it on one GPU: `python3 bench/ops/l2_prefetch_probe.py --out probe.json`."""

from __future__ import annotations

import argparse
import datetime
import json
import platform

import torch
import triton
import triton.language as tl

CALLS = 4
CHUNK = 4096  # bytes one bulk prefetch asks for
CHUNK_C = tl.constexpr(CHUNK)


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def wait_kernel(b_ptr, nbytes, wait_ns, PREFETCH: tl.constexpr, LANES: tl.constexpr):
    pid = tl.program_id(0)
    start = _globaltimer()
    if PREFETCH:
        chunks = tl.cdiv(nbytes, CHUNK_C)
        for c0 in range(pid * LANES, chunks, tl.num_programs(0) * LANES):
            c = c0 + tl.arange(0, LANES)
            off = tl.minimum(c, chunks - 1).to(tl.int64) * CHUNK_C
            size = tl.minimum(nbytes - off, CHUNK_C) // 16 * 16
            tl.inline_asm_elementwise(
                "cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
                "=r,l,r",
                [b_ptr + off, size.to(tl.int32)],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
    while _globaltimer() - start < wait_ns:
        pass


def case(m: int, k: int, n: int, wait_us: float, prefetch: bool, programs: int) -> dict:
    dev = torch.device("cuda", 0)
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    copies = max(CALLS, 1 + (2 * torch.cuda.get_device_properties(dev).L2_cache_size) // (k * n * 2))
    bs = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)

    def call(i: int) -> None:
        b = bs[i % copies]
        if wait_us > 0 or prefetch:
            wait_kernel[(programs,)](b, b.numel() * 2, int(wait_us * 1000), PREFETCH=prefetch, LANES=32, num_warps=1)
        torch.mm(a, b, out=c)

    for i in range(copies):
        call(i)
    torch.cuda.synchronize()
    ref = (a.float() @ bs[0].float()).to(torch.bfloat16)
    call(0)
    torch.cuda.synchronize()
    assert torch.allclose(c.float(), ref.float(), rtol=2e-2, atol=2e-1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        for i in range(copies):
            call(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        graph.replay()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / (20 * copies))
    times.sort()
    return {
        "m": m,
        "k": k,
        "n": n,
        "wait_us": wait_us,
        "prefetch": prefetch,
        "programs": programs,
        "b_mib": k * n * 2 / 2**20,
        "copies": copies,
        "us_per_call": times[len(times) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = []
    # (M, K, N per rank): Llama-3-70B-like AG+GEMM shapes at W=4 and W=2 (N per rank, K global)
    shapes = [
        (64, 8192, 2048),
        (128, 8192, 2048),
        (128, 4096, 1536),
        (128, 14336, 1024),
        (64, 8192, 4096),
        (256, 8192, 2048),
    ]
    for m, k, n in shapes:
        for wait_us, prefetch, programs in (
            (0, False, 64),
            (10, False, 64),
            (10, True, 64),
            (10, True, 16),
            (6, True, 64),
            (0, True, 64),
        ):
            try:
                r = case(m, k, n, wait_us, prefetch, programs)
            except Exception as e:  # a case that fails is recorded, the rest go on
                r = {"m": m, "k": k, "n": n, "wait_us": wait_us, "prefetch": prefetch, "error": repr(e)[:400]}
            print(json.dumps(r), flush=True)
            results.append(r)
    with open(args.out, "w") as f:
        json.dump(
            {
                "device": torch.cuda.get_device_name(0),
                "versions": {
                    "torch": torch.__version__,
                    "triton": triton.__version__,
                    "python": platform.python_version(),
                },
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": "python3 bench/ops/l2_prefetch_probe.py --out " + args.out,
                "results": results,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
