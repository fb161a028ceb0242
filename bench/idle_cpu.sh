#!/usr/bin/env bash
# Idle CPU of `nyala serve`: how much of one core a server uses with no client connected.
#
# Starts a server on a fresh data directory, creates TABLES tables of BUCKETS hash buckets each
# (100 tablets by default) with a few rows in every table, disconnects, lets it settle for
# SETTLE seconds, then reads the process's utime+stime from /proc/<pid>/stat before and after
# MEASURE seconds. Also prints the thread count and the context switches per second of all its
# threads (about how often something in it wakes up).
#
# Usage: bench/idle_cpu.sh [path/to/nyala]
#   default binary: $CARGO_TARGET_DIR/release/nyala (built if missing; a first release build
#   is slow); pass $CARGO_TARGET_DIR/debug/nyala to measure a debug build.
#   Environment: TABLES (10), BUCKETS (10), ROWS per table (20), SETTLE (30 s), MEASURE (60 s).
set -euo pipefail

target=${CARGO_TARGET_DIR:-$HOME/.cache/nyala-target}
bin=${1:-$target/release/nyala}
tables=${TABLES:-10}
buckets=${BUCKETS:-10}
rows=${ROWS:-20}
settle=${SETTLE:-30}
measure=${MEASURE:-60}

if [[ ! -x $bin ]]; then
    if [[ $# -gt 0 ]]; then
        echo "no executable at $bin" >&2
        exit 1
    fi
    echo "building $bin (cargo build --release -p nyala-flight --bin nyala)" >&2
    (cd "$(dirname "$0")/.." && CARGO_TARGET_DIR=$target cargo build --release -p nyala-flight --bin nyala)
fi

work=$(mktemp -d)
pid=
cleanup() {
    if [[ -n $pid ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# Port 0: the server picks a free port and says which on its first line.
"$bin" serve --data-dir "$work/data" --listen 127.0.0.1:0 >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 1 600); do
    grep -q "listening on" "$work/out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/err" >&2; exit 1; }
    sleep 0.1
done
url=$(grep -o 'grpc://[0-9.:]*' "$work/out" | head -1)
[[ -n $url ]] || { echo "the server did not start" >&2; cat "$work/err" >&2; exit 1; }

script=""
for t in $(seq 1 "$tables"); do
    values=$(seq 1 "$rows" | sed "s/.*/(&, 'row &')/" | paste -sd, -)
    script+="CREATE TABLE t$t (k BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (k) INTO $buckets BUCKETS; "
    script+="INSERT INTO t$t VALUES $values; "
done
"$bin" sql --connect "$url" -c "$script" >/dev/null

# Fields after the command name (which may hold spaces): state is 3, utime 14, stime 15.
cpu_ticks() {
    local stat
    stat=$(<"/proc/$pid/stat")
    stat=${stat##*) }
    read -r -a f <<<"$stat"
    echo $((f[11] + f[12]))
}
switches() {
    cat /proc/"$pid"/task/*/status 2>/dev/null |
        awk '/^(non)?voluntary_ctxt_switches/ { n += $2 } END { print n + 0 }'
}

sleep "$settle"
hz=$(getconf CLK_TCK)
threads=$(awk '/^Threads/ { print $2 }' "/proc/$pid/status")
t0=$(date +%s.%N) c0=$(cpu_ticks) s0=$(switches)
sleep "$measure"
t1=$(date +%s.%N) c1=$(cpu_ticks) s1=$(switches)

awk -v c="$((c1 - c0))" -v s="$((s1 - s0))" -v t0="$t0" -v t1="$t1" -v hz="$hz" \
    -v bin="$bin" -v settle="$settle" -v n="$((tables * buckets))" -v th="$threads" 'BEGIN {
    e = t1 - t0
    printf "binary:            %s\n", bin
    printf "tablets:           %d (+ the catalog)\n", n
    printf "threads:           %d\n", th
    printf "measured:          %.1f s after %s s idle\n", e, settle
    printf "cpu:               %.3f %% of one core (%d ticks of 1/%d s)\n", 100 * c / hz / e, c, hz
    printf "context switches:  %.1f /s\n", s / e
}'
