"""GEMM + all-reduce on real GPUs: every mode correct, the same bits on every rank, and graph replays that stay right
with eager calls between. What the CPU interpreter can't show: ranks that really run at once, NVLink memory ordering,
the compiled kernel.

Launch on W GPUs: `torchrun --nproc-per-node=W bench/ops/gemm_ar_check.py --out check.json`
(`bench/ops/fused_ops_device.sh archeck`).

Per shape (decode sizes by default) and config (each fused exchange: one-shot and two-shot, the tile GEMM and cuBLAS,
push, pull, LL words and the barrier exchange, several flag granularities and comm programs; and the baseline in every
all-reduce variant the device runs), in each form (the sum; + residual; + residual and RMSNorm):
- an eager call on fresh random data, outputs poisoned with NaN first, against the float32 reference;
- every rank's outputs gathered and compared bit for bit (replicated activations must not drift between ranks);
- a CUDA graph of one call, replayed `--replays` times with fresh data copied into its inputs, an eager call of another
  config between every third replay; every replay's outputs checked against the reference and across ranks.
Writes one JSON (a line per case, a summary); exits 1 if anything was wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common.cuda import device_label, init_cuda_world
from common.measure import provenance

from jointtune import gemm_ar, gemm_ar_rmsnorm
from jointtune.errors import SpaceError
from jointtune.hardware import current_limits
from jointtune.kernels.gemm_ar import reference
from jointtune.search_spaces import get_space

TOL = 2e-2
EPS = 1e-5
FORMS = ("sum", "residual", "norm")


def tiles(M: int) -> dict[str, int]:
    """One row tile over up to 128 rows (the weight read once), 128 x 128 tiles above."""
    if M <= 128:
        bm = max(16, 1 << (max(M, 1) - 1).bit_length())
        return dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=8 if bm >= 128 else 4, num_stages=4)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=1, num_warps=8, num_stages=4)


def configs(M: int, collectives: tuple[str, ...]) -> list[dict[str, Any]]:
    t = tiles(M)
    fused = [
        dict(mode="one_shot", gemm="triton", transport="push", tiles_per_flag=1, comm_sms=0, SPLIT_K=4, **t),
        dict(mode="one_shot", gemm="triton", transport="pull", tiles_per_flag=4, comm_sms=16, SPLIT_K=2, **t),
        dict(mode="two_shot", gemm="triton", transport="push", tiles_per_flag=2, comm_sms=0, SPLIT_K=2, **t),
        dict(mode="two_shot", gemm="triton", transport="pull", tiles_per_flag=1, comm_sms=8, SPLIT_K=1, **t),
        dict(mode="one_shot", gemm="triton", transport="ll", comm_sms=0, SPLIT_K=1, **t),
        dict(mode="one_shot", gemm="triton", transport="ll", comm_sms=16, SPLIT_K=2, **t),
        dict(mode="one_shot", gemm="cublas", transport="ll", comm_sms=64),
        dict(mode="one_shot", gemm="cublas", transport="push", tiles_per_flag=1, comm_sms=64),
        dict(mode="one_shot", gemm="cublas", transport="pull", tiles_per_flag=2, comm_sms=32),
        dict(mode="two_shot", gemm="cublas", transport="push", tiles_per_flag=1, comm_sms=64),
        dict(mode="two_shot", gemm="cublas", transport="pull", tiles_per_flag=4, comm_sms=128),
        dict(mode="two_shot", gemm="triton", transport="ll", comm_sms=0, SPLIT_K=1, **t),
        dict(mode="two_shot", gemm="cublas", transport="ll", comm_sms=64),
        dict(mode="two_shot", gemm="cublas", transport="barrier", comm_sms=64),
        dict(mode="two_shot", gemm="cublas", transport="barrier", comm_sms=8),
        dict(mode="one_shot", gemm="cublas", transport="barrier", comm_sms=32),
    ]
    variants = [c for c in ("nccl", "nccl_symm", "torch_two_shot", "torch_one_shot") if c in collectives]
    return fused + [dict(mode="baseline", collective=c) for c in variants]


class Site:
    """One call site's fixed tensors (what a graph captures): this rank's A and B, the replicated residual and norm
    weight, the outputs; `fresh(seed)` draws every rank's shards from one seed, so each rank builds the reference."""

    def __init__(self, W: int, rank: int, M: int, N: int, K_r: int) -> None:
        self.W, self.rank, dev = W, rank, torch.device("cuda", torch.cuda.current_device())
        self.a = torch.empty(M, K_r, dtype=torch.bfloat16, device=dev)
        self.b = torch.empty(K_r, N, dtype=torch.bfloat16, device=dev)
        self.res = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        self.weight = torch.empty(N, dtype=torch.bfloat16, device=dev)
        self.out = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        self.h = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        self.want: Any = None

    def fresh(self, seed: int, form: str) -> None:
        gen = torch.Generator(device=self.a.device).manual_seed(seed)
        M, K_r = self.a.shape
        N = self.b.shape[1]
        all_a = [torch.randn(M, K_r, generator=gen, device=self.a.device).bfloat16() / K_r**0.25 for _ in range(self.W)]
        all_b = [torch.randn(K_r, N, generator=gen, device=self.a.device).bfloat16() / K_r**0.25 for _ in range(self.W)]
        self.a.copy_(all_a[self.rank])
        self.b.copy_(all_b[self.rank])
        self.res.copy_(torch.randn(M, N, generator=gen, device=self.a.device))
        self.weight.copy_(1 + 0.1 * torch.randn(N, generator=gen, device=self.a.device))
        self.out.fill_(float("nan"))
        self.h.fill_(float("nan"))
        res = None if form == "sum" else self.res
        self.want = reference(all_a, all_b, res, self.weight if form == "norm" else None, EPS)
        if form != "norm":
            self.want = (self.want,)

    def call(self, world: Any, config: dict, form: str) -> None:
        if form == "norm":
            gemm_ar_rmsnorm(self.a, self.b, self.res, self.weight, eps=EPS, world=world, config=config,
                            out=(self.out, self.h))  # fmt: skip
        else:
            gemm_ar(self.a, self.b, world=world, config=config, residual=self.res if form == "residual" else None,
                    out=self.out)  # fmt: skip

    def verdict(self) -> tuple[float, bool]:
        """(largest error against the reference, whether every rank holds the same bits), over every rank."""
        outs = [self.out, self.h][: len(self.want)]
        err = max(((o.float() - w).norm() / w.norm()).nan_to_num(float("inf")).item() for o, w in zip(outs, self.want))
        same = True
        for o in outs:
            every = [torch.empty_like(o) for _ in range(self.W)]
            dist.all_gather(every, o.contiguous())
            same &= all(torch.equal(e.view(torch.int16), every[0].view(torch.int16)) for e in every)
        worst = torch.tensor([err, 0.0 if same else 1.0], dtype=torch.float64, device=self.a.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return worst[0].item(), worst[1].item() == 0.0


def check_case(world: Any, site: Site, other: Site, config: dict, other_config: dict, form: str, replays: int,
               seed: int) -> dict:  # fmt: skip
    site.fresh(seed, form)
    site.call(world, config, form)
    torch.cuda.synchronize()
    err, same = site.verdict()
    entry: dict[str, Any] = {"eager_error": err, "eager_same_bits": same}
    graph = torch.cuda.CUDAGraph()
    site.fresh(seed + 1, form)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        site.call(world, config, form)
    wrong = differ = wrong_eager = 0
    worst = 0.0
    for step in range(replays):
        site.fresh(seed + 2 + step, form)
        graph.replay()
        err, same = site.verdict()
        worst, wrong, differ = max(worst, err), wrong + (err > TOL), differ + (not same)
        if step % 3 == 2:  # an eager call of another config between replays: epochs and halves stay in step
            other.fresh(seed + 1000 + step, "sum")
            other.call(world, other_config, "sum")
            err, same = other.verdict()
            wrong_eager += (err > TOL) or not same
    del graph
    entry.update(replays=replays, wrong_replays=wrong, replays_with_differing_ranks=differ,
                 wrong_eager_between=wrong_eager, worst_replay_error=worst)  # fmt: skip
    eager_ok = entry["eager_error"] <= TOL and entry["eager_same_bits"]
    entry["ok"] = eager_ok and not (wrong or differ or wrong_eager)
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x8192x2048,300x4096x1024",
                    help="MxNxK_r (K per rank), comma-separated; every shape compiles every config anew")  # fmt: skip
    ap.add_argument("--forms", default="sum,norm", help=f"comma-separated, of {', '.join(FORMS)}")
    ap.add_argument("--replays", type=int, default=12)
    ap.add_argument("--transports", default="", help="comma-separated: only fused configs of these (and the baseline)")
    ap.add_argument("--out", default="gemm_ar_check.json")
    args = ap.parse_args()
    world = init_cuda_world()
    W, rank = world.world_size, world.rank
    limits = current_limits()
    space = get_space("gemm_ar")
    results, failed = [], 0
    only = set(filter(None, args.transports.split(",")))
    started = time.time()
    for shape in args.shapes.split(","):
        M, N, K_r = (int(x) for x in shape.split("x"))
        problem = space.make_problem({"M": M, "N": N, "K": K_r * W}, dtype="bf16", world_size=W)
        site, other = Site(W, rank, M, N, K_r), Site(W, rank, M, N, K_r)
        cases = []
        for config in configs(M, limits.collectives):
            if only and config["mode"] != "baseline" and config["transport"] not in only:
                continue
            try:
                space.validate(config, problem, limits)
                cases.append(config)
            except SpaceError as exc:
                results.append({"shape": shape, "config": config, "skipped": str(exc)})
        for i, config in enumerate(cases):
            other_config = cases[(i + 1) % len(cases)]
            for form in args.forms.split(","):
                entry = {"shape": shape, "form": form, "config": config}
                try:
                    entry.update(check_case(world, site, other, config, other_config, form, args.replays, seed=i * 97))
                except Exception as exc:  # a failing case is reported; the ranks stay in step (they fail alike)
                    entry.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
                failed += not entry["ok"]
                results.append(entry)
                if rank == 0:
                    print(json.dumps(entry), flush=True)
    summary = {"device": device_label(W), "world_size": W, "cases": sum("ok" in r for r in results), "failed": failed,
               "skipped": sum("skipped" in r for r in results), "seconds": round(time.time() - started, 1),
               "collectives": list(limits.collectives),
               **provenance(world, "bench/ops/gemm_ar_check.py")}  # fmt: skip
    if rank == 0:
        Path(args.out).write_text(json.dumps({"summary": summary, "results": results}, indent=1))
        print("summary:", json.dumps(summary), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
