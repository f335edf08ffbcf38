"""How the modes benchmarks measure, written once: one call's correctness (eagerly and under graph replay) and its
gpu / eager / graph timings, candidates timed with a watchdog, the mixed-replay stress run, the torch.compile check,
and the result file every run writes (its header, saved after every shape).

Regimes (each the max over ranks):
- gpu: the GPU's time for one call (`cuda.Bench`: a hold sized to the host's issue time and a device-side barrier
  before each timed call, CUDA events around it); `host_us` is the host's issue time;
- eager: wall time per call, calls issued back to back (host included), after a device-side barrier;
- graph: replays of a CUDA graph holding CALLS calls, timed with events after a hold and a device barrier.

A rig (each family's) holds one shape's tensors: `refill()` writes fresh data and the reference on the stream,
`error_on_device()` is the output's relative error as a 1-element device tensor, `call(config)` the call to time.
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
from typing import Any

import torch
import torch.distributed as dist

from common.checkout import add_tree_argument
from common.cuda import Bench, device_label

CALLS = 4  # calls per captured graph
TOL = 2e-2
#: a rig: one shape's tensors with `refill`, `error_on_device` and `call(config)` (each family's modes script)
Rig = Any


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


def launch_us(fn, calls: int = CALLS, replays: int = 10) -> float:
    """One GPU, no peers (the kernel benchmarks): µs per call of `calls` calls captured in one graph, the min over three
    runs of `replays` replays."""
    fn()
    graph = capture(fn, calls)
    best = float("inf")
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        best = min(best, _replays_ms(graph, replays) * 1000 / calls)
    return best


def graph_ms(graph, world, replays: int, calls: int = CALLS) -> float:
    """GPU time per call over `replays` replays of a graph of `calls` calls (hold + device barrier first)."""
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda._sleep(10_000_000)  # ~5 ms: the host queues every replay behind it
    world.barrier()
    return _replays_ms(graph, replays) / calls


def best_graph_us(world, fn, *, calls: int = CALLS, replays: int = 20, rounds: int = 3) -> float:
    """µs per call of `fn` under graph replay, max over ranks: one eager call, a graph of `calls` calls, the best of
    `rounds` timings of `replays` replays each (`graph_ms`), rounded to 0.01."""
    fn()
    graph = capture(fn, calls)
    best = min(graph_ms(graph, world, replays, calls) for _ in range(rounds))
    del graph
    return round(max_over_ranks([best * 1e3])[0], 2)


def launch_ms(world, launch, launches: int) -> list[float]:
    """GPU time of each of `launches` calls of `launch` (one kernel launch of a ping-pong, say), max over ranks; each
    starts behind a device barrier, so every rank's launch starts within a round trip of the others'. A rank where
    `launch` returns False takes no part (0.0 from it)."""
    per_launch = []
    for _ in range(launches):
        torch.cuda.synchronize()
        dist.barrier()
        world.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        took = launch()
        end.record()
        end.synchronize()
        per_launch.append(start.elapsed_time(end) if took else 0.0)
    return max_over_ranks(per_launch)


def _replays_ms(graph, replays: int) -> float:
    """GPU time per replay of `replays` replays of `graph`, between two events on the stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


class Watchdog:
    """Ends the process (exit 3) if the block, or the span from `start` to `cancel`, takes longer than `seconds`: a
    collective with a stuck peer never returns. What was saved stays on disk."""

    def __init__(self, name: str, seconds: float = 90.0) -> None:
        self.name, self.seconds = name, seconds
        self.timer = threading.Timer(seconds, self._fire)

    def _fire(self) -> None:
        print(f"rank {dist.get_rank()}: {self.name} did not finish in {self.seconds:.0f} s; giving up", flush=True)
        os._exit(3)

    def start(self) -> Watchdog:
        self.timer.start()
        return self

    def cancel(self) -> None:
        self.timer.cancel()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cancel()


def guarded_measure(rig, bench: Bench, *, eager_calls: int, replays: int, watchdog_s: float = 90.0):
    """`run(name, fn, bucket, **measure_options)`: `measure` into `bucket[name]`, where an exception is recorded as
    that entry's error instead of ending the run, and a hang past `watchdog_s` ends the process (a collective with
    a stuck peer never returns)."""

    def run(name: str, fn, bucket: dict, **kw) -> dict:
        dog = Watchdog(name, watchdog_s).start()
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


def stress(world, iterations: int, cases: list, make_rig) -> dict:
    """Graphs of mixed modes and shapes replayed back to back (same random order on every rank) with fresh
    data before each replay and an eager call of the same config every 4th step; every output checked.

    `cases`: (shape, config) pairs, a shape being a tuple of dims ((M, N, K) for AG+GEMM's); `make_rig(k, *shape,
    seed)`: the tensors of case k, with `refill`, `error_on_device` and `call(config)` (the family's rig)."""
    if getattr(world, "shared_gpu", False):  # gloo collectives can't be captured: the baseline is timed, not stressed
        cases = [(shape, cfg) for shape, cfg in cases if cfg["mode"] != "baseline"]
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
    dog = Watchdog("stress", 240).start()
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


def provenance(world, script: str) -> dict:
    """Where a result came from: versions, date and the exact command (`run_header` has them too)."""
    import triton

    return {
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"torchrun --nproc-per-node={world.world_size} {script} " + " ".join(sys.argv[1:]),
    }  # fmt: skip


def run_header(world, script: str) -> dict:
    """What every result file of these benchmarks starts with: device, versions, date, the exact command."""
    return {"device": device_label(world.world_size), **provenance(world, script), "dtype": "bfloat16",
            "calls_per_graph": CALLS, "shapes": []}  # fmt: skip


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


def copy_bandwidth() -> float:
    """Measured device copy bandwidth, bytes read plus bytes written per second (a 4 GiB device-to-device copy)."""
    x = torch.empty(1 << 31, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    moved = 2 * x.numel() * x.element_size()
    del x, y
    return moved / seconds
