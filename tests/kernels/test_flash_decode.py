"""Distributed Flash-Decode on simulated ranks (CPU interpreter): every mode against scaled_dot_product_attention over
the whole unsharded cache (float32) at W = 2 and 4, with GQA, ragged lengths (zero on a rank, zero everywhere),
poisoned outputs and repeated calls; CPU-recorded graph replays with lengths changed between replays, interleaved
with eager calls of other modes and of the GEMM families (one epoch counter for all); prepared calls; the family
contract, the torch op and torch.compile; the decorator with the family's bucketed key; the errors a caller meets."""

from __future__ import annotations

import pytest
import torch
from capture import capture

from jointtune.errors import ShapeError, SpaceError
from jointtune.kernels import get_family
from jointtune.kernels.flash_decode import config_json, flash_decode, prepare, reference
from jointtune.kernels.flash_decode.args import merge_splits
from jointtune.kernels.gemm_rs import gemm_rs
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import DeviceLimits, Problem, get_space

TILE = dict(kv_split=64, BLOCK_N=16, num_warps=2, num_stages=2)
CONFIGS = {
    "baseline": dict(mode="baseline", heads_per_program=2, **TILE),
    "fused": dict(mode="fused", heads_per_program=4, items_per_flag=2, **TILE),
    "pull": dict(mode="pull", heads_per_program=1, items_per_flag=4, **dict(TILE, BLOCK_N=32, num_stages=1)),
    "wait": dict(mode="wait", heads_per_program=2, items_per_flag=1, push_programs=2, **TILE),
}
FLAGGED = {"fused", "pull", "wait"}
#: B, H, H_KV, S_r, D: a GQA group of 4, a shard no split or step divides (2 splits of 64 keys, the last ragged)
SHAPE = (2, 4, 1, 100, 64)
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}


class Call:
    """Fixed q, k, v, lengths and outputs of one call site (what a captured graph reads and writes)."""

    def __init__(self, world, B, H, H_KV, S_r, D, seed, dtype=torch.bfloat16):
        W = world.world_size
        self.world, self.S_r, self.gen = world, S_r, torch.Generator().manual_seed(seed)
        self.q = [torch.empty(B, H, D, dtype=dtype) for _ in range(W)]
        self.k = [torch.empty(B, H_KV, S_r, D, dtype=dtype) for _ in range(W)]
        self.v = [torch.empty(B, H_KV, S_r, D, dtype=dtype) for _ in range(W)]
        self.lens = [torch.empty(B, dtype=torch.int32) for _ in range(W)]
        self.out = [torch.empty(B, H, D, dtype=dtype) for _ in range(W)]
        self.fresh()

    def fresh(self, lens=None):
        """New random q (one for all ranks), K, V and lengths in the same tensors; NaN in every output."""
        q = torch.randn(self.q[0].shape, generator=self.gen)
        for r in range(self.world.world_size):
            self.q[r].copy_(q)
            self.k[r].copy_(torch.randn(self.k[r].shape, generator=self.gen))
            self.v[r].copy_(torch.randn(self.v[r].shape, generator=self.gen))
            want = torch.randint(0, self.S_r + 1, self.lens[r].shape, generator=self.gen) if lens is None else lens[r]
            self.lens[r].copy_(torch.as_tensor(want))
            self.out[r].fill_(float("nan"))

    def __call__(self, config, lens=True):
        return flash_decode(self.q, self.k, self.v, self.lens if lens else None, world=self.world, config=config,
                            out=self.out)  # fmt: skip

    def error(self, lens=True):
        ref = reference(self.q, self.k, self.v, self.lens if lens else None)
        return max(((o.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item() for o in self.out)


def _flag_high(world):
    return max((int(t.max()) for (n, _), buf in world._buffers.items() if ".flags." in n for t in buf.tensors),
               default=0)  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("W", [2, 4])
def test_every_mode_matches_attention_over_the_whole_cache(name, W):
    world = LocalWorld(world_size=W)
    call = Call(world, *SHAPE, seed=W)
    for step in range(2):  # repeated calls: counters, tickets and flags are handed back ready
        call.fresh()
        result = call(CONFIGS[name])
        assert all(x is y for x, y in zip(result, call.out))
        assert call.error() < TOL[torch.bfloat16], (name, step, [x.tolist() for x in call.lens])


def test_lengths_zero_on_a_rank_or_everywhere_and_whole_shards():
    world = LocalWorld(world_size=2)
    call = Call(world, *SHAPE, seed=5)
    # sequence 0: no keys anywhere (zeros, not NaN); 1: one key on rank 0, all of rank 1's
    call.fresh(lens=[[0, 1], [0, 100]])
    for name in ("fused", "baseline"):
        out = call(CONFIGS[name])
        assert all(torch.equal(o[0], torch.zeros_like(o[0])) for o in out), name
        assert call.error() < TOL[torch.bfloat16], name
    call.fresh()
    call(CONFIGS["pull"], lens=False)  # no lengths: every rank's whole shard
    assert call.error(lens=False) < TOL[torch.bfloat16]


@pytest.mark.parametrize("name", ["baseline", "fused"])
def test_more_splits_than_one_merge_block(name):
    """35 splits of an item of 8 heads at 2 warps: the chunk's merge reads [8 heads, 16 splits, D] blocks, so it
    takes three, the last one partial (4 warps would read 32 splits a step, 1 warp 8)."""
    assert (merge_splits(35, 8, 64, 2), merge_splits(35, 8, 64, 4), merge_splits(35, 8, 64, 1)) == (16, 32, 8)
    assert CONFIGS[name]["num_warps"] == 2
    world = LocalWorld(world_size=2)
    call = Call(world, 1, 16, 2, 64 * 35, 64, seed=8)
    call.fresh(lens=[[64 * 35], [64 * 33 + 5]])
    call(
        dict(
            CONFIGS[name],
            BLOCK_N=64,
            num_stages=1,
            heads_per_program=8,
            **({"items_per_flag": 1} if name != "baseline" else {}),
        )
    )
    assert call.error() < TOL[torch.bfloat16]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(("H", "H_KV", "hpp"), [(10, 2, 5), (7, 1, 7), (12, 1, 6)])
def test_gqa_groups_of_any_size_in_one_program(name, H, H_KV, hpp):
    """Groups of 5, 7 and 12 heads (Qwen2.5's 40/8 and 28/4 layers, a 12-head group run as two of 6): a program
    takes heads_per_program of them (fewer than its 16 dot rows, more than a power of two), and the chunk's merge
    masks the rows past them; the space default takes the largest divisor of G up to 16."""
    space = get_space("flash_decode")
    problem = space.make_problem(dict(B=3, H=H, H_KV=H_KV, S=200, D=64), world_size=2)
    limits = DeviceLimits(max_shared_mem=232448, num_sms=132, compute_capability=(9, 0))
    assert space.default(problem, limits)["heads_per_program"] == H // H_KV  # G itself: every G here is <= 16
    world = LocalWorld(world_size=2)
    call = Call(world, 3, H, H_KV, 100, 64, seed=H)
    for _ in range(2):
        call.fresh()
        call(dict(CONFIGS[name], heads_per_program=hpp))
        assert call.error() < TOL[torch.bfloat16], (name, H, hpp)


def test_float16_and_head_dim_128_and_a_scale():
    world = LocalWorld(world_size=2)
    call = Call(world, 2, 4, 4, 70, 128, seed=3, dtype=torch.float16)
    cfg = dict(CONFIGS["fused"], heads_per_program=1, BLOCK_N=32, num_stages=1)
    flash_decode(call.q, call.k, call.v, call.lens, world=world, config=cfg, out=call.out, scale=0.05)
    ref = reference(call.q, call.k, call.v, call.lens, scale=0.05)
    assert max(((o.float() - ref).norm() / ref.norm()).item() for o in call.out) < TOL[torch.float16]


def test_tensor_in_tensor_out_on_one_rank():
    world = LocalWorld(world_size=1)
    q, k, v = (
        torch.randn(2, 4, 64).bfloat16(),
        torch.randn(2, 2, 50, 64).bfloat16(),
        torch.randn(2, 2, 50, 64).bfloat16(),
    )
    lens = torch.tensor([50, 7], dtype=torch.int32)
    out = flash_decode(q, k, v, lens, world=world, config=dict(CONFIGS["fused"], heads_per_program=2))
    ref = reference([q], [k], [v], [lens])
    assert isinstance(out, torch.Tensor) and out.shape == (2, 4, 64)
    assert ((out.float() - ref).norm() / ref.norm()).item() < TOL[torch.bfloat16]


#: every mode replays at W = 2; at W = 4 the one-launch and the three-launch way (baseline keeps no state)
REPLAYS = [(name, 2) for name in CONFIGS] + [("fused", 4), ("wait", 4)]


@pytest.mark.parametrize(("name", "W"), REPLAYS)
def test_replays_with_new_lengths_arm_their_waits_and_stay_correct(name, W):
    world = LocalWorld(world_size=W)
    call = Call(world, *SHAPE, seed=11)
    call(CONFIGS[name])  # warm-up: the plan is built before capture, as on a GPU
    call.fresh()
    with capture() as graph:
        call(CONFIGS[name])
    for _ in range(3):
        call.fresh()  # new data and new lengths in the captured tensors
        high = _flag_high(world)
        graph.replay()
        assert call.error() < TOL[torch.bfloat16], f"{name}: wrong result after a replay"
        if name in FLAGGED:
            assert _flag_high(world) > high, f"{name}: a replay's flags kept an earlier call's epoch"


def test_two_graphs_alternate_with_eager_calls_of_other_modes_and_gemm_rs():
    world = LocalWorld(world_size=2)
    call = Call(world, *SHAPE, seed=5)
    other = Call(world, 2, 4, 4, 90, 64, seed=6)
    rs_a = [torch.randn(8, 16).bfloat16() for _ in range(2)]
    rs_b = [torch.randn(16, 24).bfloat16() for _ in range(2)]
    rs_cfg = dict(mode="pull_cublas", reduce_sms=1)
    graphs = {}
    for name in ("fused", "wait"):
        call(CONFIGS[name])
        with capture() as graph:
            call(CONFIGS[name])
        graphs[name] = graph
    for step in range(2):
        for name, graph in graphs.items():
            call.fresh()
            graph.replay()
            assert call.error() < TOL[torch.bfloat16], f"replay {step} of {name}"
            other.fresh()
            other(dict(CONFIGS["pull" if step else "fused"], heads_per_program=1))
            assert other.error() < TOL[torch.bfloat16]
            out = gemm_rs(rs_a, rs_b, world=world, config=rs_cfg)
            want = sum(x.float() @ y.float() for x, y in zip(rs_a, rs_b))
            assert ((out[0].float() - want[:4]).norm() / want[:4].norm()) < TOL[torch.bfloat16]


def test_prepared_calls_read_new_inputs_and_lengths():
    world = LocalWorld(world_size=2)
    call = Call(world, *SHAPE, seed=9)
    prepared = prepare(call.q, call.k, call.v, call.lens, world=world, config=CONFIGS["pull"], out=call.out)
    for _ in range(2):
        call.fresh()
        result = prepared.run()
        assert all(x is y for x, y in zip(result, call.out))
        assert call.error() < TOL[torch.bfloat16]


def test_bad_calls_name_the_argument():
    world = LocalWorld(world_size=2)
    q = [torch.randn(2, 4, 64).bfloat16() for _ in range(2)]
    k = [torch.randn(2, 2, 30, 64).bfloat16() for _ in range(2)]
    ok = dict(CONFIGS["fused"], heads_per_program=2)
    with pytest.raises(ShapeError, match="q, k, v: q must be"):
        flash_decode([x[0] for x in q], k, k, world=world, config=ok)
    with pytest.raises(ShapeError, match="H_KV=3"):
        flash_decode(q, [torch.randn(2, 3, 30, 64).bfloat16()] * 2, [torch.randn(2, 3, 30, 64).bfloat16()] * 2,
                     world=world, config=ok)  # fmt: skip
    with pytest.raises(ShapeError, match="dtype"):
        flash_decode(q, [x.half() for x in k], [x.half() for x in k], world=world, config=ok)
    with pytest.raises(ShapeError, match="kv_lens"):
        flash_decode(q, k, k, [torch.zeros(3, dtype=torch.int32)] * 2, world=world, config=ok)
    with pytest.raises(ShapeError, match="kv_lens"):
        flash_decode(q, k, k, [torch.zeros(2)] * 2, world=world, config=ok)
    flash_decode(q, k, k, [torch.full((2,), 30, dtype=torch.int32)] * 2, world=world, config=ok)  # the plan exists
    with pytest.raises(ShapeError, match="kv_lens"):  # and a repeat call's lengths are still checked
        flash_decode(q, k, k, [torch.zeros(2, dtype=torch.int16)] * 2, world=world, config=ok)
    with pytest.raises(ShapeError, match="head dim must be contiguous"):
        flash_decode(q, [x.transpose(2, 3).contiguous().transpose(2, 3) for x in k], k, world=world, config=ok)
    with pytest.raises(ShapeError, match="out"):
        flash_decode(q, k, k, world=world, config=ok, out=[torch.empty(2, 4, 32).bfloat16()] * 2)
    with pytest.raises(SpaceError, match="heads_per_program"):
        flash_decode(q, k, k, world=world, config=dict(ok, heads_per_program=8))
    with pytest.raises(SpaceError, match="push_programs"):
        flash_decode(q, k, k, world=world, config=dict(ok, push_programs=2))
    with pytest.raises(SpaceError, match="mode"):
        flash_decode(q, k, k, world=world, config=dict(ok, mode="broadcast"))
    with pytest.raises(ShapeError, match="q: requires grad, and flash_decode is forward-only"):
        flash_decode([x.clone().requires_grad_() for x in q], k, k, world=world, config=ok)


def test_lengths_and_scale_the_kernel_cannot_read_as_given_are_refused():
    """A column of a [B, W] lengths table (stride W), per-rank None beside tensors, Python lists, and a scale that is
    not a finite number: each refused by name, on the first call and on a repeat call of a built plan."""
    world = LocalWorld(world_size=2)
    q = [torch.randn(2, 4, 64).bfloat16() for _ in range(2)]
    k = [torch.randn(2, 2, 30, 64).bfloat16() for _ in range(2)]
    ok = dict(CONFIGS["fused"], heads_per_program=2)
    table = torch.full((2, 2), 30, dtype=torch.int32)  # [B, W]: rank r's lengths are table[:, r], stride 2
    for _ in range(2):  # the second round finds a plan built by the whole-lengths call below
        with pytest.raises(ShapeError, match=r"kv_lens: .*contiguous.*rank index 0 has .*stride \(2,\)"):
            flash_decode(q, k, k, [table[:, 0], table[:, 1]], world=world, config=ok)
        with pytest.raises(ShapeError, match=r"kv_lens: .*rank index 1 has NoneType"):
            flash_decode(q, k, k, [table[:, 0].contiguous(), None], world=world, config=ok)
        with pytest.raises(ShapeError, match=r"kv_lens: .*rank index 0 has list"):
            flash_decode(q, k, k, [[30, 30], [30, 30]], world=world, config=ok)
        for bad in (float("nan"), float("inf"), torch.tensor(0.1), "0.1", True):
            with pytest.raises(ShapeError, match=r"scale: .* finite real number"):
                flash_decode(q, k, k, world=world, config=ok, scale=bad)
        flash_decode(q, k, k, [table[:, 0].contiguous(), table[:, 1].contiguous()], world=world, config=ok)
    plans = len(world.plans)
    flash_decode(q, k, k, world=world, config=ok, scale=1)  # an int scale is the float's plan
    flash_decode(q, k, k, world=world, config=ok, scale=1.0)
    assert len(world.plans) == plans + 1


def test_lengths_past_int32_are_clamped_like_any_long_length():
    """int64 lengths are clamped to the shard before narrowing: 2**32 + 5 keys means the whole shard, not 5."""
    world = LocalWorld(world_size=2)
    call = Call(world, 2, 4, 2, 40, 64, seed=8)
    huge = [torch.tensor([2**32 + 5, 2**31], dtype=torch.int64) for _ in range(2)]
    out = flash_decode(call.q, call.k, call.v, huge, world=world, config=CONFIGS["pull"])
    ref = reference(call.q, call.k, call.v)  # every rank's whole shard
    assert max(((o.float() - ref).norm() / ref.norm()).item() for o in out) < TOL[torch.bfloat16]


def test_one_rank_plans_check_what_they_bake_in():
    """On one rank (the CUDA world's path: no per-call check once a plan exists), a v of another length, or k and v
    on another device, build a plan of their own, which checks them, instead of reusing one that reads past v."""
    world = LocalWorld(world_size=1)
    q, k, v = torch.randn(1, 2, 64).bfloat16(), torch.randn(1, 1, 60, 64).bfloat16(), torch.randn(1, 1, 60, 64)
    v = v.bfloat16()
    cfg = dict(CONFIGS["baseline"], heads_per_program=1)
    flash_decode(q, k, v, world=world, config=cfg)
    with pytest.raises(ShapeError, match="k, v: must both be"):
        flash_decode(q, k, v[:, :, :50], world=world, config=cfg)  # same strides, fewer keys


def test_family_contract_key_buckets_and_torch_op():
    fam = get_family("flash_decode")
    world = LocalWorld(world_size=2)
    problem = Problem.of({"B": 2, "H": 4, "H_KV": 2, "S": 180, "D": 64}, dtype="bfloat16", world_size=2)
    inputs = fam.make_inputs(problem, world, seed=1, ragged=True)
    # the key buckets the per-rank capacity up to a power of two: S_r = 90 -> 128, S = 256
    assert fam.key(inputs.q, inputs.k, inputs.v, inputs.kv_lens, world=world) == {
        "B": 2, "H": 4, "H_KV": 2, "S": 256, "D": 64}  # fmt: skip
    # and a tuned record of that shape is stored under the same key (tune/sweep store `stored_problem`)
    assert fam.stored_problem(problem).dims == {"B": 2, "H": 4, "H_KV": 2, "S": 256, "D": 64}
    for S, W, want in ((100, 2, 128), (128, 2, 128), (129, 2, 256), (1, 4, 4), (300, 3, 384)):
        asked = Problem.of({"B": 1, "H": 4, "H_KV": 2, "S": S, "D": 64}, dtype="bfloat16", world_size=W)
        assert fam.stored_problem(asked).dim("S") == want
    ref = fam.reference(inputs)  # per-shard statistics, all-gathered and combined: SDPA over the whole cache
    union = reference(inputs.q, inputs.k, inputs.v, inputs.kv_lens)
    assert all(torch.allclose(r, union, atol=1e-5, rtol=1e-5) for r in ref)
    for r, lens in enumerate(inputs.kv_lens):  # no key anywhere for sequence 0, none on rank 0 for sequence 1
        lens.copy_(torch.tensor([0, 0 if r == 0 else 7], dtype=torch.int32))
    empty = fam.reference(inputs)
    assert torch.equal(empty[0][0], torch.zeros(4, 64)) and torch.allclose(
        empty[1], reference(inputs.q, inputs.k, inputs.v, inputs.kv_lens), atol=1e-5, rtol=1e-5
    )
    inputs = fam.make_inputs(problem, world, seed=1, ragged=True)
    ref = fam.reference(inputs)
    assert fam.max_error(fam.baseline(inputs, world), ref) < fam.tolerance("bfloat16")
    out = torch.ops.jointtune.flash_decode(inputs.q, inputs.k, inputs.v, inputs.kv_lens, world.name,
                                           config_json(CONFIGS["wait"]))  # fmt: skip
    assert [o.shape for o in out] == [(2, 4, 64)] * 2
    assert fam.max_error(out, ref) < fam.tolerance("bfloat16")
    whole = torch.ops.jointtune.flash_decode(inputs.q, inputs.k, inputs.v, [], world.name,
                                             config_json(dict(CONFIGS["fused"], heads_per_program=2)))  # fmt: skip
    assert fam.max_error(whole, [reference(inputs.q, inputs.k, inputs.v)] * 2) < fam.tolerance("bfloat16")
    scaled = torch.ops.jointtune.flash_decode(inputs.q, inputs.k, inputs.v, inputs.kv_lens, world.name,
                                              config_json(CONFIGS["wait"]), scale=0.07)  # fmt: skip
    want = reference(inputs.q, inputs.k, inputs.v, inputs.kv_lens, scale=0.07)
    assert fam.max_error(scaled, [want] * 2) < fam.tolerance("bfloat16")
    torch.library.opcheck(torch.ops.jointtune.flash_decode.default,
                          (inputs.q, inputs.k, inputs.v, inputs.kv_lens, world.name, config_json(CONFIGS["wait"])),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_a_config_for_a_bucket_is_valid_for_every_capacity_in_it():
    """What the key promises: a config valid at the bucket's capacity is valid for any smaller capacity in it."""
    space, limits = get_space("flash_decode"), DeviceLimits.nominal_hopper()
    for W in (2, 3, 4):
        for S_r in (65, 100, 128, 1000, 1024, 5000):
            bucket = 1 << (S_r - 1).bit_length()
            tuned = Problem.of({"B": 1, "H": 8, "H_KV": 2, "S": bucket * W, "D": 64}, dtype="bfloat16", world_size=W)
            actual = Problem.of({"B": 1, "H": 8, "H_KV": 2, "S": S_r * W, "D": 64}, dtype="bfloat16", world_size=W)
            where = {"mode": "fused", "heads_per_program": 4, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
            for cfg in space.enumerate(tuned, limits, where=where):
                assert not space.violations(cfg, actual, limits), (W, S_r, cfg)


def _decorated(monkeypatch, **options):
    """flash_decode behind `@joint_autotune(space="flash_decode", **options)`, no service or mode from the env."""
    from jointtune.autotune.runtime.decorator import joint_autotune

    monkeypatch.delenv("JOINTTUNE_SERVER", raising=False)
    monkeypatch.delenv("JOINTTUNE_MODE", raising=False)

    @joint_autotune(space="flash_decode", **options)
    def attend(q, k, v, kv_lens, *, world, config, out=None):
        return flash_decode(q, k, v, kv_lens, world=world, config=config, out=out)

    return attend


def test_decorator_uses_the_family_key(tmp_path, monkeypatch):
    attend = _decorated(monkeypatch, on_miss="default", db_url=f"sqlite:///{tmp_path / 's.db'}")
    world = LocalWorld(world_size=2)
    call = Call(world, 2, 4, 2, 40, 64, seed=2)
    attend(call.q, call.k, call.v, call.lens, world=world, out=call.out)
    assert call.error() < TOL[torch.bfloat16]
    ((key, config),) = attend.cache.items()
    assert dict(key[0]) == {"B": 2, "H": 4, "H_KV": 2, "S": 128, "D": 64}  # S_r = 40 -> 64 per rank
    assert attend.sources[key] == "default" and config["mode"] in get_space("flash_decode").modes


def test_a_key_of_the_callers_own_finds_the_bucket_record(tmp_path, monkeypatch):
    """key= returning the raw capacity (S = 80 at 2 ranks): the lookup asks for the bucket (S = 128), where tuning
    stores records, and finds the stored one exactly."""
    from jointtune.autotune.tuner.keys import triton_version
    from jointtune.db import NewRecord, open_store
    from jointtune.hardware import detect

    db = f"sqlite:///{tmp_path / 's.db'}"
    stored = dict(CONFIGS["fused"], heads_per_program=2)
    open_store(db).upsert_record(NewRecord(
        kernel="flash_decode", kernel_version=get_family("flash_decode").version,
        space_version=get_space("flash_decode").version, shape={"B": 2, "H": 4, "H_KV": 2, "S": 128, "D": 64},
        dtype="bfloat16", world_size=2, hardware_id=detect().hardware_id, triton_version=triton_version(),
        config=stored, latency_p50_us=10.0, trials=3, timing="eager",
    ))  # fmt: skip

    def raw_length(q, k, v, kv_lens, *, world, out=None):
        return {"B": q[0].shape[0], "H": q[0].shape[1], "H_KV": k[0].shape[1], "S": k[0].shape[2] * 2,
                "D": q[0].shape[2]}  # fmt: skip

    attend = _decorated(monkeypatch, key=raw_length, on_miss="error", db_url=db)
    world = LocalWorld(world_size=2)
    call = Call(world, 2, 4, 2, 40, 64, seed=3)
    attend(call.q, call.k, call.v, call.lens, world=world, out=call.out)
    assert call.error() < TOL[torch.bfloat16]
    ((key, config),) = attend.cache.items()
    assert dict(key[0])["S"] == 80 and attend.sources[key] == "store"
    assert {name: config[name] for name in stored} == stored
    # another length of the same bucket (36 keys per rank: S = 72) takes the bucket's config without a lookup
    monkeypatch.setattr(attend, "_find", lambda *a, **k: pytest.fail("a second lookup for a resolved bucket"))
    shorter = Call(world, 2, 4, 2, 36, 64, seed=4)
    attend(shorter.q, shorter.k, shorter.v, shorter.lens, world=world)
    assert {dict(k[0])["S"]: attend.sources[k] for k in attend.cache} == {80: "store", 72: "store"}
