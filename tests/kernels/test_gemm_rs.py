"""GEMM+RS on simulated ranks (CPU interpreter): every mode against the fp32 reference at W = 2 and 4, on ragged
shapes, with poisoned outputs, repeated calls, symmetric and ordinary inputs, prepared-launch replays, CPU-recorded
graph replays interleaved with eager calls of other modes and of AG+GEMM (one epoch counter for both), and the
errors a caller meets."""

from __future__ import annotations

import pytest
import torch
from capture import capture

from jointtune.errors import ShapeError, SpaceError
from jointtune.kernels import get_family
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.gemm_rs import config_json, gemm_rs, prepare, reference
from jointtune.kernels.runtime.symm import call_state
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import Problem, get_space

TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, SPLIT_K=1)
CONFIGS = {
    "baseline": dict(mode="baseline"),
    "push": dict(mode="push", chunk_m=16, reduce_by="programs", reduce_sms=2, tile_order="peers_first", **TILES),
    "push_split_k": dict(
        mode="push", chunk_m=16, reduce_by="programs", reduce_sms=1, tile_order="peers_first", **dict(TILES, SPLIT_K=2)
    ),
    "pull": dict(
        mode="pull", chunk_m=16, reduce_by="programs", reduce_sms=2, tile_order="own_first", **dict(TILES, BLOCK_M=32)
    ),
    # every SM on the GEMM; the own rows' tiles (last) sum the peers' in their epilogue
    "push_epilogue_split_k": dict(mode="push", chunk_m=16, reduce_by="epilogue", **dict(TILES, SPLIT_K=2)),
    "pull_epilogue": dict(mode="pull", chunk_m=16, reduce_by="epilogue", **dict(TILES, BLOCK_M=32)),
    # tiles over every rank's rows (a 64-row tile holds several ranks' rows), a flag per tile
    "push_tile": dict(mode="push", reduce_by="tile", **dict(TILES, BLOCK_M=64)),
    "pull_tile_split_k": dict(mode="pull", reduce_by="tile", **dict(TILES, SPLIT_K=2)),
    # the same pushed as LL words (`runtime.ll`: no flag, the owner polls the words); split-K
    "push_tile_ll": dict(mode="push", reduce_by="tile", handoff="ll", **dict(TILES, BLOCK_M=64)),
    "push_tile_ll_split_k": dict(mode="push", reduce_by="tile", handoff="ll", **dict(TILES, SPLIT_K=2)),
    "atomic": dict(mode="atomic", chunk_m=16, reduce_sms=4, tile_order="peers_first", **dict(TILES, BLOCK_N=64)),
    "pull_cublas": dict(mode="pull_cublas", reduce_sms=2),
    # cuBLAS, then one launch between two meetings (more programs than blocks: the grid is trimmed to them)
    "barrier": dict(mode="barrier", transport="pull", reduce_sms=2),
    "barrier_wide": dict(mode="barrier", transport="pull", reduce_sms=64),
    # pushed into the owners' inboxes (halves by the epoch), one meeting
    "barrier_push": dict(mode="barrier", transport="push", reduce_sms=2),
    "barrier_push_wide": dict(mode="barrier", transport="push", reduce_sms=64),
    "ce_cublas": dict(mode="ce", ce_consumer="cublas", ce_chunks=2, reduce_sms=2),
    "ce_triton": dict(mode="ce", ce_consumer="triton", ce_chunks=2, reduce_sms=1, **TILES),
}
LL = {name for name, c in CONFIGS.items() if c.get("handoff") == "ll"}
BARRIER = {name for name, c in CONFIGS.items() if c["mode"] == "barrier"}
FLAGGED = set(CONFIGS) - {"baseline"} - LL - BARRIER
#: (M, N, K_r) per world size: rows per rank that no tile or chunk divides, N and K_r not multiples of blocks
SHAPES = {2: (52, 40, 40), 4: (56, 36, 24)}
#: split-K needs each split two BLOCK_K steps deep
SPLIT_K_DEPTH = 130


def _shape(name, W):
    M, N, K_r = SHAPES[W]
    return (M, N, SPLIT_K_DEPTH) if "split_k" in name else (M, N, K_r)


TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}


class Call:
    """Fixed input and output tensors of one call site (what a captured graph reads and writes)."""

    def __init__(self, world, M, N, K_r, seed, dtype=torch.bfloat16, symmetric=False):
        W = world.world_size
        self.world, self.dtype, self.gen = world, dtype, torch.Generator().manual_seed(seed)
        self.a = world.empty((M, K_r), dtype) if symmetric else [torch.empty(M, K_r, dtype=dtype) for _ in range(W)]
        self.b = [torch.empty(K_r, N, dtype=dtype) for _ in range(W)]
        self.out = [torch.empty(M // W, N, dtype=dtype) for _ in range(W)]
        self.fresh()

    def fresh(self):
        """New random A and B in the same tensors, NaN in every output element."""
        for x in self.a + self.b:
            x.copy_(torch.randn(x.shape, generator=self.gen) / x.shape[-1] ** 0.25)
        for o in self.out:
            o.fill_(float("nan"))

    def __call__(self, config):
        return gemm_rs(self.a, self.b, world=self.world, config=config, out=self.out)

    def error(self):
        return max(((o.float() - r).norm() / r.norm()).nan_to_num(float("inf")).item()
                   for o, r in zip(self.out, reference(self.a, self.b)))  # fmt: skip


def _flag_high(world):
    return max((int(t.max()) for (n, _), buf in world._buffers.items() if ".flags." in n for t in buf.tensors),
               default=0)  # fmt: skip


def _signals_high(world):
    return max(int(t.abs().max()) for (n, _), buf in world._buffers.items() if n == "gemm_rs.meet_signals"
               for t in buf.tensors)  # fmt: skip


def _ll_high(world):
    """The newest tag LL words carry (their high 32 bits): a replay that wrote an earlier call's tag would not move
    it."""
    return max((int((t >> 32).max()) for (n, _), buf in world._buffers.items() if n == "gemm_rs.ll_inbox"
                for t in buf.tensors), default=0)  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("W", [2, 4])
def test_every_mode_matches_the_reference_on_ragged_shapes(name, W):
    world = LocalWorld(world_size=W)
    call = Call(world, *_shape(name, W), seed=W)
    for _ in range(3):  # repeated calls: buffers, counters and flags are handed back ready
        call.fresh()
        result = call(CONFIGS[name])
        assert result is call.out or all(x is y for x, y in zip(result, call.out))
        assert call.error() < TOL[torch.bfloat16], name


@pytest.mark.parametrize("name", ["push", "pull", "ce_triton", "push_tile_ll"])
def test_float16_and_symmetric_inputs(name):
    world = LocalWorld(world_size=2)
    call = Call(world, 64, 48, 40, seed=7, dtype=torch.float16, symmetric=True)
    assert world.symmetric_of(call.a[0]) is not None
    call(CONFIGS[name])
    assert call.error() < TOL[torch.float16]


def test_deterministic_modes_repeat_bit_for_bit():
    world = LocalWorld(world_size=2)
    call = Call(world, 52, 40, 40, seed=3)
    for name in ("push", "pull", "ce_triton", "pull_epilogue", "push_tile", "push_tile_ll"):
        first = [o.clone() for o in call(CONFIGS[name])]
        second = call(CONFIGS[name])
        assert all(torch.equal(x, y) for x, y in zip(first, second)), name


def test_tensor_in_tensor_out_on_one_rank():
    world = LocalWorld(world_size=1)
    a, b = torch.randn(20, 24).bfloat16(), torch.randn(24, 40).bfloat16()
    out = gemm_rs(a, b, world=world, config=CONFIGS["push"])
    assert isinstance(out, torch.Tensor) and out.shape == (20, 40)
    assert ((out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()) < TOL[torch.bfloat16]


#: W = 4 replays for one config of each way a call keeps its state (epoch halves, exit handshake, entry
#: handshake, none); every mode runs at W = 4 eagerly above, and every mode replays at W = 2
REPLAYS = [(name, 2) for name in CONFIGS] + [
    (name, 4)
    for name in (
        "push",
        "atomic",
        "pull_cublas",
        "barrier",
        "barrier_push",
        "ce_cublas",
        "baseline",
        "pull_epilogue",
        "push_tile",
        "push_tile_ll",
    )
]


@pytest.mark.parametrize(("name", "W"), REPLAYS)
def test_replays_arm_their_waits_and_stay_correct(name, W):
    world = LocalWorld(world_size=W)
    call = Call(world, *_shape(name, W), seed=11)
    call(CONFIGS[name])  # warm-up: the plan is built before capture, as on a GPU
    call.fresh()
    with capture() as graph:
        call(CONFIGS[name])
    for _ in range(3):
        call.fresh()
        high, ll_high, epoch = _flag_high(world), _ll_high(world), call_state(world).epoch()
        graph.replay()
        assert call.error() < TOL[torch.bfloat16], f"{name}: wrong result after a replay"
        if name in BARRIER:  # meetings leave their signals at 0: nothing lives across calls
            assert _signals_high(world) == 0, f"{name}: a replay left a signal set"
        if CONFIGS[name].get("transport") == "push":  # inbox halves: a replay opens a call, landing in the other half
            assert call_state(world).epoch() == epoch + 1, f"{name}: a replay kept an earlier call's epoch"
        if name in FLAGGED:
            assert _flag_high(world) > high, f"{name}: a replay's flags kept an earlier call's epoch"
        if name in LL:
            assert _ll_high(world) > ll_high, f"{name}: a replay's words kept an earlier call's tag"


def test_ll_words_and_flags_give_the_same_bits():
    # the same tiles, rows rounded once where they travel and summed in the same order: any difference is a bug
    world = LocalWorld(world_size=4)
    call = Call(world, *SHAPES[4], seed=9)
    flagged = [o.clone() for o in call(CONFIGS["push_tile"])]
    for o in call.out:
        o.fill_(float("nan"))
    assert all(torch.equal(x, y) for x, y in zip(flagged, call(CONFIGS["push_tile_ll"])))


@pytest.mark.parametrize("W", [2, 3])
def test_ll_words_with_an_odd_width(W):
    # the last word of every row holds one value; 3 ranks: a 64-row tile holds every rank's rows
    world = LocalWorld(world_size=W)
    call = Call(world, 21 * W, 41, 40, seed=W)
    for _ in range(2):
        call.fresh()
        call(CONFIGS["push_tile_ll"])
        assert call.error() < TOL[torch.bfloat16]


@pytest.mark.parametrize(("W", "N", "transport"), [(3, 36, "pull"), (3, 41, "push"), (4, 9, "push"), (3, 9, "pull")])
def test_barrier_at_three_ranks_and_unaligned_rows(W, N, transport):
    # 18 rows a rank: with N = 41 or 9 no rank's rows start 16-element aligned; a replay between eager calls of the
    # other transport (the pushed inbox's halves follow the epoch the pulled launch leaves alone)
    world = LocalWorld(world_size=W)
    call = Call(world, 18 * W, N, 24, seed=N)
    mine = "barrier" if transport == "pull" else "barrier_push"
    other = "barrier_push_wide" if transport == "pull" else "barrier_wide"
    call(CONFIGS[mine])
    with capture() as graph:
        call(CONFIGS[mine])
    for _ in range(3):
        call.fresh()
        graph.replay()
        assert call.error() < TOL[torch.bfloat16]
        call.fresh()
        call(CONFIGS[other])
        assert call.error() < TOL[torch.bfloat16]


def test_replays_interleave_with_eager_calls_other_modes_and_ag_gemm():
    world = LocalWorld(world_size=2)
    call = Call(world, 52, 40, 40, seed=5)
    other = Call(world, 36, 44, 24, seed=6)
    ag_a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    ag_b = [torch.randn(32, 16).bfloat16() for _ in range(2)]
    ag_cfg = dict(mode="push", comm_sms=2, chunk_m=16, **TILES)
    graphs = {}
    for name in ("push", "atomic", "pull", "pull_epilogue", "push_tile", "push_tile_ll", "barrier", "barrier_push"):
        call(CONFIGS[name])
        with capture() as graph:
            call(CONFIGS[name])
        graphs[name] = graph
    other(CONFIGS["ce_triton"])
    for step in range(2):
        for name, graph in graphs.items():
            call.fresh()
            graph.replay()
            assert call.error() < TOL[torch.bfloat16], f"replay {step} of {name}"
            other.fresh()
            other(CONFIGS[("barrier_push_wide", "barrier_wide", "push")[step % 3]])
            assert other.error() < TOL[torch.bfloat16]
            c = ag_gemm(ag_a, ag_b, world=world, config=ag_cfg)
            want = torch.cat([x.float() for x in ag_a]) @ ag_b[0].float()
            assert ((c[0].float() - want).norm() / want.norm()) < TOL[torch.bfloat16]


@pytest.mark.parametrize("name", ["push", "ce_cublas", "barrier", "barrier_push"])
def test_prepared_calls_read_new_inputs(name):
    world = LocalWorld(world_size=2)
    call = Call(world, 52, 40, 40, seed=9)
    prepared = prepare(call.a, call.b, world=world, config=CONFIGS[name], out=call.out)
    for _ in range(2):
        call.fresh()
        result = prepared.run()
        assert all(x is y for x, y in zip(result, call.out))
        assert call.error() < TOL[torch.bfloat16]


def test_bad_calls_name_the_argument():
    world = LocalWorld(world_size=2)
    a = [torch.randn(10, 8).bfloat16() for _ in range(2)]
    b = [torch.randn(8, 16).bfloat16() for _ in range(2)]
    with pytest.raises(ShapeError, match=r"M=10 rows|divisible"):
        gemm_rs([x[:9] for x in a], b, world=world, config=CONFIGS["baseline"])
    with pytest.raises(ShapeError, match="dtype"):
        gemm_rs(a, [x.half() for x in b], world=world, config=CONFIGS["baseline"])
    with pytest.raises(ShapeError, match="shapes"):
        gemm_rs(a, [b[0], b[1][:4]], world=world, config=CONFIGS["baseline"])
    with pytest.raises(ShapeError, match="out"):
        gemm_rs(a, b, world=world, config=CONFIGS["baseline"], out=[torch.empty(5, 15).bfloat16()] * 2)
    with pytest.raises(SpaceError, match="reduce_sms"):
        gemm_rs(a, b, world=world, config=dict(CONFIGS["push"], reduce_sms=3))
    with pytest.raises(SpaceError, match="comm_sms"):
        gemm_rs(a, b, world=world, config=dict(CONFIGS["push"], comm_sms=2))
    with pytest.raises(SpaceError, match="tile_order"):
        gemm_rs(a, b, world=world, config=dict(CONFIGS["push"], tile_order="sideways"))
    # no backward: a weight that requires grad would silently never learn, so grad mode refuses it by name
    weights = [x.clone().requires_grad_() for x in b]
    with pytest.raises(ShapeError, match=r"b: requires grad, and gemm_rs is forward-only .* torch\.no_grad\(\)"):
        gemm_rs(a, weights, world=world, config=CONFIGS["baseline"])
    with torch.no_grad():
        assert gemm_rs(a, weights, world=world, config=CONFIGS["baseline"])[0].shape == (5, 16)
    # True == 1 and hashes alike: a cached plan of reduce_sms=1 must not let reduce_sms=True skip the check
    for reduce_sms in (True, 1, True):
        config = dict(CONFIGS["pull_cublas"], reduce_sms=reduce_sms)
        if reduce_sms is True:
            with pytest.raises(SpaceError, match=r"reduce_sms: True is not allowed \(of type bool, not int\)"):
                gemm_rs(a, b, world=world, config=config)
        else:
            assert gemm_rs(a, b, world=world, config=config)[0].shape == (5, 16)


def test_family_contract_and_torch_op():
    fam = get_family("gemm_rs")
    world = LocalWorld(world_size=2)
    problem = Problem.of({"M": 40, "N": 36, "K": 48}, dtype="bfloat16", world_size=2)
    inputs = fam.make_inputs(problem, world, seed=1)
    assert fam.key(inputs.a, inputs.b, world=world) == {"M": 40, "N": 36, "K": 48}
    ref = fam.reference(inputs)
    for cfg in (CONFIGS["baseline"], CONFIGS["push"]):
        assert fam.max_error(fam.run(inputs, cfg, world), ref) < fam.tolerance("bfloat16")
    out = torch.ops.jointtune.gemm_rs(inputs.a, inputs.b, world.name, config_json(CONFIGS["pull"]))
    assert [o.shape for o in out] == [(20, 36)] * 2
    assert fam.max_error(out, ref) < fam.tolerance("bfloat16")
    torch.library.opcheck(torch.ops.jointtune.gemm_rs.default,
                          (inputs.a, inputs.b, world.name, config_json(CONFIGS["baseline"])),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_space_marks_atomic_nondeterministic_and_defaults_are_valid():
    space = get_space("gemm_rs")
    assert space.nondeterministic == ("atomic",)
    assert space.restrict({"mode": ["push", "baseline"]}).nondeterministic == ()
    from jointtune.search_spaces import DeviceLimits

    limits = DeviceLimits.nominal_hopper()
    for shape, W in (({"M": 64, "N": 8192, "K": 8192}, 2), ({"M": 8192, "N": 4096, "K": 12288}, 2),
                     ({"M": 8192, "N": 4096, "K": 12288}, 1)):  # fmt: skip
        problem = Problem.of(shape, dtype="bfloat16", world_size=W)
        cfg = space.default(problem, limits)
        assert space.violations(cfg, problem, limits) == []
        assert cfg["mode"] not in space.nondeterministic
    problem = Problem.of({"M": 1024, "N": 8192, "K": 8192}, dtype="bfloat16", world_size=2)
    # reduce programs: a quarter of the SMs beside a fused GEMM, every SM after cuBLAS
    assert space.violations({"mode": "pull_cublas", "reduce_sms": 128}, problem, limits) == []
    fused = dict(CONFIGS["push"], BLOCK_M=64, BLOCK_N=128, chunk_m=64)
    assert any("reduce_sms: 64" in v for v in space.violations(dict(fused, reduce_sms=64), problem, limits))
    # an epilogue reduce has no reduce programs and always computes the own rows last
    epilogue = {k: v for k, v in fused.items() if k not in ("reduce_sms", "tile_order")} | {"reduce_by": "epilogue"}
    assert space.violations(epilogue, problem, limits) == []
    assert "reduce_sms only exists when" in space.violations(dict(epilogue, reduce_sms=8), problem, limits)[0]
    assert "tile_order only exists when" in space.violations(dict(epilogue, tile_order="own_first"), problem, limits)[0]
    # tiles over every rank's rows: a flag per tile, so no chunk_m either
    tile = {k: v for k, v in epilogue.items() if k != "chunk_m"} | {"reduce_by": "tile"}
    assert space.violations(tile, problem, limits) == []
    assert "chunk_m only exists when" in space.violations(dict(tile, chunk_m=64), problem, limits)[0]
    fused.pop("reduce_by")  # atomic has no choice: its reduce programs cast the accumulator
    # atomic takes the big 8-warp tiles too (revision 4: the race that made them sum wrong is fixed)
    assert space.violations(dict(fused, mode="atomic", reduce_sms=8), problem, limits) == []
    big = dict(fused, mode="atomic", reduce_sms=8, BLOCK_M=128, BLOCK_N=256, num_warps=8)
    assert space.violations(big, problem, limits) == []
