"""Random valid configs on random small shapes: whatever the tuner or a user may pick, every family computes the
right thing (CPU interpreter, simulated W = 2, 3 and 4).

Each case draws a world size, a dtype and a ragged shape, then a mode uniformly and the rest of the config from
the space's choices until the space takes it (the space is the only rule book: a config it takes must run). The
output is poisoned with NaN and checked against the float32 reference; then the prepared call is re-issued with
fresh inputs (and, for Flash-Decode, new lengths), as a CUDA-graph replay would, and checked again. Seeds are
fixed: a failure names its case and reproduces.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from jointtune.kernels import ag_gemm as ag
from jointtune.kernels import flash_decode as fd
from jointtune.kernels import gemm_rs as rs
from jointtune.kernels._runtime import device_limits
from jointtune.kernels.world import LocalWorld
from jointtune.search_spaces import Problem, Space, get_space

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
LIMITS = device_limits(torch.device("cpu"))
CASES_PER_GROUP, GROUPS = 6, 8


def _sample(space: Space, problem: Problem, rng: random.Random) -> dict[str, Any]:
    """A config the space takes: a mode drawn uniformly (so modes with many knobs are drawn as often as the
    baseline), then every active param's value drawn until no constraint is broken."""
    modes = list(space.modes)
    rng.shuffle(modes)
    for mode in modes:
        for _ in range(4000):
            config: dict[str, Any] = {"mode": mode}
            for p in space.params:
                if p.name != "mode" and (p.when is None or p.when.holds(config)):
                    config[p.name] = rng.choice(list(p.choices))
            if not space.violations(config, problem, LIMITS):
                return config
    raise AssertionError(f"no valid config drawn for {problem}")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    if ref.norm() == 0:
        return out.float().abs().max().nan_to_num(float("inf")).item()
    return ((out.float() - ref).norm() / ref.norm()).nan_to_num(float("inf")).item()


def _gemm_rs_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    M, N, K_r = W * rng.randint(1, 24), rng.randint(8, 72), rng.randint(8, 160)
    problem = Problem.of({"M": M, "N": N, "K": K_r * W}, dtype=str(dtype).removeprefix("torch."), world_size=W)
    config = _sample(get_space("gemm_rs"), problem, rng)
    world = LocalWorld(world_size=W)
    a = [torch.empty(M, K_r, dtype=dtype) for _ in range(W)]
    b = [torch.empty(K_r, N, dtype=dtype) for _ in range(W)]
    out = [torch.empty(M // W, N, dtype=dtype) for _ in range(W)]

    def fresh() -> None:
        for x in a:
            x.copy_(torch.randn(x.shape, generator=gen))
        for x in b:
            x.copy_(torch.randn(x.shape, generator=gen) / K_r**0.5)
        for o in out:
            o.fill_(float("nan"))

    fresh()
    call = rs.prepare(a, b, world=world, config=config, out=out)
    for replay in (False, True):
        if replay:
            fresh()
            call.run()
        errors = [_rel(o, r) for o, r in zip(out, rs.reference(a, b))]
        assert max(errors) < TOL[dtype], (problem, config, "replay" if replay else "first call", errors)


def _ag_gemm_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    R, K, N_r = rng.randint(1, 24), rng.randint(8, 96), rng.randint(8, 64)
    problem = Problem.of({"M": R * W, "N": N_r * W, "K": K}, dtype=str(dtype).removeprefix("torch."), world_size=W)
    config = _sample(get_space("ag_gemm"), problem, rng)
    world = LocalWorld(world_size=W)
    a = [torch.empty(R, K, dtype=dtype) for _ in range(W)]
    b = [torch.empty(K, N_r, dtype=dtype) for _ in range(W)]
    out = [torch.empty(R * W, N_r, dtype=dtype) for _ in range(W)]

    def fresh() -> None:
        for x in a:
            x.copy_(torch.randn(x.shape, generator=gen))
        for x in b:
            x.copy_(torch.randn(x.shape, generator=gen) / K**0.5)
        for o in out:
            o.fill_(float("nan"))

    fresh()
    call = ag.prepare(a, b, world=world, config=config, out=out)
    for replay in (False, True):
        if replay:
            fresh()
            call.run()
        errors = [_rel(o, r) for o, r in zip(out, ag.reference(a, b))]
        assert max(errors) < TOL[dtype], (problem, config, "replay" if replay else "first call", errors)


def _flash_decode_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    B, H_KV, G, S_r, D = rng.randint(1, 3), rng.choice((1, 2)), rng.choice((1, 2, 3, 4, 5)), rng.randint(1, 300), 64
    H = H_KV * G
    shape = {"B": B, "H": H, "H_KV": H_KV, "S": S_r * W, "D": D}
    problem = Problem.of(shape, dtype=str(dtype).removeprefix("torch."), world_size=W)
    config = _sample(get_space("flash_decode"), problem, rng)
    world = LocalWorld(world_size=W)
    q = [torch.empty(B, H, D, dtype=dtype) for _ in range(W)]
    k = [torch.empty(B, H_KV, S_r, D, dtype=dtype) for _ in range(W)]
    v = [torch.empty(B, H_KV, S_r, D, dtype=dtype) for _ in range(W)]
    lens = [torch.empty(B, dtype=torch.int32) for _ in range(W)]
    out = [torch.empty(B, H, D, dtype=dtype) for _ in range(W)]

    def fresh() -> None:
        query = torch.randn(B, H, D, generator=gen)  # the same queries on every rank
        for r in range(W):
            q[r].copy_(query)
            k[r].copy_(torch.randn(k[r].shape, generator=gen))
            v[r].copy_(torch.randn(v[r].shape, generator=gen))
            lens[r].copy_(torch.randint(0, S_r + 1, (B,), generator=gen))
            out[r].fill_(float("nan"))

    fresh()
    call = fd.prepare(q, k, v, lens, world=world, config=config, out=out)
    for replay in (False, True):
        if replay:
            fresh()  # new lengths too: a captured graph serves any
            call.run()
        ref = fd.reference(q, k, v, lens)
        errors = [_rel(o, ref) for o in out]
        assert max(errors) < TOL[dtype], (problem, config, "replay" if replay else "first call", errors)


CASES = {"gemm_rs": _gemm_rs_case, "ag_gemm": _ag_gemm_case, "flash_decode": _flash_decode_case}


@pytest.mark.parametrize("group", range(GROUPS))
@pytest.mark.parametrize("family", list(CASES))
def test_random_valid_configs_on_random_shapes_match_the_reference(family: str, group: int) -> None:
    for case in range(group * CASES_PER_GROUP, (group + 1) * CASES_PER_GROUP):
        rng = random.Random(f"{family}-{case}")
        gen = torch.Generator().manual_seed(case)
        CASES[family](rng, gen, rng.choice((2, 3, 4)), DTYPES[rng.choice(list(DTYPES))])
