"""Where GEMM + all-reduce's time goes at decode sizes, in one short run: the pieces timed alone and together, under
CUDA-graph replay, so a change to the exchange shows up as a number next to what it competes with.

Launch on W GPUs (one process each):

    torchrun --nproc-per-node=W bench/ops/gemm_ar_anatomy.py --out anatomy.json [--tree OTHER_CHECKOUT]

`--tree` runs another checkout's jointtune (`common.checkout`): the same command on the commit before a change gives
the "before" numbers on the same machine.

Per M (default 8, 64, 128), N=8192 and K per rank 2048 (K global = W x 2048), each the max over ranks of the best
of three timings of a graph of 4 calls replayed 20 times (`common.measure.graph_ms`):
- `cublas_alone`: this rank's partial, torch.mm;
- `allreduce_alone:<variant>`: each all-reduce variant the device runs, on a ready [M, N] partial;
- `user:<variant>`: the user's own unfused code with that all-reduce (`ops.user_paths.MmAllReduceNorm`: cuBLAS into
  the all-reduce's buffer, the sum in place, no copy into an output);
- `baseline:<variant>`: `gemm_ar` in its baseline mode (cuBLAS, then that all-reduce, then a copy into the output);
- `ours:<name>`: `gemm_ar` in fused configs: cuBLAS then our exchange launch (one-shot / two-shot, push / pull, a few
  comm program counts; LL words; the barrier exchange) and the one-launch tile-GEMM form (split-K 4, as the space's
  seeds, and none; pushed and as LL words, one-shot and two-shot); with
  `exchange_us` = the cuBLAS form's time minus `cublas_alone`, the exchange launch's share (it is not reachable alone
  through the public API).
Every `gemm_ar` config is checked first: its output against the float32 reference and the same bits on every rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common import checkout  # first: it picks the checkout whose jointtune is run

# isort: split

import torch
import torch.distributed as dist
from common.cuda import device_label, init_cuda_world, spin_up
from common.measure import best_graph_us, max_over_ranks, provenance

from jointtune import gemm_ar
from jointtune.errors import SpaceError
from jointtune.hardware import current_limits
from jointtune.kernels.gemm_ar import reference
from jointtune.search_spaces import get_space
from ops.user_paths import MmAllReduceNorm

N, K_R = 8192, 2048
CALLS, REPLAYS, ROUNDS = 4, 20, 3
TOL = 2e-2
VARIANTS = ("nccl", "nccl_symm", "torch_two_shot", "torch_one_shot")


def fused_configs(M: int) -> dict[str, dict[str, Any]]:
    """Our fused configs by name: cuBLAS then the exchange launch in each exchange, and the one-launch tile GEMM."""
    bm = max(16, 1 << (M - 1).bit_length())
    tile = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, SPLIT_K=4, num_warps=8 if bm >= 128 else 4,
                num_stages=4)  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for comm in (32, 64, 128):
        out[f"one_shot_cublas_push_c{comm}"] = dict(mode="one_shot", gemm="cublas", transport="push",
                                                    tiles_per_flag=1, comm_sms=comm)  # fmt: skip
    out["one_shot_cublas_pull_c64"] = dict(mode="one_shot", gemm="cublas", transport="pull", tiles_per_flag=1,
                                           comm_sms=64)  # fmt: skip
    out["one_shot_cublas_ll_c64"] = dict(mode="one_shot", gemm="cublas", transport="ll", comm_sms=64)
    for comm in (64, 128):
        out[f"two_shot_cublas_push_c{comm}"] = dict(mode="two_shot", gemm="cublas", transport="push",
                                                    tiles_per_flag=1, comm_sms=comm)  # fmt: skip
    out["two_shot_cublas_pull_c64"] = dict(mode="two_shot", gemm="cublas", transport="pull", tiles_per_flag=1,
                                           comm_sms=64)  # fmt: skip
    out["two_shot_cublas_ll_c64"] = dict(mode="two_shot", gemm="cublas", transport="ll", comm_sms=64)
    for comm in (16, 32, 64, 128):
        out[f"two_shot_cublas_barrier_c{comm}"] = dict(mode="two_shot", gemm="cublas", transport="barrier",
                                                       comm_sms=comm)  # fmt: skip
    out["one_shot_cublas_barrier_c64"] = dict(mode="one_shot", gemm="cublas", transport="barrier", comm_sms=64)
    out["one_shot_triton_push_split4"] = dict(mode="one_shot", gemm="triton", transport="push", tiles_per_flag=1,
                                              comm_sms=0, **tile)  # fmt: skip
    # no split-K: 128 column tiles of 64, each program streams its whole K_r (no workspace merge)
    out["one_shot_triton_push_split1"] = dict(out["one_shot_triton_push_split4"], SPLIT_K=1)
    one_split1 = {k: v for k, v in out["one_shot_triton_push_split1"].items() if k != "tiles_per_flag"}
    out["one_shot_triton_ll_split1"] = dict(one_split1, transport="ll")
    out["two_shot_triton_push_split1"] = dict(out["one_shot_triton_push_split1"], mode="two_shot")
    out["two_shot_triton_ll_split1"] = dict(one_split1, mode="two_shot", transport="ll")
    return out


def graph_us(world: Any, fn: Any) -> float:
    """GPU time per call under graph replay, best of ROUNDS, max over ranks (µs)."""
    return best_graph_us(world, fn, calls=CALLS, replays=REPLAYS, rounds=ROUNDS)


class Shape:
    """One M's tensors on this rank, drawn from one seed on every rank, and the float32 reference of the sum."""

    def __init__(self, world: Any, M: int) -> None:
        W, rank, dev = world.world_size, world.rank, torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device=dev).manual_seed(1234 + M)
        all_a = [torch.randn(M, K_R, generator=gen, device=dev).bfloat16() / K_R**0.25 for _ in range(W)]
        all_b = [torch.randn(K_R, N, generator=gen, device=dev).bfloat16() / K_R**0.25 for _ in range(W)]
        self.a, self.b = all_a[rank].contiguous(), all_b[rank].contiguous()
        self.want = reference(all_a, all_b, None, None, 1e-5)
        self.part = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        self.out = torch.empty(M, N, dtype=torch.bfloat16, device=dev)
        self.W = W

    def verdict(self) -> tuple[float, bool]:
        """(error against the reference, the same bits on every rank), over every rank."""
        err = ((self.out.float() - self.want).norm() / self.want.norm()).nan_to_num(float("inf")).item()
        every = [torch.empty_like(self.out) for _ in range(self.W)]
        dist.all_gather(every, self.out)
        same = all(torch.equal(e.view(torch.int16), every[0].view(torch.int16)) for e in every)
        err, differ = max_over_ranks([err, 0.0 if same else 1.0])
        return err, differ == 0.0


def anatomy(world: Any, M: int, collectives: tuple[str, ...], space: Any, limits: Any) -> dict[str, Any]:
    s = Shape(world, M)
    problem = space.make_problem({"M": M, "N": N, "K": K_R * world.world_size}, dtype="bf16",
                                 world_size=world.world_size)  # fmt: skip
    row: dict[str, Any] = {"M": M, "N": N, "K_r": K_R, "K": K_R * world.world_size}
    row["cublas_alone"] = graph_us(world, lambda: torch.mm(s.a, s.b, out=s.part))
    s.part.copy_(s.a @ s.b)
    for v in (v for v in VARIANTS if v in collectives):
        full = world.collective_empty((M, N), torch.bfloat16, v)
        full[0].copy_(s.part)
        row[f"allreduce_alone:{v}"] = graph_us(world, lambda full=full, v=v: world.all_reduce(full, collective=v))
        # the user's own unfused code: cuBLAS into the all-reduce's buffer, the sum in place, no copy out; checked
        # against the reference first, as every config is
        try:  # an anchor that fails is recorded, and the run goes on (the ranks fail alike)
            user = MmAllReduceNorm(world, [s.a], [s.b], v)
            s.out.copy_(user()[0])
            err, same = s.verdict()
            row[f"user:{v}"] = {"error": err, "same_bits": same,
                                **({"us": graph_us(world, user)} if err <= TOL else {})}  # fmt: skip
        except Exception as exc:
            torch.cuda.synchronize()
            row[f"user:{v}"] = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
    configs = {f"baseline:{v}": dict(mode="baseline", collective=v) for v in VARIANTS if v in collectives}
    configs.update({f"ours:{k}": c for k, c in fused_configs(M).items()})
    for name, config in configs.items():
        try:
            space.validate(config, problem, limits)
        except SpaceError as exc:
            row[name] = {"skipped": str(exc)[:200]}
            continue
        s.out.fill_(float("nan"))
        gemm_ar(s.a, s.b, world=world, config=config, out=s.out)
        torch.cuda.synchronize()
        err, same = s.verdict()
        entry: dict[str, Any] = {"config": config, "error": err, "same_bits": same}
        if err <= TOL and same:
            entry["us"] = graph_us(world, lambda config=config: gemm_ar(s.a, s.b, world=world, config=config,
                                                                        out=s.out))  # fmt: skip
            if name.startswith("ours:") and config["gemm"] == "cublas":
                entry["exchange_us"] = round(entry["us"] - row["cublas_alone"], 2)
        row[name] = entry
    timed = {k: v["us"] for k, v in row.items() if isinstance(v, dict) and "us" in v}
    base = {k: t for k, t in timed.items() if k.startswith("baseline:")}
    ours = {k: t for k, t in timed.items() if k.startswith("ours:")}
    users = {k: t for k, t in timed.items() if k.startswith("user:")}
    if base and ours:
        b, o = min(base, key=base.__getitem__), min(ours, key=ours.__getitem__)
        row["best"] = {"baseline": b, "baseline_us": base[b], "ours": o, "ours_us": ours[o],
                       "speedup": round(base[b] / ours[o], 3)}  # fmt: skip
        if users:
            u = min(users, key=users.__getitem__)
            row["best"].update(user=u, user_us=users[u], speedup_vs_user=round(users[u] / ours[o], 3))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8,64,128", help="comma-separated M")
    ap.add_argument("--out", default="gemm_ar_anatomy.json")
    checkout.add_tree_argument(ap)
    args = ap.parse_args()
    world = init_cuda_world()
    limits = current_limits()
    space = get_space("gemm_ar")
    started = time.time()
    spin_up(2.0)
    rows = []
    for M in (int(m) for m in args.rows.split(",")):
        row = anatomy(world, M, tuple(limits.collectives), space, limits)
        rows.append(row)
        if world.rank == 0:
            print(json.dumps(row.get("best", {"M": M})), flush=True)
    result = {"device": device_label(world.world_size), "world_size": world.world_size, "tree": str(checkout.TREE),
              "torch": torch.__version__, **provenance(world, "bench/ops/gemm_ar_anatomy.py"),
              "method": {"calls_per_graph": CALLS, "replays": REPLAYS, "rounds": ROUNDS},
              "seconds": round(time.time() - started, 1), "rows": rows}  # fmt: skip
    if world.rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out} in {result['seconds']} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
