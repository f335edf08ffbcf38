"""Repeat eager calls replayed from a recording of the call (`jointtune/kernels/runtime/eager_graph.py`).

CUDA graphs need a GPU, so here the recording re-issues the recorded call on the static tensors it was given, as the
CPU suite's prepared launches stand in for graph replays (bench/ops/gpu_smoke.py's eager_replay check runs the CUDA
graphs themselves). What is checked is the bookkeeping around it: when a call site is captured, replayed or left direct,
and that every replayed call returns what a direct call would."""

from __future__ import annotations

import warnings

import pytest
import torch

from jointtune.errors import KernelError
from jointtune.kernels import ag_gemm as ag
from jointtune.kernels.runtime import eager_graph as eg
from jointtune.kernels.runtime.eager_graph import EagerGraphs, direct_only, enabled
from jointtune.kernels.runtime.world import create_world


def _recording(captured: list[int]) -> eg.Capture:
    def capture(run: eg.Run, inputs: list, outputs: list) -> object:
        captured.append(1)
        return lambda: run(inputs, outputs)

    return capture


def _call(graphs: EagerGraphs, x: torch.Tensor, w: torch.Tensor, key: tuple = ("matmul",)) -> tuple[bool, torch.Tensor]:
    """One call of a 'plan' (x @ w into a new output; w read in place): replayed, or run directly as entries do."""
    out = torch.full((x.shape[0], w.shape[1]), float("nan"))

    def run(ins: list, outs: list) -> None:
        torch.matmul(ins[0], w, out=outs[0])

    replayed = graphs.call(key, run, [x], [w], [out])
    if not replayed:
        run([x], [out])
    return replayed, out


def _graphs(captured: list[int], **kwargs: object) -> EagerGraphs:
    return EagerGraphs(torch.device("cpu"), capture=_recording(captured), **kwargs)


def test_second_call_captures_and_later_calls_replay_with_their_own_data() -> None:
    captured: list[int] = []
    graphs, w = _graphs(captured), torch.randn(8, 4)
    pattern = []
    for _ in range(5):
        x = torch.randn(3, 8)  # a new input tensor every call: copied in
        replayed, out = _call(graphs, x, w)
        pattern.append(replayed)
        torch.testing.assert_close(out, x @ w)
    assert pattern == [False, True, True, True, True] and captured == [1] and graphs.replays == 4


def test_each_weight_is_a_call_site_of_its_own() -> None:
    captured: list[int] = []
    graphs, layers = _graphs(captured), [torch.randn(8, 4) for _ in range(3)]
    for step in range(3):
        for w in layers:  # one key (same shapes and config), three weights: three graphs
            x = torch.randn(3, 8)
            replayed, out = _call(graphs, x, w)
            assert replayed is (step > 0)
            torch.testing.assert_close(out, x @ w)
    assert len(captured) == 3


def test_a_moved_weight_or_new_layout_is_a_new_site_and_the_old_one_still_replays() -> None:
    captured: list[int] = []
    graphs, w = _graphs(captured), torch.randn(8, 4)
    for _ in range(2):
        _call(graphs, torch.randn(3, 8), w)
    moved = w.clone()
    assert _call(graphs, torch.randn(3, 8), moved)[0] is False  # first call of a new site
    strided = torch.randn(8, 3).t()  # the same shape, other strides
    replayed, out = _call(graphs, strided, w)
    assert replayed is False
    torch.testing.assert_close(out, strided @ w)
    assert _call(graphs, torch.randn(3, 8), w)[0] is True


def test_big_copies_and_a_full_world_stay_direct_without_capturing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[int] = []
    graphs = _graphs(captured)
    monkeypatch.setattr(eg, "MAX_COPY_BYTES", 3 * 8 * 4 + 3 * 4 * 4 - 1)  # one byte short of x and out
    w = torch.randn(8, 4)
    assert [_call(graphs, torch.randn(3, 8), w)[0] for _ in range(3)] == [False, False, False]
    monkeypatch.setattr(eg, "MAX_COPY_BYTES", 8 << 20)
    monkeypatch.setattr(eg, "MAX_GRAPHS", 1)
    w1, w2 = torch.randn(8, 4), torch.randn(8, 4)
    for _ in range(4):
        _call(graphs, torch.randn(3, 8), w1)
        _call(graphs, torch.randn(3, 8), w2)
    assert len(captured) == 1  # w1's site; w2's found the world full and runs directly for good


def test_a_failed_capture_warns_once_resets_the_world_and_runs_directly() -> None:
    resets: list[int] = []

    def failing(run: eg.Run, inputs: list, outputs: list) -> object:
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = EagerGraphs(torch.device("cpu"), capture=failing, on_failed_capture=lambda: resets.append(1))
    w = torch.randn(8, 4)
    with pytest.warns(RuntimeWarning, match="matmul: this call can't be captured"):
        results = [_call(graphs, torch.randn(3, 8), w) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = torch.randn(3, 8)
        replayed, out = _call(graphs, x, w)
    assert [r for r, _ in results] == [False, False] and replayed is False and resets == [1]
    torch.testing.assert_close(out, x @ w)


def test_direct_only_and_the_switch_keep_calls_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: list[int] = []
    graphs, w = _graphs(captured), torch.randn(8, 4)
    with direct_only():
        assert [_call(graphs, torch.randn(3, 8), w)[0] for _ in range(3)] == [False] * 3
    monkeypatch.setenv("JOINTTUNE_EAGER_GRAPH", "0")
    off = _graphs(captured)
    assert [_call(off, torch.randn(3, 8), w)[0] for _ in range(3)] == [False] * 3
    assert captured == []


def test_capture_in_inference_mode_then_calls_outside_it() -> None:
    captured: list[int] = []
    graphs, w = _graphs(captured), torch.randn(8, 4)
    with torch.inference_mode():
        for _ in range(2):
            _call(graphs, torch.randn(3, 8), w)  # the second captures: its statics are inference tensors
    with torch.no_grad():
        x = torch.randn(3, 8)
        replayed, out = _call(graphs, x, w)
    assert replayed is True and not out.is_inference()
    torch.testing.assert_close(out, x @ w)


def test_clear_drops_graphs_and_starts_over() -> None:
    captured: list[int] = []
    graphs, w = _graphs(captured), torch.randn(8, 4)
    for _ in range(2):
        _call(graphs, torch.randn(3, 8), w)
    graphs.clear()
    assert [_call(graphs, torch.randn(3, 8), w)[0] for _ in range(2)] == [False, True] and len(captured) == 2


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), ("", True), ("0", False), ("OFF", False)])
def test_switch_reads_on_and_off(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("JOINTTUNE_EAGER_GRAPH", value)
    assert enabled() is on


def test_switch_refuses_an_unknown_value_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOINTTUNE_EAGER_GRAPH", "sometimes")
    with pytest.raises(KernelError, match="JOINTTUNE_EAGER_GRAPH: 'sometimes' is not allowed"):
        EagerGraphs(torch.device("cuda"))


def test_no_capture_on_a_cpu_world_by_default() -> None:
    graphs, w = EagerGraphs(torch.device("cpu")), torch.randn(8, 4)
    assert [_call(graphs, torch.randn(3, 8), w)[0] for _ in range(3)] == [False] * 3


def test_simulated_world_never_asks_for_a_graph() -> None:
    world = create_world("local", world_size=2)
    R, K, N_r = 32, 64, 32
    a = [torch.randn(R, K).bfloat16() for _ in range(2)]
    b = [torch.randn(K, N_r).bfloat16() for _ in range(2)]
    for _ in range(3):
        c = ag.ag_gemm(a, b, world=world, config={"mode": "ce", "ce_consumer": "cublas", "ce_chunks": 1})
        ref = torch.cat(a).float()
        for ci, bi in zip(c, b):
            torch.testing.assert_close(ci.float(), ref @ bi.float(), rtol=2e-2, atol=2e-1)
    assert world._eager is None  # simulated ranks launch one after another: the entry never asks for a graph
    world.close()
