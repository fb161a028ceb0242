#!/usr/bin/env python3
"""ALTER TABLE ADD / RENAME / DROP COLUMN on a large table, against DuckDB.

    python3 bench/alter_bench.py [--rows 10000000] [--bin PATH]

Writes a Parquet file of `--rows` rows (id BIGINT, v BIGINT, s STRING), starts a fresh
`nyala serve` (release build: --bin, default $NYALA_BIN, else $CARGO_TARGET_DIR/release/nyala),
creates `t (id BIGINT PRIMARY KEY, v BIGINT, s STRING)` hash-partitioned into 4 buckets, loads
the file with COPY and restarts the server, so that every row is in DiskRowSets. Then, over ADBC
Flight SQL, it times `ALTER TABLE t ADD COLUMN w BIGINT DEFAULT 7`, `RENAME COLUMN v TO v2` and
`DROP COLUMN s`, lists the tablets' data files (names, sizes, modification times) before and
after (a schema change must write none), and checks the rows (`sum(w)` is 7 per row). The
baseline, same run: DuckDB with the same rows in a database file, the same statements.

Target (for reference, never asserted): ADD COLUMN <= 0.2 s on 10 M rows, no data file written.
Writes bench/results/alter.json (--json) for docs/benchmarks.md.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import (  # noqa: E402
    add_binary_argument, execute_update, query, restart_server, start_server, stop_server)
from results import Report, add_json_argument, load_average  # noqa: E402

STATEMENTS = [
    ("ADD COLUMN", "ALTER TABLE t ADD COLUMN w BIGINT DEFAULT 7"),
    ("RENAME COLUMN", "ALTER TABLE t RENAME COLUMN v TO v2"),
    ("DROP COLUMN", "ALTER TABLE t DROP COLUMN s"),
]
CHECK = "SELECT count(*), sum(w), sum(v2) FROM t"


def log(msg=""):
    print(msg, flush=True)


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    chunk = 1_000_000
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            ids = pa.array(range(start, min(rows, start + chunk)), pa.int64())
            v = pc.multiply(pc.bit_wise_and(ids, 1023), 3)
            s = pc.binary_join_element_wise("s-", pc.cast(pc.bit_wise_and(ids, 4095), pa.string()),
                                            "")
            writer.write_table(pa.table({"id": ids, "v": v, "s": s}, schema=schema))


def data_files(data_dir):
    """{path: (size, mtime)} of the tablets' rowset, column and delta files."""
    found = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            if name.endswith(".parquet"):
                path = os.path.join(root, name)
                st = os.stat(path)
                found[path] = (st.st_size, st.st_mtime_ns)
    return found


def timed_update(cur, sql):
    started = time.perf_counter()
    execute_update(cur, sql)
    return time.perf_counter() - started


def duckdb_baseline(parquet, work):
    import duckdb
    con = duckdb.connect(os.path.join(work, "duck.db"))
    con.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT, s VARCHAR)")
    con.execute(f"INSERT INTO t SELECT * FROM read_parquet('{parquet}')")
    con.execute("CHECKPOINT")
    times = {}
    for name, sql in STATEMENTS:
        started = time.perf_counter()
        con.execute(sql)
        times[name] = time.perf_counter() - started
    check = tuple(int(x) for x in con.execute(CHECK).fetchone())
    con.close()
    return times, check


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    add_binary_argument(parser)
    add_json_argument(parser, "alter")
    args = parser.parse_args()
    load_at_start = load_average()
    import adbc_driver_flightsql.dbapi as flightsql
    import duckdb
    work = tempfile.mkdtemp(prefix="nyala-alter-bench.")
    parquet = os.path.join(work, "t.parquet")
    proc = None
    ours = {}
    try:
        write_parquet(parquet, args.rows)
        log(f"{args.rows:,} rows written to {parquet}")
        proc, uri, data = start_server(args.bin, work)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT, s STRING) "
                        "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
            load = timed_update(cur, f"COPY t FROM '{parquet}'")
            log(f"loaded in {load:.1f} s")
        proc, uri, data = restart_server(proc, args.bin, work)
        before = data_files(data)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            for name, sql in STATEMENTS:
                ours[name] = timed_update(cur, sql)
                log(f"Nyala  {name}: {ours[name] * 1000:.0f} ms")
            after = data_files(data)
            check = tuple(int(x) for x in query(cur, CHECK)[0])
        rewritten = sum(1 for path, stat in before.items() if after.get(path) != stat)
        written = sum(1 for path in after if path not in before)
        log(f"data files: {len(before)} before, {rewritten} rewritten or removed, "
            f"{written} written")
        stop_server(proc, work)
        proc = None
        theirs, duck_check = duckdb_baseline(parquet, work)
        for name, _ in STATEMENTS:
            log(f"DuckDB {name}: {theirs[name] * 1000:.0f} ms")
        if check != duck_check:
            raise SystemExit(f"the tables differ: Nyala {check}, DuckDB {duck_check}")
    finally:
        if proc is not None:
            stop_server(proc, work)
        shutil.rmtree(work, ignore_errors=True)

    report = Report(
        "alter", f"ALTER TABLE on {args.rows:,} rows",
        baseline=f"DuckDB {duckdb.__version__}: the same rows in a database file (checkpointed), "
                 "the same statements, same run",
        load_at_start=load_at_start)
    table = report.table("Schema changes", ["statement", "Nyala ms", "DuckDB ms"])
    for name, sql in STATEMENTS:
        table.append([sql, round(ours[name] * 1000, 1), round(theirs[name] * 1000, 1)])
    files = report.table("Data files of the tablets", ["before", "rewritten or removed",
                                                       "written"])
    files.append([len(before), rewritten, written])
    report.note("One node; t (id BIGINT PRIMARY KEY, v BIGINT, s STRING) hash-partitioned into "
                "4 buckets, loaded by COPY and flushed to DiskRowSets (a restart) before the "
                "changes; each statement over ADBC Flight SQL. The rows are checked against "
                "DuckDB's after the changes. Target: ADD COLUMN <= 0.2 s on 10 M rows, no data "
                "file written.")
    report.write(args.json)


if __name__ == "__main__":
    main()
