"""Params, conditions, shape text and the registry: the pieces every space is built from."""

from __future__ import annotations

import pytest

from jointtune.errors import JointtuneError, SpaceError, UnknownNameError
from jointtune.search_spaces import (
    Constraint,
    Space,
    categorical,
    choice,
    get_space,
    next_pow2,
    parse_shape,
    pow2,
    register_space,
    space_names,
    unregister_space,
    when,
)


def test_pow2_lists_every_power_between_the_bounds() -> None:
    assert pow2("BLOCK_M", 16, 256).choices == (16, 32, 64, 128, 256)
    assert pow2("x", 1, 1).choices == (1,)
    with pytest.raises(SpaceError, match=r"x: pow2 range 16..48"):
        pow2("x", 16, 48)
    with pytest.raises(SpaceError, match=r"x: pow2 range 64..32"):
        pow2("x", 64, 32)


def test_next_pow2() -> None:
    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 100, 4096, 4097)] == [1, 1, 2, 4, 4, 128, 4096, 8192]


def test_conditions_nest_and_combine() -> None:
    tiles = when(mode=("pull", "push")) | when(mode="ce", ce_consumer="triton")
    assert tiles.holds({"mode": "push"})
    assert tiles.holds({"mode": "ce", "ce_consumer": "triton"})
    assert not tiles.holds({"mode": "ce", "ce_consumer": "cublas"})
    assert not tiles.holds({"mode": "ce"})  # an absent (inactive) field never matches
    assert not tiles.holds({})
    assert tiles.fields == ("mode", "ce_consumer")
    assert tiles.describe() == 'mode in ["pull", "push"] or (mode == "ce" and ce_consumer == "triton")'
    assert tiles.to_json() == [{"mode": ["pull", "push"]}, {"mode": ["ce"], "ce_consumer": ["triton"]}]


def test_param_values_match_by_type_not_by_equality() -> None:
    ints = choice("num_warps", (1, 4, 8))
    assert ints.canonical(4) == 4
    assert ints.canonical(4.0) == 4 and type(ints.canonical(4.0)) is int  # JSON from other languages
    assert ints.canonical(True) is None  # True == 1 in Python, but it is not the int 1
    assert ints.canonical("4") is None
    assert ints.canonical(4.5) is None
    flags = choice("flag", (True, False))
    assert flags.canonical(1) is None and flags.canonical(True) is True


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: choice("x", ()), "x: no choices"),
        (lambda: choice("x", (1, 1)), "x: choices .* repeat"),
        (lambda: choice("x", (1.5,)), "x: choice 1.5 is not allowed"),
        (lambda: choice("not a name", (1,)), "param name"),
        (lambda: when(), "when: no fields"),
    ],
)
def test_bad_param_definitions_are_rejected(build, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        build()


def _space(params, constraints=()) -> Space:
    return Space("toy", dims=("N",), params=params, constraints=constraints, revision=1, default=lambda ctx: {})


def test_bad_space_definitions_are_rejected() -> None:
    mode = categorical("mode", ("a", "b"))
    with pytest.raises(SpaceError, match="defined twice"):
        _space([mode, mode])
    with pytest.raises(SpaceError, match="condition reads 'mode', not an earlier param"):
        _space([choice("x", (1,), when=when(mode="a")), mode])
    with pytest.raises(SpaceError, match="condition value 'c' is not a choice of mode"):
        _space([mode, choice("x", (1,), when=when(mode="c"))])
    with pytest.raises(SpaceError, match="reads unknown"):
        _space([mode], [Constraint("r", ("y",), "y > 0", lambda cfg, ctx: None)])


@pytest.mark.parametrize(
    "text", ["8192x4096x12288", "8192X4096X12288", " M=8192, N=4096 ,K=12288 ", "K=12288,N=4096,M=8192"]
)
def test_parse_shape_accepts_both_forms(text: str) -> None:
    assert parse_shape(text, ("M", "N", "K")) == {"M": 8192, "N": 4096, "K": 12288}
    assert list(parse_shape(text, ("M", "N", "K"))) == ["M", "N", "K"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8192x4096", r"shape: '8192x4096' has 2 dims; allowed: 3 dims MxNxK"),
        ("8192x0x1", r"shape.N: '0' in '8192x0x1' is not allowed; dims must be integers in 1\.\.9007199254740992"),
        ("8192x9007199254740993x1", r"shape.N: '9007199254740993' .* not allowed; dims must be integers in 1\.\."),
        ("8192x" + "9" * 5000 + "x1", r"shape.N: .* not allowed; dims must be integers in 1\.\."),
        ("²x512x512", r"shape.M: '²' in '²x512x512' is not allowed"),
        ("６４x512x512", r"shape.M: '６４'"),
        ("8192xfourx1", r"shape.N: 'four'"),
        ("M=1,N=2", r"shape: dim 'K' is missing in 'M=1,N=2'; required dims: M, N, K"),
        ("M=1,N=2,K=3,Q=4", r"shape: dim 'Q' in .* is not allowed; allowed dims: M, N, K"),
        ("M=1,M=2,N=2,K=3", r"shape: dim 'M' appears twice"),
        ("M=1,N,K=3", r"shape: 'N' in 'M=1,N,K=3' is not allowed; write name=value pairs"),
        ("", r"shape: '' is not allowed; write MxNxK"),
        ("M=-1,N=2,K=3", r"shape.M: '-1'"),
    ],
)
def test_parse_shape_errors_name_the_part(text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_shape(text, ("M", "N", "K"))


def test_shape_messages_show_a_real_shape_of_the_space() -> None:
    with pytest.raises(SpaceError, match=r"allowed: 5 dims BxHxH_KVxSxD \(e\.g\. 1x64x8x32768x128\)"):
        get_space("flash_decode").make_problem("1x4x1x256", world_size=2)
    restricted = get_space("flash_decode").restrict({"mode": ["pull"]})
    with pytest.raises(SpaceError, match=r"\(e\.g\. 1x64x8x32768x128\)"):
        restricted.make_problem("1x64", world_size=2)


def test_registry_knows_the_four_families() -> None:
    # other test packages register their own "jt_*" spaces in this process; the builtins are these four
    assert [n for n in space_names() if not n.startswith("jt_")] == ["ag_gemm", "flash_decode", "gemm_ar", "gemm_rs"]
    assert get_space("ag_gemm").dims == ("M", "N", "K")
    with pytest.raises(UnknownNameError, match="space: 'nope' is not a known search space; known: ag_gemm, ") as e:
        get_space("nope")
    assert isinstance(e.value, KeyError) and isinstance(e.value, JointtuneError)


def test_register_refuses_a_second_space_of_one_name() -> None:
    toy = _space([categorical("mode", ("a",))])
    register_space(toy)
    try:
        assert get_space("toy") is toy
        with pytest.raises(SpaceError, match="'toy' is already registered"):
            register_space(_space([categorical("mode", ("a",))]))
    finally:
        unregister_space("toy")
    assert "toy" not in space_names()
