"""Property tests: every space agrees with the spec oracle on random problems, devices and configs."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spaces_oracle import GEMM_RS_FUSED, active_fields, broken_rules, np2

from jointtune.errors import SpaceError
from jointtune.search_spaces import DeviceLimits, Problem, Space, canonical_json, config_hash, get_space
from jointtune.search_spaces.ag_gemm import default_chunk_m

NAMES = ["ag_gemm", "gemm_rs", "flash_decode"]
LIMITS = [
    DeviceLimits.nominal_hopper(),
    DeviceLimits(max_shared_mem=166912, num_sms=108, compute_capability=(8, 0)),
    DeviceLimits(max_shared_mem=101376, num_sms=84, compute_capability=(8, 9)),
    DeviceLimits(max_shared_mem=49152, num_sms=20, compute_capability=(7, 5)),
    DeviceLimits(max_shared_mem=49152, num_sms=3, compute_capability=(7, 5)),  # too few SMs for a fused kernel
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw: st.DrawFn, name: str) -> Problem:
    w = draw(st.sampled_from([1, 2, 4, 8]))
    dtype = draw(st.sampled_from(get_space(name).dtypes))
    if name == "flash_decode":
        h_kv = draw(st.sampled_from([1, 2, 4, 8]))
        dims = {
            "B": draw(st.integers(1, 128)),
            "H": h_kv * draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16, 24, 32])),  # G = H / H_KV
            "H_KV": h_kv,
            "S": draw(st.integers(w, 300_000)),
            "D": draw(st.sampled_from([64, 128, 256])),
        }
    else:
        rows = draw(st.one_of(st.sampled_from([1, 16, 100, 128, 511, 512, 4096, 9000]), st.integers(1, 10_000)))
        # the local depth (ag_gemm: K, gemm_rs: K / W) also from values just below where cdiv and
        # floor division disagree on whether a SPLIT_K leaves two BLOCK_K steps per split
        edges = st.sampled_from([127, 255, 511, 1020, 1023, 2047, 4095])
        n, k = draw(st.integers(1, 8192)), draw(st.one_of(st.integers(1, 16384), edges))
        dims = {"M": w * rows, "N": w * n, "K": k} if name == "ag_gemm" else {"M": w * rows, "N": n, "K": w * k}
    return get_space(name).make_problem(dims, dtype=dtype, world_size=w)


@st.composite
def walks(draw: st.DrawFn, space: Space) -> dict[str, Any]:
    """A config the way `suggest` builds one: each active param takes any of its choices."""
    cfg: dict[str, Any] = {}
    for p in space.params:
        if p.when is None or p.when.holds(cfg):
            cfg[p.name] = draw(st.sampled_from(p.choices))
    return cfg


@st.composite
def cases(draw: st.DrawFn) -> tuple[Space, Problem, DeviceLimits, dict[str, Any]]:
    space = get_space(draw(st.sampled_from(NAMES)))
    return space, draw(problems(space.name)), draw(st.sampled_from(LIMITS)), draw(walks(space))


def rules_the_space_finds_broken(
    space: Space, cfg: dict[str, Any], problem: Problem, limits: DeviceLimits
) -> list[str]:
    ctx = space.context(problem, limits)
    return sorted(c.name for c in space.constraints if all(f in cfg for f in c.fields) and c.check(cfg, ctx))


@SETTINGS
@given(cases())
def test_violations_agree_with_validate_and_the_spec(case) -> None:
    space, problem, limits, cfg = case
    assert set(cfg) == active_fields(space.name, cfg)
    problems_found = space.violations(cfg, problem, limits)
    expected = broken_rules(space.name, cfg, problem, limits)
    # the very rules the spec names are the ones broken, and each gives one message
    assert rules_the_space_finds_broken(space, cfg, problem, limits) == sorted(expected), problems_found
    assert len(problems_found) == len(expected), problems_found
    if problems_found:
        with pytest.raises(SpaceError) as e:
            space.validate(cfg, problem, limits)
        assert all(v in str(e.value) for v in problems_found)
    else:
        assert space.validate(cfg, problem, limits) == cfg


@SETTINGS
@given(cases(), st.data())
def test_suggest_asks_exactly_the_active_params(case, data) -> None:
    space, problem, limits, cfg = case
    answers = {p.name: data.draw(st.sampled_from(p.choices)) for p in space.params}
    answers.update(cfg)
    suggested = space.suggest(optuna.trial.FixedTrial(answers), problem, limits)
    assert suggested == cfg and list(suggested) == [p.name for p in space.params if p.name in cfg]
    assert not [v for v in space.violations(suggested, problem, limits) if "missing" in v or "only exists" in v]


MISTAKES = ["drop", "inactive", "bad_value", "unknown"]


@SETTINGS
@given(cases(), st.sampled_from(MISTAKES), st.data())
def test_structural_mistakes_are_named(case, mistake: str, data) -> None:
    space, problem, limits, cfg = case
    cfg = dict(cfg)
    if mistake == "drop":
        field = data.draw(st.sampled_from(sorted(cfg)))
        implied = space.param(field).implied
        del cfg[field]
        if implied is not None:  # a knob added later: leaving it out means its implied value, not a mistake
            # (the walk may break a rule of the shape elsewhere: then both forms are refused, with the same faults)
            faults = space.violations({**cfg, field: implied}, problem, limits)
            if faults:
                assert space.violations(cfg, problem, limits) == faults
            else:
                assert space.validate(cfg, problem, limits)[field] == implied
            return
        expected = f"{field}: missing"
    elif mistake == "inactive":
        inactive = [p for p in space.params if p.name not in cfg]
        if not inactive:
            return
        p = data.draw(st.sampled_from(inactive))
        cfg[p.name] = p.choices[0]
        expected = f"{p.name}: "
    elif mistake == "bad_value":
        field = data.draw(st.sampled_from(sorted(cfg)))
        choices = space.param(field).choices  # 3 is a real choice of num_stages: not a mistake there
        bad = [v for v in (3, 12345, "zz", True, None, 2.5) if not any(type(v) is type(c) and v == c for c in choices)]
        cfg[field] = data.draw(st.sampled_from(bad))
        expected = f"{field}: {cfg[field]!r} is not allowed"
    else:
        cfg["NOT_A_FIELD"] = 1
        expected = "NOT_A_FIELD: unknown field for space"
    found = space.violations(cfg, problem, limits)
    assert any(expected in v for v in found), (expected, found)
    with pytest.raises(SpaceError, match="allowed"):
        space.validate(cfg, problem, limits)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(st.integers(-(2**40), 2**40), st.booleans(), st.text(max_size=8)),
        max_size=12,
    ),
    st.randoms(),
)
def test_canonical_json_round_trips_and_ignores_key_order(cfg: dict[str, Any], rnd) -> None:
    text = canonical_json(cfg)
    assert json.loads(text) == cfg
    assert text == json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    items = list(cfg.items())
    rnd.shuffle(items)
    assert canonical_json(dict(items)) == text
    assert config_hash(dict(items)) == config_hash(cfg) and len(config_hash(cfg)) == 16


def test_canonical_json_normalises_integral_floats_and_rejects_other_values() -> None:
    assert canonical_json({"b": 64.0, "a": "x"}) == '{"a":"x","b":64}'
    assert config_hash({"BLOCK_M": 64}) == config_hash({"BLOCK_M": 64.0})
    assert config_hash({"BLOCK_M": 64}) != config_hash({"BLOCK_M": 128})
    with pytest.raises(SpaceError, match=r"BLOCK_M: \[64\] is not allowed; config values are int, str or bool"):
        canonical_json({"BLOCK_M": [64]})
    with pytest.raises(SpaceError, match="config: 3 is not allowed"):
        canonical_json(3)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_enumerated_configs_are_valid_distinct_and_counted(data) -> None:
    space = get_space(data.draw(st.sampled_from(NAMES)))
    problem, limits = data.draw(problems(space.name)), data.draw(st.sampled_from(LIMITS))
    where: dict[str, Any] = {"mode": data.draw(st.sampled_from(space.modes))}
    for name in ("comm_sms", "reduce_by", "reduce_sms", "tile_order", "push_programs"):  # pinned where they exist
        if any(p.name == name for p in space.params) and space.param(name).when.holds(where):
            where[name] = data.draw(st.sampled_from(space.param(name).choices))
    seen = set()
    for i, cfg in enumerate(space.enumerate(problem, limits, where=where)):
        assert set(cfg) == active_fields(space.name, cfg)
        assert all(cfg[k] == v for k, v in where.items())
        assert broken_rules(space.name, cfg, problem, limits) == [], cfg
        if i % 97 == 0:
            assert space.validate(cfg, problem, limits) == cfg
        seen.add(canonical_json(cfg))
    assert len(seen) == space.count(problem, limits, where=where)


@SETTINGS
@given(st.sampled_from(NAMES).flatmap(lambda n: st.tuples(st.just(n), problems(n))), st.sampled_from(LIMITS))
def test_default_is_always_valid(named, limits: DeviceLimits) -> None:
    name, problem = named
    space = get_space(name)
    default = space.default(problem, limits)
    assert space.violations(default, problem, limits) == []
    if name == "gemm_rs":
        assert default == _gemm_rs_default(problem.dim("M") // problem.world_size, problem.world_size, limits.num_sms)
    elif name == "ag_gemm":
        rows, w = problem.dim("M") // problem.world_size, problem.world_size
        if w == 1 or limits.num_sms < 4:
            assert default == {"mode": "baseline", "collective": "nccl"}
        elif rows <= 128:  # the barrier launch on 64 programs (at most half the SMs), LL words where few values travel
            sms = min(64, 1 << (limits.num_sms // 2).bit_length() - 1)
            landing = "ll" if (w - 1) * rows * problem.dim("K") <= 1 << 17 else "inbox"
            assert default == {"mode": "barrier", "landing": landing, "barrier_sms": sms}
        elif rows < 2048:
            assert default["mode"] == "push_cublas" and default["gemm_order"] == "gathered"
            assert default["comm_sms"] == min(32, 1 << (limits.num_sms // 4).bit_length() - 1)
        elif default_chunk_m(rows) is None:
            assert default == {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1}
        else:
            chunk = default["chunk_m"]
            assert default == {"mode": "push_cublas", "push_by": "ce", "gemm_order": "local_first", "chunk_m": chunk}
            assert rows % chunk == 0 or chunk == np2(rows)  # a chunk the kernel takes
    else:
        _check_flash_decode_default(default, problem, limits)


def _check_flash_decode_default(default: dict[str, Any], problem: Problem, limits: DeviceLimits) -> None:
    """The spec's flash_decode default, by its documented properties: a whole GQA group per program (the largest
    divisor of G up to 16); the split whose program count is nearest one per SM by ratio (of two as near, the
    longer); 128-key steps from 1024-key splits (64 below), 3 stages where the split has the steps and shared memory
    holds them (shorter steps first, then fewer stages); mode pull (one decode item per flag) where several ranks
    share few decode items (B * H_KV * (G / heads_per_program) <= 16) over a short shard (S_r <= 65536 keys per
    rank), else baseline."""
    d, w = problem.dims, problem.world_size
    g, s_r = d["H"] // d["H_KV"], -(-d["S"] // w)
    hpp = default["heads_per_program"]
    assert hpp == max(p for p in range(1, 17) if g % p == 0)
    items = d["B"] * d["H_KV"] * (g // hpp)
    if w > 1 and items <= 16 and s_r <= 65536:
        assert default["mode"] == "pull" and default["items_per_flag"] == 1
    else:
        assert default["mode"] == "baseline"
    assert set(default) == active_fields("flash_decode", default)  # the mode's fields, no others
    # nearest to one program per SM: no allowed split is nearer by ratio, and none as near is longer
    kv_split = default["kv_split"]

    def off(k: int) -> float:
        return abs(math.log2(items * -(-s_r // k) / limits.num_sms))

    allowed = [k for k in (64 << i for i in range(9)) if k <= max(64, np2(s_r))]
    assert kv_split in allowed
    assert all(off(k) > off(kv_split) or (off(k) == off(kv_split) and k <= kv_split) for k in allowed), kv_split
    # keys per step and stages: as long and as deep as the split and shared memory allow, in that order
    bn, stages = default["BLOCK_N"], default["num_stages"]
    want_bn = min(128 if kv_split >= 1024 else 64, kv_split)
    depth = min(3, kv_split // want_bn)
    order = [(b, depth) for b in (128, 64) if b <= want_bn]  # shorter steps first (down to 64),
    order += [(min(64, want_bn), st) for st in range(depth - 1, 0, -1)]  # then fewer stages,
    order += [(b, 1) for b in (32, 16) if b < min(64, want_bn)]  # then shorter steps again
    fits = [(b, st) for b, st in order if 2 * b * d["D"] * problem.dtype_bytes * st <= limits.max_shared_mem]
    assert (bn, stages) == (fits or order[-1:])[0], (bn, stages, fits[:3])
    assert default["num_warps"] == min(4, bn // 8)


@pytest.mark.parametrize(
    ("shape", "world_size", "mode", "hpp"),
    [
        # batch 1 of a 32-head, 8-kv-head model: 8 decode items; pull up to 64K keys per rank
        ({"B": 1, "H": 32, "H_KV": 8, "S": 8192}, 2, "pull", 4),
        ({"B": 1, "H": 32, "H_KV": 8, "S": 131072}, 2, "pull", 4),  # S_r = 65536
        ({"B": 1, "H": 32, "H_KV": 8, "S": 131073}, 2, "baseline", 4),  # S_r = 65537
        ({"B": 1, "H": 32, "H_KV": 8, "S": 262144}, 4, "pull", 4),
        ({"B": 1, "H": 32, "H_KV": 8, "S": 8192}, 1, "baseline", 4),  # one rank: nothing to exchange
        ({"B": 2, "H": 64, "H_KV": 8, "S": 8192}, 2, "pull", 8),  # 16 items
        ({"B": 3, "H": 64, "H_KV": 8, "S": 8192}, 2, "baseline", 8),  # 24 items
        ({"B": 8, "H": 32, "H_KV": 8, "S": 8192}, 2, "baseline", 4),  # 64 items
        ({"B": 16, "H": 3, "H_KV": 1, "S": 8192}, 2, "pull", 3),  # G = 3: the whole group per program, 16 items
        ({"B": 17, "H": 3, "H_KV": 1, "S": 8192}, 2, "baseline", 3),  # 17 items
        ({"B": 5, "H": 10, "H_KV": 2, "S": 8192}, 2, "pull", 5),  # G = 5 (a 40/8 layer's group): 10 items
        ({"B": 1, "H": 24, "H_KV": 1, "S": 8192}, 2, "pull", 12),  # G = 24: 12 divides it, 13-16 do not
        ({"B": 1, "H": 64, "H_KV": 2, "S": 8192}, 2, "pull", 16),  # G = 32: capped at 16 heads
        ({"B": 4, "H": 64, "H_KV": 2, "S": 8192}, 2, "pull", 16),  # 4 * 2 * (32 / 16) = 16 items
        ({"B": 5, "H": 64, "H_KV": 2, "S": 8192}, 2, "baseline", 16),  # 20 items
    ],
)
def test_flash_decode_default_pulls_for_few_items_on_short_shards(shape, world_size, mode, hpp) -> None:
    space, limits = get_space("flash_decode"), LIMITS[0]
    problem = space.make_problem({**shape, "D": 128}, dtype="bf16", world_size=world_size)
    default = space.default(problem, limits)
    assert default["mode"] == mode and default["heads_per_program"] == hpp
    assert space.violations(default, problem, limits) == []
    _check_flash_decode_default(default, problem, limits)


def _pow2_at_most(n: int) -> int:
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def _gemm_rs_default(rows: int, world_size: int, num_sms: int) -> dict[str, Any]:
    """The spec's gemm_rs default: cuBLAS alone on one rank (or too few SMs to share); cuBLAS + the pushed barrier
    launch on 64 programs (at most half the SMs) below 512 rows per rank; else cuBLAS + the copy engine in one
    chunk."""
    if world_size == 1 or num_sms < 4:
        return {"mode": "baseline", "collective": "nccl"}
    if rows < 512:
        return {"mode": "barrier", "transport": "push", "reduce_sms": _pow2_at_most(min(64, num_sms // 2))}
    return {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": _pow2_at_most(min(128, num_sms))}


@pytest.mark.parametrize(
    ("rows", "world_size", "num_sms", "expected"),
    [
        (4096, 1, 132, {"mode": "baseline", "collective": "nccl"}),
        (4096, 2, 3, {"mode": "baseline", "collective": "nccl"}),
        (1, 2, 4, {"mode": "barrier", "transport": "push", "reduce_sms": 2}),
        (511, 8, 132, {"mode": "barrier", "transport": "push", "reduce_sms": 64}),
        (511, 2, 20, {"mode": "barrier", "transport": "push", "reduce_sms": 8}),
        (511, 2, 63, {"mode": "barrier", "transport": "push", "reduce_sms": 16}),
        (512, 2, 132, {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": 128}),
        (512, 4, 127, {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": 64}),
        (9000, 2, 5, {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "reduce_sms": 4}),
    ],
)
def test_gemm_rs_default_follows_rows_world_size_and_sms(rows, world_size, num_sms, expected) -> None:
    space = get_space("gemm_rs")
    problem = space.make_problem({"M": world_size * rows, "N": 4096, "K": world_size * 1024}, world_size=world_size)
    limits = DeviceLimits(max_shared_mem=232448, num_sms=num_sms, compute_capability=(9, 0))
    assert _gemm_rs_default(rows, world_size, num_sms) == expected  # the spec helper itself, at its edges
    assert space.default(problem, limits) == expected
    assert space.violations(expected, problem, limits) == []


@pytest.mark.parametrize("name", ["ag_gemm", "gemm_rs"])
def test_split_k_agrees_with_the_spec_on_both_sides_of_every_edge(name: str) -> None:
    # random walks rarely land on a depth where cdiv and floor division disagree, so walk every edge:
    # depth d is the one the local GEMM loops over (ag_gemm: K; gemm_rs: K / W, here W = 2)
    space, limits = get_space(name), LIMITS[0]
    tiles = {"mode": "pull", "BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    tiles |= (
        {"chunk_m": 64, "reduce_by": "programs", "reduce_sms": 8, "tile_order": "peers_first"}
        if name == "gemm_rs"
        else {}
    )
    for split in space.param("SPLIT_K").choices:
        for bk in space.param("BLOCK_K").choices:
            first = split * (2 * bk - 1) + 1  # the least d with cdiv(d, split) >= 2 * bk
            for d in (first - 1, first, 2 * bk * split - 1, 2 * bk * split):
                k = d if name == "ag_gemm" else 2 * d
                problem = space.make_problem({"M": 128, "N": 64, "K": k}, dtype="bf16", world_size=2)
                cfg = {**tiles, "BLOCK_K": bk, "SPLIT_K": split}
                expected = broken_rules(name, cfg, problem, limits)
                assert expected == (["split_k_fits_depth"] if split > 1 and d < first else []), (cfg, d)
                assert bool(space.violations(cfg, problem, limits)) == bool(expected), (cfg, d)


GEMM_RS_TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
GEMM_RS_TILE["SPLIT_K"] = 1


@pytest.mark.parametrize("mode", GEMM_RS_FUSED)
@pytest.mark.parametrize(
    ("rows", "longest"),
    [(1, 16), (15, 16), (16, 16), (17, 32), (100, 128), (128, 128), (129, 256), (4097, 8192), (8192, 8192)],
)
def test_gemm_rs_chunks_may_be_ragged_but_no_longer_than_the_rows_rounded_up(mode: str, rows: int, longest: int):
    # chunk_fits_rows: chunk_m <= max(16, next_pow2(R)); the kernel takes a shorter last chunk, so a chunk
    # need not divide R (ag_gemm's chunk_divides_rows still holds there)
    space, limits = get_space("gemm_rs"), LIMITS[0]
    problem = space.make_problem({"M": 2 * rows, "N": 64, "K": 128}, dtype="bf16", world_size=2)
    base = {"mode": mode, **GEMM_RS_TILE, "reduce_sms": 8, "tile_order": "own_first"}
    if mode != "atomic":
        base["reduce_by"] = "programs"
    for chunk in space.param("chunk_m").choices:
        cfg = {**base, "chunk_m": chunk}
        fits = chunk <= longest
        assert broken_rules("gemm_rs", cfg, problem, limits) == ([] if fits else ["chunk_fits_rows"]), cfg
        assert space.violations(cfg, problem, limits) == (
            []
            if fits
            else [
                f"chunk_m: {chunk} is not allowed for R={rows} rows per rank (M / world_size); "
                f"allowed: <= max(16, next_pow2(R)) = {longest}"
            ]
        )


def test_a_ragged_last_chunk_is_fine_for_gemm_rs_not_for_ag_gemm() -> None:
    # 100 rows per rank in chunks of 32: the last chunk has 4 rows
    limits = LIMITS[0]
    rs = get_space("gemm_rs")
    rs_problem = rs.make_problem({"M": 200, "N": 64, "K": 128}, dtype="bf16", world_size=2)
    push = {
        "mode": "push",
        **GEMM_RS_TILE,
        "chunk_m": 32,
        "reduce_by": "programs",
        "reduce_sms": 8,
        "tile_order": "peers_first",
    }
    assert broken_rules("gemm_rs", push, rs_problem, limits) == [] == rs.violations(push, rs_problem, limits)
    ag = get_space("ag_gemm")
    ag_problem = ag.make_problem({"M": 200, "N": 128, "K": 64}, dtype="bf16", world_size=2)
    push = {"mode": "push", **GEMM_RS_TILE, "comm_sms": 8, "chunk_m": 32}
    assert broken_rules("ag_gemm", push, ag_problem, limits) == ["chunk_divides_rows"]
    assert ag.violations(push, ag_problem, limits) == [
        "chunk_m: 32 is not allowed for R=100 rows per rank (M / world_size); "
        "allowed: a divisor of R, or 128 (one chunk per rank)"
    ]


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 24, 100])
def test_ag_gemm_offers_every_chunked_mode_at_any_rows_per_rank(world_size: int, rows: int) -> None:
    # a decode step at TP=8 has M = 8..64 (1..8 rows per rank); chunk_m starts at 16, so one chunk per rank is
    # max(16, next_pow2(R)) rows (it was next_pow2(R): no push config at all for R <= 8)
    space, limits = get_space("ag_gemm"), LIMITS[0]
    shape = {"M": world_size * rows, "N": 64 * world_size, "K": 128}
    problem = space.make_problem(shape, dtype="bf16", world_size=world_size)
    single = max(16, 1 << (rows - 1).bit_length())
    for where in ({"mode": "push"}, {"mode": "push_cublas", "gemm_order": "local_first"}):
        offered = {
            c for c in space.param("chunk_m").choices if space.count(problem, limits, where={**where, "chunk_m": c})
        }
        assert offered == {c for c in space.param("chunk_m").choices if rows % c == 0 or c == single}, where
        assert single in offered


REDUCE_MODES = [
    ({"mode": "pull", **GEMM_RS_TILE, "chunk_m": 64, "reduce_by": "programs", "tile_order": "peers_first"}, "quarter"),
    ({"mode": "push", **GEMM_RS_TILE, "chunk_m": 64, "reduce_by": "programs", "tile_order": "peers_first"}, "quarter"),
    ({"mode": "atomic", **GEMM_RS_TILE, "chunk_m": 64, "tile_order": "own_first"}, "quarter"),
    ({"mode": "pull_cublas"}, "all"),
    ({"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 2}, "all"),
    ({"mode": "ce", "ce_consumer": "triton", "ce_chunks": 2, **GEMM_RS_TILE}, "all"),
]


@pytest.mark.parametrize(("base", "share"), REDUCE_MODES)
@pytest.mark.parametrize("num_sms", [3, 4, 20, 63, 64, 65, 132, 200])
def test_gemm_rs_reduce_programs_get_a_quarter_of_the_sms_beside_a_fused_gemm_else_all(base, share, num_sms):
    # reduce_sms_budget: <= num_sms // 4 in pull, push, atomic (the reduce programs share the GEMM's grid);
    # <= num_sms in pull_cublas and ce (they run after cuBLAS or beside the copy engine)
    space = get_space("gemm_rs")
    problem = space.make_problem({"M": 1024, "N": 1024, "K": 1024}, dtype="bf16", world_size=2)
    limits = DeviceLimits(max_shared_mem=232448, num_sms=num_sms, compute_capability=(9, 0))
    limit = num_sms // 4 if share == "quarter" else num_sms
    allowed = []
    for sms in space.param("reduce_sms").choices:
        cfg = {**base, "reduce_sms": sms}
        fits = sms <= limit
        allowed += [sms] if fits else []
        assert broken_rules("gemm_rs", cfg, problem, limits) == ([] if fits else ["reduce_sms_budget"]), cfg
        found = space.violations(cfg, problem, limits)
        if fits:
            assert found == [], cfg
        else:
            (message,) = found
            assert message.startswith(f"reduce_sms: {sms} is not allowed with mode={base['mode']}"), message
            rule = "num_sms // 4 beside a fused GEMM" if share == "quarter" else "num_sms"
            assert message.endswith(f"num_sms={num_sms}; allowed: <= {rule} = {limit}"), message
    where = {k: v for k, v in base.items() if k != "reduce_sms"}
    assert sorted({c["reduce_sms"] for c in space.enumerate(problem, limits, where=where)}) == allowed


def test_gemm_rs_atomic_mode_takes_every_tile_the_other_fused_modes_take() -> None:
    # revision 4: atomic mode's tile rule is gone (its wrong sums were a race in the kernel, since fixed), so a tile,
    # warp count or stage count breaks exactly the rules for atomic that it breaks for pull and push
    space, limits = get_space("gemm_rs"), LIMITS[0]
    problem = space.make_problem({"M": 8192, "N": 8192, "K": 16384}, dtype="bf16", world_size=2)
    fused = {"GROUP_M": 1, "BLOCK_K": 32, "num_stages": 2, "SPLIT_K": 1, "chunk_m": 256, "reduce_sms": 16}
    fused["tile_order"] = "peers_first"
    for bm, bn, warps in itertools.product(
        space.param("BLOCK_M").choices, space.param("BLOCK_N").choices, space.param("num_warps").choices
    ):
        tile = {**fused, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps}
        by_mode = {"pull": {"mode": "pull", "reduce_by": "programs", **tile}, "atomic": {"mode": "atomic", **tile}}
        pull = broken_rules("gemm_rs", by_mode["pull"], problem, limits)
        assert broken_rules("gemm_rs", by_mode["atomic"], problem, limits) == pull, (bm, bn, warps)
        for cfg in by_mode.values():
            found = space.violations(cfg, problem, limits)
            assert rules_the_space_finds_broken(space, cfg, problem, limits) == sorted(pull)
            assert len(found) == len(pull), found
    big = {"mode": "atomic", **fused, "BLOCK_M": 128, "BLOCK_N": 256, "num_warps": 8}
    assert space.violations(big, problem, limits) == []
    modes = space.count_by_mode(problem, limits)
    # push takes every config pull takes, and its tiles over every rank's rows once more with LL words
    pull_tiles = space.count(problem, limits, where={"mode": "pull", "reduce_by": "tile"})
    assert 0 < modes["pull"] == modes["push"] - pull_tiles
    programs = {"reduce_by": "programs"}
    assert modes["atomic"] == space.count(problem, limits, where={"mode": "pull", **programs})
