"""After a sweep under several timing policies: each policy's tuned config against the baseline, and every
tuned config timed under every policy, so the table shows where the policies disagree and what it costs.

Launch (after `jointtune sweep bench/tuner/tuner_policies.yaml --db URL`):
    torchrun --nproc-per-node=2 bench/tuner/tuner_policies.py --db URL --out tuner_policies.json

Per shape: the records the sweep stored for `eager` and `graph`, and the baseline (NCCL + cuBLAS), each
checked against the float32 reference, then timed with the tuner's own `timing.measure` under eager, graph
and gpu (identical counts on both ranks, max over ranks). "cost of the other policy's pick" is how much
slower a policy's regime runs with the config the other policy chose.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import device_label, init_cuda_world

from jointtune.autotune.tuner.timing import measure, percentile
from jointtune.autotune.workers.sweeps.sweepfile import load_sweep_file
from jointtune.db import RecordKey, open_store
from jointtune.hardware import detect
from jointtune.kernels import get_family

POLICIES = ("eager", "graph", "gpu")


def _max(value: float) -> float:
    t = torch.tensor([value], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--sweep", default=str(Path(__file__).with_name("tuner_policies.yaml")))
    ap.add_argument("--out", default="tuner_policies.json")
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    world = init_cuda_world()
    family = get_family("ag_gemm")
    store = open_store(args.db)
    hardware_id = detect().hardware_id
    import triton

    result = {
        "device": device_label(world.world_size),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "torchrun --nproc-per-node=2 bench/tuner/tuner_policies.py " + " ".join(sys.argv[1:]),
        "hardware_id": hardware_id, "shapes": [],
    }  # fmt: skip
    seen = set()
    for job in load_sweep_file(args.sweep).jobs("gpu"):
        if job.shape in seen:
            continue
        seen.add(job.shape)
        problem = job.problem
        key = RecordKey(kernel=family.name, kernel_version=family.version, shape=problem.dims, dtype=problem.dtype,
                        world_size=problem.world_size, hardware_id=hardware_id)  # fmt: skip
        records = {t: store.best(key.replace(timing=t)) for t in ("eager", "graph")}
        configs = {f"{t}-tuned": r.config for t, r in records.items() if r is not None}
        configs["baseline"] = {"mode": "baseline"}
        inputs = family.make_inputs(problem, world, seed=11)
        reference = family.reference(inputs)
        entry = {"shape": problem.dims, "configs": configs, "stored_us": {}, "measured_us": {}, "errors": {}}
        for t, r in records.items():
            if r is not None:
                entry["stored_us"][t] = {"p50": r.latency_p50_us, "baseline": r.baseline_us, "trials": r.trials}
        for name, cfg in configs.items():
            err = _max(family.max_error(family.run(inputs, cfg, world), reference))
            entry["errors"][name] = err
            entry["measured_us"][name] = {}
            for policy in POLICIES:
                run = lambda cfg=cfg, inputs=inputs: family.run(inputs, cfg, world)
                samples = measure(run, world, warmup=3, iters=args.iters, timing=policy)
                entry["measured_us"][name][policy] = _max(percentile(samples, 50))
        m = entry["measured_us"]
        summary = {}
        for policy in ("eager", "graph"):
            own = m.get(f"{policy}-tuned", {}).get(policy)
            other = m.get(f"{'graph' if policy == 'eager' else 'eager'}-tuned", {}).get(policy)
            base = m["baseline"][policy]
            summary[policy] = {
                "tuned_us": own,
                "baseline_us": base,
                "speedup_vs_baseline": (base / own) if own else None,
                "other_policys_pick_us": other,
                "cost_of_other_pick": (other / own) if own and other else None,
                "same_config": configs.get("eager-tuned") == configs.get("graph-tuned"),
            }
        entry["summary"] = summary
        result["shapes"].append(entry)
        if world.rank == 0:
            cols = ("tuned_us", "baseline_us", "speedup_vs_baseline", "cost_of_other_pick")
            line = {p: [round(s[k] or 0, 3) for k in cols] for p, s in summary.items()}
            worst = max(entry["errors"].values())
            print(f"[{problem.dims}] same={summary['eager']['same_config']} {line} err {worst:.2e}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
