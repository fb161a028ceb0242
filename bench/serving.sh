#!/usr/bin/env bash
# End-to-end serving benchmark: Nyala (`nyala serve`, an embedded single node) against a scratch
# PostgreSQL 15 cluster, both on loopback on this machine, measured in one run by
# flight-server/examples/serving_bench.rs (see its opening comment for what it measures).
#
#   bench/serving.sh [--rows N] [--threads N] [--seconds N] [--iterations N]
#
# Arguments go to serving_bench. Builds release into $CARGO_TARGET_DIR (default
# ~/.cache/nyala-target); SERVING_BENCH_PROFILE=debug builds and runs debug binaries instead (quick
# checks only: the numbers mean nothing). SERVING_FLOOR=1 then runs the same tests once more with
# flight_sql_floor (a Flight SQL server doing no work) in Nyala's place: the floor that the
# protocol, the client and the machine put under any Flight SQL server's figures. PostgreSQL runs as the `postgres` OS user, so this needs
# root (or to run as postgres); PG_BIN overrides /usr/lib/postgresql/15/bin. Both servers and their
# temporary directories are removed on exit, also after an error or Ctrl-C. Each run writes its
# results for docs/benchmarks.md (bench/render.py) to bench/results/: serving.json (Flight SQL),
# serving_pg.json (Nyala's PostgreSQL protocol) and serving_floor.json.
set -euo pipefail

cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/nyala-target}"
profile="${SERVING_BENCH_PROFILE:-release}"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"

as_postgres() {
  if [ "$(id -un)" = postgres ]; then
    "$@"
  elif [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    sudo -u postgres -- "$@"
  fi
}

if [ ! -x "$PG_BIN/pg_ctl" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "serving.sh: installing postgresql-15"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null
fi
if [ ! -x "$PG_BIN/pg_ctl" ]; then
  echo "serving.sh: no PostgreSQL 15 server binaries in $PG_BIN (install postgresql-15 or set PG_BIN)" >&2
  exit 1
fi

if [ "$profile" = release ]; then
  cargo build --release -p nyala-flight --bin nyala --example serving_bench --example flight_sql_floor
else
  cargo build -p nyala-flight --bin nyala --example serving_bench --example flight_sql_floor
fi
bin="$CARGO_TARGET_DIR/$profile"

work="$(mktemp -d "${TMPDIR:-/tmp}/nyala-serving.XXXXXX")"
chmod 755 "$work"  # PostgreSQL, running as postgres, keeps its files below it
pg_dir="$work/postgres"
nyala_pid=""
floor_pid=""

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "$nyala_pid" "$floor_pid"; do
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -f "$pg_dir/data/postmaster.pid" ]; then
    as_postgres "$PG_BIN/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ "$status" != 0 ]; then
    for log in "$work/nyala.log" "$pg_dir/server.log"; do
      [ -s "$log" ] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
    done
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nothing listens on now (bash connects to it through /dev/tcp to find out).
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (: </dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "serving.sh: no free port found" >&2
  return 1
}

# Nyala: port 0 lets the OS choose; the server prints grpc://ADDRESS once it listens, and then
# where its PostgreSQL protocol listens.
"$bin/nyala" serve --data-dir "$work/nyala" --listen 127.0.0.1:0 --http-addr 127.0.0.1:0 \
  --pg-addr 127.0.0.1:0 >"$work/nyala.log" 2>&1 &
nyala_pid=$!
nyala_addr=""
for _ in $(seq 1200); do
  nyala_addr="$(grep -o -m1 'grpc://127\.0\.0\.1:[0-9]*' "$work/nyala.log" || true)"
  [ -n "$nyala_addr" ] && break
  if ! kill -0 "$nyala_pid" 2>/dev/null; then
    echo "serving.sh: nyala serve exited before listening" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$nyala_addr" ]; then
  echo "serving.sh: nyala serve did not announce an address within 120 s" >&2
  exit 1
fi

# PostgreSQL 15: a scratch cluster with initdb's defaults (fsync and synchronous_commit on),
# trust authentication, listening on loopback only.
mkdir "$pg_dir"
[ "$(id -u)" = 0 ] && chown postgres: "$pg_dir"
as_postgres "$PG_BIN/initdb" -D "$pg_dir/data" -U postgres -A trust >"$work/initdb.log" 2>&1 || {
  cat "$work/initdb.log" >&2
  exit 1
}
pg_port="$(free_port)"
as_postgres "$PG_BIN/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_dir" start >/dev/null

echo "Nyala: nyala serve ($profile build) at $nyala_addr, data in a fresh temporary directory"
echo "PostgreSQL: $("$PG_BIN/postgres" --version), scratch cluster at 127.0.0.1:$pg_port, initdb defaults" \
  "(fsync on, synchronous_commit on), trust authentication"
results="$PWD/bench/results"
command="bench/serving.sh${*:+ $*}"
"$bin/examples/serving_bench" --nyala "$nyala_addr" \
  --postgres "host=127.0.0.1 port=$pg_port user=postgres dbname=postgres" \
  --json "$results/serving.json" --json-name serving --json-command "$command" "$@"

# The same tests through Nyala's PostgreSQL protocol, with the client PostgreSQL gets.
nyala_pg="$(grep -o -m1 'PostgreSQL protocol listening on 127\.0\.0\.1:[0-9]*' "$work/nyala.log" | grep -o '[0-9]*$')"
echo
echo "Nyala through its PostgreSQL protocol at 127.0.0.1:$nyala_pg"
"$bin/examples/serving_bench" --nyala-protocol postgres \
  --nyala "host=127.0.0.1 port=$nyala_pg user=nyala dbname=nyala" \
  --postgres "host=127.0.0.1 port=$pg_port user=postgres dbname=postgres" \
  --json "$results/serving_pg.json" --json-name serving_pg --json-command "$command" "$@"

if [ "${SERVING_FLOOR:-0}" = 1 ]; then
  kill "$nyala_pid" && wait "$nyala_pid" 2>/dev/null || true  # its CPU to the floor's run
  nyala_pid=""
  "$bin/examples/flight_sql_floor" --listen 127.0.0.1:0 >"$work/floor.log" 2>&1 &
  floor_pid=$!
  floor_addr=""
  for _ in $(seq 100); do
    floor_addr="$(grep -o -m1 'grpc://127\.0\.0\.1:[0-9]*' "$work/floor.log" || true)"
    [ -n "$floor_addr" ] && break
    sleep 0.1
  done
  [ -n "$floor_addr" ] || { echo "serving.sh: flight_sql_floor did not start" >&2; exit 1; }
  echo
  echo "The floor: flight_sql_floor (answers from memory, no database work) in Nyala's place"
  "$bin/examples/serving_bench" --nyala "$floor_addr" \
    --postgres "host=127.0.0.1 port=$pg_port user=postgres dbname=postgres" \
    --json "$results/serving_floor.json" --json-name serving_floor \
    --json-command "SERVING_FLOOR=1 $command" "$@"
fi
