#!/usr/bin/env bash
# Run Triton's own autotuner tests with `triton.autotune` replaced by `@joint_autotune`.
#
# Usage: bench/run_triton_autotuner_tests.sh TRITON_SRC [pytest args...]
#   TRITON_SRC: a checkout of the Triton release that is installed (e.g. `git clone -b release/3.6.x
#   https://github.com/triton-lang/triton`); its python/test/conftest.py supplies the `device` and
#   `fresh_knobs` fixtures. Needs a GPU (the tests default to --device cuda).
#
# A pytest plugin written to a temporary folder swaps `triton.autotune` (and `triton.runtime.Autotuner`,
# used directly by one test) for ours before the test module is imported, and gives every test a fresh
# SQLite store, so a parametrised test never finds its sibling's record and skips the benchmark.
#
# Which tests apply (Triton 3.6 test_autotuner.py):
#   same behaviour expected: test_kwargs, test_dtype_cache_results, test_no_do_bench, test_restore,
#     test_reset_to_zero, test_restore_with_none, test_hooks, test_prune_configs,
#     test_prune_configs_fractional_top_k_keeps_one, test_prune_configs_fractional_top_k_after_early_prune,
#     test_pruned_single_config_skips_benchmark, test_exceed_threads, test_exceed_tmem (sm100 only),
#     test_override_ttir/ttgir/ptx (one config: never benchmarked, never stored), test_prune_all_configs
#   untouched by the decorator (Config only): test_config_ir_override_changes_disk_cache_key
set -euo pipefail
TRITON_SRC=${1:?usage: $0 TRITON_SRC [pytest args...]}
shift
TEST_DIR="$TRITON_SRC/python/test"
[[ -f "$TEST_DIR/unit/runtime/test_autotuner.py" ]] || { echo "no test_autotuner.py under $TEST_DIR/unit/runtime" >&2; exit 2; }
PLUGIN_DIR=$(mktemp -d)
trap 'rm -rf "$PLUGIN_DIR"' EXIT
cat > "$PLUGIN_DIR/jt_triton_swap.py" <<'PY'
"""pytest plugin: Triton's autotuner tests, run against jointtune's drop-in."""
import pytest
import triton
import triton.runtime

from jointtune.autotune.decorator import joint_autotune
from jointtune.autotune.triton_compat import JointAutotuner


def _autotune(configs, key, **options):
    return joint_autotune(configs=configs, key=key, **options)


triton.autotune = _autotune
triton.runtime.Autotuner = JointAutotuner


@pytest.fixture(autouse=True)
def _fresh_store(tmp_path, monkeypatch):
    monkeypatch.setenv("JOINTTUNE_DB_URL", f"sqlite:///{tmp_path / 'jointtune.db'}")
    monkeypatch.delenv("JOINTTUNE_SERVER", raising=False)
    monkeypatch.delenv("JOINTTUNE_MODE", raising=False)
PY
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$TEST_DIR"
PYTHONPATH="$PLUGIN_DIR:$REPO:${PYTHONPATH:-}" python -m pytest -p jt_triton_swap unit/runtime/test_autotuner.py -q "$@"
