"""Timing policies in the decorator: the call's policy, explicit fallbacks, and the CUDA-graph capture guard.

There is no GPU here: `policies.capturing` (is the current stream being captured?) and `policies._cuda`
(can graphs exist at all?) are replaced, which is exactly what the decorator reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_decorator_helpers import BEST, DEFAULT, OTHER, World, make_launcher, sleep_record, source_of

from jointtune.autotune.runtime import policies
from jointtune.db import open_store
from jointtune.errors import TuningError


def _db(tmp_path: Path, *records) -> str:
    url = f"sqlite:///{tmp_path / 'local.db'}"
    store = open_store(url)
    for record in records:
        store.upsert_record(record)
    return url


def _capturing(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(policies, "capturing", lambda: on)


def test_eager_calls_and_captured_calls_ask_for_their_own_policy(tmp_path: Path, monkeypatch) -> None:
    """Records of both policies for one key: eager outside capture, graph inside. The key first seen eagerly
    (on a machine with CUDA graphs) resolves the graph config too and runs the op once with it, so the
    captured call needs no lookup and finds its launch plan built."""
    db = _db(tmp_path, sleep_record(64, BEST, timing="eager"), sleep_record(64, OTHER, timing="graph"))
    monkeypatch.setattr(policies, "_cuda", lambda: True)
    _capturing(monkeypatch, False)
    launch = make_launcher(db)
    x, world = torch.ones(64), World(2)
    launch(x, world=world)
    assert launch.seen == [OTHER, BEST]  # the graph config warmed first, then the call's own
    assert source_of(launch, 64) == "store" and source_of(launch, 64, timing="graph") == "store"

    def no_lookups(*args, **kwargs):
        raise AssertionError("nothing may be looked up during capture")

    monkeypatch.setattr(launch, "_resolve", no_lookups)
    _capturing(monkeypatch, True)
    launch(x, world=world)
    assert launch.seen[-1] == OTHER
    _capturing(monkeypatch, False)
    launch(x, world=world)
    assert launch.seen[-1] == BEST


def test_without_cuda_graphs_no_graph_config_is_resolved(tmp_path: Path, monkeypatch) -> None:
    db = _db(tmp_path, sleep_record(64, BEST, timing="eager"), sleep_record(64, OTHER, timing="graph"))
    _capturing(monkeypatch, False)
    launch = make_launcher(db)
    launch(torch.ones(64), world=World(2))
    assert launch.seen == [BEST] and [k[3] for k in launch.cache] == ["eager"]


def test_fallbacks_are_explicit_configurable_and_shown(tmp_path: Path, monkeypatch, capsys) -> None:
    """Only a gpu record: an eager call uses it along the default chain and says so; with fallbacks off it
    takes the space default; $JOINTTUNE_TIMING_FALLBACK chooses another chain; JOINTTUNE_PRINT shows it."""
    db = _db(tmp_path, sleep_record(64, BEST, timing="gpu"), sleep_record(64, OTHER, timing="graph"))
    _capturing(monkeypatch, False)
    monkeypatch.setenv("JOINTTUNE_PRINT", "1")
    launch = make_launcher(db)
    launch(torch.ones(64), world=World(2))
    assert launch.seen == [BEST]
    assert source_of(launch, 64) == "store [gpu record, fallback for eager]"
    assert "timing eager" in capsys.readouterr().out

    strict = make_launcher(db, timing_fallback="none", on_miss="default")
    strict(torch.ones(64), world=World(2))
    assert strict.seen == [DEFAULT] and source_of(strict, 64) == "default"

    monkeypatch.setenv(policies.ENV_FALLBACK, "eager:graph")
    via_graph = make_launcher(db)
    via_graph(torch.ones(64), world=World(2))
    assert via_graph.seen == [OTHER] and source_of(via_graph, 64) == "store [graph record, fallback for eager]"


def test_an_exact_record_of_the_asked_policy_beats_a_fallback_and_nearest_stays_within_a_policy(
    tmp_path: Path, monkeypatch
) -> None:
    db = _db(
        tmp_path,
        sleep_record(64, OTHER, timing="gpu"),
        sleep_record(64, BEST, timing="eager"),
        sleep_record(128, OTHER, timing="eager"),
        sleep_record(96, DEFAULT, timing="gpu"),
    )
    _capturing(monkeypatch, False)
    launch = make_launcher(db, timing_fallback="none")
    launch(torch.ones(64), world=World(2))
    launch(torch.ones(100), world=World(2))  # nearest eager record is M=128 (M=96 is gpu: not this policy)
    assert launch.seen == [BEST, OTHER] and source_of(launch, 100) == "nearest-store"


def test_a_key_first_seen_during_capture_raises_before_anything_runs(tmp_path: Path, monkeypatch) -> None:
    """No store, service or tuning inside a capture: the error names the key and the warm-up, and the
    store file is not even opened. After a warm-up the same call goes through."""
    db_path = tmp_path / "never.db"
    monkeypatch.setenv("JOINTTUNE_SERVER", "http://127.0.0.1:9")  # never asked: nothing listens there
    launch = make_launcher(f"sqlite:///{db_path}", on_miss="tune")
    _capturing(monkeypatch, True)
    miss = r"key M=64 torch.float32 world_size 2 \(timing graph\).*warm-up"
    with pytest.raises(policies.CaptureMissError, match=miss):
        launch(torch.ones(64), world=World(2))
    assert launch.seen == [] and not db_path.exists()
    _capturing(monkeypatch, False)
    monkeypatch.setattr(policies, "_cuda", lambda: True)
    monkeypatch.delenv("JOINTTUNE_SERVER")
    launch.on_miss = "default"  # the warm-up itself would tune; this test is about the capture after it
    configs = launch.warm(torch.ones(64), world=World(2))
    assert configs == {"eager": DEFAULT, "graph": DEFAULT}
    _capturing(monkeypatch, True)
    launch(torch.ones(64), world=World(2))  # resolved before the capture: no error
    with pytest.raises(TuningError, match="warm\\(\\) was called during CUDA graph capture"):
        launch.warm(torch.ones(64), world=World(2))


def test_bad_policy_settings_are_refused_naming_the_field(monkeypatch) -> None:
    with pytest.raises(TuningError, match="timing: 'wall' is not allowed"):
        make_launcher(None, timing="wall")
    with pytest.raises(TuningError, match="timing_fallback: 'cpu' is not a timing policy"):
        make_launcher(None, timing_fallback={"eager": ["cpu"]})
    with pytest.raises(TuningError, match="timing_fallback: 'eager' falls back to itself"):
        make_launcher(None, timing_fallback="eager:gpu,eager")
    monkeypatch.setenv(policies.ENV_FALLBACK, "eager=gpu")
    with pytest.raises(TuningError, match=f"{policies.ENV_FALLBACK}: 'eager=gpu' is not allowed; write policy:"):
        policies.fallbacks()
    monkeypatch.setenv(policies.ENV_FALLBACK, "none")
    assert policies.fallbacks() == {"gpu": (), "eager": (), "graph": (), "interp": ()}
    monkeypatch.delenv(policies.ENV_FALLBACK)
    assert policies.fallbacks() == policies.DEFAULT_FALLBACKS


def test_a_fixed_policy_is_used_inside_and_outside_capture(tmp_path: Path, monkeypatch) -> None:
    db = _db(tmp_path, sleep_record(64, OTHER, timing="gpu"))
    _capturing(monkeypatch, False)
    launch = make_launcher(db, timing="gpu")
    launch(torch.ones(64), world=World(2))
    _capturing(monkeypatch, True)
    launch(torch.ones(64), world=World(2))
    assert launch.seen == [OTHER, OTHER] and source_of(launch, 64, timing="gpu") == "store"


def test_a_graph_miss_never_fails_the_eager_call_and_shows_at_capture(tmp_path: Path, monkeypatch) -> None:
    """on_miss="error" with only an eager record (and no fallback to it for graph): the eager call runs; the
    graph key's miss is raised when a capture asks for it, naming the policy, before anything is queued."""
    from jointtune.autotune.runtime.decorator import NoConfigError

    db = _db(tmp_path, sleep_record(64, BEST, timing="eager"))
    monkeypatch.setattr(policies, "_cuda", lambda: True)
    _capturing(monkeypatch, False)
    launch = make_launcher(db, on_miss="error", timing_fallback="eager:gpu")
    launch(torch.ones(64), world=World(2))
    assert launch.seen == [BEST]
    _capturing(monkeypatch, True)
    with pytest.raises(NoConfigError, match=r"timing (interp or )?graph.*on_miss='error'.*first seen, outside capture"):
        launch(torch.ones(64), world=World(2))
    assert launch.seen == [BEST]


def test_in_the_interpreter_an_interp_record_answers_first_and_is_named(tmp_path: Path, monkeypatch) -> None:
    """What the CPU interpreter measures is interp, whatever a call asks: its record comes before the asked policy's
    own and is named as what it is, not as a fallback; without one, the asked policy's chain is used as before."""
    from jointtune.hardware import detect

    assert detect().hardware_id.startswith("cpu-interpreter-"), "kernels run in the interpreter in these tests"
    db = _db(tmp_path, sleep_record(64, OTHER, timing="eager"), sleep_record(64, BEST, timing="interp"))
    _capturing(monkeypatch, False)
    launch = make_launcher(db, timing_fallback="none")
    launch(torch.ones(64), world=World(2))
    assert launch.seen == [BEST] and source_of(launch, 64) == "store [interp record]"
