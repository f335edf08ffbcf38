"""The three families' spaces: the exact definitions kernels are written against, counts, messages."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from spaces_oracle import active_fields, broken_rules

from jointtune.errors import SpaceError
from jointtune.search_spaces import (
    AG_GEMM,
    ANCHORS,
    DeviceLimits,
    Space,
    anchor_problems,
    choice,
    get_space,
    pow2,
)

HOPPER = DeviceLimits.nominal_hopper()
TILES = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")


def test_ag_gemm_params_are_exactly_the_kernel_contract() -> None:
    space = get_space("ag_gemm")
    assert {p.name: p.choices for p in space.params} == {
        "mode": ("pull", "push", "push_cublas", "barrier", "ce", "baseline"),
        "ce_consumer": ("triton", "cublas"),
        "ce_chunks": (1, 2, 4, 8),
        "push_by": ("sm", "ce"),
        "gemm_order": ("local_first", "gathered"),
        "collective": ("nccl", "nccl_symm", "nccl_ce"),
        "BLOCK_M": (16, 32, 64, 128, 256),
        "BLOCK_N": (32, 64, 128, 256),
        "BLOCK_K": (32, 64, 128, 256),
        "GROUP_M": (1, 4, 8, 16),
        "num_warps": (4, 8),
        "num_stages": (2, 3, 4, 5, 6),
        "SPLIT_K": (1, 2, 4, 8),
        "comm_sms": (1, 2, 4, 8, 16, 32),
        "landing": ("direct", "inbox", "ll"),
        "barrier_sms": (1, 2, 4, 8, 16, 32, 64, 128),
        "chunk_m": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    }
    conditions = {p.name: p.when.describe() if p.when else None for p in space.params}
    assert conditions["barrier_sms"] == conditions["landing"] == 'mode == "barrier"'
    assert conditions["ce_consumer"] == conditions["ce_chunks"] == 'mode == "ce"'
    assert conditions["collective"] == 'mode == "baseline"' and space.param("collective").implied == "nccl"
    assert conditions["push_by"] == conditions["gemm_order"] == 'mode == "push_cublas"'
    assert conditions["comm_sms"] == 'mode == "push" or (mode == "push_cublas" and push_by == "sm")'
    assert conditions["chunk_m"] == 'mode == "push" or (mode == "push_cublas" and gemm_order == "local_first")'
    for tile in TILES:
        assert conditions[tile] == 'mode in ["pull", "push"] or (mode == "ce" and ce_consumer == "triton")'


def test_gemm_rs_params_are_exactly_the_kernel_contract() -> None:
    space = get_space("gemm_rs")
    assert {p.name: p.choices for p in space.params} == {
        "mode": ("pull", "push", "atomic", "pull_cublas", "barrier", "ce", "baseline"),
        "ce_consumer": ("triton", "cublas"),
        "ce_chunks": (1, 2, 4, 8),
        "collective": ("nccl", "nccl_symm"),
        "BLOCK_M": (16, 32, 64, 128, 256),
        "BLOCK_N": (32, 64, 128, 256),
        "BLOCK_K": (32, 64, 128, 256),
        "GROUP_M": (1, 4, 8, 16),
        "num_warps": (4, 8),
        "num_stages": (2, 3, 4, 5, 6),
        "SPLIT_K": (1, 2, 4, 8),
        "chunk_m": (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
        "reduce_by": ("programs", "epilogue", "tile"),
        "handoff": ("flag", "ll"),
        "transport": ("pull", "push"),
        "reduce_sms": (1, 2, 4, 8, 16, 32, 64, 128),
        "tile_order": ("peers_first", "own_first"),
    }
    conditions = {p.name: p.when.describe() if p.when else None for p in space.params}
    assert conditions["handoff"] == 'mode == "push" and reduce_by == "tile"'  # LL words: pushed, tiles over all rows
    assert conditions["mode"] is None
    assert conditions["transport"] == 'mode == "barrier"'
    assert conditions["ce_consumer"] == conditions["ce_chunks"] == 'mode == "ce"'
    for tile in TILES:
        assert conditions[tile] == 'mode in ["pull", "push", "atomic"] or (mode == "ce" and ce_consumer == "triton")'
    assert (
        conditions["chunk_m"]
        == 'mode == "atomic" or (mode in ["pull", "push"] and reduce_by in ["programs", "epilogue"])'
    )
    assert conditions["reduce_by"] == 'mode in ["pull", "push"]'
    by_programs = 'mode == "atomic" or (mode in ["pull", "push"] and reduce_by == "programs")'
    assert conditions["tile_order"] == by_programs
    assert conditions["reduce_sms"] == by_programs + ' or mode in ["pull_cublas", "barrier", "ce"]'
    assert {c.name for c in space.constraints} == {
        "shared_memory",
        "BLOCK_M_fits_problem",
        "BLOCK_N_fits_problem",
        "BLOCK_K_fits_problem",
        "warps_fit_tile",
        "group_fits_rows",
        "split_k_fits_depth",
        "chunk_fits_rows",
        "reduce_sms_budget",
        "ce_chunks_fit_rows",
        "collective_available",
    }
    # only atomic mode's sums depend on the order of the adds
    assert space.nondeterministic == ("atomic",)
    assert get_space("ag_gemm").nondeterministic == get_space("flash_decode").nondeterministic == ()


def test_version_is_pinned_so_a_changed_space_is_noticed() -> None:
    # If this fails you changed a space: bump its `revision` if constraint code changed meaning,
    # then update the pinned value. Stored records are keyed by these versions.
    assert {name: get_space(name).version for name in ("ag_gemm", "gemm_rs", "flash_decode", "gemm_ar")} == {
        # revision 5 (the baseline's collective) changed it from 1276c44a5e54; revision 6 (mode barrier, barrier_sms)
        # from 92a31e42db9c; revision 7 (landing ll) from ae63f5f583a7
        "ag_gemm": "ec5b5faee18f",
        # revision 3 (the kernel's modes: atomic, pull_cublas, reduce_sms, tile_order; chunk_fits_rows,
        # reduce_sms_budget, atomic_tile; no comm_sms) changed it from 1fd89d6bea81; revision 4 (no atomic_tile)
        # from f8b5ac3391ee; revision 5 (reduce_by) from 7685ce476574; revision 6 (the baseline's collective) from
        # 7734783b94e1; revision 7 (handoff: LL words with reduce_by=tile, push) from 794ef1e2d0ea; revision 8 (mode
        # barrier, transport) from 1cf0830ddb8c
        "gemm_rs": "6d0792f0f0bb",
        # revision 2 (the kernel's modes: fused, pull, wait, baseline; the decode tiles in every mode, baseline
        # included; items_per_flag, push_programs; items_per_flag_fit; no combine_chunks) changed it from b08fba860040;
        # revision 3 (heads_per_program any divisor of G up to 16; the default's tiles) from 42db48894d7e; revision 4
        # (the baseline's collective) from c3312b6eea52
        "flash_decode": "4beb3717f120",
        # revision 2 (transport "ll", one-shot only; tiles_per_flag only with flags) changed it from ed68e81be065;
        # revision 3 ("ll" in two-shot too; ll_rows) from 30f8cca2577b; revision 4 (transport "barrier";
        # barrier_cublas) from ac291fea8f7a; revision 5 ("barrier_push", one-shot; barrier_push_one_shot) from
        # 27c06bd44870
        "gemm_ar": "01a0ebf97ca6",
    }
    assert get_space("gemm_rs").revision == 8
    assert get_space("flash_decode").revision == 4
    assert get_space("gemm_ar").revision == 5


def _rebuild(space: Space, **changes) -> Space:
    args = {
        "dims": space.dims,
        "params": space.params,
        "constraints": space.constraints,
        "revision": space.revision,
        "default": space._default,
        "derive": space._derive,
        "check_problem": space._check_problem,
        "doc": space.doc,
    }
    args.update(changes)
    return Space(space.name, **args)


def test_version_follows_the_definition_not_the_docs() -> None:
    assert _rebuild(AG_GEMM).version == AG_GEMM.version
    assert _rebuild(AG_GEMM, doc="other words").version == AG_GEMM.version
    assert _rebuild(AG_GEMM, revision=AG_GEMM.revision + 1).version != AG_GEMM.version
    params = [pow2("chunk_m", 16, 4096, when=p.when) if p.name == "chunk_m" else p for p in AG_GEMM.params]
    assert _rebuild(AG_GEMM, params=params).version != AG_GEMM.version
    assert _rebuild(AG_GEMM, constraints=AG_GEMM.constraints[1:]).version != AG_GEMM.version


def test_to_json_describes_params_conditions_and_rules() -> None:
    data = json.loads(json.dumps(get_space("gemm_rs").to_json()))
    assert data["name"] == "gemm_rs" and data["version"] == get_space("gemm_rs").version
    chunk = next(p for p in data["params"] if p["name"] == "chunk_m")
    assert chunk["when"] == [{"mode": ["atomic"]}, {"mode": ["pull", "push"], "reduce_by": ["programs", "epilogue"]}]
    assert chunk["kind"] == "pow2" and chunk["doc"]
    reduce = next(p for p in data["params"] if p["name"] == "reduce_sms")
    assert reduce["when"] == [
        {"mode": ["atomic"]},
        {"mode": ["pull", "push"], "reduce_by": ["programs"]},
        {"mode": ["pull_cublas", "barrier", "ce"]},
    ]
    assert reduce["doc"]
    assert reduce["kind"] == "pow2" and reduce["choices"] == [1, 2, 4, 8, 16, 32, 64, 128]
    rules = {c["name"]: c for c in data["constraints"]}
    assert rules["BLOCK_K_fits_problem"]["rule"] == "BLOCK_K <= max(32, next_pow2(K_r))"
    assert rules["shared_memory"]["fields"] == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages"]
    assert rules["chunk_fits_rows"] == {
        "name": "chunk_fits_rows",
        "fields": ["chunk_m"],
        "rule": "chunk_m <= max(16, next_pow2(R))",
    }
    assert rules["reduce_sms_budget"]["fields"] == ["reduce_sms", "mode"]
    # atomic mode takes the other fused modes' tiles (revision 4): no rule of its own
    assert not any("atomic" in name for name in rules)
    # gemm_rs chunks may be ragged, and it has no comm_sms; ag_gemm keeps both rules
    assert "chunk_divides_rows" not in rules and "comm_sms_budget" not in rules
    assert all(p["name"] != "comm_sms" for p in data["params"])
    ag_rules = {c["name"] for c in AG_GEMM.to_json()["constraints"]}
    assert {"chunk_divides_rows", "comm_sms_budget"} <= ag_rules and "chunk_fits_rows" not in ag_rules


@pytest.mark.parametrize(
    ("name", "shape", "world_size", "message"),
    [
        ("ag_gemm", {"M": 8191, "N": 4096, "K": 64}, 2, "world_size: 2 is not allowed for ag_gemm; M=8191"),
        ("ag_gemm", {"M": 8192, "N": 4095, "K": 64}, 2, "N=4095 must be divisible by it"),
        ("ag_gemm", {"M": 8192, "N": 4096}, 2, "shape: dim 'K' is missing for space 'ag_gemm'"),
        ("ag_gemm", {"M": 8, "N": 8, "K": 8, "B": 1}, 1, "shape: dim 'B' is not allowed for space 'ag_gemm'"),
        ("gemm_rs", {"M": 8192, "N": 4095, "K": 12287}, 2, "K=12287 must be divisible by it"),
        ("flash_decode", {"B": 1, "H": 32, "H_KV": 8, "S": 8192, "D": 96}, 2, "shape.D: 96 is not allowed"),
        ("flash_decode", {"B": 1, "H": 32, "H_KV": 6, "S": 8192, "D": 128}, 2, "shape.H_KV: 6 is not allowed"),
        ("flash_decode", {"B": 1, "H": 32, "H_KV": 8, "S": 3, "D": 128}, 4, "shape.S: 3 is not allowed"),
    ],
)
def test_problems_a_family_cannot_run_are_refused(name, shape, world_size, message) -> None:
    with pytest.raises(SpaceError, match=message):
        get_space(name).make_problem(shape, world_size=world_size)


def _problem(name: str, text: str, world_size: int = 2):
    return get_space(name).make_problem(text, dtype="bf16", world_size=world_size)


def test_error_messages_name_field_value_and_what_is_allowed() -> None:
    space, problem = AG_GEMM, _problem("ag_gemm", "1024x8192x8192")
    no_split = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    tiles = {**no_split, "SPLIT_K": 1}
    cases = [
        (
            {"mode": "pushy"},
            'mode: \'pushy\' is not allowed; allowed: "pull", "push", "push_cublas", "barrier", "ce", "baseline"',
        ),
        ({"mode": "ce", "ce_consumer": "cublas"}, 'ce_chunks: missing (required with mode="ce"); allowed: 1, 2, 4, 8'),
        ({"mode": "baseline", "chunk_m": 64}, 'chunk_m: 64 is not allowed with mode="baseline"; chunk_m only exists'),
        ({"mode": "baseline", "blockm": 64}, "blockm: unknown field for space 'ag_gemm'; allowed fields: mode, "),
        (
            {"mode": "pull", **tiles, "num_stages": 6, "BLOCK_K": 256},
            "allowed: <= max_shared_mem = 232448",
        ),
        (
            {"mode": "push", **tiles, "comm_sms": 8, "chunk_m": 8192},
            "chunk_m: 8192 is not allowed for R=512 rows per rank (M / world_size); allowed: a divisor of R, or 512",
        ),
        ({"mode": "pull", **tiles, "BLOCK_M": 16}, "num_warps: 8 is not allowed with BLOCK_M*BLOCK_N = 16*128 = 2048"),
        ({"mode": "pull", **no_split}, 'SPLIT_K: missing (required with mode="pull"); allowed: 1, 2, 4, 8'),
        ({"mode": "pull", **tiles, "SPLIT_K": 3}, "SPLIT_K: 3 is not allowed; allowed: 1, 2, 4, 8"),
        ({"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1, "SPLIT_K": 1}, "SPLIT_K: 1 is not allowed with"),
    ]
    for cfg, message in cases:
        found = space.violations(cfg, problem, HOPPER)
        assert any(message in v for v in found), (message, found)
        with pytest.raises(SpaceError) as e:
            space.validate(cfg, problem, HOPPER)
        assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SpaceError, match="config: 'mode=pull' is not allowed; it must be a JSON object"):
        space.validate("mode=pull", problem, HOPPER)  # type: ignore[arg-type]


def test_small_problems_cap_tiles_groups_and_chunks() -> None:
    small = _problem("ag_gemm", "32x64x16")  # R=16, N_r=32, K=16
    limits = DeviceLimits(max_shared_mem=232448, num_sms=40, compute_capability=(9, 0))
    tiles = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    tiles["SPLIT_K"] = 1
    assert AG_GEMM.violations({"mode": "pull", **tiles}, small, limits) == []
    assert "SPLIT_K: 2 is not allowed" in AG_GEMM.violations({"mode": "pull", **tiles, "SPLIT_K": 2}, small, limits)[0]
    assert (
        "BLOCK_M: 64 is not allowed for M=32"
        in AG_GEMM.violations({"mode": "pull", **tiles, "BLOCK_M": 64}, small, limits)[0]
    )
    assert "GROUP_M: 4 is not allowed" in AG_GEMM.violations({"mode": "pull", **tiles, "GROUP_M": 4}, small, limits)[0]
    push = {"mode": "push", **tiles, "comm_sms": 16, "chunk_m": 16}
    assert AG_GEMM.violations(push, small, limits) == [
        "comm_sms: 16 is not allowed with num_sms=40; allowed: <= num_sms // 4 = 10"
    ]
    assert AG_GEMM.violations(
        {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 8}, _problem("ag_gemm", "8x64x16"), limits
    )
    assert AG_GEMM.count(small, limits, where={"mode": "push"}) > 0


@pytest.mark.parametrize(
    ("name", "shape", "depth"),
    [("ag_gemm", "256x256x1020", "K=1020 (global depth)"), ("gemm_rs", "256x256x2040", "K_r=1020 (K / world_size)")],
)
def test_split_k_leaves_each_split_two_k_blocks_of_the_local_depth(name: str, shape: str, depth: str) -> None:
    # both GEMMs loop over a depth of 1020 (gemm_rs: K_r = 2040 / 2); cdiv rounds up: 1020 / 8 -> 128
    space, problem = get_space(name), _problem(name, shape)
    base = {"mode": "pull", "BLOCK_M": 64, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}
    comm = (
        {"chunk_m": 64, "reduce_by": "programs", "reduce_sms": 8, "tile_order": "peers_first"}
        if name == "gemm_rs"
        else {}
    )
    base |= comm
    assert space.violations({**base, "BLOCK_K": 64, "SPLIT_K": 8}, problem, HOPPER) == []
    assert space.violations({**base, "BLOCK_K": 128, "SPLIT_K": 2}, problem, HOPPER) == []
    assert space.violations({**base, "BLOCK_K": 128, "SPLIT_K": 4}, problem, HOPPER) == [
        f"SPLIT_K: 4 is not allowed with BLOCK_K=128 for {depth}; cdiv({depth.split('=')[0]}, SPLIT_K) = 255 "
        f"< 2 * BLOCK_K = 256; allowed: 1 or cdiv({depth.split('=')[0]}, SPLIT_K) >= 2 * BLOCK_K, here 1, 2"
    ]
    pairs = {(c["SPLIT_K"], c["BLOCK_K"]) for c in space.enumerate(problem, HOPPER, where={"mode": "pull", **comm})}
    assert pairs == {
        (1, 32),
        (1, 64),
        (1, 128),
        (1, 256),
        (2, 32),
        (2, 64),
        (2, 128),
        (4, 32),
        (4, 64),
        (8, 32),
        (8, 64),
    }
    rule = next(c for c in space.to_json()["constraints"] if c["name"] == "split_k_fits_depth")
    assert rule == {
        "name": "split_k_fits_depth",
        "fields": ["SPLIT_K", "BLOCK_K"],
        "rule": f"SPLIT_K == 1 or cdiv({depth.split('=')[0]}, SPLIT_K) >= 2 * BLOCK_K",
    }


DECODE_TILE = {"kv_split": 256, "BLOCK_N": 32, "heads_per_program": 1, "num_warps": 4, "num_stages": 2}
#: each flash_decode mode's exchange knobs (the baseline's exchange is NCCL's: none)
DECODE_EXCHANGE = {
    "fused": {"items_per_flag": 4},
    "pull": {"items_per_flag": 4},
    "wait": {"items_per_flag": 4, "push_programs": 8},
    "baseline": {"collective": "nccl_symm"},
}


def test_flash_decode_params_are_exactly_the_kernel_contract() -> None:
    space = get_space("flash_decode")
    assert {p.name: p.choices for p in space.params} == {
        "mode": ("fused", "pull", "wait", "baseline"),
        "kv_split": (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
        "BLOCK_N": (16, 32, 64, 128, 256),
        "heads_per_program": tuple(range(1, 17)),
        "num_warps": (1, 2, 4, 8),
        "num_stages": (1, 2, 3, 4),
        "items_per_flag": (1, 2, 4, 8, 16, 32, 64),
        "push_programs": (1, 2, 4, 8, 16, 32),
        "collective": ("nccl", "nccl_symm", "nccl_ce"),
    }
    conditions = {p.name: p.when.describe() if p.when else None for p in space.params}
    # the baseline runs the same decode kernel: its tiles exist in every mode
    assert conditions == {
        "mode": None,
        "kv_split": None,
        "BLOCK_N": None,
        "heads_per_program": None,
        "num_warps": None,
        "num_stages": None,
        "items_per_flag": 'mode in ["fused", "pull", "wait"]',
        "push_programs": 'mode == "wait"',
        "collective": 'mode == "baseline"',
    }
    rules = {c["name"]: (c["fields"], c["rule"]) for c in space.to_json()["constraints"]}
    assert rules == {
        "kv_split_fits_shard": (["kv_split"], "kv_split <= max(64, next_pow2(S_r))"),
        "block_fits_split": (["BLOCK_N", "kv_split"], "BLOCK_N <= kv_split"),
        "stages_need_steps": (["num_stages", "kv_split", "BLOCK_N"], "num_stages <= kv_split // BLOCK_N"),
        "warps_fit_block": (["num_warps", "BLOCK_N"], "num_warps * 8 <= BLOCK_N"),
        "shared_memory": (["BLOCK_N", "num_stages"], "2 * BLOCK_N * D * dtype_bytes * num_stages <= max_shared_mem"),
        "heads_divide_group": (["heads_per_program"], "G % heads_per_program == 0"),
        "items_per_flag_fit": (
            ["items_per_flag", "heads_per_program"],
            "items_per_flag <= next_pow2(B * H / heads_per_program)",
        ),
        "collective_available": (["collective"], "collective is one the device's build runs"),
    }


@pytest.mark.parametrize("mode", ["fused", "pull", "wait", "baseline"])
def test_flash_decode_rules(mode: str) -> None:
    # S_r = cdiv(1000, 2) = 500 keys per rank, G = 24 / 8 = 3, B * H = 72 query heads (decode items at 1 head each)
    space, problem = get_space("flash_decode"), _problem("flash_decode", "B=3,H=24,H_KV=8,S=1000,D=256")
    base = {"mode": mode, **DECODE_TILE, **DECODE_EXCHANGE[mode]}
    assert space.violations(base, problem, HOPPER) == []
    assert space.validate(base, problem, HOPPER) == base
    # every tile rule holds in every mode, the baseline's included (it runs the same decode kernel); each broken
    # rule gives one message naming the field(s) and the value(s) it refused, and what is allowed
    cases = [
        (
            "kv_split_fits_shard",
            {"kv_split": 1024},
            "kv_split: 1024 is not allowed for S_r=500 keys per rank (cdiv(S, world_size)); "
            "allowed: <= max(64, next_pow2(S_r)) = 512",
        ),
        (
            "stages_need_steps",
            {"kv_split": 64, "num_stages": 3},
            "num_stages: 3 is not allowed with kv_split=64, BLOCK_N=32 (2 steps per split); "
            "allowed: <= kv_split // BLOCK_N = 2",
        ),
        (
            "warps_fit_block",
            {"num_warps": 8},
            "num_warps: 8 is not allowed with BLOCK_N=32; allowed: <= BLOCK_N // 8 = 4 "
            "(each warp takes >= 8 keys of a block)",
        ),
        (
            "shared_memory",
            {"kv_split": 512, "BLOCK_N": 256, "num_warps": 8, "num_stages": 2},
            "shared memory: 2 * BLOCK_N * D * dtype_bytes * num_stages = 2 * 256 * 256 * 2 * 2 = 524288 bytes "
            "with BLOCK_N=256, num_stages=2 is not allowed; allowed: <= max_shared_mem = 232448",
        ),
        (
            "heads_divide_group",
            {"heads_per_program": 2},
            "heads_per_program: 2 is not allowed for a GQA group of G=3 (H / H_KV); allowed: a divisor of G",
        ),
    ]
    for rule, change, message in cases:
        cfg = {**base, **change}
        assert broken_rules("flash_decode", cfg, problem, HOPPER) == [rule], cfg
        assert space.violations(cfg, problem, HOPPER) == [message]
        with pytest.raises(SpaceError) as e:
            space.validate(cfg, problem, HOPPER)
        assert str(e.value) == f"flash_decode config: {message}"
    # a block longer than the split leaves it no whole step, so its stages break too: two rules, two messages
    cfg = {**base, "kv_split": 64, "BLOCK_N": 128, "num_stages": 1}
    assert broken_rules("flash_decode", cfg, problem, HOPPER) == ["block_fits_split", "stages_need_steps"]
    assert space.violations(cfg, problem, HOPPER) == [
        "BLOCK_N: 128 is not allowed with kv_split=64; allowed: <= kv_split",
        "num_stages: 1 is not allowed with kv_split=64, BLOCK_N=128 (0 steps per split); "
        "allowed: <= kv_split // BLOCK_N = 0",
    ]
    # 72 items at one head each: every items_per_flag (<= 64 <= next_pow2(72)) fits this problem
    flagged = ("fused", "pull", "wait")
    if mode in flagged:
        assert all(not space.violations({**base, "items_per_flag": n}, problem, HOPPER) for n in (1, 16, 64))
    # the exchange's knobs exist only where the exchange is ours: items_per_flag in fused, pull and wait,
    # push_programs in wait (its own all-gather push)
    if mode not in flagged:
        assert space.violations({**base, "items_per_flag": 1}, problem, HOPPER) == [
            f'items_per_flag: 1 is not allowed with mode="{mode}"; '
            'items_per_flag only exists when mode in ["fused", "pull", "wait"]'
        ]
    else:
        without = {k: v for k, v in base.items() if k != "items_per_flag"}
        assert space.violations(without, problem, HOPPER) == [
            f'items_per_flag: missing (required with mode="{mode}"); allowed: 1, 2, 4, 8, 16, 32, 64'
        ]
    if mode != "wait":
        assert space.violations({**base, "push_programs": 8}, problem, HOPPER) == [
            f'push_programs: 8 is not allowed with mode="{mode}"; push_programs only exists when mode == "wait"'
        ]
    else:
        without = {k: v for k, v in base.items() if k != "push_programs"}
        assert space.violations(without, problem, HOPPER) == [
            'push_programs: missing (required with mode="wait"); allowed: 1, 2, 4, 8, 16, 32'
        ]
        # push_programs has no rule of its own: every choice fits any problem
        assert all(not space.violations({**base, "push_programs": n}, problem, HOPPER) for n in (1, 32))


@pytest.mark.parametrize(
    ("shape", "hpp", "items", "largest"),
    [
        ("B=1,H=8,H_KV=2,S=4096,D=128", 1, 8, 8),
        ("B=1,H=8,H_KV=2,S=4096,D=128", 2, 4, 4),
        ("B=1,H=8,H_KV=2,S=4096,D=128", 4, 2, 2),
        ("B=1,H=1,H_KV=1,S=4096,D=128", 1, 1, 1),  # one item: one flag for it
        ("B=3,H=2,H_KV=2,S=4096,D=128", 1, 6, 8),  # 6 items: a group may be rounded up to 8
        ("B=5,H=24,H_KV=2,S=4096,D=128", 4, 30, 32),
        ("B=3,H=48,H_KV=1,S=4096,D=128", 16, 9, 16),
        ("B=9,H=64,H_KV=8,S=4096,D=128", 8, 72, 64),  # next_pow2(72) = 128: every choice up to 64
    ],
)
def test_flash_decode_items_per_flag_fit_the_decode_items(shape: str, hpp: int, items: int, largest: int) -> None:
    # items_per_flag_fit: items_per_flag <= next_pow2(B * H / heads_per_program), in every mode that has it
    space, problem = get_space("flash_decode"), _problem("flash_decode", shape)
    rows = problem.dim("B") * problem.dim("H")
    assert rows // hpp == items
    for mode in ("fused", "pull", "wait"):
        base = {"mode": mode, **DECODE_TILE, "heads_per_program": hpp}
        base |= {"push_programs": 4} if mode == "wait" else {}
        for n in space.param("items_per_flag").choices:
            cfg = {**base, "items_per_flag": n}
            fits = n <= largest
            assert broken_rules("flash_decode", cfg, problem, HOPPER) == ([] if fits else ["items_per_flag_fit"])
            assert space.violations(cfg, problem, HOPPER) == (
                []
                if fits
                else [
                    f"items_per_flag: {n} is not allowed for {items} decode items "
                    f"(B * H / heads_per_program = {rows} / {hpp}); allowed: <= next_pow2(items) = "
                    f"{1 << (items - 1).bit_length()}"
                ]
            )
        allowed = {c["items_per_flag"] for c in space.enumerate(problem, HOPPER, where={**base, "mode": mode})}
        assert allowed == {n for n in space.param("items_per_flag").choices if n <= largest}


def test_flash_decode_counts_per_mode() -> None:
    # the tiles are the same in every mode; fused and pull add items_per_flag, wait also push_programs (no rule)
    space = get_space("flash_decode")
    few = _problem("flash_decode", "B=1,H=8,H_KV=2,S=4096,D=128")  # 8, 4 or 2 items: items_per_flag is capped
    many = _problem("flash_decode", "B=9,H=24,H_KV=8,S=1000,D=256")  # G = 3: 216 or 72 items, never capped
    # the baseline's tiles times its 3 collective variants
    for problem in (few, many):
        modes = space.count_by_mode(problem, HOPPER)
        assert list(modes) == ["fused", "pull", "wait", "baseline"]
        assert modes["fused"] == modes["pull"] and modes["wait"] == 6 * modes["pull"]
        assert modes["baseline"] % 3 == 0 and 0 < modes["baseline"] // 3 < modes["pull"] <= 7 * modes["baseline"] // 3
        assert modes["baseline"] == sum(1 for _ in space.enumerate(problem, HOPPER, where={"mode": "baseline"}))
    assert 3 * space.count_by_mode(many, HOPPER)["pull"] == 7 * space.count_by_mode(many, HOPPER)["baseline"]
    assert 3 * space.count_by_mode(few, HOPPER)["pull"] < 7 * space.count_by_mode(few, HOPPER)["baseline"]


@pytest.mark.parametrize(
    ("name", "shape", "where"),
    [
        ("ag_gemm", "8192x4096x12288", {"mode": "pull"}),
        ("ag_gemm", "128x8192x8192", {"mode": "pull"}),
        ("ag_gemm", "96x96x48", {"mode": "ce"}),
        ("ag_gemm", "200x40x100", {"mode": "push", "comm_sms": 4}),
        ("ag_gemm", "256x256x1020", {"mode": "pull"}),
        # gemm_rs: every reduce_sms of a fused mode (<= 64 // 4 allowed) with one chunk_m and tile order
        (
            "gemm_rs",
            "1024x8192x8192",
            {"mode": "pull", "chunk_m": 256, "reduce_by": "programs", "tile_order": "own_first"},
        ),
        # reduce_sms at the edge of what ce allows (num_sms = 64), a fused mode's budget would refuse it
        ("gemm_rs", "256x256x2040", {"mode": "ce", "reduce_sms": 64}),
        # push's reduce programs at the edge of their budget (64 // 4 = 16); R=100: ragged chunks up to 128
        (
            "gemm_rs",
            "200x40x100",
            {"mode": "push", "reduce_by": "programs", "reduce_sms": 16, "tile_order": "peers_first"},
        ),
        # the epilogue reduce: no reduce programs, no tile order
        ("gemm_rs", "200x40x100", {"mode": "pull", "reduce_by": "epilogue", "chunk_m": 32}),
        # atomic: every tile and warp count the other fused modes take
        ("gemm_rs", "2048x1024x1024", {"mode": "atomic", "reduce_sms": 8, "tile_order": "peers_first"}),
        ("gemm_rs", "200x40x100", {"mode": "pull_cublas"}),
        # flash_decode: the decode tiles in every mode; items_per_flag capped by few items (B * H = 8); kv_split by
        # a short shard (S_r = 1500, 50); push_programs pinned (it has no rule)
        ("flash_decode", "16x24x8x30000x128", {"mode": "baseline"}),
        ("flash_decode", "1x8x2x3000x128", {"mode": "pull"}),
        ("flash_decode", "1x8x2x100x64", {"mode": "fused"}),
        ("flash_decode", "3x12x4x3000x256", {"mode": "wait", "push_programs": 32}),
    ],
)
def test_enumeration_is_the_brute_force_filter_of_the_cross_product(name: str, shape: str, where: dict) -> None:
    space, problem = get_space(name), _problem(name, shape)
    limits = DeviceLimits(max_shared_mem=166912, num_sms=64, compute_capability=(8, 0))
    # every param some config of this mode may have, each over all of its choices
    variants = [{**where, "ce_consumer": c} for c in ("triton", "cublas")]
    names = sorted(set().union(*(active_fields(name, v) for v in variants)) - set(where))
    expected = set()
    for values in itertools.product(*[space.param(n).choices for n in names]):
        full = {**where, **dict(zip(names, values, strict=True))}
        cfg = {k: v for k, v in full.items() if k in active_fields(name, full)}
        if not broken_rules(name, cfg, problem, limits):
            expected.add(json.dumps(cfg, sort_keys=True))
    got = [json.dumps(c, sort_keys=True) for c in space.enumerate(problem, limits, where=where)]
    assert len(got) == len(set(got)) == space.count(problem, limits, where=where)
    assert set(got) == expected and expected


def test_anchor_counts_are_fast_and_add_up() -> None:
    start = time.perf_counter()
    rows = [(s, p, s.count(p, HOPPER), s.count_by_mode(p, HOPPER)) for s, p in anchor_problems(["ag_gemm"])]
    assert time.perf_counter() - start < 2.0
    assert len(rows) == len(ANCHORS["ag_gemm"]) == 5
    for _, _, total, modes in rows:
        assert total == sum(modes.values()) and modes["baseline"] == 3  # one per collective variant
    # (8192, 4096, 12288): 1556 tile configs x 4 SPLIT_K (K is deep enough for every split and BLOCK_K);
    # ce = 4 chunks x (cuBLAS + the tiles); push x 6 SMs x 9 chunks; push_cublas: by SMs (6 SM counts, each
    # with 9 chunk sizes local-first or gathered) or by the copy engine (9 chunk sizes local-first, or gathered)
    tiles = 1556 * 4
    push_cublas = 6 * (9 + 1) + (9 + 1)
    assert rows[0][3] == {
        "pull": tiles,
        "push": tiles * 6 * 9,
        "push_cublas": push_cublas,
        "barrier": 24,  # barrier_sms 1..128, three landings
        "ce": 4 * (tiles + 1),
        "baseline": 3,
    }


def test_count_filters_must_name_real_choices() -> None:
    problem = _problem("ag_gemm", "8192x4096x12288")
    with pytest.raises(SpaceError, match='mode: \'warp\' is not allowed; allowed: "pull", "push"'):
        AG_GEMM.count(problem, HOPPER, where={"mode": "warp"})
    with pytest.raises(SpaceError, match="chunk: unknown field"):
        AG_GEMM.count(problem, HOPPER, where={"chunk": 1})
    assert AG_GEMM.count(problem, HOPPER, where={"mode": "baseline", "chunk_m": 64}) == 0
    assert AG_GEMM.count(problem, HOPPER, where={"ce_consumer": "cublas"}) == 4


def test_seeds_are_valid_configs_of_their_regime_and_leave_the_version_alone() -> None:
    # seeds: a tuner's first trials after the default (the fused launches that measured best on one H200)
    for space, problem in anchor_problems(["ag_gemm", "gemm_rs"]):
        for seed in space.seeds(problem, HOPPER):
            assert space.violations(seed, problem, HOPPER) == [], (problem.dims, seed)
    rs = get_space("gemm_rs")
    decode = rs.make_problem("64x8192x8192", dtype="bf16", world_size=2)
    prefill = rs.make_problem("8192x4096x12288", dtype="bf16", world_size=2)
    # up to 1024 rows cuBLAS + the barrier launch leads, on half the SMs
    assert rs.seeds(decode, HOPPER)[0] == {"mode": "barrier", "transport": "push", "reduce_sms": 64}
    assert [(s["mode"], s["reduce_by"], s.get("handoff"), s["BLOCK_M"]) for s in rs.seeds(decode, HOPPER)[1:]] == [
        ("push", "tile", "ll", 64),
        ("push", "tile", "flag", 64),
        ("pull", "tile", None, 64),
    ]
    assert [(s["mode"], s["reduce_by"]) for s in rs.seeds(prefill, HOPPER)] == [
        ("pull", "epilogue"),
        ("push", "epilogue"),
    ]
    # one rank has nothing to overlap; a restriction keeps only the seeds it allows; tiny shapes take none
    assert rs.seeds(rs.make_problem("64x8192x8192", dtype="bf16", world_size=1), HOPPER) == []
    assert [s["mode"] for s in rs.restrict({"mode": ["pull", "baseline"]}).seeds(decode, HOPPER)] == ["pull"]
    assert [s["mode"] for s in rs.seeds(rs.make_problem("64x64x128", dtype="bf16", world_size=2), HOPPER)] == [
        "barrier"
    ]
    ag = get_space("ag_gemm")
    assert [s["mode"] for s in ag.seeds(ag.make_problem("128x8192x8192", dtype="bf16", world_size=2), HOPPER)] == [
        "barrier",
        "push",
        "pull",
    ]
    assert ag.seeds(ag.make_problem("1024x8192x8192", dtype="bf16", world_size=2), HOPPER) == [
        {"mode": "barrier", "landing": "inbox", "barrier_sms": 64}
    ]
    # LL words where a rank sends few values: the default's landing first, then the other (measured: the space's doc)
    landings = {(M, W): [s["landing"] for s in ag.seeds(ag.make_problem(f"{M}x8192x8192", dtype="bf16",
                                                                       world_size=W), HOPPER) if s["mode"] == "barrier"]
                for M, W in ((16, 4), (32, 4), (64, 4), (32, 2), (64, 2), (128, 2))}  # fmt: skip
    assert landings == {(16, 4): ["ll", "inbox"], (32, 4): ["inbox", "ll"], (64, 4): ["inbox"],
                        (32, 2): ["ll", "inbox"], (64, 2): ["inbox", "ll"], (128, 2): ["inbox"]}  # fmt: skip
    # split over K only where the column tiles leave three quarters of the SMs idle: AG+GEMM's 2048 columns per rank
    # at W=4 (32 tiles of 64 on 132 SMs) split 4; its 4096 at W=2 and GEMM+RS's 8192 not at all
    for W, split in ((4, 4), (2, 1)):
        seeds = [s for s in ag.seeds(ag.make_problem("64x8192x8192", dtype="bf16", world_size=W), HOPPER)
                 if s["mode"] != "barrier"]  # fmt: skip
        assert [(s["mode"], s["SPLIT_K"]) for s in seeds] == [("push", split), ("pull", split)], W
    assert {s["SPLIT_K"] for s in rs.seeds(decode, HOPPER)[1:]} == {1}
    assert get_space("flash_decode").seeds(anchor_problems(["flash_decode"])[0][1], HOPPER) == []
    # they change no record's meaning: the space's version is the same without them
    assert _rebuild(rs).version == rs.version and _rebuild(AG_GEMM).version == AG_GEMM.version


def test_a_family_space_refuses_the_collectives_of_its_own_knob_last_and_runs_the_kernels_dtypes() -> None:
    from jointtune.search_spaces._family import family_space

    for name in ("ag_gemm", "gemm_rs", "flash_decode", "gemm_ar"):
        space = get_space(name)
        rule = space.constraints[-1]
        assert space.dtypes == ("bfloat16", "float16") and rule.name == "collective_available", name
        assert rule.fields == ("collective",) and "collective" in {p.name for p in space.params}
    with pytest.raises(SpaceError, match=r"jt_no_collective: a family's space needs a `collective` param"):
        family_space("jt_no_collective", dims=("M",), params=[choice("x", (1, 2))], constraints=[], revision=1,
                     default=lambda ctx: {"x": 1})  # fmt: skip
