"""The op skeleton written once (`kernels/runtime/op.py`) and the typed launch configs derived from the spaces
(`kernels/runtime/config.py`): what every family's entry point, prepared call and torch op share."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jointtune.errors import KernelError, ShapeError
from jointtune.kernels import create_world, get_family
from jointtune.kernels.ag_gemm import ag_gemm, prepare
from jointtune.kernels.ag_gemm.args import AgGemmConfig
from jointtune.kernels.flash_decode.args import FlashDecodeConfig
from jointtune.kernels.gemm_ar import gemm_ar_rmsnorm
from jointtune.kernels.gemm_ar import prepare as gemm_ar_prepare
from jointtune.kernels.gemm_rs.args import GemmRsConfig
from jointtune.kernels.runtime.config import LaunchConfig
from jointtune.kernels.runtime.op import OpFamily
from jointtune.search_spaces import get_space


@pytest.mark.parametrize(
    ("config", "name"),
    [(AgGemmConfig, "ag_gemm"), (GemmRsConfig, "gemm_rs"), (FlashDecodeConfig, "flash_decode"),
     (get_family("gemm_ar").config_type, "gemm_ar")],
)  # fmt: skip
def test_a_launch_config_has_exactly_its_spaces_knobs_typed_as_their_choices(config, name) -> None:
    space = get_space(name)
    fields = {f.name: f for f in dataclasses.fields(config)}
    assert set(fields) == {p.name for p in space.params} and config.knobs[0] == "mode"
    for p in space.params:
        assert fields[p.name].type is type(p.choices[0])
    typed = config.of({"mode": "baseline", "collective": "nccl", "not_a_knob": 1})
    assert typed.mode == "baseline" and not hasattr(typed, "not_a_knob")
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.mode = "pull"  # type: ignore[misc]


def test_a_launch_config_refuses_defaults_its_space_does_not_declare_and_knobs_left_without_one() -> None:
    with pytest.raises(KernelError, match=r"defaults for \['BLOCK_Q'\]"):

        class Stray(LaunchConfig, space="flash_decode", defaults={"BLOCK_Q": 1}):
            pass

    with pytest.raises(KernelError, match=r"knob 'kv_split' .* needs a default"):

        class Missing(LaunchConfig, space="flash_decode", defaults={}):
            pass


def test_the_families_are_wired_to_their_ops() -> None:
    for name in ("ag_gemm", "gemm_rs", "flash_decode", "gemm_ar"):
        family = get_family(name)
        assert isinstance(family, OpFamily) and family.op.name == family.name == family.space == name
    family = get_family("gemm_ar_rmsnorm")  # a second op over gemm_ar's space, records of its own
    assert isinstance(family, OpFamily) and family.op.name == family.name == "gemm_ar_rmsnorm"
    assert family.space == family.op.space == "gemm_ar"


def test_an_op_of_two_outputs_takes_its_options_first_and_returns_the_pair_everywhere() -> None:
    # gemm_ar_rmsnorm: (normed, new residual) from the entry point, the torch op and a prepared call; the family gives
    # every rank's first output, then every rank's second
    assert str(torch.ops.jointtune.gemm_ar_rmsnorm.default._schema) == (
        "jointtune::gemm_ar_rmsnorm(Tensor[] a, Tensor[] b, Tensor[] residual, Tensor[] weight, float eps, str world, "
        "str config) -> (Tensor[], Tensor[])"
    )
    world = create_world("local", world_size=2)
    a = [torch.randn(4, 8).bfloat16() for _ in range(2)]
    b = [torch.randn(8, 16).bfloat16() for _ in range(2)]
    weight = [torch.ones(16).bfloat16() for _ in range(2)]
    config = {"mode": "baseline"}
    normed, h = gemm_ar_rmsnorm(a, b, None, weight, world=world, config=config)
    assert len(normed) == len(h) == 2
    prepared = gemm_ar_prepare(a, b, world=world, config=config, norm_weight=weight)
    assert prepared.residual == [None, None] and prepared.weight == weight
    again, h_again = prepared.run()
    assert again is prepared.out and h_again is prepared.h_out
    assert all(torch.equal(x, y) for x, y in zip([*normed, *h], [*again, *h_again]))
    with pytest.raises(ShapeError, match=r"h_out: must be one row-major \[4, 16\]"):
        gemm_ar_rmsnorm(a, b, None, weight, world=world, config=config, out=(None, [x.t() for x in b]))


def test_a_prepared_call_names_its_tensors_and_its_plan_and_reissues_the_call() -> None:
    world = create_world("local", world_size=2)
    a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    b = [torch.randn(32, 16).bfloat16() for _ in range(2)]
    config = {"mode": "baseline"}
    prepared = prepare(a, b, world=world, config=config)
    assert prepared.a is not a and prepared.a == a and prepared.b == b and len(prepared.c) == 2
    key, _ = get_family("ag_gemm").op.plan_key(world, [a, b], config)
    assert prepared.plan is world.plans[key]
    for x in prepared.a:
        x.copy_(torch.randn(16, 32))
    out = prepared.run()
    assert out is prepared.c
    want = torch.cat([x.float() for x in prepared.a]) @ b[0].float()
    assert (out[0].float() - want).abs().max() / want.abs().max() < 2e-2


def test_an_out_that_is_not_row_major_is_refused_by_name() -> None:
    world = create_world("local", world_size=2)
    a = [torch.randn(16, 32).bfloat16() for _ in range(2)]
    b = [torch.randn(32, 16).bfloat16() for _ in range(2)]
    out = [torch.empty(16, 32, dtype=torch.bfloat16).t() for _ in range(2)]
    with pytest.raises(ShapeError, match=r"out: must be one row-major \[32, 16\]"):
        ag_gemm(a, b, world=world, config={"mode": "baseline"}, out=out)
