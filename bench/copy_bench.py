#!/usr/bin/env python3
"""COPY of TPC-H lineitem from and to a Parquet file against DuckDB.

    python3 bench/copy_bench.py [--scale 1] [--buckets 8] [--bin PATH]

Generates TPC-H's lineitem (bench/tpch.py's data, once into ~/.cache/nyala-tpch), starts a fresh
`nyala serve` (release build: --bin, default $NYALA_BIN, else $CARGO_TARGET_DIR/release/nyala),
creates lineitem as bench/tpch.py does (its primary key, hash-partitioned) and, over ADBC Flight
SQL, times `COPY lineitem FROM '<lineitem.parquet>'`, then `COPY lineitem TO '<file>.parquet'`.
The baseline, same run: DuckDB's `INSERT INTO lineitem SELECT * FROM read_parquet(...)` into a
table of the same columns and primary key in a DuckDB database file, and its `COPY lineitem TO
'<file>.parquet'`. Both loads are checked (row count and a checksum).

Targets (for reference, never asserted): COPY FROM >= 1 M rows/s and >= 0.5x DuckDB's speed.
Writes bench/results/copy.json (--json) for docs/benchmarks.md.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import add_binary_argument, query, start_server, stop_server  # noqa: E402
from results import Report, add_json_argument, load_average  # noqa: E402
from tpch import PRIMARY_KEYS, create_table_sql, generate_data  # noqa: E402

CHECK = "SELECT count(*), CAST(sum(l_orderkey * 7 + l_linenumber) AS BIGINT) FROM lineitem"


def log(msg=""):
    print(msg, flush=True)


def update(cur, sql):
    """Runs `sql` as an update; (seconds, rows)."""
    started = time.perf_counter()
    cur.adbc_statement.set_sql_query(sql)
    rows = cur.adbc_statement.execute_update()
    return time.perf_counter() - started, rows


def duckdb_baseline(parquet, columns_sql, work):
    """(load seconds, write seconds, checksum) of DuckDB on the same file."""
    import duckdb
    con = duckdb.connect(os.path.join(work, "duck.db"))
    con.execute(f"CREATE TABLE lineitem ({columns_sql})")
    started = time.perf_counter()
    con.execute(f"INSERT INTO lineitem SELECT * FROM read_parquet('{parquet}')")
    load_secs = time.perf_counter() - started
    check = tuple(con.execute(CHECK).fetchone())
    started = time.perf_counter()
    con.execute(f"COPY lineitem TO '{os.path.join(work, 'duck-out.parquet')}' (FORMAT parquet)")
    write_secs = time.perf_counter() - started
    con.close()
    return load_secs, write_secs, check


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--buckets", type=int, default=8)
    add_binary_argument(parser)
    add_json_argument(parser, "copy")
    args = parser.parse_args()
    load_at_start = load_average()
    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow.parquet as pq
    parquet = generate_data(args.scale)["lineitem"]
    create = create_table_sql("lineitem", pq.ParquetFile(parquet).schema_arrow, args.buckets)
    work = tempfile.mkdtemp(prefix="nyala-copy-bench.")
    proc = None
    try:
        proc, uri, _ = start_server(args.bin, work)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(create)
            load_secs, rows = update(cur, f"COPY lineitem FROM '{parquet}'")
            log(f"COPY lineitem FROM parquet: {rows:,} rows in {load_secs:.2f} s, "
                f"{rows / load_secs:,.0f} rows/s")
            check = tuple(query(cur, CHECK)[0])
            out = os.path.join(work, "nyala-out.parquet")
            write_secs, written = update(cur, f"COPY lineitem TO '{out}'")
            log(f"COPY lineitem TO parquet: {written:,} rows in {write_secs:.2f} s")
        stop_server(proc, work)
        proc = None
        # DuckDB's table: the same columns and primary key.
        columns_sql = create[create.index("(") + 1:create.rindex("PRIMARY KEY")]
        columns_sql += f"PRIMARY KEY ({', '.join(PRIMARY_KEYS['lineitem'])})"
        duck_load, duck_write, duck_check = duckdb_baseline(parquet, columns_sql, work)
        if duck_check != check:
            raise SystemExit(f"the loads differ: Nyala {check}, DuckDB {duck_check}")
        log(f"DuckDB INSERT INTO ... SELECT * FROM read_parquet: {duck_load:.2f} s; "
            f"COPY TO: {duck_write:.2f} s")
        log(f"COPY FROM: {duck_load / load_secs:.2f}x DuckDB's speed")
    finally:
        if proc is not None:
            stop_server(proc, work)
        shutil.rmtree(work, ignore_errors=True)

    import duckdb
    report = Report(
        "copy", f"COPY of TPC-H SF {args.scale:g} lineitem ({rows:,} rows) from and to Parquet",
        baseline=f"DuckDB {duckdb.__version__}: INSERT INTO lineitem SELECT * FROM "
                 "read_parquet(...) into a table with the same primary key in a database file, "
                 "and COPY lineitem TO (FORMAT parquet), same run",
        load_at_start=load_at_start)
    table = report.table("COPY lineitem", ["operation", "Nyala s", "DuckDB s",
                                           "Nyala rows/s", "DuckDB rows/s",
                                           "Nyala speed / DuckDB's"])
    for name, ours, theirs in (("FROM 'lineitem.parquet' (DuckDB: INSERT ... read_parquet)",
                                load_secs, duck_load),
                               ("TO 'out.parquet'", write_secs, duck_write)):
        table.append([name, round(ours, 2), round(theirs, 2), round(rows / ours),
                      round(rows / theirs), round(theirs / ours, 2)])
    report.note(f"One node, lineitem hash-partitioned into {args.buckets} buckets on l_orderkey "
                "(bench/tpch.py's table). Targets: COPY FROM >= 1 M rows/s and >= 0.5x "
                "DuckDB's speed. Both loads are checked (rows and a checksum).")
    report.write(args.json)


if __name__ == "__main__":
    main()
