"""Flags carried in the data (`jointtune.kernels.runtime.ll`): 16-bit values packed two to a word and back bit for bit
(NaN, infinities and negative zero included) with the tag in the other half; a reader that takes words only once they
carry its tag, between processes in the interpreter (bench/ops/ll_litmus.py's ping-pong, two forked ranks sharing its
buffer through a file); and the compiled form for Hopper under the GPU image's Triton (3.6): the writer's
strong 64-bit stores and no fence in GEMM+AR's and GEMM+RS's LL forms, against their flagged forms."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from sm90 import child_env, gpu_image_triton, run_in_session

from jointtune.kernels.runtime.ll import ll_pack16, ll_store, ll_tag, ll_unpack16, ll_wait

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def _round_trip_kernel(x_ptr, words_ptr, y_ptr, epoch, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    w = tl.arange(0, COLS // 2)
    tag = ll_tag(epoch)
    at = r[:, None] * (COLS // 2) + w[None, :]
    ll_store(words_ptr + at, ll_pack16(tl.load(x_ptr + r[:, None] * COLS + c[None, :]), tag, ROWS, COLS), at >= 0)
    got = ll_wait(words_ptr + at, at >= 0, tag)
    tl.store(y_ptr + r[:, None] * COLS + c[None, :], ll_unpack16(got, ROWS, COLS, y_ptr.dtype.element_ty))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_values_survive_packing_bit_for_bit_and_words_carry_the_tag(dtype):
    x = torch.randn(4, 32).to(dtype)
    x.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=dtype)
    words = torch.zeros(4 * 16, dtype=torch.int64)
    y = torch.empty_like(x)
    epoch = (7 << 32) + 5  # the tag is the epoch's low 32 bits
    _round_trip_kernel[(1,)](x, words, y, epoch, ROWS=4, COLS=32)
    assert torch.equal(y.view(torch.int16), x.view(torch.int16))
    assert set((words >> 32).tolist()) == {5}
    low = (words & 0xFFFF).to(torch.int16)  # column 2j in word j's low half, 2j + 1 in its high half
    assert torch.equal(low, x.view(torch.int16).view(4, 16, 2)[..., 0].reshape(-1))


def test_a_reader_waits_for_its_tag_between_processes_in_the_interpreter(tmp_path):
    """bench/ops/ll_litmus.py's ping-pong between two forked ranks: the follower polls before the leader writes, every
    value of every round arrives as sent (the follower counts the others), and each case ends."""
    run_in_session([sys.executable, __file__, "pingpong", str(tmp_path)],
                   child_env(str(ROOT / "bench"), TRITON_INTERPRET="1"), timeout=240)  # fmt: skip
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert outs[0]["took"] == outs[1]["took"] == [True, True, True]
    assert outs[1]["wrong"] == [0, 0, 0]
    # the last round of the last case (tags 1..3, 4..6, 7..8): rank 1's `to` words, rank 0's answers
    assert outs[1]["to_tags"] == [8] * 4 and outs[0]["back_tags"] == [8, 8]


@pytest.mark.timeout(600)
def test_the_ll_form_of_gemm_ar_compiles_to_strong_stores_with_no_fence():
    """With the GPU image's Triton (3.6) where `make test` installed it: GEMM+AR's one-shot and two-shot LL calls (the
    tile GEMM; cuBLAS's copied tiles with the RMSNorm epilogue) and GEMM+RS's tiles over every rank's rows with LL
    words store their words with st.relaxed.sys and have no system-scope fence (nothing is flagged), where the same
    calls with flags have their fence and no such store (the control).
    That the reader's volatile polls see the words is checked where they run: between processes above, on GPUs by
    bench/ops/ll_litmus.py and gemm_ar_check.py."""
    out = run_in_session([sys.executable, __file__, "compile"], child_env(str(gpu_image_triton())), timeout=500)
    facts = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(facts) == 14
    for f in facts:
        if f["transport"] == "ll":
            assert f["strong_word_stores"] > 0 and f["sys_fences"] == 0, f
        else:
            assert f["strong_word_stores"] == 0 and f["sys_fences"] > 0, f
    assert "triton 3.6" in out


def _pingpong(folder: Path) -> None:
    """Rank 0 here, rank 1 forked (before any thread runs), each buffer in a file both map."""
    from ops import ll_litmus as lit

    words = lit.MAX_WORDS + lit.MAX_PROGRAMS
    (folder / "words").write_bytes(bytes(2 * words * 8))
    pid = os.fork()
    rank = 1 if pid == 0 else 0
    code = 1
    try:
        shared = torch.from_file(str(folder / "words"), shared=True, size=2 * words, dtype=torch.int64)

        halves = [shared[p * words : (p + 1) * words] for p in (0, 1)]
        buffer = SimpleNamespace(tensors=[halves[rank]], peers=[halves])  # the symmetric buffer's fields it reads
        pp = lit.LLPingPong(rank, buffer)
        took, wrong = [], []
        for case in (dict(programs=1, rounds=3, elements=0), dict(programs=2, rounds=3, elements=64, check=True),
                     dict(programs=2, rounds=2, elements=1024, check=True)):  # fmt: skip
            took.append(pp.launch(**case))
            wrong.append(int(pp.wrong.sum()))
        own = halves[rank]
        result = {"took": took, "wrong": wrong, "to_tags": (own[:4] >> 32).tolist(),
                  "back_tags": (own[lit.MAX_WORDS : lit.MAX_WORDS + 2] >> 32).tolist()}  # fmt: skip
        (folder / f"rank{rank}.json").write_text(json.dumps(result))
        code = 0
    finally:
        if pid == 0:
            os._exit(code)
    if os.waitpid(pid, 0)[1] != 0:
        sys.exit("rank 1 failed")


def _compile() -> None:
    """Lower GEMM+AR's and GEMM+RS's LL configs (and their flagged controls) for sm_90; print what their PTX holds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from aot_compile import config_launches, lower

    tile = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, SPLIT_K=1, num_warps=4, num_stages=4)
    configs = []
    for transport in ("ll", "push"):
        flags = {} if transport == "ll" else {"tiles_per_flag": 1}
        configs += [
            dict(family="gemm_ar", shape=dict(M=8, N=8192, K=8192), world_size=4, mode="one_shot", gemm="triton",
                 transport=transport, comm_sms=0, **tile, **flags),
            dict(family="gemm_ar_rmsnorm", shape=dict(M=8, N=5120, K=8192), world_size=2, mode="one_shot",
                 gemm="cublas", transport=transport, comm_sms=64, **flags),
            # two-shot: words to the owners and back (the tile GEMM; cuBLAS's copied tiles with the RMSNorm epilogue)
            dict(family="gemm_ar", shape=dict(M=32, N=8192, K=8192), world_size=4, mode="two_shot", gemm="triton",
                 transport=transport, comm_sms=0, **dict(tile, BLOCK_M=32), **flags),
            dict(family="gemm_ar_rmsnorm", shape=dict(M=64, N=8192, K=8192), world_size=4, mode="two_shot",
                 gemm="cublas", transport=transport, comm_sms=64, **flags),
            dict(family="gemm_rs", shape=dict(M=64, N=8192, K=8192), world_size=2, mode="push", reduce_by="tile",
                 handoff="ll" if transport == "ll" else "flag", **dict(tile, BLOCK_M=64)),
            # the seeds' forms at 65-128 rows (8 warps, 128-row tiles) and with split-K
            dict(family="gemm_rs", shape=dict(M=128, N=8192, K=8192), world_size=2, mode="push", reduce_by="tile",
                 handoff="ll" if transport == "ll" else "flag", **dict(tile, BLOCK_M=128, num_warps=8)),
            dict(family="gemm_rs", shape=dict(M=64, N=2048, K=16384), world_size=4, mode="push", reduce_by="tile",
                 handoff="ll" if transport == "ll" else "flag", **dict(tile, BLOCK_M=64, SPLIT_K=4)),
        ]  # fmt: skip
    for config in configs:
        for kernel, named, options in config_launches(config):
            ptx = lower(kernel, named, options).asm["ptx"]
            ll = config.get("transport", config.get("handoff")) == "ll"
            print(json.dumps({"family": config["family"], "transport": "ll" if ll else "flag",
                              "strong_word_stores": ptx.count("st.relaxed.sys.global.b64"),
                              "sys_fences": ptx.count("fence.acq_rel.sys")}))  # fmt: skip
    print(f"triton {triton.__version__}")


if __name__ == "__main__":
    if sys.argv[1] == "pingpong":
        _pingpong(Path(sys.argv[2]))
    else:
        _compile()
