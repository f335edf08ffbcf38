"""The eager-graph switch and where it stays out of the way on the CPU (replays themselves need CUDA graphs: they
are checked on a GPU by bench/gpu_smoke.py's eager_replay check and the modes stress runs)."""

from __future__ import annotations

import pytest
import torch

from jointtune.errors import KernelError
from jointtune.kernels import ag_gemm as ag
from jointtune.kernels._eager_graph import EagerGraphs, enabled
from jointtune.kernels.world import create_world


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), ("", True), ("0", False), ("OFF", False)])
def test_switch_reads_on_and_off(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("JOINTTUNE_EAGER_GRAPH", value)
    assert enabled() is on


def test_switch_refuses_an_unknown_value_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOINTTUNE_EAGER_GRAPH", "sometimes")
    with pytest.raises(KernelError, match="JOINTTUNE_EAGER_GRAPH: 'sometimes' is not allowed"):
        EagerGraphs(torch.device("cuda"))


def test_cpu_calls_run_directly_and_never_record() -> None:
    graphs = EagerGraphs(torch.device("cpu"))
    ran = []
    x, y = torch.ones(2), torch.zeros(2)
    for _ in range(3):
        assert graphs.call(("k",), lambda ins, outs: ran.append(1), [x], [], [y]) is False
    assert ran == [] and graphs.replays == 0  # the caller runs the plan itself


def test_simulated_world_takes_the_direct_path_for_a_ce_plan() -> None:
    world = create_world("local", world_size=2)
    R, K, N_r = 32, 64, 32
    a = [torch.randn(R, K).bfloat16() for _ in range(2)]
    b = [torch.randn(K, N_r).bfloat16() for _ in range(2)]
    config = {"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1}
    for _ in range(3):
        c = ag.ag_gemm(a, b, world=world, config=config)
        ref = torch.cat(a).float()
        for ci, bi in zip(c, b):
            torch.testing.assert_close(ci.float(), ref @ bi.float(), rtol=2e-2, atol=2e-1)
    assert world._eager is None  # simulated ranks launch one after another: the entry never asks for a graph
    world.close()
