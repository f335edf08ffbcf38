#!/usr/bin/env bash
# The config-service load benchmark (bench/service/service_load.py) on a machine with no PostgreSQL, no
# internet and no project install: the lent GPU node. Everything comes from two carried folders:
#   .whl/  the service's wheels (cp312), installed into a temporary site with pip --no-index
#   .pg/   the PyPI wheel pgserver (PostgreSQL 16 binaries, manylinux2014 x86_64; only its
#          bin/ lib/ share/ are used, never its Python layer), and small wheels that .whl lacks:
#          annotated-doc (typer, FastAPI), MarkupSafe (Alembic's Mako), packaging and tqdm
#          (Optuna); each is installed only where neither .whl nor the machine's Python has it
# It starts a throw-away PostgreSQL on 127.0.0.1 (a free port, trust auth, database `test`) as an
# unprivileged user when run as root (postgres refuses root), runs the benchmark with workers and
# client processes sized to the cores, then the closed-loop flood benchmark (bench/service/service_flood.py:
# 8 anonymous flooders of misses and dashboard pages beside 4 clients of exact lookups, `serve`'s
# default workers; issue 38's target on 16 cores or more: exact-lookup p99 <= 50 ms), writes the
# JSON results and the logs to $OUT, and always stops the server and deletes its files, whatever
# happens.
#
#   OUT=/path/to/dir bash bench/service/service_load_device.sh [extra service_load.py arguments]
#   FLOOD_ONLY=1 OUT=/path/to/dir bash bench/service/service_load_device.sh   # only the flood benchmark
#   bash bench/service/service_load_device.sh --fetch     # with internet: download .pg/ (the wheels above)
#
# Extra arguments come after the defaults, so they override them (e.g. --records 5000 --duration 5);
# FLOOD_ARGS (a string) does the same for service_flood.py.
# PYTHON (default python3) must be CPython 3.12, the version the carried wheels are built for.
set -euo pipefail

PG_WHEEL_SPEC="pgserver==0.1.4"
PG_WHEEL_SHA256="1a5d07c61d51f2abfef4ef61e2ef5cd014b994f7e09de8d3c140d2cf370e84a8"
EXTRA_SPECS=(annotated-doc==0.0.7 markupsafe==3.0.4 packaging==26.3 tqdm==4.70.1)

cd "$(dirname "$0")/../.."
REPO=$(pwd)
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--fetch" ]]; then
  mkdir -p .pg
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .pg "$PG_WHEEL_SPEC" "${EXTRA_SPECS[@]}"
  sha256sum .pg/*.whl
  exit 0
fi

: "${OUT:?set OUT to the folder for the JSON result}"
mkdir -p "$OUT"
shopt -s nullglob
wheels=(.whl/*.whl)
pg_wheels=(.pg/pgserver-*.whl)
extra=()
for wheel in .pg/*.whl; do
  name=${wheel##*/}
  name=${name%%-*}  # the project as wheel files spell it, which is also its module here
  [[ $name != pgserver ]] || continue
  shopt -s nocaseglob
  in_whl=(.whl/"$name"-*.whl)
  shopt -u nocaseglob
  if [[ ${#in_whl[@]} -eq 0 ]] && ! "$PY" -c "import $name" 2>/dev/null; then extra+=("$wheel"); fi
done
shopt -u nullglob
[[ ${#wheels[@]} -gt 0 ]] || { echo "no wheels in $REPO/.whl (carry .whl)" >&2; exit 2; }
[[ ${#pg_wheels[@]} -eq 1 ]] || { echo "need exactly one .pg/pgserver-*.whl (carry .pg; here: --fetch)" >&2; exit 2; }
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
  || { echo "$PY is $("$PY" -V 2>&1); the carried wheels need CPython 3.12 (set PYTHON)" >&2; exit 2; }
echo "${PG_WHEEL_SHA256}  ${pg_wheels[0]}" | sha256sum -c --quiet - \
  || { echo "${pg_wheels[0]}: not the pgserver wheel this script was tested with" >&2; exit 2; }

umask 022  # the server's user must read the installed binaries
WORK=$(mktemp -d /tmp/jt-load.XXXXXX)  # /tmp: traversable by that user, unlike a root-only $TMPDIR
chmod 755 "$WORK"
# pg_ctl starts the postmaster in a session of its own, so a kill of this script's process group
# (a time limit's SIGKILL) would leave it running. A watchdog in its own session outlives such a
# kill: once this script is gone it shuts the server down (SIGQUIT: immediate) and deletes $WORK.
"$PY" - "$$" "$WORK" >/dev/null 2>&1 <<'PY' &
import os, shutil, signal, sys, time

script, work = int(sys.argv[1]), sys.argv[2]
if os.fork():
    os._exit(0)
os.setsid()
while True:
    try:
        os.kill(script, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(1)
try:
    with open(os.path.join(work, "data", "postmaster.pid")) as fh:
        postmaster = int(fh.readline())
    os.kill(postmaster, signal.SIGQUIT)
    for _ in range(100):
        time.sleep(0.1)
        os.kill(postmaster, 0)
except (OSError, ValueError):
    pass
shutil.rmtree(work, ignore_errors=True)
PY
PGDATA="$WORK/data"
PGRUN="$WORK/run"  # socket, log: written by the server's user
PGBIN="$WORK/site/pgserver/pginstall/bin"
STARTED=0

# Run a command as the server's user: itself when not root, else an unprivileged account.
as_pg() {
  if [[ -z "${PG_OS_USER:-}" ]]; then
    "$@"
  else
    "$PY" -c 'import os, pwd, sys
entry = pwd.getpwnam(sys.argv[1])
os.setgroups([])
os.setgid(entry.pw_gid)
os.setuid(entry.pw_uid)
os.environ["HOME"] = sys.argv[2]
os.execv(sys.argv[3], sys.argv[3:])' "$PG_OS_USER" "$PGRUN" "$@"
  fi
}

stop_server() {
  [[ $STARTED -eq 1 ]] || return 0
  STARTED=0
  if ! as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 30 stop >/dev/null 2>&1; then
    # pg_ctl could not stop it: kill the postmaster (its backends exit with it)
    pid=$(head -n 1 "$PGDATA/postmaster.pid" 2>/dev/null || true)
    if [[ -n "$pid" ]]; then kill -9 "$pid" 2>/dev/null || true; fi
    sleep 1
  fi
  echo "PostgreSQL stopped"
}

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  status=$?
  stop_server || true
  if [[ $status -ne 0 && -f "$PGRUN/postgres.log" ]]; then
    cp "$PGRUN/postgres.log" "$OUT/postgres.log" 2>/dev/null || true
    echo "PostgreSQL's log: $OUT/postgres.log" >&2
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== installing ${#wheels[@]} wheels from .whl, ${pg_wheels[0]##*/} and ${extra[*]:-nothing else} into $WORK/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --target "$WORK/site" "${wheels[@]}" "${pg_wheels[0]}" "${extra[@]}"
"$PGBIN/postgres" --version

mkdir -p "$PGDATA" "$PGRUN"
if [[ $(id -u) -eq 0 ]]; then
  if id -u nobody >/dev/null 2>&1; then
    PG_OS_USER=nobody
  else
    useradd --system --no-create-home --shell /usr/sbin/nologin jtpg 2>/dev/null || id -u jtpg >/dev/null
    PG_OS_USER=jtpg
  fi
  chown "$PG_OS_USER" "$PGDATA" "$PGRUN"
  echo "== running as root: PostgreSQL runs as $PG_OS_USER"
fi
chmod 700 "$PGDATA"

echo "== initdb"
as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust --no-locale -E UTF8 --no-sync >"$PGRUN/initdb.log" 2>&1 \
  || { cat "$PGRUN/initdb.log" >&2; exit 1; }

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
CORES=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
# Server side: lookups are short; 4 workers for 8 cores, 8 for 16. Clients: one process per
# 4 cores, so the client's own GIL does not add to the measured latency.
WORKERS=$((CORES / 2 > 2 ? CORES / 2 : 2))
CLIENTS=$((CORES / 4 > 1 ? CORES / 4 : 1))
# each worker's pool holds up to 15 connections (SQLAlchemy's default 5 + 10 overflow); the flood
# benchmark runs serve's default workers: one per core, at most 16
SERVE_WORKERS=$((CORES < 16 ? CORES : 16))
MAX_CONN=$(((WORKERS > SERVE_WORKERS ? WORKERS : SERVE_WORKERS) * 15 + 50))

echo "== starting PostgreSQL on 127.0.0.1:$PORT"
STARTED=1
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGRUN/postgres.log" -w -t 60 start -o \
  "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$PGRUN -c max_connections=$MAX_CONN -c shared_buffers=512MB" \
  >/dev/null
"$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres test

STAMP=$(date -u +%Y-%m-%dT%H%M%SZ)
RESULT="$OUT/service_load_$STAMP.json"
OS=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
DEVICE="$CORES cores ($(uname -m), ${OS:-$(uname -sr)}), \
PostgreSQL $("$PGBIN/postgres" --version | awk '{print $NF}') (pgserver wheel) on loopback, server and client on the same machine"
rc=0
set +e
if [[ "${FLOOD_ONLY:-0}" != 1 ]]; then
  echo "== benchmark: $WORKERS workers, $CLIENTS client processes ($DEVICE)"
  PYTHONPATH="$REPO:$WORK/site" PYTHONUNBUFFERED=1 "$PY" bench/service/service_load.py \
    --db-url "postgresql+psycopg://postgres@127.0.0.1:$PORT/test" \
    --workers "$WORKERS" --clients "$CLIENTS" --threads 16 --rate 500 --duration 30 --records 100000 \
    --device "$DEVICE" --out "$RESULT" "$@" 2>&1 | tee "$OUT/service_load_$STAMP.log"
  rc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] && echo "== result: $RESULT"
fi
FLOOD_RESULT="$OUT/service_flood_$STAMP.json"
echo "== flood benchmark: serve's default workers, 8 flooders + 4 exact-lookup clients ($DEVICE)"
# shellcheck disable=SC2086  # FLOOD_ARGS is a list of arguments
PYTHONPATH="$REPO:$WORK/site" PYTHONUNBUFFERED=1 "$PY" bench/service/service_flood.py \
  --db-url "postgresql+psycopg://postgres@127.0.0.1:$PORT/test" --records 5000 --duration 60 \
  --device "$DEVICE" --out "$FLOOD_RESULT" ${FLOOD_ARGS:-} 2>&1 | tee "$OUT/service_flood_$STAMP.log"
flood_rc=${PIPESTATUS[0]}
[[ $flood_rc -eq 0 ]] && echo "== result: $FLOOD_RESULT"
set -e
stop_server
[[ $rc -eq 0 ]] || exit "$rc"
exit "$flood_rc"
