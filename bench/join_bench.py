#!/usr/bin/env python3
"""Runtime filters: a big table joined with a few keys, with the filters off, min/max only, and
min/max plus bloom, against a full scan of the same columns; after the bloom-filter post
(`kudu-bloom-filter-predicate.txt`) at this machine's scale.

    python3 bench/join_bench.py [--rows 3000000] [--runs 5] [--bin PATH]

Starts a fresh `nyala serve` (release build: --bin, default $NYALA_BIN, else
$CARGO_TARGET_DIR/release/nyala) and loads, through ADBC bulk ingest:

    big (id BIGINT PRIMARY KEY, g BIGINT, v BIGINT, payload STRING), hash-partitioned into
        20 buckets: --rows rows, g = id % 100 000;
    small (id BIGINT PRIMARY KEY, w BIGINT): the lowest and the highest 1 000 ids of big, so
        that its min/max covers all of big and only the bloom filter (or the keys themselves)
        can leave rows out;
    groups95 (g BIGINT PRIMARY KEY): 95 % of big's g values, a join that keeps most rows.

Then it times, over Flight SQL (one warm-up, best of --runs), first with big's rows just
written (in MemRowSets), then again after a restart has flushed them into DiskRowSets:

- the full scan `SELECT count(*), sum(v) FROM big`, for scale;
- `SELECT count(*), sum(b.v) FROM big b JOIN small s ON b.id = s.id` with
  `SET nyala.runtime_filters` = off, minmax and bloom;
- the same with all of big's columns returned;
- `... JOIN groups95 s ON b.g = s.g` (the bloom filter removes 5 %, under its 10 % bar, and
  switches itself off), off and bloom.

Targets (issue 54, never asserted): the join with bloom <= 0.5x the full scan and >= 3x faster
than with min/max only; the low-selectivity join with bloom <= 1.05x its time with filters off.
Every mode's results must agree (FAILED and a non-zero exit code otherwise). Writes
bench/results/join.json (--json).
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import (  # noqa: E402
    add_binary_argument, best, execute_update, query, restart_server, start_server, stop_server)
from results import Report, add_json_argument  # noqa: E402

GROUPS = 100_000
SCAN = "SELECT count(*), sum(v) FROM big"
JOINS = [
    ("join, count and sum", "SELECT count(*), sum(b.v) FROM big b JOIN small s ON b.id = s.id",
     ("off", "minmax", "bloom")),
    ("join, all columns", "SELECT b.* FROM big b JOIN small s ON b.id = s.id ORDER BY b.id",
     ("off", "minmax", "bloom")),
    ("low-selectivity join",
     "SELECT count(*), sum(b.v) FROM big b JOIN groups95 s ON b.g = s.g", ("off", "bloom")),
]


def log(msg=""):
    print(msg, flush=True)


def big_batches(rows, chunk=262_144):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    for start in range(0, rows, chunk):
        ids = np.arange(start, min(rows, start + chunk), dtype=np.int64)
        yield pa.record_batch({
            "id": pa.array(ids),
            "g": pa.array(ids % GROUPS),
            "v": pa.array(ids * 3),
            "payload": pc.binary_join_element_wise("event-", pc.cast(pa.array(ids), pa.string()),
                                                   ""),
        })


def load(uri, rows):
    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow as pa
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        execute_update(cur, "CREATE TABLE big (id BIGINT PRIMARY KEY, g BIGINT, v BIGINT, "
                            "payload STRING) DISTRIBUTE BY HASH (id) INTO 20 BUCKETS")
        execute_update(cur, "CREATE TABLE small (id BIGINT PRIMARY KEY, w BIGINT)")
        execute_update(cur, "CREATE TABLE groups95 (g BIGINT PRIMARY KEY)")
        batches = list(big_batches(rows))
        started = time.perf_counter()
        cur.adbc_ingest("big", pa.RecordBatchReader.from_batches(batches[0].schema, batches),
                        mode="append")
        log(f"{rows:,} rows of big ingested in {time.perf_counter() - started:.1f} s")
        keys = list(range(1000)) + list(range(rows - 1000, rows))
        cur.adbc_ingest("small", pa.table({"id": pa.array(keys, pa.int64()),
                                           "w": pa.array(keys, pa.int64())}), mode="append")
        cur.adbc_ingest("groups95", pa.table({"g": pa.array(
            [g for g in range(GROUPS) if g % 20 != 0], pa.int64())}), mode="append")


def measure(uri, runs):
    """{name: seconds} of the scan and of each join in each mode, and {name: result}."""
    import adbc_driver_flightsql.dbapi as flightsql
    times, results = {}, {}
    # Settings go through a cursor of their own (the same session): the DB-API cursor that
    # runs the queries keeps its prepared statement only while it runs the same text.
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur, \
            conn.cursor() as settings:
        def run(sql):
            return best(lambda: [tuple(r) for r in query(cur, sql)], runs, warm_up=True)
        times["scan"], _ = run(SCAN)
        for name, sql, modes in JOINS:
            for mode in modes:
                execute_update(settings, f"SET nyala.runtime_filters = {mode}")
                times[(name, mode)], results[(name, mode)] = run(sql)
    return times, results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_argument(parser)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--runs", type=int, default=5)
    add_json_argument(parser, "join")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="nyala-join-bench.")
    proc = None
    measured = {}
    try:
        proc, uri, _ = start_server(args.bin, work)
        load(uri, args.rows)
        measured["fresh"] = measure(uri, args.runs)
        proc, uri, _ = restart_server(proc, args.bin, work)
        measured["flushed"] = measure(uri, args.runs)
    finally:
        if proc is not None:
            stop_server(proc, work)
        shutil.rmtree(work, ignore_errors=True)

    report = Report("join", f"Runtime filters: {args.rows:,} rows joined with 2 000 keys"
                    .replace(",", " "),
                    baseline="the same query with runtime filters off, and a full scan of the "
                             "same columns, same run")
    failed = 0
    for state in ("fresh", "flushed"):
        times, results = measured[state]
        scan = times["scan"]
        rows = report.table(f"Best of the runs, seconds: rows {state}",
                            ["query", "filters", "seconds", "/ full scan", "/ off",
                             "/ min-max only", "results"])
        rows.append(["full scan of big (count, sum of v)", None, round(scan, 4), 1.0, None,
                     None, None])
        log(f"\n{state}: full scan {scan:.4f} s")
        for name, _, modes in JOINS:
            off = times[(name, "off")]
            same = all(results[(name, m)] == results[(name, "off")] for m in modes)
            failed += not same
            for mode in modes:
                t = times[(name, mode)]
                minmax = times.get((name, "minmax"))
                rows.append([name, mode, round(t, 4), round(t / scan, 2), round(t / off, 2),
                             round(t / minmax, 2) if minmax else None,
                             "agree" if same else "DIFFER"])
                log(f"  {name:<22} {mode:>6} {t:.4f} s  {t / scan:.2f}x scan  {t / off:.2f}x off"
                    + (f"  {t / minmax:.2f}x minmax" if minmax else "")
                    + ("" if same else "  FAILED: results differ between modes"))
    report.note("Targets: the join with bloom at most 0.5x the full scan and at least 3x faster "
                "than with min/max only; the low-selectivity join with bloom at most 1.05x its "
                "time with filters off.")
    report.write(args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
