"""Property tests: every space agrees with the spec oracle on random problems, devices and configs."""

from __future__ import annotations

import json
from typing import Any

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spaces_oracle import active_fields, broken_rules, np2

from jointtune.errors import SpaceError
from jointtune.search_spaces import DeviceLimits, Problem, Space, canonical_json, config_hash, get_space
from jointtune.search_spaces.ag_gemm import default_chunk_m

NAMES = ["ag_gemm", "gemm_rs", "flash_decode"]
LIMITS = [
    DeviceLimits.nominal_hopper(),
    DeviceLimits(max_shared_mem=166912, num_sms=108, compute_capability=(8, 0)),
    DeviceLimits(max_shared_mem=101376, num_sms=84, compute_capability=(8, 9)),
    DeviceLimits(max_shared_mem=49152, num_sms=20, compute_capability=(7, 5)),
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw: st.DrawFn, name: str) -> Problem:
    w = draw(st.sampled_from([1, 2, 4, 8]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    if name == "flash_decode":
        h_kv = draw(st.sampled_from([1, 2, 4, 8]))
        dims = {
            "B": draw(st.integers(1, 128)),
            "H": h_kv * draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16])),
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


@SETTINGS
@given(cases())
def test_violations_agree_with_validate_and_the_spec(case) -> None:
    space, problem, limits, cfg = case
    assert set(cfg) == active_fields(space.name, cfg)
    problems_found = space.violations(cfg, problem, limits)
    assert bool(problems_found) == bool(broken_rules(space.name, cfg, problem, limits)), problems_found
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
        del cfg[field]
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
        cfg[field] = data.draw(st.sampled_from([3, 12345, "zz", True, None, 2.5]))
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
    if where["mode"] == "push" and space.name != "flash_decode":
        where["comm_sms"] = data.draw(st.sampled_from(space.param("comm_sms").choices))  # keep it small
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
        rows = problem.dim("M") // problem.world_size
        expected = {"mode": "baseline"} if rows < 512 else {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1}
        assert default == expected
    elif name == "ag_gemm":
        rows, w = problem.dim("M") // problem.world_size, problem.world_size
        if w == 1 or limits.num_sms < 4:
            assert default == {"mode": "baseline"}
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
        assert default == {"mode": "baseline"}


@pytest.mark.parametrize("name", ["ag_gemm", "gemm_rs"])
def test_split_k_agrees_with_the_spec_on_both_sides_of_every_edge(name: str) -> None:
    # random walks rarely land on a depth where cdiv and floor division disagree, so walk every edge:
    # depth d is the one the local GEMM loops over (ag_gemm: K; gemm_rs: K / W, here W = 2)
    space, limits = get_space(name), LIMITS[0]
    tiles = {"mode": "pull", "BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    tiles |= {"chunk_m": 64} if name == "gemm_rs" else {}
    for split in space.param("SPLIT_K").choices:
        for bk in space.param("BLOCK_K").choices:
            first = split * (2 * bk - 1) + 1  # the least d with cdiv(d, split) >= 2 * bk
            for d in (first - 1, first, 2 * bk * split - 1, 2 * bk * split):
                k = d if name == "ag_gemm" else 2 * d
                problem = space.make_problem({"M": 128, "N": 64, "K": k}, dtype="bf16", world_size=2)
                cfg = {**tiles, "BLOCK_K": bk, "SPLIT_K": split}
                expected = broken_rules(name, cfg, problem, limits)
                assert expected == (["split_k"] if split > 1 and d < first else []), (cfg, d)
                assert bool(space.violations(cfg, problem, limits)) == bool(expected), (cfg, d)
