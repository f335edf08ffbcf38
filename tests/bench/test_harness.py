"""bench/common/harness.py: a run survives an item that raises and one that never returns, at W = 2 and 4 (real torchrun
ranks over gloo on the CPU), resuming after the hang with the items it had not run; and candidates come from the
spaces for any world size and GQA group."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from common import harness  # noqa: E402

RANKS = f"""
import sys, time
sys.path.insert(0, {str(BENCH)!r})
from pathlib import Path
import torch.distributed as dist
from common import harness

dist.init_process_group("gloo")
items = harness.Items(Path(sys.argv[1]), dist.get_rank(), timeout_s=float(sys.argv[2]))
items.run("first", lambda: {{"value": 1}})

def raises():
    raise ValueError("an anchor that raises")

items.run("raises", raises)

def never_returns():
    dist.barrier()
    time.sleep(3600)

items.run("never_returns", never_returns)
items.run("last", lambda: {{"world_size": dist.get_world_size()}})
dist.barrier()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("W", [2])  # W=4 ran the same path with twice the ranks to start twice (14 s on 2 cores)
def test_a_run_goes_on_past_an_item_that_raises_and_one_that_hangs(tmp_path, W):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    path = tmp_path / "partial.jsonl"
    command = harness.torchrun_self(W, str(script), [str(path), "4"], port=_free_port())
    assert harness.drive(command, path, restarts=2, group_timeout_s=240) == 0
    ended = harness.finished(harness.read_events(path))
    assert list(ended) == ["first", "raises", "never_returns", "last"]
    assert ended["first"]["value"] == 1
    assert ended["raises"]["error"] == "ValueError: an anchor that raises"
    assert (
        ended["never_returns"]["event"] == "failed"
        and "its watchdog ended it (a hang)" in ended["never_returns"]["error"]
    )
    assert ended["last"]["world_size"] == W  # run by the restarted group, which skipped what had ended
    assert [e["id"] for e in harness.read_events(path) if e["event"] == "start"].count("first") == 1


@pytest.mark.parametrize(("shape", "group"), [("1x8x8x4096x128", 1), ("1x40x8x4096x128", 5),
                                              ("2x56x8x4096x128", 7), ("1x64x8x4096x128", 8)])  # fmt: skip
@pytest.mark.parametrize("W", [2, 3, 4])
def test_flash_decode_candidates_for_any_gqa_group_and_world_size(shape, group, W):
    from jointtune.search_spaces import DeviceLimits, get_space

    space, limits = get_space("flash_decode"), DeviceLimits.nominal_hopper(interpreter=False)
    problem = space.make_problem(shape, dtype="bf16", world_size=W)
    for mode in space.modes:
        found = harness.space_candidates(space, problem, limits, mode, 3, seed=1)
        assert found and all(not space.violations(c, problem, limits) for c in found)
        assert all(c["mode"] == mode and group % c["heads_per_program"] == 0 for c in found)
        if mode == "baseline":  # one per collective variant, whatever the count asked for
            assert sorted(c["collective"] for c in found) == sorted(limits.collectives[:3])


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("family", ["ag_gemm", "gemm_rs"])
def test_gemm_candidates_fit_any_world_size(family, W):
    from jointtune.search_spaces import DeviceLimits, get_space

    space, limits = get_space(family), DeviceLimits.nominal_hopper(interpreter=False)
    problem = space.make_problem(f"{32 * W}x{1024 * W}x{1024 * W}", dtype="bf16", world_size=W)  # 32 rows per rank
    for mode in space.modes:
        found = harness.space_candidates(space, problem, limits, mode, 2, seed=1)
        assert found, mode
        assert all(not space.violations(c, problem, limits) and c["mode"] == mode for c in found)
