#!/usr/bin/env python3
"""Scans of rows just written (in MemRowSets) against the same scans after a flush, and against
DataFusion reading the same rows from a Parquet file.

    python3 bench/fresh_scan.py [--rows 2000000] [--runs 3] [--bin PATH]

Starts a fresh `nyala serve` (release build: --bin, default $NYALA_BIN, else
$CARGO_TARGET_DIR/release/nyala), creates `t (id BIGINT PRIMARY KEY, g BIGINT, v BIGINT,
s STRING)` hash-partitioned into 4 buckets, and writes `--rows` rows through ADBC bulk ingest
(they stay in the tablets' MemRowSets: no flush happens within the run). It times three queries
(one warm-up, then the best of --runs, each fetching its result over Flight SQL): `sum(v)`, a
`GROUP BY g` count, and a count with `s LIKE '%-4999%'`. Then it restarts the server, which
flushes every row into DiskRowSets, and times them again. The baseline, same run: DataFusion
(Python) over a Parquet file of the same rows. Results are compared.

Targets (issue 54, never asserted): fresh scans <= 1.2x the flushed ones, both <= 1.0x DataFusion
(geomean of the three queries). Writes bench/results/fresh_scan.json (--json).
"""
import argparse
import math
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import (  # noqa: E402
    add_binary_argument, best, query, restart_server, start_server, stop_server)
from results import Report, add_json_argument  # noqa: E402

QUERIES = [
    ("sum", "SELECT sum(v) FROM t"),
    ("group by", "SELECT g, count(*) FROM t GROUP BY g ORDER BY g"),
    ("like", "SELECT count(*) FROM t WHERE s LIKE '%-4999%'"),
]


def log(msg=""):
    print(msg, flush=True)


def rows_table(rows):
    import pyarrow as pa
    import pyarrow.compute as pc
    ids = pa.array(range(rows), pa.int64())
    return pa.table({
        "id": ids,
        "g": pc.bit_wise_and(ids, 1023),
        "v": pc.multiply(pc.bit_wise_and(ids, 255), 3),
        "s": pc.binary_join_element_wise("s-", pc.cast(pc.bit_wise_and(ids, 16383), pa.string()),
                                         ""),
    })


def nyala_times(uri, runs):
    import adbc_driver_flightsql.dbapi as flightsql
    out = {}
    with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        memory = query(cur, "SELECT coalesce(sum(memory_bytes), 0) FROM sys.partitions "
                            "WHERE table_name = 't'")[0][0]
        for name, sql in QUERIES:
            out[name] = best(lambda: [tuple(r) for r in query(cur, sql)], runs, warm_up=True)
    return out, memory


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_argument(parser)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    add_json_argument(parser, "fresh_scan")
    args = parser.parse_args()
    import adbc_driver_flightsql.dbapi as flightsql
    import datafusion
    import pyarrow.parquet as pq

    report = Report("fresh_scan",
                    f"Scans of {args.rows:,} rows just written against the same after a flush",
                    baseline="DataFusion (Python) over a Parquet file of the same rows, same run")
    work = tempfile.mkdtemp(prefix="nyala-fresh-scan.")
    proc = None
    try:
        table = rows_table(args.rows)
        parquet = os.path.join(work, "t.parquet")
        pq.write_table(table, parquet)
        proc, uri, _ = start_server(args.bin, work)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, v BIGINT, s STRING) "
                        "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
            cur.fetchall()
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            t = time.perf_counter()
            import pyarrow as pa
            batches = table.to_batches(max_chunksize=65536)
            cur.adbc_ingest("t", pa.RecordBatchReader.from_batches(table.schema, batches),
                            mode="append")
            log(f"{args.rows:,} rows ingested in {time.perf_counter() - t:.1f} s")
        fresh, fresh_memory = nyala_times(uri, args.runs)
        log(f"fresh: {fresh_memory / 2**20:.1f} MiB in MemRowSets")
        proc, uri, _ = restart_server(proc, args.bin, work)
        flushed, flushed_memory = nyala_times(uri, args.runs)
        log(f"flushed: {flushed_memory / 2**20:.1f} MiB in MemRowSets")
        stop_server(proc, work)
        proc = None
        ctx = datafusion.SessionContext()
        ctx.register_parquet("t", parquet)
        theirs = {name: best(lambda: [tuple(r.values()) for r in ctx.sql(sql).to_pylist()],
                             args.runs, warm_up=True)
                  for name, sql in QUERIES}
    finally:
        if proc is not None:
            stop_server(proc, work)
        shutil.rmtree(work, ignore_errors=True)

    rows = report.table("Best of the runs, seconds",
                        ["query", "fresh", "flushed", "DataFusion", "fresh / flushed",
                         "fresh / DataFusion", "flushed / DataFusion", "results"])
    ratios = {"ff": [], "fd": [], "ld": []}
    for name, _ in QUERIES:
        (f, fr), (l, lr), (d, dr) = fresh[name], flushed[name], theirs[name]
        same = "agree" if [tuple(float(x) for x in r) for r in fr] == \
            [tuple(float(x) for x in r) for r in lr] == \
            [tuple(float(x) for x in r) for r in dr] else "DIFFER"
        ratios["ff"].append(f / l)
        ratios["fd"].append(f / d)
        ratios["ld"].append(l / d)
        rows.append([name, round(f, 4), round(l, 4), round(d, 4), round(f / l, 2),
                     round(f / d, 2), round(l / d, 2), same])
        log(f"{name:<9} fresh {f:.4f} s  flushed {l:.4f} s  DataFusion {d:.4f} s  "
            f"{f / l:.2f}x flushed  {f / d:.2f}x DataFusion  {l / d:.2f}x (flushed)  {same}")
    geo = [round(geomean(ratios[k]), 2) for k in ("ff", "fd", "ld")]
    rows.append(["geomean", None, None, None, *geo, None])
    log(f"geomean: fresh {geo[0]}x flushed, fresh {geo[1]}x DataFusion, flushed {geo[2]}x "
        f"DataFusion")
    report.note("targets: fresh <= 1.2x flushed; both <= 1.0x DataFusion (geomeans)")
    report.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
