"""AG+GEMM under (CPU-recorded) graph replay: every mode at W = 2 and 4 stays correct when a captured call
is replayed with new data, between eager calls of the same and other modes, and alternated with a
second captured call of another shape and config.

`capture.py` freezes a call's launches as a CUDA graph does (same kernels, grids, pointers, integers)
and re-issues them; outputs are NaN-poisoned before every replay and checked against the fp32
reference. The interpreter runs ranks one after another, so a wait that a stale epoch lets through
still finds its data in place: the tests also check that every replay armed the waits it runs,
i.e. raised each flag to an epoch no earlier call used. On 37d9ad0 (epochs and inbox halves passed
from host counters) `test_replays_arm_their_waits_and_stay_correct` fails there: the flags of every
replay stay at the capture's epoch.
"""

from __future__ import annotations

import pytest
import torch
from capture import capture

from jointtune.kernels.ag_gemm import ag_gemm, reference
from jointtune.kernels.runtime.symm import call_state
from jointtune.kernels.runtime.world import create_world

TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, SPLIT_K=1)
CONFIGS = {
    "baseline": dict(mode="baseline"),
    "pull": dict(mode="pull", **TILES),
    "push": dict(mode="push", comm_sms=2, chunk_m=16, **TILES),
    "push_split_k": dict(mode="push", comm_sms=2, chunk_m=16, **dict(TILES, SPLIT_K=2)),
    "ce_triton": dict(mode="ce", ce_consumer="triton", ce_chunks=2, **TILES),
    "ce_cublas": dict(mode="ce", ce_consumer="cublas", ce_chunks=2),
    "push_cublas_sm": dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=2, chunk_m=16),
    "push_cublas_ce": dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=16),
    "push_cublas_sm_gathered": dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=2),
    "push_cublas_ce_gathered": dict(mode="push_cublas", push_by="ce", gemm_order="gathered"),
    "barrier": dict(mode="barrier", landing="direct", barrier_sms=4),
    "barrier_inbox": dict(mode="barrier", landing="inbox", barrier_sms=4),
    "barrier_ll": dict(mode="barrier", landing="ll", barrier_sms=4),
}
FLAGGED = {"push", "push_split_k", "push_cublas_sm", "push_cublas_ce", "push_cublas_sm_gathered",
           "push_cublas_ce_gathered"}  # fmt: skip
EPOCHED = {"barrier_inbox", "barrier_ll"}
LL = {"barrier_ll"}
TOL = 1.5e-2


class Call:
    """Fixed input and output tensors of one call site (what a captured graph reads and writes)."""

    def __init__(self, world, R, K, N_r, seed):
        W = world.world_size
        self.world, self.gen = world, torch.Generator().manual_seed(seed)
        self.a = [torch.empty(R, K, dtype=torch.bfloat16) for _ in range(W)]
        self.b = [torch.empty(K, N_r, dtype=torch.bfloat16) for _ in range(W)]
        self.out = [torch.empty(W * R, N_r, dtype=torch.bfloat16) for _ in range(W)]
        self.fresh()

    def fresh(self):
        """New random A and B in the same tensors, NaN in every output element."""
        for x in self.a + self.b:
            x.copy_(torch.randn(x.shape, generator=self.gen) / x.shape[-1] ** 0.25)
        for o in self.out:
            o.fill_(float("nan"))

    def __call__(self, config):
        return ag_gemm(self.a, self.b, world=self.world, config=config, out=self.out)

    def error(self):
        return max(((o.float() - r).norm() / r.norm()).nan_to_num(float("inf")).item()
                   for o, r in zip(self.out, reference(self.a, self.b)))  # fmt: skip


def _flag_high(world):
    """The highest epoch any push flag of the world holds."""
    return max((int(t.max()) for (n, _), buf in world._buffers.items() if ".flags." in n for t in buf.tensors),
               default=0)  # fmt: skip


def _ll_high(world):
    """The newest tag AG+GEMM's LL words carry (their high 32 bits): a replay that wrote an earlier call's tag would
    not move it."""
    return max((int((t >> 32).max()) for (n, _), buf in world._buffers.items() if n == "ag_gemm.ll_inbox"
                for t in buf.tensors), default=0)  # fmt: skip


def _captured(call, config):
    call(config)  # warm-up: the plan is built (and kernels compiled) before capture, as on a GPU
    call.fresh()
    with capture() as graph:
        call(config)
    assert call.error() < TOL
    return graph


def _replay(graph, call, name):
    call.fresh()
    high, ll_high, epoch = _flag_high(call.world), _ll_high(call.world), call_state(call.world).epoch()
    graph.replay()
    assert call.error() < TOL, f"{name}: wrong result after a replay"
    if name in LL:
        assert _ll_high(call.world) > ll_high, f"{name}: a replay's words kept an earlier call's tag"
    if name in FLAGGED:
        assert _flag_high(call.world) > high, f"{name}: a replay's flags kept an earlier call's epoch"
    if name in EPOCHED:  # no flags, but inbox halves: a replay opens a call of its own, so it lands in the other half
        assert call_state(call.world).epoch() == epoch + 1, f"{name}: a replay kept an earlier call's epoch"


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("W", [2, 4])
def test_replays_arm_their_waits_and_stay_correct(name, W):
    world = create_world("local", world_size=W)
    site = Call(world, 32, 128, 32, seed=1)
    graph = _captured(site, CONFIGS[name])
    for _ in range(3):
        _replay(graph, site, name)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("W", [2, 4])
def test_replays_interleave_with_eager_calls_and_other_modes(name, W):
    """Replays of one graph between eager calls of the same mode (other tensors) and of other modes."""
    world = create_world("local", world_size=W)
    site, other = Call(world, 32, 128, 32, seed=2), Call(world, 16, 128, 16, seed=3)
    graph = _captured(site, CONFIGS[name])
    others = [n for n in CONFIGS if n not in (name, "push_split_k")]
    for k in range(2):
        _replay(graph, site, name)
        for eager in (name, others[(3 * k + W) % len(others)]):
            other.fresh()
            other(CONFIGS[eager])
            assert other.error() < TOL, f"eager {eager} after a replay of {name}"


@pytest.mark.parametrize("W", [2, 4])
def test_two_graphs_of_other_shapes_and_configs_alternate(W):
    """Two captured calls (different shapes, chunk counts and modes sharing inboxes and flags) replayed in
    alternation, with an eager call of a third config between rounds."""
    world = create_world("local", world_size=W)
    pairs = [("push_cublas_sm_gathered", "push"), ("push_cublas_ce", "push_cublas_sm_gathered"),
             ("push_cublas_sm", "push_cublas_ce_gathered"), ("pull", "ce_triton"), ("barrier_inbox", "barrier"),
             ("push", "barrier_inbox"), ("barrier_ll", "barrier_inbox"), ("push_cublas_sm", "barrier_ll")]  # fmt: skip
    for first, second in pairs:
        one, two = Call(world, 32, 48, 32, seed=4), Call(world, 16, 40, 48, seed=5)
        g1, g2 = _captured(one, CONFIGS[first]), _captured(two, CONFIGS[second])
        third = Call(world, 32, 32, 16, seed=6)
        for _ in range(2):
            _replay(g1, one, first)
            _replay(g2, two, second)
            third.fresh()
            third(CONFIGS["push_cublas_sm"])
            assert third.error() < TOL


def test_capture_refuses_a_host_read():
    """The recorder refuses what CUDA graph capture refuses (a sanity check of the CPU stand-in)."""
    from capture import CaptureError

    t = torch.ones(2)
    with pytest.raises(CaptureError, match="host read"), capture():
        (t + 1).sum().item()
