"""The baseline's collective variants on simulated ranks (CPU interpreter): every family's baseline in every variant
matches the float32 reference, with inputs from `world.collective_empty` (no copy-in) and plain ones (copied in), on
repeat calls; the world's all-reduce; and a variant the device's build can't run is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jointtune.errors import SpaceError
from jointtune.kernels import get_family
from jointtune.kernels.ag_gemm import ag_gemm
from jointtune.kernels.gemm_ar import gemm_ar, gemm_ar_rmsnorm, reference
from jointtune.kernels.gemm_rs import gemm_rs
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import DeviceLimits, Problem, get_space
from jointtune.search_spaces._collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

TOL = 2e-2


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("collective", ALL_GATHER)
def test_ag_gemm_baseline_in_every_variant(W, collective):
    world = LocalWorld(world_size=W)
    gen = torch.Generator().manual_seed(W)
    R, K, N_r = 5, 24, 8
    for placed in (False, True):
        all_a = torch.randn(W * R, K, generator=gen)
        b = [torch.randn(K, N_r, generator=gen).bfloat16() for _ in range(W)]
        if placed:  # the producer wrote A where the variant reads it
            a = world.collective_empty((R, K), torch.bfloat16, collective)
            for r, x in enumerate(a):
                x.copy_(all_a[r * R : (r + 1) * R])
        else:
            a = [all_a[r * R : (r + 1) * R].bfloat16() for r in range(W)]
        for _ in range(2):  # a repeat call reuses the plan and its buffers
            out = ag_gemm(a, b, world=world, config={"mode": "baseline", "collective": collective})
            for r in range(W):
                assert _rel(out[r], all_a.bfloat16().float() @ b[r].float()) < TOL


@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("collective", REDUCE_SCATTER)
def test_gemm_rs_baseline_in_every_variant(W, collective):
    world = LocalWorld(world_size=W)
    gen = torch.Generator().manual_seed(10 + W)
    M, N, K_r = 6 * W, 16, 12
    a = [torch.randn(M, K_r, generator=gen).bfloat16() for _ in range(W)]
    b = [torch.randn(K_r, N, generator=gen).bfloat16() for _ in range(W)]
    full = sum(x.float() @ y.float() for x, y in zip(a, b))
    for placed in (False, True):
        out = world.collective_empty((M // W, N), torch.bfloat16, collective) if placed else None
        for _ in range(2):
            got = gemm_rs(a, b, world=world, config={"mode": "baseline", "collective": collective}, out=out)
            for r in range(W):
                assert _rel(got[r], full[r * (M // W) : (r + 1) * (M // W)]) < TOL


@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("collective", ALL_REDUCE)
def test_gemm_ar_baseline_in_every_variant(W, collective):
    world = LocalWorld(world_size=W)
    gen = torch.Generator().manual_seed(20 + W)
    M, N, K_r = 5, 16, 12
    a = [torch.randn(M, K_r, generator=gen).bfloat16() for _ in range(W)]
    b = [torch.randn(K_r, N, generator=gen).bfloat16() for _ in range(W)]
    res = [torch.randn(M, N, generator=gen).bfloat16()] * W
    weight = [torch.rand(N, generator=gen).bfloat16() + 1] * W
    config = {"mode": "baseline", "collective": collective}
    for placed in (False, True):  # the caller's output where the variant sums (no copy out), or anywhere
        out = world.collective_empty((M, N), torch.bfloat16, collective) if placed else None
        for _ in range(2):
            got = gemm_ar(a, b, world=world, config=config, out=out)
            assert max(_rel(g, reference(a, b)) for g in got) < TOL
    got = gemm_ar(a, b, world=world, config=config, residual=res)
    assert max(_rel(g, reference(a, b, res[0])) for g in got) < TOL
    normed, h = gemm_ar_rmsnorm(a, b, res, weight, world=world, config=config)
    want_normed, want_h = reference(a, b, res[0], weight[0])
    assert max(_rel(g, want_normed) for g in normed) < TOL and max(_rel(g, want_h) for g in h) < TOL


@pytest.mark.parametrize("collective", ALL_GATHER)
def test_flash_decode_baseline_in_every_variant(collective):
    fam = get_family("flash_decode")
    world = LocalWorld(world_size=2)
    problem = Problem.of({"B": 1, "H": 4, "H_KV": 2, "S": 96, "D": 64}, dtype="bf16", world_size=2)
    inputs = fam.make_inputs(problem, world, seed=3)
    cfg = {**get_space("flash_decode").baseline(problem, DeviceLimits.nominal_hopper()), "collective": collective}
    assert fam.max_error(fam.run(inputs, cfg, world), fam.reference(inputs)) < TOL


def test_all_reduce_sums_every_rank_alike():
    world = LocalWorld(world_size=3)
    xs = [torch.full((2, 3), float(r + 1)) for r in range(3)]
    world.all_reduce(xs, collective="torch_two_shot")
    assert all(torch.equal(x, torch.full((2, 3), 6.0)) for x in xs)


def test_a_variant_the_build_lacks_is_refused_by_name():
    space = get_space("ag_gemm")
    problem = Problem.of({"M": 64, "N": 64, "K": 64}, dtype="bf16", world_size=2)
    plain = dataclasses.replace(DeviceLimits.nominal_hopper(), collectives=("nccl",))
    with pytest.raises(SpaceError, match=r'collective: "nccl_symm" is not available on this device \(needs NCCL >= 2'):
        space.validate({"mode": "baseline", "collective": "nccl_symm"}, problem, plain)
    with pytest.raises(SpaceError, match=r"collective: 'torch_two_shot' is not allowed; allowed: \"nccl\""):
        space.validate({"mode": "baseline", "collective": "torch_two_shot"}, problem, DeviceLimits.nominal_hopper())
    # a config written before the knob existed means NCCL's default kernels, as it did
    assert space.validate({"mode": "baseline"}, problem, plain) == {"mode": "baseline", "collective": "nccl"}
