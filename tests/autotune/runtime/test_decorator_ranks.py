"""Rank agreement: real gloo processes (2 and 4) with different local stores end up with the same configs."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import triton
import triton.language as tl
from test_decorator_helpers import BEST, OTHER, World, make_launcher, sleep_record

from jointtune.autotune.runtime.decorator import joint_autotune
from jointtune.db import RecordKey, open_store

CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})]


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _bench_for(rank: int):
    """Each rank measures a different winner: rank 0 BLOCK=32, the others BLOCK=16."""
    times = [3.0, 1.0, 2.0] if rank == 0 else [1.0, 2.0, 3.0]
    calls = []

    def bench(kernel_call, quantiles=None):
        kernel_call()
        calls.append(1)
        value = times[(len(calls) - 1) % 3]
        return [value, value, value]

    return bench


def _rank_main(rank: int, port: int, folder: str, size: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    db = f"sqlite:///{folder}/rank{rank}.db"
    store = open_store(db)
    if rank % 2 == 0:
        store.upsert_record(sleep_record(64, BEST, world_size=size))  # even ranks hit M=64; odd ranks miss it
    else:
        store.upsert_record(sleep_record(128, OTHER, world_size=size))  # odd ranks hit M=128; even ranks miss it
    launch = make_launcher(db)
    world = World(size)
    result: dict[str, object] = {}
    for m in (64, 128, 100):  # 100: nobody has it; the odd ranks' nearest (128) is closer than the even ranks' (64)
        launch(torch.ones(m), world=world)
        result[f"M={m}"] = [launch.seen[-1], launch.sources[((("M", m),), torch.float32, size, "eager")]]
    kernel = joint_autotune(configs=CONFIGS, key=["n"], do_bench=_bench_for(rank), db_url=db)(_copy_kernel)
    x = torch.arange(40, dtype=torch.float32)
    out = torch.empty(40)
    kernel[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, out, 40)
    result["triton"] = kernel.best_config.kwargs["BLOCK"]
    result["triton_stored"] = [r.config["BLOCK"] for r in store.list_records(RecordKey.any(kernel=kernel.kernel))]
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("size", [2, 4])
def test_ranks_with_different_stores_use_the_same_config(tmp_path: Path, monkeypatch, size: int) -> None:
    for name in ("JOINTTUNE_MODE", "JOINTTUNE_SERVER", "JOINTTUNE_PRINT"):
        monkeypatch.delenv(name, raising=False)
    mp.spawn(_rank_main, args=(_free_port(), str(tmp_path), size), nprocs=size, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(size)]
    for r in results:
        assert r["M=64"] == [BEST, "store"]
        assert r["M=128"] == [OTHER, "store"]
        assert r["M=100"] == [OTHER, "nearest-store"]
        # Triton benchmarks disagree; every rank adopts rank 0's winner and stores that one
        assert r["triton"] == 32
        assert r["triton_stored"] == [32]
