"""AG+GEMM as serving engines meet it: every mode at its best config in three regimes, against NCCL+cuBLAS
and PyTorch's fused op, in one run; graph-replay correctness and a mixed replay stress run.

Launch: `torchrun --nproc-per-node=2 bench/ag_gemm_modes.py --out modes.json [--shapes MxNxK,...]`

Regimes (each the max over ranks; the baseline and torch's op timed the same way):
- gpu: the GPU's time for one call (`ag_gemm_bench.Bench`: a hold sized to the host's issue time and a
  device-side barrier before each timed call, CUDA events around it); `host_us` is the host's issue time;
- eager: wall time per call, calls issued back to back (host included), after a device-side barrier;
- graph: replays of a CUDA graph holding CALLS calls, timed with events after a hold and a device barrier.

Every candidate is checked against a float32 reference before it is timed: eagerly with a NaN-poisoned
output, and under graph replay with fresh random A and B written into the captured tensors between
replays. The stress run replays graphs of mixed modes and shapes back to back with fresh data each time
and eager calls in between, checking every output on the device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkout import add_tree_argument  # first: `--tree` picks the jointtune every import below gets

# isort: split

from ag_gemm_bench import Bench, device_label, init_cuda_world, spin_up

from jointtune.kernels.ag_gemm import ag_gemm, config_json
from jointtune.search_spaces._gemm import row_tile

ANCHOR_SHAPES = [(8192, 4096, 12288), (8192, 8192, 28672), (8192, 3584, 14336), (1024, 8192, 8192), (128, 8192, 8192)]
DECODE_SHAPES = [(64, 8192, 8192), (256, 8192, 8192), (64, 6144, 4096), (128, 6144, 4096), (256, 6144, 4096)]
CALLS = 4  # calls per captured graph
TOL = 2e-2
BIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, SPLIT_K=1)
SMALL = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4, SPLIT_K=1)


def candidates(M: int, W: int) -> dict[str, list[dict]]:
    """A short list per mode: each mode's best configs of the previous sweeps (bench/results)."""
    R = M // W
    pc = dict(mode="push_cublas")
    if R >= 2048:
        push_cublas = [dict(pc, push_by="ce", gemm_order="local_first", chunk_m=c) for c in (R, R // 2)]
        push_cublas.append(dict(pc, push_by="sm", gemm_order="gathered", comm_sms=32))
        tiles, push_chunk = BIG, 256
    else:
        push_cublas = [dict(pc, push_by="sm", gemm_order="gathered", comm_sms=s) for s in (8, 16, 32)]
        push_cublas.append(dict(pc, push_by="ce", gemm_order="gathered"))
        push_cublas.append(dict(pc, push_by="ce", gemm_order="local_first", chunk_m=1 << (R.bit_length() - 1)))
        tiles, push_chunk = (BIG if R >= 512 else dict(SMALL, BLOCK_N=64)), min(1 << (R.bit_length() - 1), 256)
    out = {
        "baseline": [dict(mode="baseline")],
        "push_cublas": push_cublas,
        "ce_cublas": [dict(mode="ce", ce_consumer="cublas", ce_chunks=c) for c in (1, 2)],
        "ce_triton": [dict(mode="ce", ce_consumer="triton", ce_chunks=1, **tiles)],
        "pull": [dict(mode="pull", **(BIG if R >= 512 else SMALL))],
        "push": [dict(mode="push", comm_sms=32, chunk_m=push_chunk, **tiles)],
    }
    if M <= 128:  # one row tile over all M rows (B read once): the tile GEMM's best at 32-128 rows on one H200
        one = row_tile(M)
        out["pull"].append(dict(mode="pull", **one))
        out["push"].append(dict(mode="push", comm_sms=8, chunk_m=max(16, 1 << (R - 1).bit_length()), **one))
    return out


class Rig:
    """One shape's tensors on this rank: A in symmetric memory, B, a static C, and fresh-data refills."""

    def __init__(self, world, M: int, N: int, K: int, seed: int = 1234) -> None:
        self.world, self.M, self.N, self.K = world, M, N, K
        W = world.world_size
        self.R, self.N_r = M // W, N // W
        (self.a,) = world.empty((self.R, K), torch.bfloat16)
        self.b = torch.empty(K, self.N_r, dtype=torch.bfloat16, device="cuda")
        self.out = torch.empty(M, self.N_r, dtype=torch.bfloat16, device="cuda")
        self.ref = torch.empty(M, self.N_r, dtype=torch.float32, device="cuda")
        self.seed = seed
        self.refill()

    def refill(self, seed: int | None = None) -> None:
        """New A shards (all ranks', from one seed), a new B per rank, the reference; C poisoned. On the
        stream only (no host sync), so it can run between back-to-back replays."""
        self.seed = self.seed + 1 if seed is None else seed
        gen = torch.Generator(device="cuda").manual_seed(self.seed)
        W, rank = self.world.world_size, self.world.rank
        all_a = torch.randn(W * self.R, self.K, device="cuda", generator=gen).div_(self.K**0.25).bfloat16()
        gen_b = torch.Generator(device="cuda").manual_seed(self.seed * 7919 + rank)
        self.b.copy_(torch.randn(self.K, self.N_r, device="cuda", generator=gen_b).div_(self.K**0.25))
        self.a.copy_(all_a[rank * self.R : (rank + 1) * self.R])
        torch.mm(all_a.float(), self.b.float(), out=self.ref)
        self.out.fill_(float("nan"))

    def error_on_device(self) -> torch.Tensor:
        return ((self.out.float() - self.ref).norm() / self.ref.norm()).nan_to_num(float("inf")).reshape(1)

    def call(self, config: dict):
        return lambda: ag_gemm(self.a, self.b, world=self.world, config=config, out=self.out)


def max_over_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def eager_ms(fn, world, n: int) -> float:
    """Wall time per call of n calls issued back to back (host included), after a device barrier."""
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    world.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n


def capture(fn, calls: int = CALLS) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def graph_ms(graph, world, replays: int, calls: int = CALLS) -> float:
    """GPU time per call over `replays` replays of a graph of `calls` calls (hold + device barrier first)."""
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda._sleep(10_000_000)  # ~5 ms: the host queues every replay behind it
    world.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * calls)


def _watchdog(name: str, seconds: float = 90.0) -> threading.Timer:
    def fire() -> None:
        print(f"rank {dist.get_rank()}: {name} did not finish in {seconds:.0f} s; giving up", flush=True)
        os._exit(3)

    dog = threading.Timer(seconds, fire)
    dog.start()
    return dog


def guarded_measure(rig, bench: Bench, *, eager_calls: int, replays: int, watchdog_s: float = 90.0):
    """`run(name, fn, bucket, **measure_options)`: `measure` into `bucket[name]`, where an exception is recorded as
    that entry's error instead of ending the run, and a hang past `watchdog_s` ends the process (a collective with
    a stuck peer never returns)."""

    def run(name: str, fn, bucket: dict, **kw) -> dict:
        dog = _watchdog(name, watchdog_s)
        try:
            bucket[name] = measure(rig, fn, bench, eager_calls=eager_calls, replays=replays, **kw)
        except Exception as exc:
            bucket[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            torch.cuda.synchronize()
        finally:
            dog.cancel()
        return bucket[name]

    return run


def time_candidates(entry: dict, candidates: dict, run, rig, label: str, modes: str = "", partial_save=None) -> None:
    """Every candidate config of every mode (or of `modes`, comma-separated) through `run` (`guarded_measure`'s),
    into `entry["modes"][mode]`; `partial_save(entry)` after each, so a hang later keeps what was measured."""
    for mode, cands in candidates.items():
        if modes and mode not in modes.split(","):
            continue
        entry["modes"][mode] = []
        for cfg in cands:
            name = json.dumps(cfg, sort_keys=True)
            if dist.get_rank() == 0:
                print(f"  {label} {name}", flush=True)
            entry["modes"][mode].append(dict(config=cfg, **run(name, rig.call(cfg), {})))
            if partial_save:
                partial_save(entry)


def measure(rig: Rig, fn, bench: Bench, *, eager_calls: int, replays: int, graphable: bool = True) -> dict:
    """Correctness (eager and under replay), then gpu / eager / graph timings of one call."""
    world = rig.world
    rig.refill()
    fn()
    torch.cuda.synchronize()
    entry: dict = {"eager_error": max_over_ranks([rig.error_on_device().item()])[0]}
    entry.update(bench.time(fn))
    entry["eager_ms"] = max_over_ranks([statistics.median(eager_ms(fn, world, eager_calls) for _ in range(3))])[0]
    if graphable:
        try:
            graph = capture(fn)
            errors = []
            for _ in range(3):
                rig.refill()
                graph.replay()
                errors.append(rig.error_on_device())
            entry["graph_error"] = max_over_ranks([torch.cat(errors).max().item()])[0]
            entry["graph_ms"] = max_over_ranks([min(graph_ms(graph, world, replays) for _ in range(3))])[0]
            del graph
        except Exception as exc:  # a failing capture is a result (torch's own op, say), not a dead run
            entry["graph_failure"] = f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.synchronize()
    return entry


def measure_only(rig: Rig, fn, bench: Bench, eager_calls: int, replays: int) -> dict:
    """gpu / eager / graph timings of a part of a call (no output to check): the ideal bound's terms."""
    world = rig.world
    entry = dict(bench.time(fn))
    entry["eager_ms"] = max_over_ranks([statistics.median(eager_ms(fn, world, eager_calls) for _ in range(3))])[0]
    graph = capture(fn)
    entry["graph_ms"] = max_over_ranks([min(graph_ms(graph, world, replays) for _ in range(3))])[0]
    return entry


def bench_shape(M: int, N: int, K: int, world, bench: Bench, group_name: str, modes: str = "") -> dict:
    t0 = time.time()
    rig = Rig(world, M, N, K)
    big = M * N * K >= 8192 * 4096 * 12288
    eager_calls, replays = (20, 10) if big else (100, 50)
    entry: dict = {"M": M, "N": N, "K": K, "world_size": world.world_size, "anchors": {}, "modes": {}}

    run = guarded_measure(rig, bench, eager_calls=eager_calls, replays=replays)

    gathered = torch.empty(M, K, dtype=torch.bfloat16, device="cuda")

    def nccl_cublas():
        dist.all_gather_into_tensor(gathered, rig.a)
        torch.mm(gathered, rig.b, out=rig.out)

    run("nccl_cublas", nccl_cublas, entry["anchors"])

    def torch_fused():
        _, (c,) = torch.ops.symm_mem.fused_all_gather_matmul(rig.a, [rig.b], 0, group_name)
        rig.out.copy_(c)

    # torch's op hangs under graph capture from the large shapes on (seen with torch 2.11): time it eagerly there
    run("torch_fused", torch_fused, entry["anchors"], graphable=rig.R < 2048)
    dist.all_gather_into_tensor(gathered, rig.a)
    entry["anchors"]["cublas_alone"] = measure_only(
        rig, lambda: torch.mm(gathered, rig.b, out=rig.out), bench, eager_calls, replays
    )
    entry["anchors"]["nccl_all_gather_alone"] = measure_only(
        rig, lambda: dist.all_gather_into_tensor(gathered, rig.a), bench, eager_calls, replays
    )
    for mode, cands in candidates(M, world.world_size).items():
        if modes and mode not in modes.split(","):
            continue
        results = []
        for cfg in cands:
            res = run(json.dumps(cfg, sort_keys=True), rig.call(cfg), {})
            results.append(dict(config=cfg, **res))
        entry["modes"][mode] = results
    # best per regime, per mode and overall (only candidates that were right eagerly and under replay)
    base = entry["anchors"]["nccl_cublas"]
    summary = {}
    for regime in ("median_ms", "eager_ms", "graph_ms"):
        per_mode = {}
        for mode, results in entry["modes"].items():
            ok = [r for r in results if r.get("eager_error", 1) < TOL and r.get("graph_error", 1) < TOL and regime in r]
            if ok:
                best = min(ok, key=lambda r: r[regime])
                per_mode[mode] = {"ms": best[regime], "config": best["config"], "host_us": best.get("host_us")}
        best_mode = min(per_mode, key=lambda m: per_mode[m]["ms"]) if per_mode else None
        summary[regime] = {
            "per_mode": per_mode,
            "best_mode": best_mode,
            "nccl_cublas_ms": base.get(regime),
            "torch_fused_ms": entry["anchors"]["torch_fused"].get(regime),
            "speedup_vs_nccl_cublas": (base[regime] / per_mode[best_mode]["ms"])
            if best_mode and regime in base
            else None,
        }
    entry["best"] = summary
    entry["seconds"] = time.time() - t0
    if world.rank == 0:
        line = {r: (s["best_mode"], round(s["per_mode"][s["best_mode"]]["ms"], 4) if s["best_mode"] else None,
                    round(s["nccl_cublas_ms"] or 0, 4), round(s["speedup_vs_nccl_cublas"] or 0, 3))
                for r, s in summary.items()}  # fmt: skip
        host = {m: round(v.get("host_us") or 0) for m, v in summary["median_ms"]["per_mode"].items()}
        print(f"[{M}x{N}x{K}] {entry['seconds']:.0f}s {line} host_us {host} (nccl_cublas "
              f"{round(base.get('host_us', 0))})", flush=True)  # fmt: skip
    return entry


STRESS = [
    ((128, 8192, 8192), dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32)),
    ((64, 6144, 4096), dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=8)),
    ((256, 6144, 4096), dict(mode="push_cublas", push_by="ce", gemm_order="gathered")),
    ((1024, 8192, 8192), dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=256)),
    ((1024, 2048, 2048), dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=16, chunk_m=128)),
    ((1024, 2048, 2048), dict(mode="push", comm_sms=16, chunk_m=128, **dict(SMALL, SPLIT_K=2))),
    ((128, 8192, 8192), dict(mode="push", comm_sms=32, chunk_m=64, **dict(SMALL, BLOCK_N=64))),
    ((256, 2048, 4096), dict(mode="ce", ce_consumer="cublas", ce_chunks=2)),
    ((256, 2048, 4096), dict(mode="pull", **SMALL)),
    ((512, 2048, 4096), dict(mode="ce", ce_consumer="triton", ce_chunks=2, **SMALL)),
    ((128, 8192, 8192), dict(mode="baseline")),
]


def stress(world, iterations: int, cases=None, make_rig=None) -> dict:
    """Graphs of mixed modes and shapes replayed back to back (same random order on every rank) with fresh
    data before each replay and an eager call of the same config every 4th step; every output checked.

    `cases`: (shape, config) pairs, a shape being a tuple of dims ((M, N, K): AG+GEMM's STRESS by default);
    `make_rig(k, *shape, seed)`: the tensors of case k, with `refill`, `error_on_device` and `call(config)`
    (AG+GEMM's Rig by default)."""
    cases = STRESS if cases is None else cases
    if getattr(world, "shared_gpu", False):  # gloo collectives can't be captured: the baseline is timed, not stressed
        cases = [(shape, cfg) for shape, cfg in cases if cfg["mode"] != "baseline"]
    make_rig = make_rig or (lambda k, M, N, K, seed: Rig(world, M, N, K, seed=seed))
    rigs, graphs, eager_rigs = [], [], []
    trace = bool(os.environ.get("STRESS_TRACE"))  # name each case as it is set up (the last named one broke)
    for k, (shape, cfg) in enumerate(cases):
        if trace and world.rank == 0:
            print(f"stress case {k}: {shape} {json.dumps(cfg, sort_keys=True)}", flush=True)
        rig, spare = make_rig(k, *shape, k * 1000), make_rig(k, *shape, k * 1000 + 500)
        rig.call(cfg)()
        torch.cuda.synchronize()
        graphs.append(capture(rig.call(cfg), calls=1))
        if trace:
            rig.refill()
            graphs[-1].replay()
            torch.cuda.synchronize()
            print(f"[rank {world.rank}] case {k}: eager and one replay ran, error {rig.error_on_device().item():.2e}",
                  flush=True)  # fmt: skip
        rigs.append(rig)
        eager_rigs.append(spare)
    gen = torch.Generator().manual_seed(7)
    order = torch.randint(len(rigs), (iterations,), generator=gen).tolist()
    errors, eager_errors = [], []
    dog = _watchdog("stress", 240)
    t0 = time.time()
    for step, k in enumerate(order):
        rigs[k].refill()
        graphs[k].replay()
        errors.append(rigs[k].error_on_device())
        if trace:
            torch.cuda.synchronize()
            print(f"[rank {world.rank}] step {step}: replay of case {k} ran, error {errors[-1].item():.2e}", flush=True)
        if step % 4 == 3:
            spare = eager_rigs[k]
            spare.refill()
            spare.call(cases[k][1])()
            eager_errors.append(spare.error_on_device())
            if trace:
                torch.cuda.synchronize()
                print(f"[rank {world.rank}] step {step}: eager call of case {k} ran", flush=True)
    torch.cuda.synchronize()
    dog.cancel()
    errs = torch.cat(errors)
    eager = torch.cat(eager_errors)
    wrong, wrong_eager = float((errs > TOL).sum()), float((eager > TOL).sum())
    worst = max_over_ranks([errs.max().item(), eager.max().item(), wrong, wrong_eager])
    # per case: replays, and the worst error and wrong replays over ranks (a fault may show on one rank only)
    mine = [[errs[i].item() for i, o in enumerate(order) if o == k] for k in range(len(cases))]
    worst_k = max_over_ranks([max(m, default=0.0) for m in mine] + [float(sum(e > TOL for e in m)) for m in mine])
    per_config = {}
    for k, (shape, cfg) in enumerate(cases):
        per_config[f"{'x'.join(map(str, shape))} {json.dumps(cfg, sort_keys=True)}"] = {
            "replays": len(mine[k]), "worst": worst_k[k], "wrong": int(worst_k[len(cases) + k])}  # fmt: skip
    return {"replays": iterations, "eager_calls": len(eager_errors), "worst_replay_error": worst[0],
            "worst_eager_error": worst[1], "wrong_replays": int(worst[2]), "wrong_eager": int(worst[3]),
            "seconds": time.time() - t0, "per_config": per_config}  # fmt: skip


def compiled_call_check(rig, call) -> dict:
    """`call()` runs a torch.compile(fullgraph=True)'d module once and copies its result into `rig.out`: it is
    compiled (two calls), checked eagerly, captured in a CUDA graph, and 5 replays are checked with fresh data."""
    t0 = time.time()
    call()
    call()
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    rig.refill()
    call()
    eager_err = max_over_ranks([rig.error_on_device().item()])[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    errors = []
    for _ in range(5):
        rig.refill()
        graph.replay()
        errors.append(rig.error_on_device())
    replay_err = max_over_ranks([torch.cat(errors).max().item()])[0]
    return {"compile_s": compile_s, "eager_error": eager_err, "replay_error": replay_err, "replays": 5}


def compiled_module_check(world) -> dict:
    """torch.compile(fullgraph=True) of a module calling torch.ops.jointtune.ag_gemm, then CUDA-graph capture
    of the compiled module; every replay checked against the reference."""
    cfg = config_json(dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32))
    rig = Rig(world, 128, 8192, 8192, seed=4242)

    class Layer(torch.nn.Module):
        def forward(self, a, b):
            (c,) = torch.ops.jointtune.ag_gemm([a], [b], world.name, cfg)
            return c * 1.0

    compiled = torch.compile(Layer(), fullgraph=True)
    return compiled_call_check(rig, lambda: rig.out.copy_(compiled(rig.a, rig.b)))


def run_header(world, script: str) -> dict:
    """What every result file of these benchmarks starts with: device, versions, date, the exact command."""
    import triton

    return {
        "device": device_label(world.world_size),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"torchrun --nproc-per-node={world.world_size} {script} " + " ".join(sys.argv[1:]),
        "dtype": "bfloat16", "calls_per_graph": CALLS, "shapes": [],
    }  # fmt: skip


def save_result(world, result: dict, out: str, **extra) -> None:
    """The benchmark's JSON as it stands (rank 0 writes it), `extra` keys beside (an unfinished shape)."""
    if world.rank == 0:
        Path(out).write_text(json.dumps(dict(result, **extra), indent=1))


def run_shapes(world, result: dict, out: str, shapes, measure) -> None:
    """`measure(shape, partial)` per shape into result["shapes"], saved after each shape and, through
    `partial(entry)`, after each candidate (a hang later keeps what was measured); then the process group ends."""
    for shape in shapes:
        result["shapes"].append(measure(shape, lambda entry: save_result(world, result, out, partial=entry)))
        torch.cuda.empty_cache()
        save_result(world, result, out)
    dist.barrier()
    dist.destroy_process_group()


def modes_arguments(out: str, shapes_help: str) -> argparse.ArgumentParser:
    """The options every modes benchmark takes: where the JSON goes, shapes, stress replays, timing iterations,
    which of our modes to time."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=out)
    ap.add_argument("--shapes", default="", help=shapes_help)
    ap.add_argument("--stress", type=int, default=600, help="graph replays in the stress run (0: skip)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="", help="comma-separated modes of ours to time (default: all)")
    ap.add_argument("--no-timing", action="store_true", help="only the stress and compile checks (ranks sharing a GPU)")
    add_tree_argument(ap)
    return ap


def shapes_to_time(args: argparse.Namespace, default: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """--shapes (dims joined by x, comma-separated), else `default`; none with --no-timing."""
    if args.no_timing:
        return []
    return [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or default


def main() -> None:
    ap = modes_arguments("ag_gemm_modes.json", "MxNxK,... (default: the anchor shapes and the decode shapes)")
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    world = init_cuda_world()
    bench = Bench(args.iters, args.warmup, world)
    shapes = shapes_to_time(args, DECODE_SHAPES + ANCHOR_SHAPES)
    group_name = dist.group.WORLD.group_name
    try:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        enable_symm_mem_for_group(group_name)
    except Exception:
        pass
    result = run_header(world, "bench/ag_gemm_modes.py")

    def save() -> None:
        save_result(world, result, args.out)

    spin_up(2.0)
    if args.stress:
        result["stress"] = stress(world, args.stress)
        if world.rank == 0:
            print("stress", {k: v for k, v in result["stress"].items() if k != "per_config"}, flush=True)
        save()
    if not args.skip_compile:
        try:
            result["compiled_module"] = compiled_module_check(world)
        except Exception as exc:
            result["compiled_module"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if world.rank == 0:
            print("compiled module", result["compiled_module"], flush=True)
        save()
    run_shapes(world, result, args.out, shapes, lambda s, _: bench_shape(*s, world, bench, group_name, args.modes))


if __name__ == "__main__":
    main()
