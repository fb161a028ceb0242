#!/usr/bin/env python3
"""Primary-key lookups as a Python user makes them: ADBC's DB-API, rows in memory and on disk.

    python3 bench/adbc_lookups.py [--rows 10000] [--lookups 3000] [--keys 1000]

Starts its own `nyala serve` (release binary: $NYALA_BIN, default
$CARGO_TARGET_DIR/release/nyala, CARGO_TARGET_DIR defaulting to ~/.cache/nyala-target) on a fresh
temporary data directory, loads --rows YCSB-like rows (a STRING key and 10 STRING fields of 100
bytes, 8 hash buckets) with one bulk ingest, then runs --lookups

    cursor.execute("SELECT * FROM usertable WHERE ycsb_key = ?", (key,)); cursor.fetchall()

on one connection, keys drawn uniformly from --keys of the loaded ones (fixed seed), three times:

1. rows in memory (the MemRowSet), right after the load;
2. rows on disk, after the server flushed the idle table (it does after 30 s without writes):
   each lookup reads the data page holding its row per column, which the page cache then
   keeps, so later lookups of rows in the same pages find them decoded (a small table is
   soon all cached; with --rows beyond what the 256 MB cache holds, about 200 000, most
   lookups read their pages);
3. rows on disk again, the same keys.

The DB-API cursor runs statements in a transaction (autocommit is off by default), prepares the
statement once and binds each key with a DoPut, then GetFlightInfo and DoGet. Prints the client's
p50/p99 per lookup and the server's mean time per call of each Flight method (its
`nyala_rpc_duration_seconds` metric), with the ratio of each phase to the first. Timings are
never asserted; the exit code is non-zero only if a lookup returns other than one row. Writes
the run's results to bench/results/adbc_lookups.json (--json) for docs/benchmarks.md. Needs pyarrow and adbc-driver-flightsql (tests/python/requirements.txt).
"""
import argparse
import os
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from queue_bench import Processes  # noqa: E402
from results import Report, add_json_argument  # noqa: E402

FIELDS = 10
FIELD_BYTES = 100
METHODS = ("DoPut", "GetFlightInfo", "DoGet")


def rpc_totals(http):
    """{method: (calls, seconds)} of the server's Flight methods so far."""
    text = urllib.request.urlopen(f"{http}/metrics", timeout=10).read().decode()
    totals = {}
    for m in re.finditer(r'nyala_rpc_duration_seconds_(sum|count)\{service="FlightService",'
                         r'method="(\w+)"\} (\S+)', text):
        kind, method, value = m.groups()
        calls, seconds = totals.get(method, (0.0, 0.0))
        totals[method] = (float(value), seconds) if kind == "count" else (calls, float(value))
    return totals


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def lookups(cur, http, keys):
    """Runs the lookups; returns (client latencies in s, {method: mean µs per call})."""
    before = rpc_totals(http)
    latencies = []
    for key in keys:
        start = time.perf_counter()
        cur.execute("SELECT * FROM usertable WHERE ycsb_key = ?", (key,))
        rows = cur.fetchall()
        latencies.append(time.perf_counter() - start)
        if len(rows) != 1:
            raise SystemExit(f"lookup of {key} returned {len(rows)} rows")
    after = rpc_totals(http)
    means = {}
    for method in METHODS:
        calls = after.get(method, (0, 0))[0] - before.get(method, (0, 0))[0]
        seconds = after.get(method, (0, 0))[1] - before.get(method, (0, 0))[1]
        means[method] = seconds / calls * 1e6 if calls else float("nan")
    return latencies, means


def results_report(args, phases, load_at_start=None):
    """The run as bench/results/adbc_lookups.json holds it (see bench/results.py); `phases`:
    [(name, (client latencies in s, {method: mean µs per call}))]."""
    report = Report("adbc_lookups",
                    f"Primary-key lookups through ADBC's DB-API: {args.rows} rows of "
                    f"{FIELDS} x {FIELD_BYTES}-byte STRING fields, {args.lookups} lookups over "
                    f"{args.keys} keys on one connection",
                    baseline="the first phase (rows in memory) of the same run",
                    load_at_start=load_at_start)
    rows = report.table("Client latency per lookup (execute + fetchall) and the server's mean "
                        "time per call",
                        ["rows", "p50 ms", "p99 ms", "p50 / in memory"]
                        + [f"{m} µs" for m in METHODS])
    base = pct(phases[0][1][0], 0.5)
    for name, (latencies, means) in phases:
        p50 = pct(latencies, 0.5)
        rows.append([name, round(p50 * 1e3, 3), round(pct(latencies, 0.99) * 1e3, 3),
                     round(p50 / base, 2)] + [round(means[m], 1) for m in METHODS])
    report.note("Target (prepared primary-key lookup through Flight SQL, loopback, warm): "
                "p50 at most 0.3 ms, p99 at most 2 ms.")
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--lookups", type=int, default=3_000)
    p.add_argument("--keys", type=int, default=1_000)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/nyala-target"))
    p.add_argument("--nyala", default=os.environ.get("NYALA_BIN",
                                                     os.path.join(target, "release", "nyala")))
    add_json_argument(p, "adbc_lookups")
    args = p.parse_args()
    load_at_start = os.getloadavg()[0]

    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow as pa

    work = tempfile.mkdtemp(prefix="nyala-lookups.")
    procs = Processes(args.nyala, work)
    try:
        m = procs.start("nyala", ["serve", "--data-dir", os.path.join(work, "data"),
                                  "--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
                        r"Nyala listening on (grpc://\S+) and (http://\S+)")
        uri, http = m.group(1), m.group(2)
        conn = flightsql.connect(uri)
        cur = conn.cursor()
        fields = ", ".join(f"field{i} STRING" for i in range(FIELDS))
        cur.execute(f"CREATE TABLE usertable (ycsb_key STRING, {fields}, PRIMARY KEY (ycsb_key)) "
                    f"DISTRIBUTE BY HASH (ycsb_key) INTO 8 BUCKETS")
        conn.commit()
        rng = random.Random(7)
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        columns = {"ycsb_key": [f"user{i}" for i in range(args.rows)]}
        for f in range(FIELDS):
            columns[f"field{f}"] = ["".join(rng.choices(alphabet, k=FIELD_BYTES))
                                    for _ in range(args.rows)]
        cur.adbc_ingest("usertable", pa.table(columns), mode="append")
        conn.commit()
        keys = [f"user{rng.randrange(min(args.keys, args.rows))}" for _ in range(args.lookups)]
        print(f"ADBC DB-API lookups of rows of {FIELDS} x {FIELD_BYTES}-byte STRING fields: "
              f"{args.rows} rows, {args.lookups} lookups over {args.keys} keys, one connection")
        phases = [("in memory", lookups(cur, http, keys))]
        conn.commit()
        deadline = time.monotonic() + 120
        while True:
            cur.execute("SELECT sum(memory_bytes) FROM sys.partitions "
                        "WHERE table_name = 'usertable'")
            unflushed = cur.fetchall()[0][0]
            conn.commit()
            if not unflushed:
                break
            if time.monotonic() > deadline:
                raise SystemExit("the table was not flushed within 120 s")
            time.sleep(1)
        phases.append(("on disk", lookups(cur, http, keys)))
        phases.append(("on disk, again", lookups(cur, http, keys)))
        conn.close()

        head = f"{'rows':<24}{'p50 ms':>9}{'p99 ms':>9}{'ratio':>7}" + "".join(
            f"{m + ' µs':>18}" for m in METHODS)
        print(head)
        print("-" * len(head))
        base = pct(phases[0][1][0], 0.5)
        for name, (latencies, means) in phases:
            p50 = pct(latencies, 0.5)
            print(f"{name:<24}{p50 * 1e3:>9.3f}{pct(latencies, 0.99) * 1e3:>9.3f}"
                  f"{p50 / base:>6.2f}x" + "".join(f"{means[m]:>18.1f}" for m in METHODS))
        print("client p50/p99 per lookup (execute + fetchall); server: mean time per call")
        results_report(args, phases, load_at_start).write(args.json)
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
