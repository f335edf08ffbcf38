"""bench/ops/decode_anatomy.py off the GPU: what each row times (the space's seeds and per-mode starts, every baseline
variant the device runs, our tile GEMM alone at world size 1), the unfused pieces on simulated ranks, the floor and the
page built from a row, and its flag ping-pong kernel: run in Triton's interpreter between three processes (one
imports, then forks the others) that share its flags and tile through files (the leader, two followers: round trips,
a checked tile handoff, a fan-out, and a control the check must catch), and compiled for Hopper (sm_90) with the GPU
image's Triton (3.6), or this one where that is not installed.

This file is also the child those tests start (`python test_decode_anatomy.py pingpong|compile ...`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH, KERNEL_TESTS = ROOT / "bench", ROOT / "tests" / "kernels"
W_SHARED = 3  # processes of the interpreter ping-pong: rank 0 and two followers
FLAGS, TILE, BLOCK = 4 * 8, 4 * 64, 64  # per rank: flag slots, tile elements; elements per block


def _anatomy():
    sys.path.insert(0, str(BENCH))
    from ops import decode_anatomy

    return decode_anatomy


# ----------------------------------------------------------------------------------------- what a row times


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs"])
def test_a_row_times_every_fused_mode_the_seeds_and_every_baseline_variant(family: str) -> None:
    da = _anatomy()
    from jointtune.kernels import get_family
    from jointtune.search_spaces import DeviceLimits, get_space

    fam, space = get_family(family), get_space(family)
    limits = DeviceLimits(max_shared_mem=232448, num_sms=132, compute_capability=(9, 0),
                          collectives=("nccl", "nccl_symm", "torch_two_shot"))  # fmt: skip
    for W in (2, 4):
        for M in (16, 64, 128):
            problem = space.make_problem({"M": M, "N": 8192, "K": 8192}, dtype="bf16", world_size=W)
            configs = da.candidates(space, problem, limits)
            ours = {k: c for k, c in configs.items() if k.startswith("ours:")}
            assert {c["mode"] for c in ours.values()} == set(space.modes) - {"baseline"}
            assert all(s in ours.values() for s in space.seeds(problem, limits)) and space.seeds(problem, limits)
            assert [k for k in configs if k.startswith("baseline:")] == ["baseline:nccl", "baseline:nccl_symm"]
            assert all(not space.violations(c, problem, limits) for c in configs.values())
            cfg, one = da.tile_alone(fam, space, problem, ours, limits)
            split = "N" if family == "ag_gemm" else "K"
            assert one.world_size == 1 and one.dim(split) == 8192 // W and one.dim("M") == M
            assert cfg == ours["ours:pull"]
    assert da.tile_alone(fam, space, problem, {"ours:ce": ours["ours:ce"]}, limits) == "no pull config among ours"


@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs"])
def test_the_unfused_pieces_compute_what_they_stand_for(family: str) -> None:
    """On simulated ranks: cuBLAS alone is this rank's GEMM, the collective alone gathers A (reduce-scatters the
    partials) in every variant, and the baseline in every variant, A placed in its window, matches the reference."""
    da = _anatomy()
    import torch

    from jointtune.kernels import create_world, get_family
    from jointtune.search_spaces import DeviceLimits, get_space

    fam, space, world = get_family(family), get_space(family), create_world("local", 2)
    problem = space.make_problem("32x256x128", dtype="bf16", world_size=2)
    rig, tol = da.Rig(fam, problem, world), fam.tolerance("bfloat16")
    x = rig.x
    want = (
        torch.cat([a.float() for a in x.all_a]) @ x.b[0].float()
        if family == "ag_gemm"
        else x.a[0].float() @ x.b[0].float()
    )
    c = rig.gemm_alone()()
    assert ((c.float() - want).norm() / want.norm()).item() < tol
    baselines = [k for k in da.candidates(space, problem, DeviceLimits.nominal_hopper()) if k.startswith("baseline:")]
    assert len(baselines) == (3 if family == "ag_gemm" else 2)
    for key in baselines:
        v = key.split(":", 1)[1]
        assert fam.max_error(rig.call({"mode": "baseline", "collective": v})(), rig.ref) <= tol, v
        got = rig.collective_alone(v)()
        if family == "ag_gemm":
            assert all(torch.equal(g, torch.cat(x.all_a)) for g in got), v
        else:
            assert fam.max_error(got, rig.ref) <= tol, v


def _row() -> dict:
    tile = dict(BLOCK_M=64, BLOCK_N=64)
    return {
        "M": 64, "N": 8192, "K": 8192,
        "gemm_alone": {"cublas": 10.0, "ours_tile": {"config": tile, "error": 0.003, "graph_error": 0.003,
                                                     "us": 14.0}},
        "collective_alone": {"nccl": 16.0, "nccl_symm": 12.0},
        "baseline": {"baseline:nccl": {"config": {}, "us": 26.0}, "baseline:nccl_symm": {"config": {}, "us": 23.0}},
        "ours": {"ours:push": {"config": {"mode": "push", **tile}, "us": 24.0},
                 "ours:push_cublas": {"config": {"mode": "push_cublas"}, "us": 20.0},
                 "ours:ce": {"config": {"mode": "ce"}, "error": 0.9, "graph_error": 0.9},
                 "ours:pull": {"failed": "RuntimeError: x"}},
    }  # fmt: skip


def test_the_floor_says_what_a_further_gain_would_need() -> None:
    da = _anatomy()
    f = da.floor(_row(), 2.0)
    assert (f["best_unfused"], f["best_unfused_us"], f["ours"], f["ours_us"]) == (
        "baseline:nccl_symm",
        23.0,
        "ours:push_cublas",
        20.0,
    )
    assert (f["ideal_us"], f["collective_alone"], f["serial_sum_us"]) == (12.0, "nccl_symm", 22.0)
    assert f["target_us"] == round(23.0 / 1.15, 2) and f["cut_to_target_us"] == round(20.0 - 23.0 / 1.15, 2)
    assert f["target_within_ideal"] and f["tile_gemm_over_cublas_us"] == 4.0
    # each timed mode over its own GEMM alone: the tile GEMM for a mode with tiles, cuBLAS otherwise
    assert f["modes"]["ours:push"] == {
        "us": 24.0,
        "speedup": round(23 / 24, 3),
        "gemm": "ours_tile",
        "gemm_alone_us": 14.0,
        "over_gemm_us": 10.0,
        "over_gemm_round_trips": 5.0,
    }
    assert f["modes"]["ours:push_cublas"]["gemm"] == "cublas" and f["modes"]["ours:push_cublas"]["over_gemm_us"] == 10
    assert set(f["modes"]) == {"ours:push", "ours:push_cublas"}  # wrong and failed configs are not timed
    assert "incomplete" in da.floor({**_row(), "ours": {}}, 2.0)
    assert da.floor(_row(), None)["cut_to_target_round_trips"] is None  # no ping-pong measured


def test_the_page_reads_the_whole_result() -> None:
    da = _anatomy()
    cases = {"round_trip": {"us_per_round": 2.0}, "fan_out": {"us_per_round": 3.0},
             "flags_p8": {"us_per_round": 2.5}, "tile_p8": {"us_per_round": 12.5}}  # fmt: skip
    summary = da.flag_summary(cases)
    (h,) = summary["handoff"]
    assert (summary["round_trip_us"], summary["fan_out_us"], h["tile_adds_us"], h["tile_one_way_us"]) == (
        2,
        3,
        10,
        11.25,
    )
    assert h["one_way_GBps"] == round(2 * da.TILE / 11.25 / 1e3, 1)
    row = _row()
    row["floor"] = da.floor(row, summary["round_trip_us"])
    result = {"device": "4x NVIDIA H100 80GB HBM3", "world_size": 4, "flags": {"cases": cases, "summary": summary},
              "families": {"ag_gemm": [row], "gemm_rs": []}}  # fmt: skip
    page = da.render(json.loads(json.dumps(result)))  # what the JSON holds is enough
    assert "W=4" in page and "round trip over NVLink, rank 0 <-> 1: 2.00 µs" in page and "all 3 peers" in page
    assert "  64 |   10.0 |   14.0 | 16.0 / 12.0 | 26.0 / 23.0 | 12.0 | push_cublas 20.0 | 1.15x" in page
    assert "- ag_gemm M=64: 1.15x the best unfused (nccl_symm 23.0) means <= 20.0 µs" in page
    assert "push 24.0 (+10.0 over tile, 5.0 RT)" in page and "4.0 µs over cuBLAS" in page
    cases_w2 = da.flag_cases(2, [8, 32], 100, 10)
    assert list(cases_w2) == ["round_trip", "flags_p8", "tile_p8", "flags_p32", "tile_p32"]
    assert "fan_out" in da.flag_cases(4, [], 100, 10) and cases_w2["tile_p8"]["tile"] == da.TILE


def test_a_launch_that_cannot_be_made_is_refused_by_name() -> None:
    da = _anatomy()
    import torch

    flags, tile = torch.zeros(8, dtype=torch.int64), torch.zeros(1024, dtype=torch.bfloat16)
    pp = da.PingPong(0, flags, flags, tile, tile, block=64)
    with pytest.raises(ValueError, match="programs: 5"):
        pp.arguments(followers=1, programs=5, rounds=1)  # 2 x 5 flags > 8
    with pytest.raises(ValueError, match="tile: 96"):
        pp.arguments(followers=1, programs=1, rounds=1, tile=96)  # not whole blocks
    with pytest.raises(ValueError, match="tile: 128"):
        pp.arguments(followers=2, programs=1, rounds=1, tile=128)  # one follower only
    assert pp.issued == 0
    assert da.PingPong(3, flags, flags, tile, tile).arguments(followers=2, programs=1, rounds=5) is None
    assert pp.arguments(followers=1, programs=2, rounds=5, tile=256)["blocks"] == 2 and pp.issued == 5


# ----------------------------------------------------------------------------------------- the kernel itself


def _sm90():
    """tests/kernels/sm90.py: its child environment and its runner of ranks that may wait on each other."""
    sys.path.insert(0, str(KERNEL_TESTS))
    import sm90

    return sm90


def test_pingpong_between_processes_in_the_interpreter(tmp_path: Path) -> None:
    for name, size in (("flags", FLAGS * 8), ("tile", TILE * 2)):
        (tmp_path / name).write_bytes(bytes(W_SHARED * size))
    sm90 = _sm90()
    sm90.run_in_session([sys.executable, __file__, "pingpong", str(tmp_path)], sm90.child_env(TRITON_INTERPRET="1"),
                        timeout=90)  # fmt: skip
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(W_SHARED)]
    took = [o["took"] for o in outs]
    assert took == [[True] * 5, [True] * 5, [False, False, True, False, False]]  # rank 2 only in the fan-out
    assert [o["wrong"] for o in outs] == [[0] * 5, [0, 0, 0, 0, 2 * TILE], [0] * 5]  # the control: every element
    # rank 0's answers at f * P + p (the last value each got), the followers' flags at p
    assert outs[0]["flags"][:6] == [0, 3, 12, 12, 8, 8] and outs[1]["flags"][:2] == [12, 12]
    assert outs[2]["flags"][:2] == [8, 8]


def _pingpong_ranks(folder: Path) -> None:
    """Every rank of the interpreter ping-pong, each a process: this one imports once, then forks ranks 1.. (no
    thread runs yet) and plays rank 0; a rank that fails makes this exit non-zero."""
    da = _anatomy()
    import torch

    children = []
    for rank in range(1, W_SHARED):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _pingpong_rank(da, torch, rank, folder)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    _pingpong_rank(da, torch, 0, folder)
    failed = [pid for pid in children if os.waitpid(pid, 0)[1] != 0]
    if failed:
        sys.exit(f"forked ranks failed: {failed}")


def _pingpong_rank(da, torch, rank: int, folder: Path) -> None:
    """One rank: every rank's flags and tile in files all of them map (the flag table holds each rank's buffer as
    this process maps it, as symmetric memory's does); what it saw goes to rank{rank}.json."""
    flags = torch.from_file(str(folder / "flags"), shared=True, size=W_SHARED * FLAGS, dtype=torch.int64)
    tiles = torch.from_file(str(folder / "tile"), shared=True, size=W_SHARED * TILE, dtype=torch.bfloat16)
    table = torch.tensor([flags[p * FLAGS :].data_ptr() for p in range(W_SHARED)], dtype=torch.int64)
    pp = da.PingPong(rank, table, flags[rank * FLAGS : (rank + 1) * FLAGS], tiles[TILE : 2 * TILE],
                     torch.zeros(TILE, dtype=torch.bfloat16), block=BLOCK)  # fmt: skip
    cases = [
        dict(followers=1, programs=1, rounds=3),  # values 1-3
        dict(followers=1, programs=2, rounds=3, tile=TILE, check=True),  # 4-6
        dict(followers=2, programs=2, rounds=2),  # 7-8: rank 0 -> ranks 1 and 2
        dict(followers=1, programs=2, rounds=2),  # 9-10
        dict(followers=1, programs=2, rounds=2, tile=TILE, check=True),  # 11-12, rank 0 sends ones: every element wrong
    ]
    took, wrong = [], []
    for k, case in enumerate(cases):
        if k == len(cases) - 1:
            pp.src = torch.ones(TILE, dtype=torch.bfloat16)
        took.append(pp.launch(**case))
        wrong.append(int(pp.wrong.sum()))
    result = {"rank": rank, "took": took, "wrong": wrong, "flags": pp.flags.tolist()}
    (folder / f"rank{rank}.json").write_text(json.dumps(result))


def test_pingpong_compiles_for_hopper() -> None:
    """With the GPU image's Triton (3.6) where `make test` installed it, else with this one."""
    sys.path.insert(0, str(KERNEL_TESTS))
    from sm90 import GPU_TRITON

    first = str(GPU_TRITON) if (GPU_TRITON / "triton").is_dir() else ""
    if not first and os.environ.get("JOINTTUNE_REQUIRE_GPU_TRITON"):
        pytest.fail(f"{GPU_TRITON} has no Triton; `make test` installs the GPU image's Triton there")
    sm90 = _sm90()
    out = sm90.run_in_session([sys.executable, __file__, "compile"], sm90.child_env(first), timeout=240)
    facts = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(facts) == 4
    for f in facts:
        # one polling loop and its acquire, one fence per release, every one-thread handoff behind its barrier
        assert (f["spins"], f["flag_acquires"], f["sys_fences"]) == (1, 1, 1), f
        assert f["unbarriered_handoffs"] == [] and f["unfenced_flag_writes"] == [], f
    assert facts[0]["vector_stores"] > 0 and facts[1]["vector_loads"] > 0  # the tile moves in 16-byte pieces


def _compile_child() -> None:
    """Lower each form of the ping-pong kernel for sm_90 (no GPU) and print what `ordering_probe` finds in it."""
    sys.path.insert(0, str(KERNEL_TESTS))
    import torch
    import triton  # before jointtune: then it compiles (no interpreter), with TRITON_INTERPRET unset
    from ordering_probe import facts, lower

    da = _anatomy()
    flags, tile = torch.zeros(4 * da.MAX_PROGRAMS, dtype=torch.int64), torch.zeros(da.TILE, dtype=torch.bfloat16)
    forms = [(0, dict(followers=1, programs=8, rounds=9, tile=da.TILE)),
             (1, dict(followers=1, programs=8, rounds=9, tile=da.TILE, check=True)),
             (0, dict(followers=3, programs=1, rounds=9)), (2, dict(followers=3, programs=1, rounds=9))]  # fmt: skip
    for rank, case in forms:
        compiled = lower(da.pingpong_kernel, da.PingPong(rank, flags, flags, tile, tile).arguments(**case),
                         {"num_warps": 4})  # fmt: skip
        ptx = compiled.asm["ptx"]
        vectors = {"vector_stores": ptx.count("st.global.v4"), "vector_loads": ptx.count("ld.global.v4")}
        print(json.dumps({"rank": rank, **case, **vectors, **facts("pingpong_kernel", compiled)}))
    print(f"triton {triton.__version__}")


if __name__ == "__main__":
    if sys.argv[1] == "pingpong":
        _pingpong_ranks(Path(sys.argv[2]))
    else:
        _compile_child()
