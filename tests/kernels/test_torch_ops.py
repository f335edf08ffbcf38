"""`torch.ops.jointtune.ag_gemm`, `gemm_rs`, `flash_decode`, `gemm_ar` and `gemm_ar_rmsnorm`: real torch ops (schema,
fake tensor, no autograd surprises) that torch.compile traces without graph breaks, on the local world."""

from __future__ import annotations

import pytest
import torch

from jointtune.errors import KernelError, SpaceError
from jointtune.kernels.ag_gemm import config_json, reference
from jointtune.kernels.runtime.calls import parse_config
from jointtune.kernels.runtime.world import create_world, world_named

CONFIG = dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=2)


def _inputs(W, R=16, K=32, N_r=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = [(torch.randn(R, K, generator=gen) / K**0.25).bfloat16() for _ in range(W)]
    b = [(torch.randn(K, N_r, generator=gen) / K**0.25).bfloat16() for _ in range(W)]
    return a, b


class ColumnParallel(torch.nn.Module):
    """A layer calling the op with its world and config as constants, then ordinary torch work."""

    def __init__(self, world, b, config):
        super().__init__()
        self.world, self.b, self.config = world.name, b, config_json(config)

    def forward(self, a):
        c = torch.ops.jointtune.ag_gemm(a, self.b, self.world, self.config)
        return [torch.nn.functional.gelu(x.float()) for x in c]


def test_op_passes_torch_opcheck():
    world = create_world("local", world_size=2)
    a, b = _inputs(2)
    result = torch.library.opcheck(torch.ops.jointtune.ag_gemm.default, (a, b, world.name, config_json(CONFIG)))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("W", [2, 4])
def test_compiled_module_with_fullgraph_matches_eager(W):
    torch._dynamo.reset()
    world = create_world("local", world_size=W)
    a, b = _inputs(W, seed=W)
    layer = ColumnParallel(world, b, CONFIG)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    for seed in range(2):
        a, _ = _inputs(W, seed=10 + seed)
        expected = [torch.nn.functional.gelu(r) for r in reference(a, b)]
        for got, want in zip(compiled(a), expected):
            assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_fake_tensors_give_the_output_shape_without_running():
    world = create_world("local", world_size=4)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = [torch.empty(8, 32, dtype=torch.bfloat16) for _ in range(4)]
        b = [torch.empty(32, 24, dtype=torch.bfloat16) for _ in range(4)]
        out = torch.ops.jointtune.ag_gemm(a, b, world.name, config_json(CONFIG))
    assert [tuple(o.shape) for o in out] == [(32, 24)] * 4


def test_bad_world_or_config_text_names_the_field():
    world = create_world("local", world_size=2)
    a, b = _inputs(2)
    with pytest.raises(KernelError, match="world: 'nowhere' is not a live world"):
        torch.ops.jointtune.ag_gemm(a, b, "nowhere", config_json(CONFIG))
    with pytest.raises(SpaceError, match=r"config: .* is not JSON"):
        torch.ops.jointtune.ag_gemm(a, b, world.name, "{mode: push}")
    # past Python's digit limit, and nested past the parser's stack: the same kind of error, not a raw one
    for text in ('{"mode":"push","BLOCK_M":1' + "0" * 5000 + "}", '{"mode":' + "[" * 100_000 + "]" * 100_000 + "}"):
        with pytest.raises(SpaceError, match=r"config: .* is not a config \((ValueError|RecursionError)\)"):
            torch.ops.jointtune.ag_gemm(a, b, world.name, text)
    # the parse is cached, the dict handed out is the caller's: changing it changes no later call
    text = config_json(CONFIG)
    parse_config(text)["mode"] = "no such mode"
    assert parse_config(text) == CONFIG
    assert world_named(world.name) is world
    world.close()
    with pytest.raises(KernelError, match="is not a live world"):
        world_named(world.name)


class RowParallel(torch.nn.Module):
    """The row-parallel half: `torch.ops.jointtune.gemm_rs` between ordinary torch work."""

    def __init__(self, world, b, config):
        super().__init__()
        self.world, self.b, self.config = world.name, b, config_json(config)

    def forward(self, a):
        out = torch.ops.jointtune.gemm_rs([x * 1.0 for x in a], self.b, self.world, self.config)
        return [torch.nn.functional.gelu(x.float()) for x in out]


def test_gemm_rs_compiles_with_fullgraph_and_fakes_its_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jointtune.kernels.gemm_rs import reference as rs_reference

    torch._dynamo.reset()
    W = 2
    world = create_world("local", world_size=W)
    gen = torch.Generator().manual_seed(3)
    b = [(torch.randn(16, 24, generator=gen) / 2).bfloat16() for _ in range(W)]
    compiled = torch.compile(RowParallel(world, b, dict(mode="pull_cublas", reduce_sms=4)), fullgraph=True,
                             backend="aot_eager")  # fmt: skip
    for _ in range(2):  # two calls: the second replays the compiled graph
        a = [(torch.randn(32, 16, generator=gen) / 2).bfloat16() for _ in range(W)]
        for got, want in zip(compiled(a), rs_reference(a, b)):
            want = torch.nn.functional.gelu(want)
            assert ((got - want).norm() / want.norm()).item() < 2e-2
    with FakeTensorMode():
        fa = [torch.empty(32, 16, dtype=torch.bfloat16) for _ in range(W)]
        fb = [torch.empty(16, 24, dtype=torch.bfloat16) for _ in range(W)]
        out = torch.ops.jointtune.gemm_rs(fa, fb, world.name, config_json(dict(mode="baseline")))
    assert [tuple(o.shape) for o in out] == [(16, 24)] * W


class DecodeAttention(torch.nn.Module):
    """A decode step: `torch.ops.jointtune.flash_decode` between ordinary torch work, lengths as a device tensor."""

    def __init__(self, world, config):
        super().__init__()
        self.world, self.config = world.name, config_json(config)

    def forward(self, q, k, v, lens):
        out = torch.ops.jointtune.flash_decode([x * 1.0 for x in q], k, v, lens, self.world, self.config)
        return [x.float() * 2.0 for x in out]


def test_flash_decode_compiles_with_fullgraph_and_fakes_its_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jointtune.kernels.flash_decode import reference as fd_reference

    torch._dynamo.reset()
    W = 2
    world = create_world("local", world_size=W)
    gen = torch.Generator().manual_seed(4)
    config = dict(mode="fused", kv_split=64, BLOCK_N=32, heads_per_program=2, num_warps=2, num_stages=1,
                  items_per_flag=1)  # fmt: skip
    compiled = torch.compile(DecodeAttention(world, config), fullgraph=True, backend="aot_eager")
    k = [torch.randn(1, 1, 40, 64, generator=gen).bfloat16() for _ in range(W)]
    v = [torch.randn(1, 1, 40, 64, generator=gen).bfloat16() for _ in range(W)]
    for step in range(2):  # two calls, new lengths: the second replays the compiled graph
        q = [torch.randn(1, 2, 64, generator=gen).bfloat16()] * W
        lens = [torch.tensor([40 - 17 * step], dtype=torch.int32), torch.tensor([3 + step], dtype=torch.int32)]
        want = 2.0 * fd_reference(q, k, v, lens)
        for got in compiled(q, k, v, lens):
            assert ((got - want).norm() / want.norm()).item() < 2e-2
    with FakeTensorMode():
        fq = [torch.empty(3, 8, 128, dtype=torch.bfloat16) for _ in range(W)]
        fk = [torch.empty(3, 2, 50, 128, dtype=torch.bfloat16) for _ in range(W)]
        out = torch.ops.jointtune.flash_decode(fq, fk, fk, [], world.name, config_json(dict(config, mode="baseline")))
    assert [tuple(o.shape) for o in out] == [(3, 8, 128)] * W


class RowParallelNorm(torch.nn.Module):
    """The standard layout's row-parallel GEMM with its residual + RMSNorm: `torch.ops.jointtune.gemm_ar_rmsnorm`
    between ordinary torch work, then the plain `gemm_ar` on the normed rows."""

    def __init__(self, world, b, weight, config):
        super().__init__()
        self.world, self.b, self.weight, self.config = world.name, b, weight, config_json(config)

    def forward(self, a, residual):
        normed, h = torch.ops.jointtune.gemm_ar_rmsnorm([x * 1.0 for x in a], self.b, residual, self.weight, 1e-6,
                                                        self.world, self.config)  # fmt: skip
        k = a[0].shape[1]
        again = torch.ops.jointtune.gemm_ar([x[:, :k] for x in normed], self.b, [], self.world, self.config)
        return [x.float() * 2.0 for x in again], h


def test_gemm_ar_compiles_with_fullgraph_and_fakes_its_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jointtune.kernels.gemm_ar import reference as ar_reference

    torch._dynamo.reset()
    W = 2
    world = create_world("local", world_size=W)
    gen = torch.Generator().manual_seed(5)
    b = [(torch.randn(16, 24, generator=gen) / 2).bfloat16() for _ in range(W)]
    weight = [torch.ones(24).bfloat16()] * W
    config = dict(mode="two_shot", gemm="cublas", transport="push", tiles_per_flag=1, comm_sms=4)
    compiled = torch.compile(RowParallelNorm(world, b, weight, config), fullgraph=True, backend="aot_eager")
    for _ in range(2):  # two calls: the second replays the compiled graph
        a = [(torch.randn(5, 16, generator=gen) / 2).bfloat16() for _ in range(W)]
        residual = [torch.randn(5, 24, generator=gen).bfloat16()] * W
        out, h = compiled(a, residual)
        want_normed, want_h = ar_reference(a, b, residual[0], weight[0], 1e-6)
        want = 2.0 * ar_reference([x.float()[:, :16] for x in [want_normed] * W], b)
        for got in out:
            assert ((got - want).norm() / want.norm()).item() < 3e-2
        for got in h:
            assert ((got.float() - want_h).norm() / want_h.norm()).item() < 2e-2
    with FakeTensorMode():
        fa = [torch.empty(7, 16, dtype=torch.bfloat16) for _ in range(W)]
        fb = [torch.empty(16, 24, dtype=torch.bfloat16) for _ in range(W)]
        fw = [torch.empty(24, dtype=torch.bfloat16) for _ in range(W)]
        normed, h = torch.ops.jointtune.gemm_ar_rmsnorm(fa, fb, [], fw, 1e-6, world.name, config_json(config))
        out = torch.ops.jointtune.gemm_ar(fa, fb, [], world.name, config_json(dict(mode="baseline")))
    assert [tuple(o.shape) for o in (*normed, *h, *out)] == [(7, 24)] * 3 * W
