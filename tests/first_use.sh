#!/usr/bin/env bash
# A newcomer's first use from a fresh clone, run by hand outside CI (it installs into a fresh venv, torch
# included where the machine has none, so it needs a package index and several minutes):
#   tests/first_use.sh                       # the README's `make sweep`
#   SWEEP=path/to/small.yaml tests/first_use.sh
# It clones this checkout's HEAD into a temporary directory, runs `make sweep` there with a private default
# store, runs each `next:` command the sweep printed exactly as printed (before any activation: they name
# .venv/bin/jointtune), then activates the venv as README's Set-up says and runs `jointtune db list` by name.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
git clone -q "$src" "$work/jointtune"
cd "$work/jointtune"
export XDG_DATA_HOME="$work/data"   # the default store of this check, not yours
unset JOINTTUNE_DB_URL VIRTUAL_ENV
make sweep SWEEP="${SWEEP:-examples/sweep.yaml}" | tee "$work/sweep.log"
sed -n '/^next:$/,$p' "$work/sweep.log" | grep -F ' db list' | sed 's/  #.*//' > "$work/next.sh"
test -s "$work/next.sh"
bash "$work/next.sh"
# shellcheck disable=SC1091
. .venv/bin/activate
command -v jointtune
jointtune db list
echo "first use: OK (in $work)"
