"""Every flag wait acquires, every read-then-zero of an fp32 buffer has a barrier between, and every one-thread
release or acquire has the barrier that makes it speak for the whole program, in the PTX/TTGIR that this Triton and
the GPU image's (3.6) emit for Hopper.

Both faults made GEMM+RS atomic mode sum wrong on a GPU (whole warps' rows read as zero) while every CPU test
passed: the interpreter neither drops atomics nor runs threads out of step. `ordering_probe.py` compiles
without a GPU and reports what the compiler kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from sm90 import gpu_image_triton, run_sm90
from ttgir_checks import unbarriered_handoffs, unfenced_flag_writes

GEMM = dict(M=1024, N=2048, K=1024)
TILE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4)
FD = dict(kv_split=1024, BLOCK_N=64, heads_per_program=8, num_warps=4, num_stages=2, items_per_flag=4)
FD_SHAPE = dict(B=4, H=64, H_KV=8, S=65536, D=128)
CONFIGS = [
    # atomic with 8-warp tiles: the reduce's read and its zeroing get different thread layouts
    dict(family="gemm_rs", shape=GEMM, mode="atomic", chunk_m=128, reduce_sms=16, tile_order="peers_first",
         SPLIT_K=1, **TILE),
    dict(family="gemm_rs", shape=GEMM, mode="atomic", chunk_m=128, reduce_sms=16, tile_order="own_first", SPLIT_K=2,
         **dict(TILE, BLOCK_M=64, num_warps=4, num_stages=3)),
    dict(family="gemm_rs", shape=GEMM, mode="pull", chunk_m=64, reduce_by="programs", reduce_sms=8,
         tile_order="own_first", SPLIT_K=2, **dict(TILE, BLOCK_M=64, BLOCK_K=32)),
    # the GEMM programs themselves wait (the own rows' epilogue)
    dict(family="gemm_rs", shape=GEMM, mode="push", chunk_m=128, reduce_by="epilogue", SPLIT_K=1, **TILE),
    dict(family="gemm_rs", shape=GEMM, mode="pull", reduce_by="tile", SPLIT_K=2, **TILE),
    dict(family="gemm_rs", shape=GEMM, mode="pull_cublas", reduce_sms=16),
    dict(family="ag_gemm", shape=GEMM, mode="push", comm_sms=16, chunk_m=128, SPLIT_K=2, **TILE),
    dict(family="flash_decode", shape=FD_SHAPE, mode="fused", **FD),
    dict(family="flash_decode", shape=FD_SHAPE, mode="wait", push_programs=8, **FD),
    # GEMM+AR: every wait is a vector of flags polled and acquired at once; a chunk of tiles counted before it releases
    dict(family="gemm_ar_rmsnorm", shape=GEMM, world_size=4, mode="two_shot", gemm="triton", transport="push",
         tiles_per_flag=4, comm_sms=8, SPLIT_K=2, **dict(TILE, BLOCK_M=64, num_warps=4)),
    dict(family="gemm_ar", shape=GEMM, mode="one_shot", gemm="cublas", transport="pull", tiles_per_flag=1,
         comm_sms=32),
    # the decode form: one fence, then a relaxed flag write per rank, for every released tile
    dict(family="gemm_ar", shape=dict(M=8, N=8192, K=8192), world_size=4, mode="one_shot", gemm="cublas",
         transport="push", tiles_per_flag=1, comm_sms=64),
    # the barrier exchange: meetings of CAS loops on vectors of W lanes, both forms
    dict(family="gemm_ar_rmsnorm", shape=dict(M=64, N=8192, K=8192), world_size=4, mode="two_shot", gemm="cublas",
         transport="barrier", comm_sms=64),
    dict(family="gemm_ar", shape=dict(M=64, N=8192, K=8192), world_size=4, mode="one_shot", gemm="cublas",
         transport="barrier", comm_sms=64),
    dict(family="gemm_ar_rmsnorm", shape=dict(M=64, N=8192, K=8192), world_size=4, mode="one_shot", gemm="cublas",
         transport="barrier_push", comm_sms=64),
    # GEMM+RS's barrier launch: the same meetings
    dict(family="gemm_rs", shape=dict(M=128, N=8192, K=8192), world_size=4, mode="barrier", transport="pull",
         reduce_sms=64),
    dict(family="gemm_rs", shape=dict(M=128, N=8192, K=8192), world_size=4, mode="barrier", transport="push",
         reduce_sms=64),
    # AG+GEMM's barrier launch: two meetings around the pushes
    dict(family="ag_gemm", shape=dict(M=128, N=8192, K=8192), world_size=4, mode="barrier", landing="direct",
         barrier_sms=64),
    dict(family="ag_gemm", shape=dict(M=128, N=8192, K=8192), world_size=4, mode="barrier", landing="inbox",
         barrier_sms=64),
]  # fmt: skip


def _facts(triton_dir: Path | None = None) -> tuple[str, list[dict]]:
    done = run_sm90("ordering_probe.py", CONFIGS, triton_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines[0]["triton"], lines[1:]


def _check(facts: list[dict]) -> None:
    waiting = {f["kernel"] for f in facts if f["spins"]}
    # the probe sees the waits at all: every family's fused kernel and the shared wait kernels poll
    assert {"gemm_rs_kernel", "ag_gemm_kernel", "flash_decode_kernel", "gemm_ar_kernel", "wait_chunks_kernel",
            "open_call_kernel", "release_chunk_kernel"} <= waiting  # fmt: skip
    for f in facts:
        where = f"{f['kernel']} of {f['config']}"
        assert f["flag_acquires"] >= f["spins"], f"{where}: {f['spins']} polling loops, {f['flag_acquires']} acquires"
        assert f["unfenced_zeroing"] == [], f"{where}: zeroing with no barrier after the read: {f['unfenced_zeroing']}"
        assert f["unbarriered_handoffs"] == [], f"{where}: one thread's handoff alone: {f['unbarriered_handoffs']}"
        assert f["unfenced_flag_writes"] == [], f"{where}: {f['unfenced_flag_writes']}"
    # a flag to several ranks goes out as one fence and relaxed writes when compiled (`signals.release_ranks`; the
    # interpreter keeps release exchanges): every kernel that releases to every peer has its fence
    fenced = {"gemm_ar_kernel", "allgather_push_kernel", "release_chunk_kernel", "open_call_kernel"}
    assert all(f["sys_fences"] >= 1 for f in facts if f["kernel"] in fenced)
    # the barrier exchange meets twice a call, each meeting a release CAS then an acquire CAS, and every CAS result
    # is handed to every thread of the program (through shared memory and a barrier) before the spin loop reads it
    meets = [f for f in facts if f["kernel"] in ("gemm_ar_meet_kernel", "gemm_rs_meet_kernel", "ag_gemm_meet_kernel")
             and (f["config"] or {}).get("transport") != "barrier_push"]  # fmt: skip
    assert len(meets) == 4
    pushed = [
        f
        for f in facts
        if f["kernel"] in ("gemm_rs_push_meet_kernel", "ag_gemm_inbox_meet_kernel")
        or (f["config"] or {}).get("transport") == "barrier_push"
    ]  # fmt: skip  (one meeting)
    assert len(pushed) == 3
    for f in pushed:
        assert [sem for sem, _ in f["sys_cas"]].count("release") >= 1 and all(h for _, h in f["sys_cas"]), f["config"]
    for f in meets:
        sems = [sem for sem, _ in f["sys_cas"]]
        assert sems.count("release") >= 2 and sems.count("acquire") >= 2, f"{f['config']}: {f['sys_cas']}"
        assert all(handed for _, handed in f["sys_cas"]), f"{f['config']}: a CAS result one thread alone holds"
    by_mode = {((f["config"] or {}).get("family"), (f["config"] or {}).get("mode")): f for f in facts}
    assert by_mode[("ag_gemm", "push")]["sys_fences"] >= 1
    assert by_mode[("flash_decode", "fused")]["sys_fences"] >= 1
    assert by_mode[("gemm_rs", "pull_cublas")]["sys_fences"] >= 1


def test_waits_acquire_and_zeroing_waits_for_every_read_with_this_triton():
    _, facts = _facts()
    _check(facts)


def test_waits_acquire_and_zeroing_waits_for_every_read_with_the_gpu_images_triton():
    version, facts = _facts(gpu_image_triton())
    assert version.startswith("3.6")
    _check(facts)


# TTGIR as Triton prints it (abridged): a tile's stores, then one thread's release of its flag; a wait's acquire,
# then the tile's loads
_STORE = "tt.store %d_ptrs, %acc, %mask : tensor<128x64x!tt.ptr<bf16>, #blocked> loc(#loc1)"
_RELEASE = "%5 = tt.atomic_rmw exch, release, sys, %flag, %epoch, %true : (!tt.ptr<i64>, i64, i1) -> i64 loc(#loc2)"
_COUNT = "%6 = tt.atomic_rmw add, acq_rel, gpu, %count, %c1_i32, %true : (!tt.ptr<i32>, i32, i1) -> i32 loc(#loc3)"
_ACQUIRE = "%7 = tt.atomic_rmw add, acquire, sys, %flag, %c0_i64, %true : (!tt.ptr<i64>, i64, i1) -> i64 loc(#loc4)"
_LOAD = "%8 = tt.load %src, %mask, %cst : tensor<128x64x!tt.ptr<bf16>, #blocked> loc(#loc5)"
_TENSOR_ADDS = "%9 = tt.atomic_rmw fadd, relaxed, gpu, %slot, %acc, %m : (tensor<128x64x!tt.ptr<f32>, #b>, ...) loc(#l)"
_ASYNC_LOAD = "%a = ttg.async_copy_global_to_local %p, %buf mask %m : tensor<128x64x!tt.ptr<bf16>, #b> -> <128x64xbf16>"
_FENCE = (
    '%v = tt.elementwise_inline_asm "fence.acq_rel.sys;\\0A\\09mov.b64 $0, $1;" {constraints = "=l,l", '
    "packed_element = 1 : i32, pure = false} %epoch : i64 -> i64 loc(#loc7)"
)
_RELAXED_FLAG = "%f = tt.atomic_rmw exch, relaxed, sys, %flag, %v, %true : (!tt.ptr<i64>, i64, i1) -> i64 loc(#loc8)"
_TICKET = "%w = tt.atomic_rmw add, relaxed, gpu, %tickets, %c1_i32, %true : (!tt.ptr<i32>, i32, i1) -> i32 loc(#loc6)"


def test_the_handoff_check_flags_a_release_or_acquire_without_its_barrier():
    for barrier in ("gpu.barrier loc(#loc9)", "ttg.barrier local loc(#loc9)"):  # Triton 3.6, 3.9
        assert unbarriered_handoffs("\n".join([_STORE, barrier, _RELEASE])) == []
        assert unbarriered_handoffs("\n".join([_TENSOR_ADDS, barrier, _COUNT, barrier, _LOAD])) == []
        assert unbarriered_handoffs("\n".join([_ACQUIRE, barrier, _LOAD])) == []
    assert len(unbarriered_handoffs("\n".join([_STORE, _RELEASE]))) == 1
    assert len(unbarriered_handoffs("\n".join([_TENSOR_ADDS, "gpu.barrier", _COUNT, _LOAD]))) == 1
    assert len(unbarriered_handoffs("\n".join([_ACQUIRE, _LOAD]))) == 1
    assert len(unbarriered_handoffs("\n".join([_ACQUIRE, _ASYNC_LOAD]))) == 1  # a K loop's pipelined loads
    assert unbarriered_handoffs("\n".join([_ACQUIRE, "gpu.barrier", _ASYNC_LOAD])) == []
    # a relaxed work counter hands nothing over
    assert unbarriered_handoffs("\n".join([_STORE, _TICKET, _LOAD])) == []
    # a fence speaks for the program only behind a barrier
    assert unbarriered_handoffs("\n".join([_STORE, "gpu.barrier", _FENCE, _RELAXED_FLAG])) == []
    assert len(unbarriered_handoffs("\n".join([_STORE, _FENCE, _RELAXED_FLAG]))) == 1


def test_the_fence_check_flags_a_relaxed_flag_write_with_no_fence_before_it():
    assert unfenced_flag_writes("\n".join([_STORE, "gpu.barrier", _FENCE, _RELAXED_FLAG, _RELAXED_FLAG])) == []
    assert len(unfenced_flag_writes("\n".join([_STORE, "gpu.barrier", _RELAXED_FLAG]))) == 1
    assert len(unfenced_flag_writes("\n".join([_FENCE, _STORE, _RELAXED_FLAG]))) == 1
    assert len(unfenced_flag_writes(_RELAXED_FLAG)) == 1
    assert unfenced_flag_writes(_RELEASE) == []  # a release exchange is a handoff of its own
