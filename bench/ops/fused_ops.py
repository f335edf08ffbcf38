"""Every family at any world size against the best unfused path, in one run that no anchor can end.

`python bench/ops/fused_ops.py --ranks 4 --family ag_gemm --shapes 64x8192x8192,128x6144x4096 --out r.json`
starts the rank group itself (torchrun) and restarts it where it stopped if an item hangs or crashes (`harness`).

Per shape, each an item on the record before the next starts:
- every mode of the family's space at `--per-mode` candidates drawn from the space (its seeds and default of the mode,
  then seeded random valid configs: a short random search per mode, the same on every rank);
- the baseline in every collective variant the device runs (NCCL default, NCCL symmetric kernels, NCCL copy engine);
  where a variant reads its operands from an NCCL window, the caller's input is placed there first, as our fused
  modes get theirs in symmetric memory (no side pays a copy the other is spared; gemm_rs's symmetric reduce-scatter
  still copies its [M/W, N] result out, and gemm_ar's its [M, N] sum, about a microsecond at decode sizes);
- the anchors: torch's fused op (ag_gemm, gemm_rs), the compute alone, each collective variant alone (for gemm_ar
  torch's symmetric-memory one-shot and two-shot all-reduces too), and the ideal bound max(compute alone, best
  collective alone); for flash_decode the user's own path (`user_paths`: SDPA over the rank's KV slice, one
  all-gather of output and LSE per variant, a torch combine), which competes with the baseline variants as the best
  unfused path, and SDPA alone as the compute; for gemm_ar likewise the user's own path per variant (cuBLAS into the
  all-reduce's buffer, the all-reduce in place, the residual add and torch's `F.rms_norm` for the RMSNorm form: no
  copy into an op's outputs, which our baseline mode makes).
Every candidate is checked against the float32 reference eagerly and after graph replays with fresh inputs copied
into the captured tensors, then timed three ways (max over ranks, medians): GPU time behind a hold and a device
barrier (`common.cuda.Bench`), eager wall time of back-to-back calls, and CUDA-graph replays (with `--cold`, a
fourth: the graph with a read of twice L2 before each call, that read's own time taken off, `graph_cold_ms`). A
graph-replay stress run of the best config per mode (mixed shapes, fresh data before every replay, eager calls
between) ends each run.
Shapes: MxNxK for the GEMM families, BxHxH_KVxSxD for flash_decode (any GQA group).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages
from common import harness

TOL = 2e-2
REGIMES = ("graph_ms", "graph_cold_ms", "eager_ms", "median_ms")  # what summarize() ranks by, each on its own
UNFUSED_ANCHOR = "unfused_sdpa:"  # an anchor that is a user's whole unfused path: it competes as the best unfused
UNFUSED_USER = "unfused_user:"  # the same for GEMM + all-reduce (ops/user_paths.py's MmAllReduceNorm)
EPS = 1e-6  # the RMSNorm epsilon GEMM + all-reduce's inputs carry (the family's reference uses it)
CALLS = 4  # calls per captured graph


def _arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True,
                    choices=["ag_gemm", "gemm_rs", "flash_decode", "gemm_ar", "gemm_ar_rmsnorm"])  # fmt: skip
    ap.add_argument("--shapes", required=True, help="comma-separated; MxNxK or BxHxH_KVxSxD")
    ap.add_argument("--ranks", type=int, default=2, help="ranks (one per GPU); torchrun runs them")
    ap.add_argument("--per-mode", type=int, default=4, help="candidates per mode from the space")
    ap.add_argument("--modes", default="", help="comma-separated modes to time (default: every mode)")
    ap.add_argument("--configs", default="", help="a JSON list of configs timed too, each at every shape that takes "
                    "it and whose mode is timed (a knob sweep the space's seeds don't reach)")  # fmt: skip
    ap.add_argument("--stress", type=int, default=300, help="graph replays in the closing stress run (0: none)")
    ap.add_argument("--cold", action="store_true", help="also time every call in graph replay with its weight cold "
                    "(graph_cold_ms: a read of twice L2 before each call, its own time taken off), as a model's "
                    "layer reads it; a graph's back-to-back calls keep a 32 MB weight partly in L2")  # fmt: skip
    ap.add_argument("--item-timeout", type=float, default=150.0, help="seconds before an item counts as hung")
    ap.add_argument("--port", type=int, default=29500, help="torchrun's master port (two runs on one node: differ)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    return ap


# ----------------------------------------------------------------------------------------------- rank side


def _max(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _tensors(inputs) -> dict[str, list]:
    """The per-rank tensor lists of a family's inputs (what fresh data is copied into)."""
    import torch

    return {
        f.name: getattr(inputs, f.name)
        for f in dataclasses.fields(inputs)
        if isinstance(getattr(inputs, f.name), list) and getattr(inputs, f.name)
        and isinstance(getattr(inputs, f.name)[0], torch.Tensor)
    }  # fmt: skip


class Rig:
    """One shape's inputs on this rank: a live set the candidates run on, two fresh sets copied in for replay checks,
    and each set's float32 reference."""

    def __init__(self, fam, problem, world) -> None:
        self.fam, self.problem, self.world = fam, problem, world
        self.sets = [fam.make_inputs(problem, world, seed=s) for s in (11, 12, 13)]
        self.refs = [fam.reference(x) for x in self.sets]
        self.live = fam.make_inputs(problem, world, seed=11)  # set 0's data; sets are only ever copied from
        self.current = 0
        self.placed: dict[str, list] = {}  # collective -> A placed where that variant reads it (ag_gemm)
        self.flush = None  # `l2_flush()` with --cold: measure() adds graph_cold_ms

    def load(self, k: int) -> None:
        """Copy set k into the live tensors (and any placed copies): on the stream, no host sync."""
        src = _tensors(self.sets[k])
        for name, dst in _tensors(self.live).items():
            for d, s in zip(dst, src[name]):
                d.copy_(s)
        for placed in self.placed.values():
            for d, s in zip(placed, self.live.a):
                d.copy_(s)
        self.current = k

    def error(self, outs) -> float:
        return self.fam.max_error(outs, self.refs[self.current])

    def call(self, config: dict):
        """The call of `config` on the live inputs; a baseline variant that reads A from an NCCL window gets A there."""
        inputs = self.live
        collective = config.get("collective")
        if self.fam.name == "ag_gemm" and config.get("mode") == "baseline" and collective not in (None, "nccl"):
            if collective not in self.placed:
                self.placed[collective] = self.world.collective_empty(tuple(self.live.a[0].shape), self.live.a[0].dtype,
                                                                      collective)  # fmt: skip
                for d, s in zip(self.placed[collective], self.live.a):
                    d.copy_(s)
            inputs = dataclasses.replace(self.live, a=self.placed[collective])
        return lambda: self.fam.run(inputs, config, self.world)


def l2_flush():
    """A call that reads twice L2's size (a sum into a scalar: no dirty lines of its own), so whatever runs after it
    finds nothing of its operands in L2."""
    import torch

    size = 2 * torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    buf = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    sink = torch.empty((), dtype=torch.float32, device="cuda")

    def flush() -> None:
        torch.sum(buf, dim=0, out=sink)

    flush()  # its kernel loaded before any capture
    torch.cuda.synchronize()
    return flush


def cold_graph_ms(fn, flush, world) -> float:
    """ms per call with its operands cold: a graph of CALLS calls, each after `flush`, less a graph of the flushes
    alone (the two timed in turn, three times, the best of each; max over ranks)."""
    both, _ = _graph(lambda: (flush(), fn())[1], CALLS)
    alone, _ = _graph(flush, CALLS)
    from common.measure import graph_ms

    t_both = t_alone = float("inf")
    for _ in range(3):
        t_both = min(t_both, graph_ms(both, world, 20, CALLS))
        t_alone = min(t_alone, graph_ms(alone, world, 20, CALLS))
    del both, alone
    return _max(t_both - t_alone)


def _graph(fn, calls: int):
    import torch

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = None
    with torch.cuda.graph(graph):
        for _ in range(calls):
            outs = fn()
    torch.cuda.synchronize()
    return graph, outs


def measure(rig: Rig, fn, bench, *, check: bool = True, graphable: bool = True) -> dict:
    """Checked eagerly and under replay with fresh inputs (when `check`), then GPU, eager and graph times (ms)."""
    import torch
    from common.measure import eager_ms, graph_ms

    rig.load(0)
    out = fn()
    torch.cuda.synchronize()
    entry: dict = {}
    if check:
        entry["eager_error"] = _max(rig.error(out))
    entry.update(bench.time(fn))
    entry["eager_ms"] = _max(statistics.median(eager_ms(fn, rig.world, 30) for _ in range(3)))
    if graphable:
        if check:
            graph, outs = _graph(fn, 1)
            errors = []
            for k in (1, 2, 0):
                rig.load(k)
                graph.replay()
                errors.append(rig.error(outs))
            entry["graph_error"] = _max(max(errors))
            del graph
        graph, _ = _graph(fn, CALLS)
        entry["graph_ms"] = _max(min(graph_ms(graph, rig.world, 20, CALLS) for _ in range(3)))
        del graph
        if rig.flush is not None:
            entry["graph_cold_ms"] = cold_graph_ms(fn, rig.flush, rig.world)
    rig.load(0)
    return entry


def anchors(rig: Rig, bench, items, tag: str, limits) -> None:
    """torch's fused op (AG+GEMM, GEMM+RS) or the user's whole unfused path (Flash-Decode's SDPA path, GEMM +
    all-reduce's cuBLAS + all-reduce [+ add + F.rms_norm]: each competes as the best unfused), the compute alone, each
    collective variant alone."""
    import torch
    import torch.distributed as dist

    fam, world, x = rig.fam, rig.world, rig.live
    group = dist.group.WORLD.group_name
    variants = [c for c in ("nccl", "nccl_symm", "nccl_ce") if c in limits.collectives]
    if fam.name == "ag_gemm":
        (a,), (b,) = x.a, x.b
        gathered = torch.cat([t.to(a.dtype) for t in x.all_a]).contiguous()
        c = torch.empty(gathered.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        items.run(f"{tag}|anchor:compute_alone", lambda: measure(rig, lambda: torch.mm(gathered, b, out=c), bench,
                                                                 check=False))  # fmt: skip

        def torch_fused():
            _, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group)
            return [out]

        items.run(f"{tag}|anchor:torch_fused", lambda: measure(rig, torch_fused, bench))
        for v in variants:
            if v == "nccl_ce" and fam.name != "ag_gemm":
                continue

            def alone(v=v):
                shard = world.collective_empty(tuple(a.shape), a.dtype, v)
                shard[0].copy_(a)
                full = world.collective_empty(tuple(gathered.shape), a.dtype, v)
                return measure(rig, lambda: world.all_gather(shard, out=full, collective=v), bench, check=False)

            items.run(f"{tag}|anchor:collective_alone:{v}", alone)
    elif fam.name == "gemm_rs":
        (a,), (b,) = x.a, x.b
        part = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        items.run(f"{tag}|anchor:compute_alone", lambda: measure(rig, lambda: torch.mm(a, b, out=part), bench,
                                                                 check=False))  # fmt: skip

        def torch_fused():
            return [torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group)]

        items.run(f"{tag}|anchor:torch_fused", lambda: measure(rig, torch_fused, bench))
        for v in (v for v in variants if v != "nccl_ce"):

            def alone(v=v):
                full = world.collective_empty(tuple(part.shape), a.dtype, v)
                full[0].copy_(part)
                rows = world.collective_empty((part.shape[0] // world.world_size, part.shape[1]), a.dtype, v)
                return measure(rig, lambda: world.reduce_scatter(full, rows, collective=v), bench, check=False)

            items.run(f"{tag}|anchor:collective_alone:{v}", alone)
    elif fam.name == "flash_decode":
        from ops.user_paths import SdpaGatherCombine, sdpa_partial

        scale = x.q[0].shape[-1] ** -0.5
        (q,), (k,), (v_,) = x.q, x.k, x.v
        items.run(f"{tag}|anchor:compute_alone", lambda: measure(rig, lambda: sdpa_partial(q, k, v_, scale), bench,
                                                                 check=False))  # fmt: skip
        for v in variants:
            items.run(
                f"{tag}|anchor:{UNFUSED_ANCHOR}{v}",
                lambda v=v: measure(rig, SdpaGatherCombine(world, x.q, x.k, x.v, scale, v), bench),
            )

            def alone(v=v):
                path = SdpaGatherCombine(world, x.q, x.k, x.v, scale, v)
                return measure(rig, lambda: world.all_gather(path.send, out=path.every, collective=v), bench,
                               check=False)  # fmt: skip

            items.run(f"{tag}|anchor:collective_alone:{v}", alone)
    elif fam.name in ("gemm_ar", "gemm_ar_rmsnorm"):
        from ops.user_paths import MmAllReduceNorm

        (a,), (b,) = x.a, x.b
        part = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        items.run(f"{tag}|anchor:compute_alone", lambda: measure(rig, lambda: torch.mm(a, b, out=part), bench,
                                                                 check=False))  # fmt: skip
        for v in (v for v in ("nccl", "nccl_symm", "torch_two_shot", "torch_one_shot") if v in limits.collectives):

            def alone(v=v):
                full = world.collective_empty(tuple(part.shape), a.dtype, v)
                full[0].copy_(part)
                return measure(rig, lambda: world.all_reduce(full, collective=v), bench, check=False)

            items.run(f"{tag}|anchor:collective_alone:{v}", alone)
            items.run(
                f"{tag}|anchor:{UNFUSED_USER}{v}",
                lambda v=v: measure(rig, MmAllReduceNorm(world, x.a, x.b, v, x.residual, x.weight, EPS), bench),
            )


def stress(fam, space, world, items, results: list[dict], replays: int, limits) -> None:
    """Graphs of the best config per mode at each measured shape, replayed in a random order (the same on every rank)
    with fresh inputs before each replay and an eager call of the same config every 4th step; every output checked."""
    import torch

    best: dict[tuple, tuple] = {}
    for r in results:
        if "config" not in r or r.get("graph_error", 1) > TOL or r.get("eager_error", 1) > TOL:
            continue
        key = (r["shape"], r["config"]["mode"])
        if key not in best or r["graph_ms"] < best[key][1]:
            best[key] = (r["config"], r["graph_ms"])
    cases = sorted(best.items())[:24]
    if not cases:
        return

    def run() -> dict:
        rigs, graphs = [], []
        for (shape, _), (cfg, _) in cases:
            problem = space.make_problem(shape, dtype="bf16", world_size=world.world_size)
            rig = Rig(fam, problem, world)
            fn = rig.call(cfg)
            fn()
            graph, outs = _graph(fn, 1)
            rigs.append(rig)
            graphs.append((graph, outs, fn))
        order = torch.randint(len(cases), (replays,), generator=torch.Generator().manual_seed(7)).tolist()
        wrong = wrong_eager = 0
        worst = 0.0
        for step, k in enumerate(order):
            rig, (graph, outs, fn) = rigs[k], graphs[k]
            rig.load(1 + step % 2)
            graph.replay()
            err = rig.error(outs)
            worst, wrong = max(worst, err), wrong + (err > TOL)
            if step % 4 == 3:
                rig.load(2 - step % 2)
                err = rig.error(fn())
                worst, wrong_eager = max(worst, err), wrong_eager + (err > TOL)
        torch.cuda.synchronize()
        return {"stress": {"replays": replays, "eager_calls": replays // 4, "wrong_replays": int(_max(wrong)),
                           "wrong_eager": int(_max(wrong_eager)), "worst_error": _max(worst),
                           "cases": [{"shape": s, "config": c} for (s, _), (c, _) in cases]}}  # fmt: skip

    items.run("stress", run, timeout_s=600)


def rank_side(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import triton
    from common.cuda import Bench, device_label, init_cuda_world, spin_up

    from jointtune.hardware import current_limits
    from jointtune.kernels import get_family
    from jointtune.search_spaces import get_space

    world = init_cuda_world()
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(dist.group.WORLD.group_name)
    except Exception:
        pass
    fam = get_family(args.family)
    space = get_space(fam.space)
    limits = current_limits()
    items = harness.Items(Path(args.out + ".partial.jsonl"), world.rank, args.item_timeout)
    bench = Bench(15, 5, world)
    items.run("header", lambda: {
        "device": device_label(world.world_size), "world_size": world.world_size, "family": fam.name,
        "kernel_version": fam.version, "space_version": space.version, "collectives": list(limits.collectives),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": {"calls_per_graph": CALLS, "gpu_iters": 15, "eager_calls": 30, "graph_replays": 20,
                   "per_mode": args.per_mode, "tolerance": TOL, "cold": args.cold},
    })  # fmt: skip
    spin_up(2.0)
    modes = [m for m in space.modes if not args.modes or m in args.modes.split(",")]
    given_configs = _given_configs(args.configs)
    flush = l2_flush() if args.cold else None
    measured: list[dict] = []
    for shape in args.shapes.split(","):
        problem = space.make_problem(shape, dtype="bf16", world_size=world.world_size)
        rig = Rig(fam, problem, world)
        rig.flush = flush
        tag = shape
        anchors(rig, bench, items, tag, limits)
        for mode in modes:
            drawn = harness.space_candidates(space, problem, limits, mode, args.per_mode, seed=1)
            extra = []
            for c in (c for c in given_configs if c["mode"] == mode):
                broken = space.violations(c, problem, limits)
                if not broken:
                    extra.append(space.validate(c, problem, limits))
                elif world.rank == 0:
                    print(f"  {shape}: --configs {json.dumps(c)} skipped: {broken[0]}", flush=True)
            for cfg in drawn + [c for c in extra if c not in drawn]:
                item_id = f"{tag}|{json.dumps(cfg, sort_keys=True)}"
                if world.rank == 0:
                    print(f"  {item_id}", flush=True)
                res = items.run(item_id, lambda cfg=cfg, rig=rig: measure(rig, rig.call(cfg), bench))
                res = res if res is not None else items.done.get(item_id, {})
                measured.append({"shape": shape, "config": cfg, **res})
        del rig
        torch.cuda.empty_cache()
    if args.stress:
        stress(fam, space, world, items, measured, args.stress, limits)
    dist.barrier()
    dist.destroy_process_group()


# -------------------------------------------------------------------------------------------------- driver


def summarize(data: dict) -> dict:
    """Per shape: the best candidate per mode and regime, the best unfused path (fastest baseline variant), torch's
    fused op, the ideal bound, and our best against the best unfused path."""
    shapes: dict[str, dict] = {}
    for it in data["items"]:
        if "|" not in it["id"]:
            continue
        shape, what = it["id"].split("|", 1)
        entry = shapes.setdefault(shape, {"modes": {}, "anchors": {}})
        if what.startswith("anchor:"):
            entry["anchors"][what.removeprefix("anchor:")] = {k: v for k, v in it.items() if k != "id"}
            continue
        cfg = json.loads(what)
        ok = "error" not in it and it.get("eager_error", 1) <= TOL and it.get("graph_error", 1) <= TOL
        for regime in REGIMES:
            if ok and regime in it:
                name = cfg["mode"] if cfg["mode"] != "baseline" else f"baseline:{cfg.get('collective', 'nccl')}"
                best = entry["modes"].setdefault(regime, {})
                if name not in best or it[regime] < best[name]["ms"]:
                    best[name] = {"ms": it[regime], "config": cfg}
    for entry in shapes.values():
        entry["best"] = {}
        for regime, per in entry["modes"].items():
            unfused = {k: v for k, v in per.items() if k.startswith("baseline:")}
            ours = {k: v for k, v in per.items() if not k.startswith("baseline:")}
            for name, a in entry["anchors"].items():  # a user's own unfused path (SDPA + all-gather + combine)
                if (
                    name.startswith((UNFUSED_ANCHOR, UNFUSED_USER))
                    and a.get(regime)
                    and a.get("eager_error", 1) <= TOL
                    and a.get("graph_error", 1) <= TOL
                ):
                    unfused[name] = {"ms": a[regime], "config": None}
            if not unfused:
                continue
            u = min(unfused, key=lambda k: unfused[k]["ms"])
            o = min(ours, key=lambda k: ours[k]["ms"]) if ours else None
            alone = [a.get(regime) for n, a in entry["anchors"].items() if n.startswith("collective_alone") and
                     a.get(regime)]  # fmt: skip
            compute = entry["anchors"].get("compute_alone", {}).get(regime)
            torch_fused = entry["anchors"].get("torch_fused", {})
            entry["best"][regime] = {
                "best_unfused": u, "best_unfused_ms": unfused[u]["ms"],
                "best_ours": o, "best_ours_ms": ours[o]["ms"] if o else None,
                "speedup_vs_best_unfused": unfused[u]["ms"] / ours[o]["ms"] if o else None,
                "torch_fused_ms": torch_fused.get(regime),
                "ideal_bound_ms": max(compute, min(alone)) if compute and alone else None,
            }  # fmt: skip
    return shapes


def _given_configs(text: str) -> list[dict]:
    """`--configs`: a JSON list of config objects, each with a `mode` (SystemExit naming the option otherwise)."""
    try:
        configs = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--configs: not JSON ({exc}); allowed: a JSON list of config objects") from None
    if not isinstance(configs, list) or not all(isinstance(c, dict) and "mode" in c for c in configs):
        raise SystemExit('--configs: must be a JSON list of config objects, each with a "mode"')
    unique: list[dict] = []
    for c in configs:
        if c not in unique:
            unique.append(c)
    return unique


def main() -> None:
    args = _arguments().parse_args()
    _given_configs(args.configs)  # a bad list stops the run before any rank starts
    if args.rank_side:
        rank_side(args)
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    partial = Path(args.out + ".partial.jsonl")
    command = harness.torchrun_self(args.ranks, __file__, [*sys.argv[1:], "--rank-side"], port=args.port)
    code = harness.drive(command, partial)
    data = harness.assemble(partial, {"command": "python bench/ops/fused_ops.py " + " ".join(sys.argv[1:])})
    header = next((it for it in data["items"] if it["id"] == "header"), {})
    data = {**{k: v for k, v in header.items() if k != "id"}, **data, "exit": code}
    data["summary"] = summarize(data)
    harness.write_json(Path(args.out), data)
    for shape, entry in data["summary"].items():
        for regime, label in (("graph_ms", "graph"), ("graph_cold_ms", "graph cold")):
            g = entry["best"].get(regime, {})
            if g:
                ours = f"{g['best_ours_ms'] * 1e3:.1f}" if g["best_ours_ms"] else "-"
                print(f"{shape}: {label} best ours {g['best_ours']} {ours} us, best unfused {g['best_unfused']} "
                      f"{g['best_unfused_ms'] * 1e3:.1f} us, x{g['speedup_vs_best_unfused'] or 0:.3f}; torch fused "
                      f"{g['torch_fused_ms']}", flush=True)  # fmt: skip
    stress_item = next((it for it in data["items"] if it["id"] == "stress"), None)
    if stress_item:
        print("stress:", {k: v for k, v in stress_item.get("stress", stress_item).items() if k != "cases"}, flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
