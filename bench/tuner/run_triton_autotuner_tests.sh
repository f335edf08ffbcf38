#!/usr/bin/env bash
# Run Triton's own autotuner tests with `triton.autotune` replaced by `@joint_autotune`.
#
# Usage: bench/tuner/run_triton_autotuner_tests.sh TRITON_SRC [pytest args...]
#   TRITON_SRC: a checkout (or just python/test/conftest.py and python/test/unit/runtime/test_autotuner.py) of
#   the Triton release that is installed, e.g. release/3.6.x for Triton 3.6; its conftest.py supplies the
#   `--device` option (default cuda) and the `device` fixture. Needs a GPU unless `--device cpu` with
#   TRITON_INTERPRET=1, where only the tests that bring no `do_bench` of their own can pass (their `do_bench`
#   is triton.testing.do_bench, which needs a GPU driver, with or without us).
#   PYTHON: the interpreter that has torch, triton and pytest (default python3).
#
# A pytest plugin written to a temporary folder swaps `triton.autotune` (and `triton.runtime.Autotuner`, used
# directly by a test of newer releases) for ours before any test runs (the tests decorate their kernels
# inside the test functions), gives every test a fresh SQLite store, so a parametrised test never finds its
# sibling's record and skips the benchmark, and ends with a line counting the kernels it decorated, the keys
# Triton benchmarked through it and the records saved. pytest runs with an empty config of its own (not the
# repository's pyproject.toml) and without auto-loaded third-party plugins (an empty PYTEST_DISABLE_PLUGIN_AUTOLOAD=
# loads them again).
#
# Which tests apply (Triton 3.6.0 test_autotuner.py, unchanged on main from #8059 until after the 3.6 cut):
#   same behaviour expected: test_kwargs[False/True] (True: CUDA graphs), test_no_do_bench,
#     test_restore[False/True], test_hooks, test_prune_configs[False/True], test_exceed_threads,
#     test_prune_all_configs (Triton's AutotunerError passes through us)
#   one config (never benchmarked, never stored): test_override_ttir, test_override_ttgir (sm >= 90),
#     test_override_ptx (sm 90 only)
#   skipped off sm100: test_exceed_tmem
# Newer releases add tests (reset_to_zero/restore_value with None, fractional top_k, single pruned config,
# cache_results, ir_override cache key) that test behaviour 3.6's Autotuner does not have.
set -euo pipefail
TRITON_SRC=${1:?usage: $0 TRITON_SRC [pytest args...]}
shift
PY=${PYTHON:-python3}
TEST_DIR=$(cd "$TRITON_SRC/python/test" 2>/dev/null && pwd) || { echo "no python/test under $TRITON_SRC" >&2; exit 2; }
[[ -f "$TEST_DIR/unit/runtime/test_autotuner.py" ]] || { echo "no unit/runtime/test_autotuner.py in $TEST_DIR" >&2
  exit 2; }
[[ -f "$TEST_DIR/conftest.py" ]] || { echo "no conftest.py (the device fixture) in $TEST_DIR" >&2; exit 2; }
"$PY" -c 'import pytest, torch, triton' || { echo "$PY cannot import pytest, torch and triton" >&2; exit 2; }
PLUGIN_DIR=$(mktemp -d)
trap 'rm -rf "$PLUGIN_DIR"' EXIT
printf '[pytest]\n' > "$PLUGIN_DIR/pytest.ini"
cat > "$PLUGIN_DIR/jt_triton_swap.py" <<'PY'
"""pytest plugin: Triton's autotuner tests, run against jointtune's drop-in."""
import os

import pytest
import triton
import triton.runtime

from jointtune.autotune.runtime.decorator import joint_autotune
from jointtune.autotune.runtime.triton_compat import JointAutotuner
from jointtune.db import open_store

_TUNERS = []
_SAVED = [0]


def _autotune(configs, key, **options):
    decorate = joint_autotune(configs=configs, key=key, **options)

    def wrap(fn):
        tuner = decorate(fn)
        _TUNERS.append(tuner)
        return tuner

    return wrap


triton.autotune = _autotune
triton.runtime.Autotuner = JointAutotuner


@pytest.fixture(autouse=True)
def _fresh_store(tmp_path, monkeypatch):
    db = tmp_path / "jointtune.db"
    url = f"sqlite:///{db}"
    monkeypatch.setenv("JOINTTUNE_DB_URL", url)
    monkeypatch.delenv("JOINTTUNE_SERVER", raising=False)
    monkeypatch.delenv("JOINTTUNE_MODE", raising=False)
    yield
    if db.exists():
        _SAVED[0] += open_store(url).count_records()


def pytest_terminal_summary(terminalreporter):
    benchmarked = sum(list(t.sources_by_key.values()).count("benchmark") for t in _TUNERS)
    terminalreporter.write_line(
        f"jointtune drop-in (triton {triton.__version__}, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}): "
        f"{len(_TUNERS)} kernels decorated by joint_autotune, {benchmarked} keys benchmarked, "
        f"{_SAVED[0]} records saved"
    )
PY
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$TEST_DIR"
PYTEST_DISABLE_PLUGIN_AUTOLOAD=${PYTEST_DISABLE_PLUGIN_AUTOLOAD-1} PYTHONPATH="$PLUGIN_DIR:$REPO:${PYTHONPATH:-}" \
  "$PY" -m pytest -c "$PLUGIN_DIR/pytest.ini" --rootdir "$TEST_DIR" -p no:cacheprovider -p jt_triton_swap \
  unit/runtime/test_autotuner.py -q "$@"
