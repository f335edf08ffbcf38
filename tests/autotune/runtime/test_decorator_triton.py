"""`@joint_autotune` as a drop-in for `triton.autotune`, on kernels run by Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from jointtune.autotune.runtime.decorator import NoConfigError, joint_autotune
from jointtune.db import open_store
from jointtune.timings import measured_as

CONFIGS = [triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})]


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    old = tl.load(out_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, old + tl.load(x_ptr + offs, mask=mask), mask=mask)


def grid(meta: dict) -> tuple[int]:
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


class Ladder:
    """A do_bench whose timings follow a fixed list per call, so the winner is known."""

    def __init__(self, times: list[float]) -> None:
        self.times, self.calls = list(times), 0

    def __call__(self, kernel_call, quantiles=None):
        kernel_call()
        value = self.times[self.calls % len(self.times)]
        self.calls += 1
        return [value, value, value]


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'triton.db'}"


def add(kernel, n: int = 100):
    x, y = torch.arange(n, dtype=torch.float32), torch.ones(n)
    out = torch.empty(n)
    kernel[grid](x, y, out, n)
    torch.testing.assert_close(out, x + y)


def _stands_in(timing: str) -> str:
    """How a record of `timing` is named when it answers an eager call (interp: the CPU interpreter's)."""
    return "[interp record]" if timing == "interp" else f"[{timing} record, fallback for eager]"


def test_benchmarks_like_triton_then_the_store_answers_a_fresh_process(db: str) -> None:
    bench = Ladder([3.0, 1.0, 2.0])
    kernel = joint_autotune(configs=CONFIGS, key=["n"], do_bench=bench, db_url=db)(_add_kernel)
    add(kernel)
    assert set(kernel.configs_timings) == set(CONFIGS) and bench.calls == 3
    assert kernel.best_config == CONFIGS[1] and list(kernel.cache.values()) == [CONFIGS[1]]
    assert list(kernel.cache) == [(100, "torch.float32", "torch.float32", "torch.float32")]
    add(kernel)  # a cached key: no benchmark
    assert bench.calls == 3
    (record,) = open_store(db).list_records()
    assert record.config["BLOCK"] == 32 and record.shape == {"n": 100} and record.latency_p50_us == 1000.0
    # a do_bench of the user's times the device, not the host: not an eager record (interp in the CPU interpreter)
    assert record.timing == measured_as("gpu", record.hardware_id)
    fresh = joint_autotune(configs=CONFIGS, key=["n"], do_bench=Ladder([5.0]), db_url=db)(_add_kernel)
    add(fresh)
    assert fresh.best_config == CONFIGS[1] and fresh.sources_by_key == {
        (100, "torch.float32", "torch.float32", "torch.float32"): f"store {_stands_in(record.timing)}"
    }
    assert not hasattr(fresh, "configs_timings")  # nothing was benchmarked


def test_nearest_and_error_policies(db: str) -> None:
    add(joint_autotune(configs=CONFIGS, key=["n"], do_bench=Ladder([1.0, 2.0, 3.0]), db_url=db)(_add_kernel), 100)
    near = joint_autotune(configs=CONFIGS, key=["n"], on_miss="nearest", db_url=db)(_add_kernel)
    add(near, 120)
    assert near.best_config == CONFIGS[0]
    (record,) = open_store(db).list_records()
    assert list(near.sources_by_key.values()) == [f"nearest-store {_stands_in(record.timing)}"]
    strict = joint_autotune(configs=CONFIGS, key=["n"], on_miss="error", db_url=db)(_add_kernel)
    with pytest.raises(NoConfigError, match="no tuned config"):
        add(strict, 120)


def test_interpreter_uses_a_wall_clock_timer(db: str) -> None:
    kernel = joint_autotune(configs=CONFIGS[:2], key=["n"], db_url=db)(_add_kernel)
    add(kernel, 40)
    assert all(t[0] > 0 for t in kernel.configs_timings.values())


def test_pruning_keeps_triton_semantics(db: str) -> None:
    seen = {}

    def early(configs, named_args, **kwargs):
        seen["args"] = sorted(named_args)
        return [c for c in configs if c.kwargs["BLOCK"] >= 32]

    def perf_model(**kwargs):
        return -kwargs["BLOCK"]  # the model prefers big blocks

    kernel = joint_autotune(
        configs=CONFIGS,
        key=["n"],
        do_bench=Ladder([1.0, 2.0]),
        db_url=db,
        prune_configs_by={"early_config_prune": early, "perf_model": perf_model, "top_k": 1},
    )(_add_kernel)
    add(kernel)
    assert seen["args"] == ["n", "out_ptr", "x_ptr", "y_ptr"]
    # one config left after pruning: Triton runs it without benchmarking
    assert kernel.best_config == CONFIGS[2] and not hasattr(kernel, "configs_timings")
    both = joint_autotune(
        configs=CONFIGS,
        key=["n"],
        do_bench=Ladder([2.0, 1.0]),
        db_url=db,
        prune_configs_by={"early_config_prune": early},
    )(_add_kernel)
    add(both, 64)
    assert set(both.configs_timings) == set(CONFIGS[1:]) and both.best_config == CONFIGS[2]


def test_reset_to_zero_and_restore_value(db: str) -> None:
    n = 50
    x = torch.ones(n)
    out = torch.full((n,), 7.0)
    reset = joint_autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"], db_url=db)(_accumulate_kernel)
    reset[grid](x, out, n)
    torch.testing.assert_close(out, x)  # zeroed before each benchmark and before the real run
    out = torch.full((n,), 7.0)
    restore = joint_autotune(configs=CONFIGS, key=["n"], restore_value=["out_ptr"], do_bench=Ladder([1.0]), db_url=db)(
        _accumulate_kernel
    )
    restore[grid](x, out, n + 0)
    torch.testing.assert_close(out, torch.full((n,), 8.0))  # benchmarks undone: one real run counts


def test_user_hooks_are_called_like_triton(db: str) -> None:
    calls: list[tuple[str, object]] = []
    kernel = joint_autotune(
        configs=CONFIGS[:2],
        key=["n"],
        do_bench=Ladder([1.0, 2.0]),
        db_url=db,
        pre_hook=lambda kwargs, reset_only=False: calls.append(("pre", reset_only)),
        post_hook=lambda kwargs, exception: calls.append(("post", exception)),
    )(_add_kernel)
    add(kernel)
    assert calls == [("pre", False), ("post", None), ("pre", False), ("post", None), ("pre", True)]
    assert kernel.user_defined_pre_hook and kernel.user_defined_post_hook


def test_mode_off_is_plain_triton(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOINTTUNE_MODE", "off")
    kernel = joint_autotune(configs=CONFIGS, key=["n"], do_bench=Ladder([2.0, 1.0, 3.0]), db_url=db)(_add_kernel)
    add(kernel)
    assert kernel.best_config == CONFIGS[1] and kernel.sources_by_key == {}
    assert open_store(db).count_records() == 0


def test_timing_policies_in_the_drop_in(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config per (key, policy): an eager call benchmarks with the policy's timer and saves an eager record,
    and on a machine with CUDA graphs also readies the key's graph entry (the eager config: no graph or gpu
    record exists, and the graph chain allows eager); under capture the readied key runs, and a new key
    raises before any benchmark or lookup."""
    from jointtune.autotune.runtime import policies

    monkeypatch.setattr(policies, "_cuda", lambda: True)
    monkeypatch.setattr(policies, "capturing", lambda: False)
    kernel = joint_autotune(configs=CONFIGS, key=["n"], db_url=db)(_add_kernel)
    add(kernel)
    (record,) = open_store(db).list_records()
    assert record.timing == measured_as("eager", record.hardware_id)
    assert kernel.sources_by_key[((100, "torch.float32", "torch.float32", "torch.float32"), "graph")] == (
        "eager config [fallback for graph]"
    )
    timed = len(kernel.configs_timings)
    monkeypatch.setattr(policies, "capturing", lambda: True)
    add(kernel)  # readied before the capture: no benchmark inside it
    assert list(kernel.cache.values()) == [kernel.best_config] and len(kernel.configs_timings) == timed
    with pytest.raises(policies.CaptureMissError, match=r"Triton key \(64, .*\(timing graph\).*first seen during"):
        add(kernel, n=64)
    monkeypatch.setattr(policies, "capturing", lambda: False)
    strict = joint_autotune(configs=CONFIGS, key=["n"], db_url=db, timing_fallback="graph:gpu")(_add_kernel)
    add(strict, n=48)  # the graph chain excludes eager: no graph entry is made up
    assert not any(p == "graph" for _, p in dict.keys(strict.cache))


def test_the_drop_in_benchmarks_by_policy() -> None:
    from jointtune.autotune.runtime.triton_compat import eager_bench, wall_clock_bench

    kernel = joint_autotune(configs=CONFIGS, key=["n"])(_add_kernel)
    assert kernel.do_bench is wall_clock_bench  # the interpreter has no CUDA events whatever the policy
    calls = []
    assert eager_bench(lambda: calls.append(1)) > 0 and len(calls) == 1 + 10 * 8  # warm-up, 10 samples of 8


COMPILED_ON_A_CPU = """
import torch, triton, triton.language as tl
from jointtune import joint_autotune

@joint_autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"], db_url="sqlite://")
@triton.jit
def add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

x = torch.arange(10.0)
out = torch.empty(10)
add_one[(1,)](x, out, 10)
print(out.tolist())
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU is what this checks")
def test_a_compiled_kernel_on_a_cpu_says_how_to_interpret_it(tmp_path: Path) -> None:
    """Triton picks interpreted or compiled as @triton.jit runs: without TRITON_INTERPRET a CPU-only call gets one
    line saying what to set, not Triton's "0 active drivers"; with it, the same script runs."""
    import os
    import subprocess
    import sys

    script = tmp_path / "example.py"
    script.write_text(COMPILED_ON_A_CPU)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    compiled = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert compiled.returncode != 0
    assert compiled.stderr.strip().splitlines()[-1] == (
        "jointtune.errors.TuningError: triton:__main__.add_one: no GPU here, and the kernel was compiled for one; "
        "to run it in Triton's CPU interpreter, set TRITON_INTERPRET=1 before the module that defines it is imported"
    )
    env["TRITON_INTERPRET"] = "1"
    interpreted = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert interpreted.returncode == 0, interpreted.stderr
    assert interpreted.stdout.strip() == str([float(i + 1) for i in range(10)])
