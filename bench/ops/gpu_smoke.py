"""The user's paths on a real GPU, one rank or more: what the CPU suite can't run on CUDA.

Launch: `torchrun --nproc-per-node=1 bench/ops/gpu_smoke.py --out smoke.json` (any number of GPUs).

Checks, each against a float32 reference on fresh random data, outputs poisoned with NaN first:
- every family through `@joint_autotune(space=...)` (its own key, an empty store: the space default), twice
  (the second call from the launcher's cache), and once inside a CUDA graph replayed with new data;
- a flash_decode `key=` of the caller's own that returns the raw KV length: it finds the record stored at the
  length's bucket (source "store");
- the `triton.autotune` drop-in on a compiled `@triton.jit` kernel: benchmarks its configs, saves the winner, and
  a second decorator over the same store finds it without benchmarking;
- inputs that require grad in grad mode are refused by name (the ops have no backward), and run under no_grad;
- repeat eager calls of both GEMM families' ce modes replayed from their own CUDA graph (`eager_graph`): direct on
  the first call, replayed from the second, direct with the weight moved, replayed again once it is back.
Writes one JSON with each check's result and error; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: `common` and every folder import as packages

from common.cuda import device_label, init_cuda_world

from jointtune import joint_autotune
from jointtune.errors import ShapeError
from jointtune.kernels import ag_gemm as ag
from jointtune.kernels import flash_decode as fd
from jointtune.kernels import gemm_rs as rs

TOL = 2e-2


def gemm_rs_op(a: Any, b: Any, *, world: Any, config: Any, out: Any = None) -> Any:
    return rs.gemm_rs(a, b, world=world, config=config, out=out)


def ag_gemm_op(a: Any, b: Any, *, world: Any, config: Any, out: Any = None) -> Any:
    return ag.ag_gemm(a, b, world=world, config=config, out=out)


def decode_op(q: Any, k: Any, v: Any, lens: Any, *, world: Any, config: Any, out: Any = None) -> Any:
    return fd.flash_decode(q, k, v, lens, world=world, config=config, out=out)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()


def _graph_replay(fn: Any, refresh: Any, check: Any) -> float:
    """Capture `fn()` in a CUDA graph after a warm-up on a side stream, replay it 3 times with new data; worst
    error of the replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    worst = 0.0
    for _ in range(3):
        refresh()
        graph.replay()
        torch.cuda.synchronize()
        worst = max(worst, check())
    return worst


def _through_decorator(launcher: Any, call: Any, refresh: Any, check: Any) -> dict[str, Any]:
    """`call()` twice eagerly (the second from the launcher's cache), then in a graph replayed with new data: the
    errors, and the key, config and source the eager calls resolved."""
    errors = []
    for _ in range(2):
        refresh()
        call()
        torch.cuda.synchronize()
        errors.append(check())
    errors.append(_graph_replay(call, refresh, check))
    (key,) = [k for k in launcher.cache if k[3] == "eager"]
    return {"errors": errors, "key": dict(key[0]), "config": dict(launcher.cache[key]), "source": launcher.sources[key]}


def check_gemm_rs(world: Any, db: str) -> dict[str, Any]:
    W, M, N, K_r = world.world_size, 128 * world.world_size, 4096, 2048
    launcher = joint_autotune(space="gemm_rs", on_miss="default", db_url=db)(gemm_rs_op)
    a = torch.empty(M, K_r, dtype=torch.bfloat16, device=world.device)
    b = torch.empty(K_r, N, dtype=torch.bfloat16, device=world.device)
    out = torch.empty(M // W, N, dtype=torch.bfloat16, device=world.device)

    def refresh() -> None:
        a.copy_(torch.randn_like(a, dtype=torch.float32))
        b.copy_(torch.randn_like(b, dtype=torch.float32) / K_r**0.5)
        out.fill_(float("nan"))

    def check() -> float:
        all_a, all_b = [torch.empty_like(a) for _ in range(W)], [torch.empty_like(b) for _ in range(W)]
        dist.all_gather(all_a, a)
        dist.all_gather(all_b, b)
        return _rel(out, rs.reference(all_a, all_b)[world.rank])

    return _through_decorator(launcher, lambda: launcher(a, b, world=world, out=out), refresh, check)


def check_ag_gemm(world: Any, db: str) -> dict[str, Any]:
    W, R, K, N_r = world.world_size, 64, 4096, 2048
    launcher = joint_autotune(space="ag_gemm", on_miss="default", db_url=db)(ag_gemm_op)
    a = torch.empty(R, K, dtype=torch.bfloat16, device=world.device)
    b = torch.empty(K, N_r, dtype=torch.bfloat16, device=world.device)
    out = torch.empty(R * W, N_r, dtype=torch.bfloat16, device=world.device)

    def refresh() -> None:
        a.copy_(torch.randn_like(a, dtype=torch.float32))
        b.copy_(torch.randn_like(b, dtype=torch.float32) / K**0.5)
        out.fill_(float("nan"))

    def check() -> float:
        all_a = [torch.empty_like(a) for _ in range(W)]
        dist.all_gather(all_a, a)
        return _rel(out, torch.cat(all_a).float() @ b.float())

    return _through_decorator(launcher, lambda: launcher(a, b, world=world, out=out), refresh, check)


def _decode_inputs(world: Any, B: int, H: int, H_KV: int, S_r: int, D: int) -> tuple[Any, ...]:
    dev = world.device
    q = torch.empty(B, H, D, dtype=torch.bfloat16, device=dev)
    k = torch.empty(B, H_KV, S_r, D, dtype=torch.bfloat16, device=dev)
    v = torch.empty_like(k)
    lens = torch.empty(B, dtype=torch.int32, device=dev)
    out = torch.empty(B, H, D, dtype=torch.bfloat16, device=dev)

    def refresh() -> None:
        query = torch.randn(B, H, D, device=dev)
        dist.broadcast(query, 0)  # the same queries on every rank
        q.copy_(query)
        k.copy_(torch.randn_like(k, dtype=torch.float32))
        v.copy_(torch.randn_like(v, dtype=torch.float32))
        lens.copy_(torch.randint(1, S_r + 1, (B,), device=dev))
        out.fill_(float("nan"))

    def check() -> float:
        W = world.world_size
        gathered = [[torch.empty_like(t) for _ in range(W)] for t in (q, k, v, lens)]
        for dst, t in zip(gathered, (q, k, v, lens)):
            dist.all_gather(dst, t)
        return _rel(out, fd.reference(*gathered))

    return q, k, v, lens, out, refresh, check


def check_flash_decode(world: Any, db: str) -> dict[str, Any]:
    q, k, v, lens, out, refresh, check = _decode_inputs(world, 1, 64, 8, 3000, 128)
    launcher = joint_autotune(space="flash_decode", on_miss="default", db_url=db)(decode_op)
    return _through_decorator(launcher, lambda: launcher(q, k, v, lens, world=world, out=out), refresh, check)


def _eager_repeats(world: Any, call: Any, refresh: Any, check: Any, weight: dict[str, Any]) -> dict[str, Any]:
    """Six eager calls of one key with new data (the second captures its eager graph, the rest replay it), one with
    the weight (`weight["at"]`, which `refresh` fills) moved to a new tensor (it must run directly), one more with the
    weight back (replayed again): each checked, with whether the call took the graph (a replay count that went up)."""
    errors, replayed, home = [], [], weight["at"]
    for step in range(8):
        weight["at"] = torch.empty_like(home) if step == 6 else home
        refresh()
        before = world.eager.replays
        call()
        torch.cuda.synchronize()
        errors.append(check())
        replayed.append(world.eager.replays > before)
    return {"errors": errors, "replayed": replayed}


RS_CE = {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 2, "reduce_sms": 16}


def check_eager_replay(world: Any) -> dict[str, Any]:
    """Repeat eager calls replayed from their own CUDA graph (`jointtune/kernels/runtime/eager_graph.py`) in both GEMM
    families' ce modes: right on every call, replayed from the second call on, and direct while a weight is
    elsewhere."""
    W, dev = world.world_size, world.device
    results: dict[str, Any] = {}
    # ag_gemm, ce mode (the one whose host cost the graph is for): fresh A and C tensors every call, B in place
    R, K, N_r = 128, 4096, 1024
    b = {"at": torch.empty(K, N_r, dtype=torch.bfloat16, device=dev)}
    box: dict[str, Any] = {}

    def ag_refresh() -> None:
        box["a"] = torch.randn(R, K, device=dev).bfloat16()
        b["at"].copy_(torch.randn(K, N_r, device=dev) / K**0.5)

    def ag_call() -> None:
        box["c"] = ag.ag_gemm(box["a"], b["at"], world=world, config={"mode": "ce", "ce_consumer": "cublas",
                                                                        "ce_chunks": 2})  # fmt: skip

    def ag_check() -> float:
        all_a = [torch.empty_like(box["a"]) for _ in range(W)]
        dist.all_gather(all_a, box["a"])
        return _rel(box["c"], torch.cat(all_a).float() @ b["at"].float())

    results["ag_gemm"] = _eager_repeats(world, ag_call, ag_refresh, ag_check, b)
    # gemm_rs, ce mode into out=
    M, K_r, N = 256 * W, 2048, 2048
    a = torch.empty(M, K_r, dtype=torch.bfloat16, device=dev)
    w = {"at": torch.empty(K_r, N, dtype=torch.bfloat16, device=dev)}
    out = torch.empty(M // W, N, dtype=torch.bfloat16, device=dev)

    def rs_refresh() -> None:
        a.copy_(torch.randn_like(a, dtype=torch.float32))
        w["at"].copy_(torch.randn_like(w["at"], dtype=torch.float32) / K_r**0.5)
        out.fill_(float("nan"))

    def rs_check() -> float:
        all_a, all_b = [torch.empty_like(a) for _ in range(W)], [torch.empty_like(w["at"]) for _ in range(W)]
        dist.all_gather(all_a, a)
        dist.all_gather(all_b, w["at"])
        return _rel(out, rs.reference(all_a, all_b)[world.rank])

    results["gemm_rs"] = _eager_repeats(
        world, lambda: rs.gemm_rs(a, w["at"], world=world, config=RS_CE, out=out),
        rs_refresh, rs_check, w,
    )  # fmt: skip
    results["errors"] = [e for r in results.values() for e in r["errors"]]
    want = [False, True, True, True, True, True, False, True]  # the first call builds, the moved weight runs directly
    results["replays_as_expected"] = all(r["replayed"] == want for r in list(results.values())[:2])
    return results


def check_raw_length_key(world: Any, db: str) -> dict[str, Any]:
    """A record stored at the bucket of 3000 keys per rank (4096), found by a key returning the raw length."""
    from jointtune.autotune.tuner.keys import triton_version
    from jointtune.db import NewRecord, open_store
    from jointtune.hardware import detect
    from jointtune.kernels import get_family
    from jointtune.search_spaces import get_space

    W = world.world_size
    q, k, v, lens, out, refresh, check = _decode_inputs(world, 1, 32, 8, 3000, 128)
    config = {"mode": "baseline", "kv_split": 256, "BLOCK_N": 64, "heads_per_program": 4, "num_warps": 4,
              "num_stages": 2}  # fmt: skip
    if world.rank == 0:
        shape = {"B": 1, "H": 32, "H_KV": 8, "S": 4096 * W, "D": 128}  # 3000 keys per rank: the 4096 bucket
        open_store(db).upsert_record(NewRecord(
            kernel="flash_decode", kernel_version=get_family("flash_decode").version,
            space_version=get_space("flash_decode").version, shape=shape, dtype="bfloat16", world_size=W,
            hardware_id=detect().hardware_id, triton_version=triton_version(), config=config, latency_p50_us=10.0,
            trials=1, timing="eager",
        ))  # fmt: skip
    dist.barrier()

    def raw(q: Any, k: Any, v: Any, lens: Any, *, world: Any, out: Any = None) -> dict[str, int]:
        return {"B": q.shape[0], "H": q.shape[1], "H_KV": k.shape[1], "S": k.shape[2] * world.world_size,
                "D": q.shape[2]}  # fmt: skip

    launcher = joint_autotune(space="flash_decode", key=raw, on_miss="error", db_url=db, timing="eager")(decode_op)
    refresh()
    launcher(q, k, v, lens, world=world, out=out)
    torch.cuda.synchronize()
    (key,) = launcher.cache
    found = dict(launcher.cache[key])
    ok = launcher.sources[key] == "store" and all(found[name] == value for name, value in config.items())
    return {"errors": [check()], "source": launcher.sources[key], "config": found, "matches_record": ok}


def check_dropin(db: str) -> dict[str, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    configs = [triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 512})]
    x = torch.randn(100_000, device="cuda")
    out = torch.empty_like(x)
    first = joint_autotune(configs=configs, key=["n"], db_url=db)(add_one)
    first[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    torch.cuda.synchronize()
    error = (out - (x + 1)).abs().max().item()
    again = joint_autotune(configs=configs, key=["n"], db_url=db)(add_one)  # a new process would be the same
    out.zero_()
    again[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())
    torch.cuda.synchronize()
    from jointtune.db import open_store

    return {"max_abs_error": [error, (out - (x + 1)).abs().max().item()],
            "first_sources": {str(k): v for k, v in first.sources_by_key.items()},
            "second_sources": {str(k): v for k, v in again.sources_by_key.items()},
            "records": open_store(db).count_records(),
            "benchmarked": len(getattr(first, "configs_timings", None) or {}),  # set by Triton once it benchmarks
            "second_benchmarked": len(getattr(again, "configs_timings", None) or {}),
            "second_source": next((v for k, v in again.sources_by_key.items() if k[-1] != "graph"), None)}  # fmt: skip


def check_forward_only(world: Any) -> dict[str, Any]:
    a = torch.randn(64 * world.world_size, 512, dtype=torch.bfloat16, device=world.device)
    weight = torch.randn(512, 1024, dtype=torch.bfloat16, device=world.device, requires_grad=True)
    try:
        rs.gemm_rs(a, weight, world=world, config={"mode": "baseline"})
        refused = None
    except ShapeError as exc:
        refused = str(exc)
    with torch.no_grad():
        shape = tuple(rs.gemm_rs(a, weight, world=world, config={"mode": "baseline"}).shape)
    return {"refused": refused, "no_grad_shape": list(shape)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_smoke.json")
    args = ap.parse_args()
    world = init_cuda_world()
    made = [tempfile.mkdtemp(prefix="gpu_smoke_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(made, 0)  # one fresh folder for every rank's stores (one node)
    tmp = Path(made[0])
    results: dict[str, Any] = {}
    checks = {
        "gemm_rs": lambda: check_gemm_rs(world, f"sqlite:///{tmp}/rs.db"),
        "ag_gemm": lambda: check_ag_gemm(world, f"sqlite:///{tmp}/ag.db"),
        "flash_decode": lambda: check_flash_decode(world, f"sqlite:///{tmp}/fd.db"),
        "raw_length_key": lambda: check_raw_length_key(world, f"sqlite:///{tmp}/bucket.db"),
        "dropin": lambda: check_dropin(f"sqlite:///{tmp}/dropin_{world.rank}.db"),
        "forward_only": lambda: check_forward_only(world),
        "eager_replay": lambda: check_eager_replay(world),
    }
    failed = []
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            result = check()
        except Exception as exc:
            result = {"exception": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        result["seconds"] = round(time.perf_counter() - start, 2)
        bad = "exception" in result or max(result.get("errors", [0.0])) > TOL
        bad = bad or result.get("matches_record") is False or (name == "forward_only" and not result.get("refused"))
        bad = bad or result.get("replays_as_expected") is False
        bad = bad or (
            name == "dropin"
            and (
                max(result["max_abs_error"]) > 1e-6
                or result["benchmarked"] != 2
                or result["second_benchmarked"]
                or result["second_source"] != "store"
            )
        )
        result["ok"] = not bad
        failed += [name] if bad else []
        results[name] = result
        print(f"[rank {world.rank}] {name}: {'ok' if not bad else 'FAILED'} {json.dumps(result)[:600]}", flush=True)
    if world.rank == 0:
        doc = {"device": device_label(world.world_size), "world_size": world.world_size,
               "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
               "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "results": results}  # fmt: skip
        Path(args.out).write_text(json.dumps(doc, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
