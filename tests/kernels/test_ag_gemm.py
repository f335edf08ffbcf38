"""AG+GEMM on the CPU: every mode through the same launch plans the GPUs use, W = 2 and 4."""

from __future__ import annotations

import pytest
import torch

from jointtune.errors import ShapeError, SpaceError
from jointtune.kernels import get_family
from jointtune.kernels.ag_gemm import ag_gemm, prepare, reference
from jointtune.kernels.runtime.symm import call_state
from jointtune.kernels.runtime.world import create_world
from jointtune.search_spaces import Problem, get_space
from jointtune.search_spaces._problem import DeviceLimits

TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, SPLIT_K=1)
CONFIGS = {
    "baseline": dict(mode="baseline"),
    "pull": dict(mode="pull", **TILES),
    "push": dict(mode="push", comm_sms=2, chunk_m=16, **TILES),
    "push_one_chunk": dict(mode="push", comm_sms=1, chunk_m=64, **dict(TILES, BLOCK_M=32)),
    "ce_triton": dict(mode="ce", ce_consumer="triton", ce_chunks=2, **TILES),
    "ce_cublas": dict(mode="ce", ce_consumer="cublas", ce_chunks=4),
    "push_cublas_sm": dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=2, chunk_m=16),
    "push_cublas_ce": dict(mode="push_cublas", push_by="ce", gemm_order="local_first", chunk_m=16),
    "push_cublas_sm_gathered": dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=4),
    "push_cublas_ce_gathered": dict(mode="push_cublas", push_by="ce", gemm_order="gathered"),
    # rows pushed into every rank's gathered buffer between two meetings, then one cuBLAS GEMM (more programs than
    # blocks: the grid is trimmed to them)
    "barrier": dict(mode="barrier", landing="direct", barrier_sms=2),
    "barrier_wide": dict(mode="barrier", landing="direct", barrier_sms=128),
    # into inbox halves by the epoch, one meeting, a local copy
    "barrier_inbox": dict(mode="barrier", landing="inbox", barrier_sms=2),
    "barrier_inbox_wide": dict(mode="barrier", landing="inbox", barrier_sms=128),
    # into inbox halves as words tagged with the call, polled, no meeting (odd R x K: the last word half empty)
    "barrier_ll": dict(mode="barrier", landing="ll", barrier_sms=2),
    "barrier_ll_wide": dict(mode="barrier", landing="ll", barrier_sms=128),
}
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
#: (W, R, K, N_r): rows a multiple of 16 (chunks of 16 divide them), and ragged (one chunk of 16 per rank)
SHAPES = [(2, 48, 40, 48), (4, 13, 37, 20)]


def _inputs(W, R, K, N_r, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    a = [(torch.randn(R, K, generator=gen) / K**0.25).to(dtype) for _ in range(W)]
    b = [(torch.randn(K, N_r, generator=gen) / K**0.25).to(dtype) for _ in range(W)]
    return a, b


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def _config(name, R):
    cfg = dict(CONFIGS[name])
    single = max(16, 1 << (R - 1).bit_length())  # one chunk per rank: the space's rule for ragged R
    if "chunk_m" in cfg and R % cfg["chunk_m"] and cfg["chunk_m"] != single:
        cfg["chunk_m"] = single
    return cfg


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("W,R,K,N_r", SHAPES)
def test_every_mode_matches_reference_with_poisoned_output(name, W, R, K, N_r):
    """Ragged shapes (nothing a multiple of the tiles), NaN-poisoned outputs, repeated calls reusing buffers."""
    world = create_world("local", world_size=W)
    for call, dtype in enumerate([torch.bfloat16, torch.float16, torch.bfloat16]):
        a, b = _inputs(W, R, K, N_r, dtype, seed=call)
        out = [torch.full((W * R, N_r), float("nan"), dtype=dtype) for _ in range(W)]
        result = ag_gemm(a, b, world=world, config=_config(name, R), out=out)
        assert all(r is o for r, o in zip(result, out))
        for o, ref in zip(out, reference(a, b)):
            assert not torch.isnan(o).any(), "an output element was never written"
            assert _rel(o, ref) < TOL[dtype]


@pytest.mark.parametrize("name", ["push", "push_cublas_sm", "push_cublas_ce"])
@pytest.mark.parametrize("W,R", [(2, 8), (4, 2)])
def test_chunked_push_at_fewer_rows_than_a_chunk(name, W, R):
    """Decode sizes at TP=W (M = W..8W): one 16-row chunk per rank, the only chunk the space allows there."""
    world = create_world("local", world_size=W)
    a, b = _inputs(W, R, 40, 24, torch.bfloat16, seed=R)
    out = [torch.full((W * R, 24), float("nan"), dtype=torch.bfloat16) for _ in range(W)]
    ag_gemm(a, b, world=world, config=_config(name, R), out=out)
    for o, ref in zip(out, reference(a, b)):
        assert _rel(o, ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "ce_cublas"])
def test_gathered_a_is_returned_and_symmetric_input_needs_no_copy(name):
    W, R, K, N_r = 2, 16, 32, 32
    world = create_world("local", world_size=W)
    a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=7)
    slots = world.empty((R, K), torch.bfloat16)
    for s, x in zip(slots, a):
        s.copy_(x)
    assert world.symmetric_of(slots[0]) is not None
    for _ in range(2):  # the second call alternates inbox halves where a mode has them
        results = ag_gemm(slots, b, world=world, config=_config(name, R), return_gathered=True)
        full = torch.cat(a)
        for (c, gathered), ref in zip(results, reference(a, b)):
            assert torch.equal(gathered, full)
            assert _rel(c, ref) < TOL[torch.bfloat16]


def test_push_modes_share_inboxes_flags_and_the_device_epoch():
    """push and every push_cublas variant alternate on one world with changing chunk counts: every call is
    right, each opened exactly one epoch on the device, and the copy counters end at zero."""
    W, R, K, N_r = 2, 32, 48, 24
    world = create_world("local", world_size=W)
    configs = [
        CONFIGS["push"],
        dict(CONFIGS["push_cublas_sm"], chunk_m=32),
        CONFIGS["push_cublas_ce"],
        dict(CONFIGS["push"], chunk_m=32),
        CONFIGS["push_cublas_sm_gathered"],
        CONFIGS["push_cublas_sm"],
        CONFIGS["push_cublas_ce_gathered"],
        CONFIGS["baseline"],  # opens no epoch
    ]
    for seed, cfg in enumerate(configs):
        a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=seed)
        out = [torch.full((W * R, N_r), float("nan"), dtype=torch.bfloat16) for _ in range(W)]
        for o, ref in zip(ag_gemm(a, b, world=world, config=cfg, out=out), reference(a, b)):
            assert _rel(o, ref) < TOL[torch.bfloat16], cfg
    state = call_state(world)
    assert [state.epoch(i) for i in range(W)] == [len(configs) - 1] * W
    assert all(int(c[1]) == 0 for c in state.counters), "every launch that closed a call reset its arrivals"
    done = world._scratch[("ag_gemm.push_done", torch.int32)]
    assert all(int(t.abs().sum()) == 0 for t in done)
    assert all(int(t.abs().sum()) == 0 for t in world._scratch[("ag_gemm.tickets", torch.int32)])


def test_push_cublas_alternating_dtypes_use_their_own_inboxes():
    """bf16 and fp16 calls have separate inboxes and plans; a fourth call reuses call 2's."""
    W, R, K, N_r = 2, 16, 32, 24
    for name in ("push_cublas_sm", "push_cublas_ce", "push_cublas_sm_gathered", "push"):
        world = create_world("local", world_size=W)
        for call, dtype in enumerate([torch.bfloat16, torch.float16, torch.float16, torch.bfloat16, torch.bfloat16]):
            a, b = _inputs(W, R, K, N_r, dtype, seed=call)
            for o, ref in zip(ag_gemm(a, b, world=world, config=CONFIGS[name]), reference(a, b)):
                assert o.dtype == dtype and _rel(o, ref) < TOL[dtype], (name, call)
        assert sum(1 for k in world.plans if k[0] == "ag_gemm") == 2  # one plan per dtype, built once


def test_four_ranks_mixing_chunk_counts_modes_and_gathered_a():
    """W = 4, ragged rows (slots padded, so no single [M, K] view): calls alternate chunk counts (each count
    has its own flags, one writer per flag), transports, GEMM orders and the fused push; each returns A."""
    W, R, K, N_r = 4, 13, 37, 20
    world = create_world("local", world_size=W)
    configs = [
        dict(CONFIGS["push_cublas_sm"], chunk_m=16),
        CONFIGS["push_cublas_ce_gathered"],
        CONFIGS["barrier"],
        CONFIGS["barrier_inbox"],
        CONFIGS["push_cublas_sm_gathered"],
        dict(CONFIGS["push"], chunk_m=16),
        CONFIGS["barrier_wide"],
        CONFIGS["barrier_inbox_wide"],
        dict(CONFIGS["push_cublas_ce"], chunk_m=16),
    ]
    for seed, cfg in enumerate(configs):
        a, b = _inputs(W, R, K, N_r, torch.float16, seed=seed)
        results = ag_gemm(a, b, world=world, config=cfg, return_gathered=True)
        for (c, gathered), ref in zip(results, reference(a, b)):
            assert torch.equal(gathered, torch.cat(a)), cfg
            assert _rel(c, ref) < TOL[torch.float16], cfg


@pytest.mark.parametrize(("R", "K"), [(7, 41), (16, 24), (5, 9)])
def test_barrier_at_three_ranks(R, K):
    """W = 3, rows whose blocks start unaligned in the gathered buffer (R * K not a multiple of 16), eager calls
    alternating with the copy engine's and NCCL's paths, the gathered A returned."""
    world = create_world("local", world_size=3)
    names = ("barrier", "barrier_inbox", "push_cublas_ce_gathered", "barrier_wide", "barrier_ll", "barrier_inbox_wide",
             "baseline", "barrier_ll_wide", "barrier_inbox", "barrier")  # fmt: skip
    for seed, name in enumerate(names):
        a, b = _inputs(3, R, K, 24, torch.bfloat16, seed=seed)
        results = ag_gemm(a, b, world=world, config=CONFIGS[name], return_gathered=True)
        for (c, gathered), ref in zip(results, reference(a, b)):
            assert torch.equal(gathered, torch.cat(a)), name
            assert _rel(c, ref) < TOL[torch.bfloat16], name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("W", [2, 3, 4])
def test_ll_landing_over_several_blocks_with_an_odd_tail(W, dtype):
    """LL words over blocks split between programs (2: each takes several; 128: trimmed to one a block) with an odd
    R x K (the last word half empty), calls alternating inbox halves and the other landings between: the gathered A
    comes back bit for bit."""
    R, K = 37, 129  # 4773 values a rank: three blocks of MEET_BLOCK, the last one ragged
    world = create_world("local", world_size=W)
    for seed, name in enumerate(("barrier_ll", "barrier_ll_wide", "barrier_inbox", "barrier_ll", "barrier")):
        a, b = _inputs(W, R, K, 24, dtype, seed=seed)
        results = ag_gemm(a, b, world=world, config=CONFIGS[name], return_gathered=True)
        for (c, gathered), ref in zip(results, reference(a, b)):
            assert torch.equal(gathered, torch.cat(a)), name
            assert _rel(c, ref) < TOL[dtype], name


def test_regrown_buffers_leave_older_plans_working():
    """A larger call grows the inbox; the plan built on the smaller one keeps its buffer and stays right."""
    W, K, N_r = 2, 32, 16
    world = create_world("local", world_size=W)
    for R in (16, 48, 16, 48):
        for name in ("push_cublas_ce", "push_cublas_sm_gathered", "push", "barrier_ll"):
            cfg = _config(name, R)
            a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=R)
            for o, ref in zip(ag_gemm(a, b, world=world, config=cfg), reference(a, b)):
                assert _rel(o, ref) < TOL[torch.bfloat16], (R, name)


def test_world_size_one_multiplies_its_own_rows():
    world = create_world("local", world_size=1)
    a, b = _inputs(1, 20, 40, 24, torch.float16, seed=5)
    for name in (
        "push_cublas_sm_gathered",
        "push_cublas_ce_gathered",
        "baseline",
        "ce_cublas",
        "barrier",
        "barrier_inbox",
    ):
        (out,) = ag_gemm(a, b, world=world, config=CONFIGS[name])
        assert _rel(out, reference(a, b)[0]) < TOL[torch.float16]


def test_prepared_call_reissues_the_same_launches_on_new_data():
    """`prepare` binds a call's tensors; `run()` re-issues its launches (new A and B in the same tensors)."""
    W, R, K, N_r = 2, 32, 32, 32
    world = create_world("local", world_size=W)
    a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=0)
    call = prepare(a, b, world=world, config=CONFIGS["push_cublas_sm_gathered"])
    before = call_state(world).epoch()
    for seed in range(1, 4):
        fresh_a, fresh_b = _inputs(W, R, K, N_r, torch.bfloat16, seed=seed)
        for x, y in zip(call.a + call.b, fresh_a + fresh_b):
            x.copy_(y)
        for c in call.c:
            c.fill_(float("nan"))
        for o, ref in zip(call.run(), reference(fresh_a, fresh_b)):
            assert _rel(o, ref) < TOL[torch.bfloat16]
    assert call_state(world).epoch() == before + 3


def test_family_runs_configs_from_the_space():
    """The space's default and enumerated configs run through the family and pass its tolerance."""
    fam = get_family("ag_gemm")
    space = get_space(fam.space)
    problem = Problem.of({"M": 64, "N": 64, "K": 64}, dtype="bfloat16", world_size=2)
    limits = DeviceLimits.nominal_hopper()
    world = create_world("local", world_size=2)
    inputs = fam.make_inputs(problem, world, seed=3)
    ref = fam.reference(inputs)
    picks = [space.default(problem, limits)]
    for mode in ("pull", "push", "push_cublas", "ce"):
        picks.append(
            next(c for c in space.enumerate(problem, limits) if c["mode"] == mode and c.get("BLOCK_K", 32) == 32)
        )
    for cfg in picks:
        assert fam.max_error(fam.run(inputs, cfg, world), ref) <= fam.tolerance(problem.dtype), cfg
    assert fam.max_error(fam.baseline(inputs, world), ref) <= fam.tolerance(problem.dtype)
    assert fam.key(inputs.a, inputs.b, world=world) == {"M": 64, "N": 64, "K": 64}


def test_configs_are_checked_by_the_space_once_and_name_the_field():
    world = create_world("local", world_size=2)
    a, b = _inputs(2, 8, 16, 8, torch.float16, seed=0)
    with pytest.raises(SpaceError, match=r"mode: 'teleport' is not allowed"):
        ag_gemm(a, b, world=world, config={"mode": "teleport"})
    # a mode's counts must be given: an empty push grid would leave its peers waiting forever
    with pytest.raises(SpaceError, match=r'comm_sms: missing \(required with mode="push_cublas", push_by="sm"\)'):
        ag_gemm(a, b, world=world, config={"mode": "push_cublas", "push_by": "sm", "gemm_order": "gathered"})
    with pytest.raises(SpaceError, match=r"chunk_m: missing"):
        ag_gemm(a, b, world=world, config=dict(TILES, mode="push", comm_sms=2))
    with pytest.raises(SpaceError, match=r"push_by: 'dma' is not allowed; allowed: \"sm\", \"ce\""):
        ag_gemm(a, b, world=world, config={"mode": "push_cublas", "push_by": "dma", "gemm_order": "gathered"})
    with pytest.raises(SpaceError, match=r"chunk_m: 64 is not allowed for R=8"):
        ag_gemm(a, b, world=world, config={"mode": "push_cublas", "push_by": "ce", "gemm_order": "local_first",
                                           "chunk_m": 64})  # fmt: skip
    with pytest.raises(SpaceError, match=r"config: .* is not allowed; it must be a mapping"):
        ag_gemm(a, b, world=world, config={"mode": ["baseline"]})
    assert not world.plans.get(("call_state",)), "a refused config allocated nothing"


def test_bad_tensors_name_the_field():
    world = create_world("local", world_size=2)
    a, b = _inputs(2, 8, 16, 8, torch.float16, seed=0)
    with pytest.raises(ShapeError, match="shapes"):
        ag_gemm(a, [b[0], b[1][:4]], world=world, config={"mode": "baseline"})
    with pytest.raises(ShapeError, match="dtype"):
        ag_gemm([x.float() for x in a], [x.float() for x in b], world=world, config={"mode": "baseline"})
    with pytest.raises(ShapeError, match="one tensor per local rank"):
        ag_gemm(a[:1], b[:1], world=world, config={"mode": "baseline"})
    with pytest.raises(ShapeError, match="out"):
        ag_gemm(a, b, world=world, config={"mode": "baseline"}, out=[torch.empty(3, 3)] * 2)
    with pytest.raises(ShapeError, match="out"):  # C must be row-major: the kernels write it so
        ag_gemm(a, b, world=world, config={"mode": "baseline"}, out=[torch.empty(8, 16).t()] * 2)
    with pytest.raises(ShapeError, match="2-D"):
        ag_gemm([x[0] for x in a], b, world=world, config={"mode": "baseline"})
    fam = get_family("ag_gemm")
    with pytest.raises(ShapeError, match="divisible by world_size"):
        fam.make_inputs(Problem.of({"M": 9, "N": 8, "K": 8}, dtype="fp16", world_size=2), world, seed=0)


def test_non_contiguous_and_transposed_operands():
    """A as a strided view is copied in; B as a transposed view keeps its strides (a plan of its own)."""
    W, R, K, N_r = 2, 16, 32, 32
    world = create_world("local", world_size=W)
    a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=11)
    a_strided = [torch.cat([x, x], dim=1)[:, ::2] for x in a]
    b_t = [x.t().contiguous().t() for x in b]
    for name in ("pull", "push", "push_cublas_sm_gathered", "ce_triton"):
        for o, ref in zip(ag_gemm(a_strided, b_t, world=world, config=CONFIGS[name]), reference(a_strided, b)):
            assert _rel(o, ref) < TOL[torch.bfloat16], name


@pytest.mark.parametrize("mode", ["pull", "push", "ce"])
def test_split_k_reduces_partial_sums_and_leaves_its_workspace_clean(mode):
    """Split-K tiles meet in an fp32 slot; the last split writes C and zeroes slot and counter."""
    W, R, K, N_r = 2, 24, 256, 40
    world = create_world("local", world_size=W)
    cfg = dict(TILES, SPLIT_K=4, mode=mode)
    cfg.update({"push": dict(comm_sms=2, chunk_m=32), "ce": dict(ce_consumer="triton", ce_chunks=2)}.get(mode, {}))
    for seed in range(2):  # the second call relies on the first leaving the workspace zeroed
        a, b = _inputs(W, R, K, N_r, torch.bfloat16, seed=seed)
        for o, ref in zip(ag_gemm(a, b, world=world, config=cfg), reference(a, b)):
            assert _rel(o, ref) < TOL[torch.bfloat16]
    for (name, _), buf in world._scratch.items():
        if name.startswith(("ag_gemm.splitk", "ag_gemm.tickets", "ag_gemm.push_done")):
            assert all(int(t.abs().sum()) == 0 for t in buf), name
