"""Two fresh tunes with the same seed pick the same config (issue 34), on flash_decode's real space over a simulated
latency (`jt_sim_decode`, the SimulatedClock): what is compared never depends on how busy the machine is."""

from __future__ import annotations

import os
import subprocess
import sys

from jt_tuning import job_json, ran, result_of, tune

from jointtune.autotune.tuner.settings import Job, TuneSettings
from jointtune.search_spaces import get_space

SIM = TuneSettings(trials=16, warmup=0, iters=2, seed=5, lookahead=1)


def decode_job(trials: int = 16, world_size: int = 2, shape: str = "8x32x8x32768x128") -> Job:
    problem = get_space("flash_decode").make_problem(shape, dtype="bf16", world_size=world_size)
    return Job.of("jt_sim_decode", problem, SIM.replace(trials=trials))


def test_two_fresh_tunes_with_one_seed_run_the_same_configs_and_pick_the_same_one(families, tmp_path, subprocess_env):
    job = decode_job()
    url = f"sqlite:///{tmp_path / 'first'}.db"
    tune(url, job)
    first = result_of(url, job)
    assert first.counted == 16 and first.state.refused_count == 0  # every proposal was one the space takes
    # a fresh tune in a fresh process, with another string hashing seed: the sampler's seeding and the start's order
    # are its own, so it runs the same configs in the same order, and so picks the same one
    env = {**subprocess_env, "PYTHONHASHSEED": "4242"}
    fresh = f"sqlite:///{tmp_path / 'fresh'}.db"
    out = subprocess.run([sys.executable, "-m", "jt_tuning", fresh, job_json(job)], env=env, capture_output=True,
                         text=True, timeout=240, cwd=os.path.dirname(families.__file__))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ran(first)
    assert result_of(fresh, job).best_config == first.best_config
    # a shorter budget asks the same first configs: TPE starts after the same history whatever the budget
    short = decode_job(trials=8)
    tune(f"sqlite:///{tmp_path / 'short'}.db", short)
    assert ran(result_of(f"sqlite:///{tmp_path / 'short'}.db", short)) == ran(first)[:8]
