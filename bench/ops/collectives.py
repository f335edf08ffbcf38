"""The collectives alone, every variant a user could pick, in one run: NCCL's default kernels, NCCL's symmetric kernels
(buffers in a memory pool registered with NCCL as a symmetric window), the copy engine reading peers' symmetric memory,
and torch's symmetric-memory all-reduces; each timed eagerly and in CUDA-graph replay, the kernels each ran read from a
profile (NCCL falls back to its default kernels silently where a buffer is not eligible), and every output checked.

Launch: `torchrun --nproc-per-node=W bench/ops/collectives.py --out collectives_wW.json [--rows 64,128] [--cols 8192]`
Rows are the full tensor's ([rows, cols] bf16): all-gather's output, reduce-scatter's input, all-reduce's tensor.
Each all-reduce call first copies its input into the (in-place) buffer, the same copy for every variant.
It ends with a check that our fused ops still run right in the same process after the window registration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common.cuda import init_cuda_world, spin_up
from common.measure import capture, run_header

CALLS = 8  # calls per captured graph


def timed_graph(fn, replays: int = 20) -> float:
    """µs per call over replays of a graph of CALLS calls, max over ranks."""
    fn()
    graph = capture(fn, CALLS)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * CALLS))
    return max_over_ranks(statistics.median(times))


def timed_eager(fn, calls: int = 50) -> float:
    """µs per call of calls issued back to back (host included), max over ranks."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return max_over_ranks((time.perf_counter() - t0) * 1e6 / calls)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ (NaN counts as infinite)."""
    return ((out.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def kernels_of(fn) -> list[str]:
    """Names of the GPU kernels one call runs (what NCCL really chose)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    return sorted(n[:80] for n in names)


class Window:
    """Tensors in a memory pool of NCCL's allocator, registered with the group's communicator as a symmetric window."""

    def __init__(self, group) -> None:
        device = torch.device("cuda", torch.cuda.current_device())
        self.backend = group._get_backend(device)
        self.pool = torch.cuda.MemPool(self.backend.mem_allocator)
        self.registered = False
        self.how = ""

    def empty(self, *shape, dtype=torch.bfloat16) -> torch.Tensor:
        with torch.cuda.use_mem_pool(self.pool):
            return torch.empty(*shape, dtype=dtype, device="cuda")

    def register(self) -> str:
        torch.cuda.synchronize()
        try:
            self.backend.register_mem_pool(self.pool, symm=True)
            self.how = "register_mem_pool(pool, symm=True)"
        except TypeError as exc:
            self.backend.register_mem_pool(self.pool)
            self.how = f"register_mem_pool(pool) (symm= refused: {exc})"
        self.registered = True
        return self.how


def run_variant(entries: dict, name: str, fn, check) -> None:
    try:
        fn()
        torch.cuda.synchronize()
        err = max_over_ranks(check())
        entry = {"error_rel": err, "graph_us": timed_graph(fn), "eager_us": timed_eager(fn)}
        try:
            entry["kernels"] = kernels_of(fn)
        except Exception as exc:  # the profiler is a witness, not a requirement
            entry["kernels"] = [f"profile failed: {type(exc).__name__}: {exc}"[:200]]
    except Exception as exc:  # a variant this build can't run is a result, not a dead run
        entry = {"failure": f"{type(exc).__name__}: {exc}"[:400]}
        torch.cuda.synchronize()
    entries[name] = entry
    if dist.get_rank() == 0:
        short = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in entry.items() if k != "kernels"}
        print(f"  {name}: {short} {[k for k in entry.get('kernels', []) if 'nccl' in k.lower()][:2]}", flush=True)


def measure_size(rows: int, C: int, W: int, rank: int, group, window_full, window_part, s_full, handle) -> dict:
    """Every variant of the three collectives on a [rows, C] bf16 tensor: checked, then timed."""
    R = rows // W
    gen = torch.Generator(device="cuda").manual_seed(rows * 31 + rank)
    full = torch.randn(rows, C, generator=gen, device="cuda").bfloat16()
    shard = full[rank * R : (rank + 1) * R].contiguous()
    every = [torch.empty_like(shard) for _ in range(W)]
    dist.all_gather(every, shard)
    gathered_ref = torch.cat(every).float()
    parts = [torch.empty_like(full) for _ in range(W)]
    dist.all_gather(parts, full)
    sum_ref = torch.stack([p.float() for p in parts]).sum(0)
    entry = {"rows": rows, "cols": C, "all_gather": {}, "reduce_scatter": {}, "all_reduce": {}}

    # all-gather
    out = torch.empty(rows, C, dtype=torch.bfloat16, device="cuda")
    run_variant(entry["all_gather"], "nccl", lambda out=out, s=shard: dist.all_gather_into_tensor(out, s),
                lambda out=out: rel(out, gathered_ref))  # fmt: skip
    wo, wi = window_full[: rows * C].view(rows, C), window_part[: R * C].view(R, C)
    wi.copy_(shard)
    run_variant(entry["all_gather"], "nccl_symm", lambda: dist.all_gather_into_tensor(wo, wi),
                lambda: rel(wo, gathered_ref))  # fmt: skip
    so = s_full[: rows * C].view(rows, C)
    so[rank * R : (rank + 1) * R].copy_(shard)

    def ce_all_gather() -> None:  # every rank's shard sits in its own slice; copy the peers' slices in
        handle.barrier(channel=0)
        for p in range(W):
            if p != rank:
                peer = handle.get_buffer(p, (rows, C), torch.bfloat16, 0)
                so[p * R : (p + 1) * R].copy_(peer[p * R : (p + 1) * R])
        handle.barrier(channel=0)

    run_variant(entry["all_gather"], "ce", ce_all_gather, lambda: rel(so, gathered_ref))
    # reduce-scatter
    rs_out = torch.empty(R, C, dtype=torch.bfloat16, device="cuda")
    rs_ref = sum_ref[rank * R : (rank + 1) * R]
    run_variant(entry["reduce_scatter"], "nccl", lambda: dist.reduce_scatter_tensor(rs_out, full),
                lambda: rel(rs_out, rs_ref))  # fmt: skip
    wfull = window_full[: rows * C].view(rows, C)

    def rs_symm() -> None:
        dist.reduce_scatter_tensor(wi, wfull)

    wfull.copy_(full)
    run_variant(entry["reduce_scatter"], "nccl_symm", rs_symm, lambda: rel(wi, rs_ref))
    # all-reduce (in place: refill from `full` first, inside the timed call, for every variant alike)
    ar = torch.empty_like(full)

    def ar_nccl() -> None:
        ar.copy_(full)
        dist.all_reduce(ar)

    run_variant(entry["all_reduce"], "nccl", ar_nccl, lambda: rel(ar, sum_ref))

    def ar_symm() -> None:
        wfull.copy_(full)
        dist.all_reduce(wfull)

    run_variant(entry["all_reduce"], "nccl_symm", ar_symm, lambda: rel(wfull, sum_ref))
    for op in ("one_shot_all_reduce", "two_shot_all_reduce_"):
        fn_op = getattr(torch.ops.symm_mem, op, None)
        if fn_op is None:
            entry["all_reduce"][f"torch_{op}"] = {"failure": f"torch.ops.symm_mem.{op} is not in this build"}
            continue
        res = {}

        def torch_ar(fn_op=fn_op, op=op, res=res) -> None:
            so.copy_(full)
            r = fn_op(so, "sum", group.group_name)
            res["out"] = so if op.endswith("_") else r

        run_variant(entry["all_reduce"], f"torch_{op.rstrip('_')}", torch_ar, lambda res=res: rel(res["out"], sum_ref))
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="collectives.json")
    ap.add_argument("--rows", default="16,64,128,256,1024,4096")
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--skip-ours", action="store_true", help="skip the check of our ops after registration")
    args = ap.parse_args()
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    group = dist.group.WORLD
    result = {**run_header(world, "bench/ops/collectives.py"), "world_size": W, "calls_per_graph": CALLS, "sizes": []}
    del result["shapes"]
    try:
        cfg = dist.ProcessGroupNCCL.Options().config
        result["nccl_config_fields"] = [n for n in dir(cfg) if not n.startswith("_")]
    except Exception as exc:
        result["nccl_config_fields"] = f"{type(exc).__name__}: {exc}"
    rows_list = [int(r) for r in args.rows.split(",")]
    C = args.cols
    top = max(rows_list)
    window = Window(group)
    w_full = window.empty(top * C)  # all-gather output, reduce-scatter input, all-reduce tensor
    w_part = window.empty(max(top // W, 1) * C)
    result["window_registration"] = window.register()
    import torch.distributed._symmetric_memory as symm_mem

    s_full = symm_mem.empty(top * C, dtype=torch.bfloat16, device="cuda")
    handle = symm_mem.rendezvous(s_full, group.group_name)
    spin_up(1.0)
    for rows in rows_list:
        if rows % W == 0:
            result["sizes"].append(measure_size(rows, C, W, rank, group, w_full, w_part, s_full, handle))
            if rank == 0:
                Path(args.out).write_text(json.dumps(result, indent=1))
    if not args.skip_ours:  # our fused ops in the same process, after the window registration
        from jointtune import ag_gemm

        checks = {}
        for cfg in ({"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered", "comm_sms": 8},
                    {"mode": "pull", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
                     "num_stages": 3, "SPLIT_K": 1}):  # fmt: skip
            try:
                M, N, K = 128 * W, 512 * W, 1024
                gen = torch.Generator(device="cuda").manual_seed(5)
                all_a = torch.randn(M, K, generator=gen, device="cuda").bfloat16()
                b = torch.randn(K, N // W, device="cuda").bfloat16()
                (a,) = world.empty((M // W, K), torch.bfloat16)
                a.copy_(all_a[rank * (M // W) : (rank + 1) * (M // W)])
                (c,) = ag_gemm([a], [b], world=world, config=cfg)
                checks[cfg["mode"]] = max_over_ranks(rel(c, all_a.float() @ b.float()))
            except Exception as exc:
                checks[cfg["mode"]] = f"{type(exc).__name__}: {exc}"[:300]
        result["our_ops_after_registration"] = checks
        if rank == 0:
            print("our ops after registration:", checks, flush=True)
    if rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
