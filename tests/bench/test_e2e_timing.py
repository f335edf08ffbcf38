"""bench/e2e/timing.py's `interleaved_us` off the GPU (a local world: eager calls by wall clock): every step is timed
in the same rounds, its order rotating, each a burst after an untimed call, and a step that fails is given as failed
while the others are still timed."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

E2E = Path(__file__).resolve().parents[2] / "bench" / "e2e"


def _timing():
    sys.path.insert(0, str(E2E))
    import timing

    return timing


def test_steps_are_timed_in_rotating_rounds_and_a_failing_step_does_not_stop_the_others():
    timing = _timing()
    world = SimpleNamespace(kind="local", world_size=2, device=torch.device("cpu"))
    calls: list[str] = []

    def step(name):
        return lambda: calls.append(name)

    def broken():
        raise RuntimeError("no such kernel")

    steps = {"a": step("a"), "broken": broken, "b": step("b"), "c": step("c")}
    timed = timing.interleaved_us(steps, world, iters=3, warmup=1, burst=2)
    assert list(timed) == ["a", "broken", "b", "c"]  # the caller's order
    assert timed["broken"] == "failed: RuntimeError: no such kernel"
    assert all(isinstance(timed[n], float) and timed[n] >= 0 for n in "abc")
    assert calls[:3] == ["a", "b", "c"]  # each step run once before the rounds (a GPU captures it there)
    assert calls[3:6] == ["a", "b", "c"]  # the warm-up round
    # each timed round starts one later; a step's burst is an untimed call, then two timed ones
    assert "".join(calls[6:]) == "aaabbbccc" + "bbbcccaaa" + "cccaaabbb"
    assert timing.interleaved_us({}, world, iters=3, warmup=1) == {}
    # a step whose check raised on this rank is passed as None (every rank passes the same names): given as failed
    calls.clear()
    timed = timing.interleaved_us({"a": step("a"), "checked_out": None}, world, iters=2, warmup=0, burst=1)
    assert timed["checked_out"].startswith("failed: its check raised") and isinstance(timed["a"], float)
    assert calls == ["a"] + ["a", "a"] * 2  # run once before the rounds, then each round's untimed and timed call


def test_a_cold_burst_reads_over_the_cache_before_each_timed_call_and_not_before_the_untimed_one():
    timing = _timing()
    world = SimpleNamespace(kind="local", world_size=1, device=torch.device("cpu"))
    calls: list[str] = []
    took = timing._burst_us(lambda: calls.append("run"), world, 2, flush=lambda: calls.append("flush"))
    assert calls == ["run", "flush", "run", "flush", "run"] and len(took) == 2
