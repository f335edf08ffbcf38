"""GEMM+AR on simulated ranks (CPU interpreter): every mode at W = 2, 3 and 4 against the float32 reference on ragged
shapes, with and without the residual + RMSNorm epilogue; the same bits on every rank (and in every fused mode of one
tile config); prepared launches and CPU-recorded graph replays re-issued with fresh inputs between eager calls of
other modes and of GEMM+RS (one epoch counter for both); fewer rows than ranks; and the errors a caller meets."""

from __future__ import annotations

import pytest
import torch
from capture import capture

from jointtune.errors import ShapeError, SpaceError
from jointtune.kernels import get_family
from jointtune.kernels.gemm_ar import (
    config_json,
    gemm_ar,
    gemm_ar_rmsnorm,
    plans,
    prepare,
    reference,
    row_parallel,
    standin_launches,
)
from jointtune.kernels.gemm_ar.args import ArShape, GemmArConfig
from jointtune.kernels.gemm_rs import gemm_rs
from jointtune.kernels.runtime.symm import call_state
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import DeviceLimits, Problem, get_space

TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2, SPLIT_K=1)
FUSED = dict(tiles_per_flag=1, comm_sms=0)
CONFIGS = {
    "baseline": dict(mode="baseline"),
    # the GEMM programs sum after their last tile; a flag per tile
    "one_shot_push": dict(mode="one_shot", gemm="triton", transport="push", **FUSED, **TILES),
    # split-K, flags per 2 tiles, 4 programs that only sum beside the GEMM
    "one_shot_pull_split_k": dict(
        mode="one_shot", gemm="triton", transport="pull", tiles_per_flag=2, comm_sms=4, **dict(TILES, SPLIT_K=2)
    ),
    # grouped tile order (column-major over 4 row tiles), tiles holding several owners' rows
    "two_shot_push_grouped": dict(
        mode="two_shot", gemm="triton", transport="push", tiles_per_flag=4, comm_sms=0, **dict(TILES, GROUP_M=4)
    ),
    "two_shot_pull": dict(mode="two_shot", gemm="triton", transport="pull", tiles_per_flag=2, comm_sms=4, **TILES),
    "one_shot_cublas_pull": dict(mode="one_shot", gemm="cublas", transport="pull", tiles_per_flag=2, comm_sms=8),
    "two_shot_cublas_push": dict(mode="two_shot", gemm="cublas", transport="push", tiles_per_flag=1, comm_sms=4),
    # words that carry their flag (`runtime.ll`): the GEMM programs sum; split-K with programs that only sum; cuBLAS
    "one_shot_ll": dict(mode="one_shot", gemm="triton", transport="ll", comm_sms=0, **TILES),
    "one_shot_ll_split_k": dict(mode="one_shot", gemm="triton", transport="ll", comm_sms=4, **dict(TILES, SPLIT_K=2)),
    "one_shot_cublas_ll": dict(mode="one_shot", gemm="cublas", transport="ll", comm_sms=4),
    # two-shot with words both ways (the tiles to their owners, the reduced rows and 1/rms to every rank)
    "two_shot_ll": dict(mode="two_shot", gemm="triton", transport="ll", comm_sms=0, **TILES),
    "two_shot_cublas_ll": dict(mode="two_shot", gemm="cublas", transport="ll", comm_sms=4),
    # cuBLAS into symmetric memory, one launch between two meetings of the ranks (`kernels.gemm_ar.meet`)
    "two_shot_barrier": dict(mode="two_shot", gemm="cublas", transport="barrier", comm_sms=4),
    "one_shot_barrier": dict(mode="one_shot", gemm="cublas", transport="barrier", comm_sms=8),
    # one-shot pushed into every rank's inbox half (by the epoch) before one meeting
    "one_shot_barrier_push": dict(mode="one_shot", gemm="cublas", transport="barrier_push", comm_sms=8),
}
LL = {name for name, c in CONFIGS.items() if c.get("transport") == "ll"}
BARRIER = {name for name, c in CONFIGS.items() if c.get("transport") in ("barrier", "barrier_push")}
FLAGGED = set(CONFIGS) - {"baseline"} - LL - BARRIER
#: (M, N, K_r): rows no tile, owner or world size divides (a tile holds several owners' rows); N and K_r not multiples
#: of the blocks
SHAPE = (21, 40, 40)
#: split-K needs each split two BLOCK_K steps deep; a tile group of 4 needs 4 row tiles
SHAPES = {
    "one_shot_pull_split_k": (21, 40, 130),
    "two_shot_push_grouped": (50, 40, 24),
    "one_shot_ll_split_k": (21, 41, 130),
    "one_shot_ll": (21, 41, 40),
    "two_shot_ll": (21, 41, 40),
    "two_shot_cublas_ll": (23, 41, 24),
}  # LL: an odd N (the last word of a row holds one value)
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
EPS = 1e-5


def _shape(name: str) -> tuple[int, int, int]:
    return SHAPES.get(name, SHAPE)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()


class Call:
    """Fixed tensors of one call site (what a captured graph reads and writes): A, B per rank; the residual and norm
    weight, the same on every rank; the outputs, poisoned with NaN before every call."""

    def __init__(self, world, M, N, K_r, seed, dtype=torch.bfloat16):
        W = world.world_size
        self.world, self.gen = world, torch.Generator().manual_seed(seed)
        self.a = [torch.empty(M, K_r, dtype=dtype) for _ in range(W)]
        self.b = [torch.empty(K_r, N, dtype=dtype) for _ in range(W)]
        self.res = [torch.empty(M, N, dtype=dtype) for _ in range(W)]
        self.weight = [torch.empty(N, dtype=dtype) for _ in range(W)]
        self.out = [torch.empty(M, N, dtype=dtype) for _ in range(W)]
        self.h = [torch.empty(M, N, dtype=dtype) for _ in range(W)]
        self.fresh()

    def fresh(self):
        for x in self.a + self.b:
            x.copy_(torch.randn(x.shape, generator=self.gen) / x.shape[-1] ** 0.25)
        res, weight = torch.randn(self.res[0].shape, generator=self.gen), 1 + torch.rand(self.weight[0].shape)
        for r, w in zip(self.res, self.weight):
            r.copy_(res)
            w.copy_(weight)
        for o in self.out + self.h:
            o.fill_(float("nan"))

    def plain(self, config, residual=False):
        return gemm_ar(self.a, self.b, world=self.world, config=config, residual=self.res if residual else None,
                       out=self.out)  # fmt: skip

    def norm(self, config):
        return gemm_ar_rmsnorm(self.a, self.b, self.res, self.weight, eps=EPS, world=self.world, config=config,
                               out=(self.out, self.h))  # fmt: skip

    def check(self, *, residual=False, norm=False):
        """Every rank's outputs against the float32 reference, and the same bits on every rank."""
        if norm:
            want_normed, want_h = reference(self.a, self.b, self.res[0], self.weight[0], EPS)
            got = [(self.out, want_normed), (self.h, want_h)]
        else:
            got = [(self.out, reference(self.a, self.b, self.res[0] if residual else None))]
        for outs, want in got:
            assert max(_rel(o, want) for o in outs) < TOL[outs[0].dtype]
            assert all(torch.equal(o, outs[0]) for o in outs[1:]), "ranks differ"


def _flag_high(world):
    return max((int(t.max()) for (n, _), buf in world._buffers.items() if ".flags." in n for t in buf.tensors),
               default=0)  # fmt: skip


def _ll_high(world):
    """The newest tag LL words carry (their high 32 bits): a replay that wrote last call's tag again would not move
    it."""
    return max((int((t >> 32).max()) for (n, _), buf in world._buffers.items()
                if n in ("gemm_ar.ll_inbox", "gemm_ar.ll_gather") for t in buf.tensors), default=0)  # fmt: skip


#: every config at W = 3; one-shot, two-shot and the baseline (with each GEMM and transport) at W = 2 and 4
CASES = (
    [(name, 3) for name in CONFIGS]
    + [
        (name, 2)
        for name in (
            "baseline",
            "one_shot_push",
            "two_shot_pull",
            "one_shot_cublas_pull",
            "one_shot_ll",
            "two_shot_ll",
            "two_shot_barrier",
            "one_shot_barrier_push",
        )
    ]
    + [
        (name, 4)
        for name in (
            "baseline",
            "one_shot_pull_split_k",
            "two_shot_push_grouped",
            "two_shot_cublas_push",
            "one_shot_ll_split_k",
            "one_shot_cublas_ll",
            "two_shot_ll",
            "two_shot_cublas_ll",
            "two_shot_barrier",
            "one_shot_barrier",
            "one_shot_barrier_push",
        )
    ]
)


@pytest.mark.parametrize(("name", "W"), CASES)
def test_every_mode_matches_the_reference_on_ragged_shapes(name, W):
    world = LocalWorld(world_size=W)
    call = Call(world, *_shape(name), seed=W)
    result = call.plain(CONFIGS[name])
    assert all(x is y for x, y in zip(result, call.out))
    call.check()
    call.fresh()  # a second call, fresh inputs: buffers, counters and flags were handed back ready
    normed, h = call.norm(CONFIGS[name])
    assert all(x is y for x, y in zip(normed, call.out)) and all(x is y for x, y in zip(h, call.h))
    call.check(norm=True)


@pytest.mark.parametrize(
    "name", ["one_shot_push", "two_shot_pull", "two_shot_cublas_push", "baseline", "one_shot_ll", "two_shot_cublas_ll"]
)
def test_residual_without_norm_and_the_residual_updated_in_place(name):
    world = LocalWorld(world_size=3)
    call = Call(world, *_shape(name), seed=5)
    call.plain(CONFIGS[name], residual=True)
    call.check(residual=True)
    call.fresh()
    want_normed, want_h = reference(call.a, call.b, call.res[0], call.weight[0], EPS)
    normed, h = gemm_ar_rmsnorm(call.a, call.b, call.res, call.weight, eps=EPS, world=world, config=CONFIGS[name],
                                out=(call.out, call.res))  # fmt: skip
    assert all(x is y for x, y in zip(h, call.res))
    assert max(_rel(x, want_h) for x in h) < TOL[torch.bfloat16]
    assert max(_rel(x, want_normed) for x in normed) < TOL[torch.bfloat16]


def test_fused_modes_of_one_tile_config_give_the_same_bits():
    # partials rounded once where they travel, summed in rank order: one-shot, two-shot, push and pull agree exactly
    world = LocalWorld(world_size=2)
    call = Call(world, *SHAPE, seed=8)
    for form in ("plain", "norm"):
        seen = []
        for mode, transport in (("one_shot", "push"), ("one_shot", "pull"), ("one_shot", "ll"), ("two_shot", "push"),
                                ("two_shot", "pull"), ("two_shot", "ll")):  # fmt: skip
            config = dict(CONFIGS["one_shot_push"], mode=mode, transport=transport)
            if transport == "ll":
                del config["tiles_per_flag"]
            call.plain(config) if form == "plain" else call.norm(config)
            seen.append([x.clone() for x in call.out + call.h[: 2 if form == "norm" else 0]])
        assert all(torch.equal(x, y) for other in seen[1:] for x, y in zip(seen[0], other)), form


@pytest.mark.parametrize(("M", "W"), [(1, 4), (2, 3), (3, 4)])
def test_fewer_rows_than_ranks(M, W):
    # two-shot: the last ranks own no rows, they only send and copy
    world = LocalWorld(world_size=W)
    call = Call(world, M, 40, 24, seed=M)
    for name in (
        "two_shot_pull",
        "two_shot_cublas_push",
        "one_shot_push",
        "one_shot_ll",
        "two_shot_ll",
        "two_shot_barrier",
    ):
        config = CONFIGS[name]
        call.fresh()
        call.norm(config)
        call.check(norm=True)
        call.fresh()
        call.plain(config)
        call.check()


#: (mode, transport, W): cuBLAS partials of [21, 600] copied in [16, 256] tiles, 6 of them over 4 programs, a flag each:
#: programs 0 and 1 send two tiles before releasing both flags at once (two-shot: tiles holding several owners' rows)
COPIED = [("one_shot", "push", 2), ("one_shot", "push", 4), ("two_shot", "push", 3), ("one_shot", "pull", 3),
          ("two_shot", "pull", 4)]  # fmt: skip


@pytest.mark.parametrize(("mode", "transport", "W"), COPIED)
def test_copied_tiles_flagged_together_once_their_program_sent_them_all(mode, transport, W):
    world = LocalWorld(world_size=W)
    call = Call(world, 21, 600, 40, seed=W)
    config = dict(mode=mode, gemm="cublas", transport=transport, tiles_per_flag=1, comm_sms=4)
    call.plain(config)
    call.check()
    prepared = prepare(call.a, call.b, world=world, config=config, residual=call.res, norm_weight=call.weight,
                       eps=EPS, out=call.out, h_out=call.h)  # fmt: skip
    for _ in range(2):  # the prepared launch re-issued with fresh inputs, an eager call between
        call.fresh()
        high = _flag_high(world)
        prepared.run()
        call.check(norm=True)
        assert _flag_high(world) > high
        call.fresh()
        call.plain(config)
        call.check()


#: replays at W = 2, 3 and 4, with the norm epilogue or without (the interleaving test below replays and re-issues the
#: other configs)
REPLAYS = [("baseline", 4, True), ("one_shot_pull_split_k", 3, False), ("two_shot_push_grouped", 4, False),
           ("two_shot_pull", 3, True), ("two_shot_cublas_push", 2, True), ("one_shot_ll", 3, True),
           ("one_shot_cublas_ll", 2, False), ("two_shot_ll", 4, True), ("two_shot_cublas_ll", 3, False),
           ("two_shot_barrier", 4, True), ("one_shot_barrier", 2, False), ("one_shot_barrier_push", 4, True),
           ("one_shot_barrier_push", 3, False)]  # fmt: skip


@pytest.mark.parametrize(("name", "W", "norm"), REPLAYS)
def test_replays_arm_their_waits_and_stay_correct(name, W, norm):
    world = LocalWorld(world_size=W)
    call = Call(world, *_shape(name), seed=11)
    run = call.norm if norm else call.plain
    run(CONFIGS[name])  # warm-up: the plan is built before capture, as on a GPU
    call.fresh()
    with capture() as graph:
        run(CONFIGS[name])
    for _ in range(2):
        call.fresh()
        high, ll_high, epoch = _flag_high(world), _ll_high(world), call_state(world).epoch()
        graph.replay()
        call.check(norm=norm)
        if CONFIGS[name].get("transport") == "barrier_push":  # inbox halves: a replay opens a call of its own
            assert call_state(world).epoch() == epoch + 1, f"{name}: a replay kept an earlier call's epoch"
        if name in FLAGGED:
            assert _flag_high(world) > high, f"{name}: a replay's flags kept an earlier call's epoch"
        if name in LL:
            assert _ll_high(world) > ll_high, f"{name}: a replay's words kept an earlier call's tag"


def test_prepared_calls_and_replays_interleave_with_eager_calls_of_other_modes_and_gemm_rs():
    world = LocalWorld(world_size=2)
    call = Call(world, *SHAPE, seed=5)
    other = Call(world, 9, 24, 16, seed=6)
    rs_a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    rs_b = [torch.randn(32, 24).bfloat16() for _ in range(2)]
    rs_cfg = dict(mode="push", reduce_by="tile", **TILES)
    prepared = {
        name: prepare(call.a, call.b, world=world, config=CONFIGS[name], residual=call.res, norm_weight=call.weight,
                      eps=EPS, out=call.out, h_out=call.h)
        for name in ("two_shot_pull", "one_shot_cublas_pull", "one_shot_ll", "two_shot_ll", "one_shot_barrier_push")
    }  # fmt: skip
    graphs = {}
    for name in ("one_shot_push", "two_shot_cublas_push", "one_shot_cublas_ll", "two_shot_cublas_ll",
                 "one_shot_barrier_push"):  # fmt: skip
        call.plain(CONFIGS[name])
        with capture() as graph:
            call.plain(CONFIGS[name])
        graphs[name] = graph
    for step in range(2):
        for p in prepared.values():
            call.fresh()
            p.run()
            call.check(norm=True)
            other.fresh()
            other.plain(CONFIGS[("one_shot_barrier_push", "two_shot_cublas_push", "one_shot_push")[step % 3]])
            other.check()
        for graph in graphs.values():
            call.fresh()
            graph.replay()
            call.check()
            c = gemm_rs(rs_a, rs_b, world=world, config=rs_cfg)
            want = sum(x.float() @ y.float() for x, y in zip(rs_a, rs_b))
            assert _rel(torch.cat(c), want) < TOL[torch.bfloat16]


def test_one_rank_and_the_row_parallel_call():
    world = LocalWorld(world_size=1)
    a, b = torch.randn(20, 24).bfloat16(), torch.randn(24, 40).bfloat16()
    out = gemm_ar(a, b, world=world, config=CONFIGS["one_shot_push"])
    assert isinstance(out, torch.Tensor) and _rel(out, a.float() @ b.float()) < TOL[torch.bfloat16]
    world = LocalWorld(world_size=2)
    call = Call(world, 6, 40, 24, seed=2)
    y = row_parallel(call.a, call.b, world=world, config=CONFIGS["one_shot_push"])
    assert max(_rel(t, reference(call.a, call.b)) for t in y) < TOL[torch.bfloat16]
    normed, h = row_parallel(call.a, call.b, world=world, config=CONFIGS["two_shot_pull"], residual=call.res,
                             norm_weight=call.weight, eps=EPS)  # fmt: skip
    want_normed, want_h = reference(call.a, call.b, call.res[0], call.weight[0], EPS)
    assert max(_rel(t, want_normed) for t in normed) < TOL[torch.bfloat16]
    assert max(_rel(t, want_h) for t in h) < TOL[torch.bfloat16]


def test_ll_rows_normed_in_more_than_one_step_with_an_odd_width():
    # a normed row of 4099 columns: two steps of 4096 (the second one 3 columns wide), the last word of every row
    # holding one value; the sum alone and with the residual too
    world = LocalWorld(world_size=2)
    call = Call(world, 3, 4099, 32, seed=12)
    config = dict(CONFIGS["one_shot_ll"], BLOCK_N=256)
    call.norm(config)
    call.check(norm=True)
    call.fresh()
    call.plain(config, residual=True)
    call.check(residual=True)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(
    "name",
    [
        "one_shot_push",
        "two_shot_pull",
        "one_shot_ll",
        "two_shot_ll",
        "two_shot_cublas_ll",
        "two_shot_barrier",
        "one_shot_barrier_push",
    ],
)
def test_the_precompile_specialises_on_the_pointer_types_the_plan_passes(name, norm):
    # the tuner's precompile (`standin_launches`) builds the kernel a call launches only if every pointer has the
    # call's type: Triton compiles anew per pointer type
    world, (M, N, K_r) = LocalWorld(world_size=2), _shape(name)
    cfg = GemmArConfig.of(CONFIGS[name])
    plan = plans.build_plan(world, ArShape(2, M, K_r, N, torch.bfloat16, (N, 1), norm, norm), cfg, EPS)
    launch = plan.phases[0][0]
    planned = dict(zip(launch.kernel.arg_names, launch._argv))
    ((_, named, _),) = standin_launches(cfg, M=M, N=N, K=2 * K_r, world_size=2, dtype=torch.bfloat16,
                                        device=torch.device("cpu"), norm=norm)  # fmt: skip
    pointers = {arg: value.dtype for arg, value in named.items() if isinstance(value, torch.Tensor)}
    assert pointers == {arg: planned[arg].dtype for arg in pointers}


def test_the_barrier_exchange_launches_no_program_that_would_only_meet():
    # a program per item (a row with the norm, a 2048-value block of the rows one rank sums without), at most
    # comm_sms; every rank launches as many (two-shot: for the most rows any rank owns), so namesakes exist to meet
    def programs(mode, M, N, W, norm, comm_sms=64):
        cfg = GemmArConfig.of(dict(mode=mode, gemm="cublas", transport="barrier", comm_sms=comm_sms))
        return plans.meet_programs(cfg, ArShape(W, M, 1, N, torch.bfloat16, (N, 1), norm, norm))

    assert programs("two_shot", 32, 8192, 4, norm=True) == 8  # 8 rows a rank
    assert programs("two_shot", 33, 8192, 4, norm=True) == 9  # rank 3 owns 6 rows, every rank launches 9
    assert programs("two_shot", 32, 8192, 4, norm=False) == 32  # 8 x 8192 values a rank
    assert programs("two_shot", 1024, 8192, 4, norm=False) == 64  # comm_sms caps it
    assert programs("one_shot", 1, 8192, 4, norm=False) == 4  # every row on every rank
    assert programs("two_shot", 1, 8192, 4, norm=True) == 1  # ranks without rows still meet
    with pytest.raises(SpaceError, match="comm_sms: 300 is not allowed"):  # past the exchange's signal slots
        programs("two_shot", 1024, 8192, 4, norm=False, comm_sms=300)


def test_float16():
    world = LocalWorld(world_size=2)
    call = Call(world, 21, 48, 40, seed=7, dtype=torch.float16)
    for name in ("two_shot_pull", "one_shot_cublas_pull", "one_shot_ll", "two_shot_ll"):
        call.fresh()
        call.norm(CONFIGS[name])
        call.check(norm=True)


def test_bad_calls_name_the_argument():
    world = LocalWorld(world_size=2)
    a = [torch.randn(10, 8).bfloat16() for _ in range(2)]
    b = [torch.randn(8, 16).bfloat16() for _ in range(2)]
    res = [torch.randn(10, 16).bfloat16() for _ in range(2)]
    weight = [torch.ones(16).bfloat16() for _ in range(2)]
    cfg = CONFIGS["one_shot_push"]
    with pytest.raises(ShapeError, match="dtype"):
        gemm_ar(a, [x.half() for x in b], world=world, config=cfg)
    with pytest.raises(ShapeError, match="shapes"):
        gemm_ar(a, [b[0], b[1][:4]], world=world, config=cfg)
    with pytest.raises(ShapeError, match=r"out: must be one row-major \[10, 16\]"):
        gemm_ar(a, b, world=world, config=cfg, out=[torch.empty(5, 16).bfloat16()] * 2)
    with pytest.raises(ShapeError, match=r"residual: must be a contiguous \[10, 16\] bfloat16 tensor"):
        gemm_ar(a, b, world=world, config=cfg, residual=[x[:, :8] for x in res])
    with pytest.raises(ShapeError, match=r"weight: must be a contiguous \[16\] bfloat16 or float32 tensor"):
        gemm_ar_rmsnorm(a, b, res, [torch.ones(15)] * 2, world=world, config=cfg)
    with pytest.raises(ShapeError, match=r"eps: -1\.0 is not allowed"):
        gemm_ar_rmsnorm(a, b, res, weight, eps=-1.0, world=world, config=cfg)
    with pytest.raises(SpaceError, match='comm_sms: 64 is not allowed with gemm="triton"'):
        gemm_ar(a, b, world=world, config=dict(cfg, comm_sms=64))
    with pytest.raises(SpaceError, match='comm_sms: 0 is not allowed with gemm="cublas"'):
        gemm_ar(a, b, world=world, config=dict(CONFIGS["one_shot_cublas_pull"], comm_sms=0))
    with pytest.raises(SpaceError, match='transport: "barrier" is not allowed with gemm="triton"'):
        gemm_ar(a, b, world=world, config=dict(CONFIGS["one_shot_ll"], transport="barrier"))
    with pytest.raises(SpaceError, match='transport: "barrier_push" is not allowed with mode="two_shot"'):
        gemm_ar(a, b, world=world, config=dict(CONFIGS["one_shot_barrier_push"], mode="two_shot"))
    with pytest.raises(SpaceError, match="tiles_per_flag: 32 is not allowed for 1 tiles"):
        gemm_ar(a, b, world=world, config=dict(cfg, tiles_per_flag=32))
    weights = [x.clone().requires_grad_() for x in b]
    with pytest.raises(ShapeError, match=r"b: requires grad, and gemm_ar is forward-only"):
        gemm_ar(a, weights, world=world, config=cfg)
    with torch.no_grad():  # float32 norm weights are taken too
        normed, h = gemm_ar_rmsnorm(a, b, None, [torch.ones(16)] * 2, world=world, config=CONFIGS["baseline"])
    assert normed[0].shape == h[0].shape == (10, 16)


def test_the_unfused_norm_applies_a_float32_weight_unrounded_as_the_epilogue_does():
    """The baseline plan's RMSNorm (torch's `F.rms_norm`) with bf16 rows and a float32 weight: computed in float32 and
    rounded once, within half a bf16 step of float32 everywhere; the weight rounded to bf16 first misses that."""
    gen = torch.Generator().manual_seed(0)
    h, w = torch.randn(64, 256, generator=gen).bfloat16(), 1 + 0.003 * torch.randn(256, generator=gen)
    x = h.float()
    want = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w
    out = plans.rms_norm(h, w, 1e-6)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - want).abs() <= want.abs() * 2**-8).all()
    assert not ((plans.rms_norm(h, w.bfloat16(), 1e-6).float() - want).abs() <= want.abs() * 2**-8).all()


@pytest.mark.parametrize("kernel", ["gemm_ar", "gemm_ar_rmsnorm"])
def test_family_contract_and_torch_op(kernel):
    fam = get_family(kernel)
    assert fam.space == "gemm_ar" and fam.version == get_family("gemm_ar").version
    world = LocalWorld(world_size=3)
    problem = Problem.of({"M": 7, "N": 36, "K": 48}, dtype="bfloat16", world_size=3)
    inputs = fam.make_inputs(problem, world, seed=1)
    assert fam.key(inputs.a, inputs.b, inputs.residual, inputs.weight, world=world) == {"M": 7, "N": 36, "K": 48}
    ref = fam.reference(inputs)
    for cfg in (CONFIGS["baseline"], CONFIGS["two_shot_pull"]):
        assert fam.max_error(fam.run(inputs, cfg, world), ref) < fam.tolerance("bfloat16")
    text = config_json(CONFIGS["one_shot_push"])
    if kernel == "gemm_ar":
        args = (inputs.a, inputs.b, [], world.name, text)
        out = torch.ops.jointtune.gemm_ar(*args)
    else:
        args = (inputs.a, inputs.b, inputs.residual, inputs.weight, 1e-6, world.name, text)
        out = [x for part in torch.ops.jointtune.gemm_ar_rmsnorm(*args) for x in part]
    assert fam.max_error(out, ref) < fam.tolerance("bfloat16")
    op = getattr(torch.ops.jointtune, kernel).default
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_space_defaults_seeds_and_rules():
    space, limits = get_space("gemm_ar"), DeviceLimits.nominal_hopper()
    assert space.nondeterministic == ()
    for shape, W in (({"M": 1, "N": 8192, "K": 8192}, 4), ({"M": 128, "N": 5120, "K": 27648}, 4),
                     ({"M": 1024, "N": 8192, "K": 28672}, 2), ({"M": 64, "N": 8192, "K": 8192}, 1)):  # fmt: skip
        problem = Problem.of(shape, dtype="bfloat16", world_size=W)
        assert space.default(problem, limits) == {"mode": "baseline", "collective": "nccl"}
        seeds = space.seeds(problem, limits)
        # one-shot pushed before one meeting, and one-shot's and two-shot's LL, up to 32 rows; two-shot's barrier
        # exchange everywhere; every seed valid here
        assert len(seeds) == (0 if W == 1 else 10 if shape["M"] <= 32 else 7), shape
        assert [s["mode"] for s in seeds[:1]] == ([] if W == 1 else ["one_shot" if shape["M"] <= 32 else "two_shot"])
        # one-shot pushed before one meeting leads up to 32 rows, and is not offered above
        pushed = [i for i, s in enumerate(seeds) if s["transport"] == "barrier_push"]
        assert pushed == ([0] if W > 1 and shape["M"] <= 32 else []), shape
        # the barrier exchange leads from 32 to 1024 rows (after the pushed one at 32) and closes the list elsewhere
        barrier = [i - len(pushed) for i, s in enumerate(seeds) if s["transport"] == "barrier"]
        assert barrier == ([] if W == 1 else [0] if 32 <= shape["M"] <= 1024 else [len(seeds) - 1 - len(pushed)])
        # LL words come first where the handoff is latency (up to 32 rows); none where bytes dominate (from 256 rows)
        assert [s["transport"] == "ll" for s in seeds[1:2]] == ([] if W == 1 else [shape["M"] < 32])
        assert all(shape["M"] <= 32 for s in seeds if s.get("transport") == "ll")

    # from 32 rows at W >= 4 (two-shot moves 2/W of one-shot's bytes) the exchanges alternate, two-shot's cuBLAS form
    # first; at W=2, or fewer rows, every one-shot seed comes first
    def modes(M: int, W: int) -> list[tuple[str, str, str]]:
        problem = Problem.of({"M": M, "N": 8192, "K": 8190 if W == 3 else 8192}, dtype="bfloat16", world_size=W)
        return [(s["mode"], s["gemm"], s["transport"]) for s in space.seeds(problem, limits)]

    assert modes(32, 4) == [("one_shot", "cublas", "barrier_push"), ("two_shot", "cublas", "barrier"),
                            ("one_shot", "triton", "ll"),
                            ("two_shot", "cublas", "push"), ("one_shot", "triton", "push"),
                            ("two_shot", "cublas", "ll"), ("one_shot", "cublas", "push"),
                            ("two_shot", "triton", "push"), ("one_shot", "triton", "pull"),
                            ("two_shot", "triton", "pull")]  # fmt: skip
    assert [m for m, _, _ in modes(64, 8)] == ["two_shot"] + ["one_shot", "two_shot"] * 3
    assert modes(8, 2)[5:7] == [("two_shot", "triton", "push"), ("two_shot", "triton", "ll")]
    assert [m for m, _, _ in modes(128, 4)][:3] == ["two_shot", "one_shot", "two_shot"]
    for M, W in ((8, 4), (64, 2), (128, 3)):  # one-shot first, after the barrier exchange
        flagged = [m for m, _, t in modes(M, W) if t not in ("barrier", "barrier_push")]
        assert flagged == sorted(flagged), (M, W)
    assert modes(256, 4)[0] == ("two_shot", "cublas", "barrier")
    assert modes(4096, 4)[0] == ("two_shot", "triton", "push") and modes(4096, 4)[-1][2] == "barrier"
    # split-K only where the column tiles leave three quarters of the SMs idle: none at N=8192 (128 tiles of 64) or
    # 4096 (64 tiles), 4 at N=2048
    for N, split in ((8192, 1), (5120, 1), (4096, 1), (2048, 4)):
        problem = Problem.of({"M": 8, "N": N, "K": 8192}, dtype="bfloat16", world_size=4)
        assert {s.get("SPLIT_K") for s in space.seeds(problem, limits) if s["gemm"] == "triton"} == {split}, N
    problem = Problem.of({"M": 64, "N": 8192, "K": 8192}, dtype="bfloat16", world_size=4)
    # K only must divide: any M
    assert space.violations({"mode": "baseline", "collective": "torch_one_shot"}, problem, limits) == []
    cublas = dict(mode="one_shot", gemm="cublas", transport="push", tiles_per_flag=32, comm_sms=128)
    assert space.violations(cublas, problem, limits) == []  # 16-row, 256-column copies: 4 x 32 tiles
    one_tile = Problem.of({"M": 2, "N": 256, "K": 8192}, dtype="bfloat16", world_size=4)
    assert any("tiles_per_flag: 2 is not allowed for 1 tiles" in v
               for v in space.violations(dict(cublas, tiles_per_flag=2), one_tile, limits))  # fmt: skip
    assert "BLOCK_M only exists when" in space.violations(dict(cublas, BLOCK_M=64), problem, limits)[0]
    prefill = Problem.of({"M": 4096, "N": 8192, "K": 8192}, dtype="bfloat16", world_size=4)
    assert space.violations(cublas, prefill, limits) == [
        'mode: "one_shot" is not allowed for M=4096 rows; allowed: M <= 2048 (its inbox holds every rank\'s whole '
        'partial); "two_shot" or "baseline" above'
    ]
    assert space.violations(dict(cublas, mode="two_shot"), prefill, limits) == []
    ll = dict(mode="one_shot", gemm="cublas", transport="ll", comm_sms=64)
    assert space.violations(ll, problem, limits) == []
    assert space.violations(dict(ll, mode="two_shot"), problem, limits) == []  # words both ways
    many = Problem.of({"M": 1025, "N": 8192, "K": 8192}, dtype="bfloat16", world_size=4)
    assert space.violations(dict(ll, mode="two_shot"), many, limits) == [
        'transport: "ll" is not allowed for M=1025 rows; allowed: M <= 1024 (its words carry two values in 8 bytes); '
        '"push" or "pull" above'
    ]
    assert "tiles_per_flag only exists when" in space.violations(dict(ll, tiles_per_flag=1), problem, limits)[0]
    with pytest.raises(SpaceError, match="K=8190 must be divisible by it"):
        space.validate({"mode": "baseline"}, Problem.of({"M": 8, "N": 64, "K": 8190}, dtype="bf16", world_size=4),
                       limits)  # fmt: skip
