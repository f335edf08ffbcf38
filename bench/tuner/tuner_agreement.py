"""Issue 34's live checks: the configs several tuning databases picked for the same shapes, re-timed side by side.

Launch (one rank per GPU of the world size the studies tuned; each --db a label and a database):
    torchrun --nproc-per-node=2 bench/tuner/tuner_agreement.py \
        --jobs ag_gemm:2048x5120x8192,flash_decode:4x48x8x65536x128 \
        --db fresh-a=sqlite:///a.db --db fresh-b=sqlite:///b.db --db exhaustive=sqlite:///truth.db --out agree_w2.json

Per shape: each database's stored pick (its best record of this kernel version, shape, dtype, world size and timing
policy, on any hardware id: a W=2 run on GPUs 0,1 of a 4-GPU node keys its hardware as x2), checked once against
the float32 reference, then timed in `--rounds` rounds, each round timing every pick once in a rotated order with
the tuner's own `timing.measure` (max over ranks of the median); a pick's latency is the median over rounds, so a
drift of the machine during the run hits every pick alike. Reported: the picks, their latencies, whether the fresh
tunes agree within `--agree` (2%: "two fresh tunes agree"), and each pick's gap to the exhaustive pick ("within
3% of the exhaustive best").
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import device_label, init_cuda_world

from jointtune.autotune.tuner.timing import measure, percentile
from jointtune.db import RecordKey, open_store
from jointtune.kernels import get_family
from jointtune.search_spaces import canonical_json, get_space


def _max(value: float) -> float:
    t = torch.tensor([value], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _pick(url: str, family, problem, timing: str) -> dict | None:
    """A database's stored best record for the problem (any hardware id), as {config, p50_us, trials, study}."""
    where = RecordKey.any(kernel=family.name, kernel_version=family.version, dtype=problem.dtype,
                          world_size=problem.world_size, timing=timing)  # fmt: skip
    records = open_store(url).list_records(where, limit=1000)
    found = [r for r in records if dict(r.shape) == problem.dims]
    if not found:
        return None
    best = min(found, key=lambda r: r.latency_p50_us)
    return {"config": best.config, "stored_p50_us": best.latency_p50_us, "trials": best.trials,
            "study": best.study_name, "hardware_id": best.hardware_id}  # fmt: skip


def _timed(family, problem, configs: dict[str, dict], world, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """(max error, per-round latencies, median latency) per config key, the configs timed in rotated rounds."""
    inputs = family.make_inputs(problem, world, seed=11)
    reference = family.reference(inputs)
    errors = {key: _max(family.max_error(family.run(inputs, c, world), reference)) for key, c in configs.items()}
    rounds: dict[str, list[float]] = {key: [] for key in configs}
    order = list(configs)
    for r in range(args.rounds):
        for key in order[r % len(order) :] + order[: r % len(order)]:
            config = configs[key]

            def call(config: dict = config) -> object:
                return family.run(inputs, config, world)

            samples = measure(call, world, warmup=3, iters=args.iters, timing=args.timing)
            rounds[key].append(_max(percentile(samples, 50)))
    return errors, rounds, {key: statistics.median(values) for key, values in rounds.items()}


def _shape_entry(kernel: str, shape: str, dbs: dict[str, str], world, args: argparse.Namespace) -> dict:
    family = get_family(kernel)
    problem = get_space(family.space).make_problem(shape, dtype=args.dtype, world_size=world.world_size)
    picks = {label: _pick(url, family, problem, args.timing) for label, url in dbs.items()}
    configs = {canonical_json(p["config"]): p["config"] for p in picks.values() if p is not None}
    errors, rounds, timed = _timed(family, problem, configs, world, args)
    keys = {label: canonical_json(p["config"]) for label, p in picks.items() if p is not None}
    us = {label: timed[key] for label, key in keys.items()}
    entry = {
        "kernel": kernel, "shape": problem.dims, "world_size": world.world_size, "picks": picks, "us": us,
        "errors": {label: errors[key] for label, key in keys.items()},
        "rounds_us": {label: rounds[key] for label, key in keys.items()},
    }  # fmt: skip
    fresh = {label: v for label, v in us.items() if label.startswith("fresh")}
    if len(fresh) >= 2:
        entry["fresh_spread"] = max(fresh.values()) / min(fresh.values()) - 1
        entry["fresh_agree"] = entry["fresh_spread"] <= args.agree
        entry["fresh_same_config"] = len({keys[label] for label in fresh}) == 1
    if "exhaustive" in us:
        entry["gap_to_exhaustive"] = {label: v / us["exhaustive"] - 1 for label, v in us.items()}
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", required=True, help="kernel:shape,... (the studies' shapes)")
    ap.add_argument("--db", action="append", required=True, help="label=URL, once per database")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--timing", default="graph")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--agree", type=float, default=0.02)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    world = init_cuda_world()
    dbs = dict(item.split("=", 1) for item in args.db)
    import triton

    result = {
        "device": device_label(world.world_size),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"torchrun --nproc-per-node={world.world_size} bench/tuner/tuner_agreement.py "
                   + " ".join(sys.argv[1:]),
        "timing": args.timing, "rounds": args.rounds, "iters": args.iters, "shapes": [],
    }  # fmt: skip
    for item in args.jobs.split(","):
        kernel, shape = item.split(":")
        entry = _shape_entry(kernel, shape, dbs, world, args)
        result["shapes"].append(entry)
        if world.rank == 0:
            timed = ", ".join(f"{label} {v:.1f} µs" for label, v in entry["us"].items())
            spread = entry.get("fresh_spread")
            print(f"[{kernel} {shape} w{world.world_size}] {timed}; fresh spread "
                  f"{'-' if spread is None else f'{spread:.2%}'}", flush=True)  # fmt: skip
            Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
