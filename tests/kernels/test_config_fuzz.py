"""Random valid configs on random small shapes: whatever the tuner or a user may pick, every family computes the right
thing (CPU interpreter, simulated W = 2, 3 and 4).

Each case draws a world size, a dtype and a ragged shape (and for GEMM+AR an epilogue), then a mode uniformly and
the rest of the config from the space's choices until the space takes it (the space is the only rule book: a config
it takes must run). The output is poisoned with NaN and checked against the float32 reference; then the prepared
call is re-issued with fresh inputs (and, for Flash-Decode, new lengths), as a CUDA-graph replay would, and checked
again. Seeds are fixed: a failure names its case and reproduces.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from jointtune.kernels import ag_gemm as ag
from jointtune.kernels import flash_decode as fd
from jointtune.kernels import gemm_ar as ar
from jointtune.kernels import gemm_rs as rs
from jointtune.kernels.runtime.device import device_limits
from jointtune.kernels.runtime.world import LocalWorld
from jointtune.search_spaces import Problem, Space, get_space

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
LIMITS = device_limits(torch.device("cpu"))
CASES_PER_GROUP, GROUPS = 6, 8
#: fewer groups where a family's other tests already run every mode at every world size (the suite's time budget:
#: a Flash-Decode case costs 1.3 s in the interpreter, against 0.2-0.6 s for the GEMM families)
GROUPS_OF = {"gemm_ar": 3, "flash_decode": 5}


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


def _first_call_and_replay(prepare: Any, fresh: Any, errors: Any, dtype: torch.dtype, what: tuple) -> None:
    """Fresh inputs, the prepared call, its errors; then fresh inputs again, the call re-issued, its errors."""
    fresh()
    call = prepare()
    for replay in (False, True):
        if replay:
            fresh()
            call.run()
        found = errors()
        assert max(found) < TOL[dtype], (*what, "replay" if replay else "first call", found)


def _gemm_case(family: str, module: Any, dims: dict[str, int], a_shape: tuple[int, int], b_shape: tuple[int, int],
               out_shape: tuple[int, int], rng: random.Random, gen: torch.Generator, W: int,
               dtype: torch.dtype) -> None:  # fmt: skip
    """One GEMM family's case: its op module's prepared call on per-rank A, B and out of these shapes."""
    problem = Problem.of(dims, dtype=str(dtype).removeprefix("torch."), world_size=W)
    config = _sample(get_space(family), problem, rng)
    world = LocalWorld(world_size=W)
    a = [torch.empty(a_shape, dtype=dtype) for _ in range(W)]
    b = [torch.empty(b_shape, dtype=dtype) for _ in range(W)]
    out = [torch.empty(out_shape, dtype=dtype) for _ in range(W)]

    def fresh() -> None:
        for x in a:
            x.copy_(torch.randn(x.shape, generator=gen))
        for x in b:
            x.copy_(torch.randn(x.shape, generator=gen) / b_shape[0] ** 0.5)
        for o in out:
            o.fill_(float("nan"))

    _first_call_and_replay(lambda: module.prepare(a, b, world=world, config=config, out=out), fresh,
                           lambda: [_rel(o, r) for o, r in zip(out, module.reference(a, b))], dtype,
                           (problem, config))  # fmt: skip


def _gemm_rs_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    M, N, K_r = W * rng.randint(1, 24), rng.randint(8, 72), rng.randint(8, 160)
    _gemm_case("gemm_rs", rs, {"M": M, "N": N, "K": K_r * W}, (M, K_r), (K_r, N), (M // W, N), rng, gen, W, dtype)


def _ag_gemm_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    R, K, N_r = rng.randint(1, 24), rng.randint(8, 96), rng.randint(8, 64)
    _gemm_case("ag_gemm", ag, {"M": R * W, "N": N_r * W, "K": K}, (R, K), (K, N_r), (R * W, N_r), rng, gen, W, dtype)


def _gemm_ar_case(rng: random.Random, gen: torch.Generator, W: int, dtype: torch.dtype) -> None:
    """Any M (no divisibility), with no epilogue, the residual alone, or the residual + RMSNorm (every rank's outputs
    the same bits: the residual and weight are the same on every rank, as replicated activations are)."""
    M, N, K_r = rng.randint(1, 24), rng.randint(8, 72), rng.randint(8, 160)
    epilogue = rng.choice(("none", "residual", "norm"))
    problem = Problem.of({"M": M, "N": N, "K": K_r * W}, dtype=str(dtype).removeprefix("torch."), world_size=W)
    config = _sample(get_space("gemm_ar"), problem, rng)
    world = LocalWorld(world_size=W)
    a = [torch.empty(M, K_r, dtype=dtype) for _ in range(W)]
    b = [torch.empty(K_r, N, dtype=dtype) for _ in range(W)]
    res = [torch.empty(M, N, dtype=dtype) for _ in range(W)]
    weight = [torch.empty(N, dtype=dtype) for _ in range(W)]
    out = [torch.empty(M, N, dtype=dtype) for _ in range(W)]
    h = [torch.empty(M, N, dtype=dtype) for _ in range(W)]

    def fresh() -> None:
        for x in a:
            x.copy_(torch.randn(x.shape, generator=gen))
        for x in b:
            x.copy_(torch.randn(x.shape, generator=gen) / K_r**0.5)
        residual, w = torch.randn(M, N, generator=gen), 1 + torch.rand(N, generator=gen)
        for r in range(W):
            res[r].copy_(residual)
            weight[r].copy_(w)
        for o in out + h:
            o.fill_(float("nan"))

    def errors() -> list[float]:
        outs = [out, h] if epilogue == "norm" else [out]
        wanted = ar.reference(a, b, res[0] if epilogue != "none" else None, weight[0] if epilogue == "norm" else None)
        wanted = wanted if epilogue == "norm" else (wanted,)
        found = [_rel(o, want) for got, want in zip(outs, wanted) for o in got]
        # the same bits on every rank (inf marks a rank that differs)
        return found + [0.0 if all(torch.equal(o, got[0]) for o in got) else float("inf") for got in outs]

    def prepare() -> Any:
        return ar.prepare(a, b, world=world, config=config, residual=res if epilogue != "none" else None,
                          norm_weight=weight if epilogue == "norm" else None, out=out, h_out=h)  # fmt: skip

    _first_call_and_replay(prepare, fresh, errors, dtype, (problem, epilogue, config))


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

    def errors() -> list[float]:
        ref = fd.reference(q, k, v, lens)
        return [_rel(o, ref) for o in out]

    # fresh() draws new lengths too: a captured graph serves any
    _first_call_and_replay(lambda: fd.prepare(q, k, v, lens, world=world, config=config, out=out), fresh, errors,
                           dtype, (problem, config))  # fmt: skip


CASES = {"gemm_rs": _gemm_rs_case, "ag_gemm": _ag_gemm_case, "flash_decode": _flash_decode_case,
         "gemm_ar": _gemm_ar_case}  # fmt: skip


@pytest.mark.parametrize(("family", "group"), [(f, g) for f in CASES for g in range(GROUPS_OF.get(f, GROUPS))])
def test_random_valid_configs_on_random_shapes_match_the_reference(family: str, group: int) -> None:
    for case in range(group * CASES_PER_GROUP, (group + 1) * CASES_PER_GROUP):
        rng = random.Random(f"{family}-{case}")
        gen = torch.Generator().manual_seed(case)
        CASES[family](rng, gen, rng.choice((2, 3, 4)), DTYPES[rng.choice(list(DTYPES))])
