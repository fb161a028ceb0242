#!/usr/bin/env python3
"""COPY of TPC-H lineitem from and to a Parquet file, and its bulk ingest, against DuckDB.

    python3 bench/copy_bench.py [--scale 1] [--buckets 8] [--bin PATH] [--cluster]

Generates TPC-H's lineitem (bench/tpch.py's data, once into ~/.cache/nyala-tpch), starts a fresh
`nyala serve` (release build: --bin, default $NYALA_BIN, else $CARGO_TARGET_DIR/release/nyala),
creates lineitem as bench/tpch.py does (its primary key, hash-partitioned) and, over ADBC Flight
SQL, times `COPY lineitem FROM '<lineitem.parquet>'`, then `COPY lineitem TO '<file>.parquet'`,
then the ADBC bulk ingest (`adbc_ingest`, Flight SQL's CommandStatementIngest) of the same rows,
read into memory before the clock starts, in batches of --batch-rows, into a second such table.
The server's CPU time is measured for each load. The baseline, same run: DuckDB's `INSERT INTO
lineitem SELECT * FROM read_parquet(...)` into a table of the same columns and primary key in a
DuckDB database file, its `COPY lineitem TO '<file>.parquet'`, and its `INSERT INTO ... SELECT *
FROM` the same in-memory Arrow table into another such table. Every load is checked (row count
and a checksum).

With --cluster, the same on a master (the coordinator) and three tablet servers on this machine,
the tables WITH (replicas = 3); the server CPU is that of all four processes.

Targets (for reference, never asserted): COPY FROM and bulk ingest >= 1 M rows/s on one node and
>= 300 k rows/s with 3 replicas, COPY FROM >= 0.5x DuckDB's speed. Writes
bench/results/copy.json, or copy_cluster.json with --cluster (--json), for docs/benchmarks.md.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import add_binary_argument, query, start_server, stop_server  # noqa: E402
from results import (Report, add_json_argument, default_path, load_average,  # noqa: E402
                     process_cpu_seconds)
from queue_bench import Processes, create_retried, start_cluster  # noqa: E402
from tpch import PRIMARY_KEYS, create_table_sql, generate_data  # noqa: E402

REPLICAS = 3

CHECK = "SELECT count(*), CAST(sum(l_orderkey * 7 + l_linenumber) AS BIGINT) FROM {table}"


def log(msg=""):
    print(msg, flush=True)


def update(cur, sql):
    """Runs `sql` as an update; (seconds, rows)."""
    started = time.perf_counter()
    cur.adbc_statement.set_sql_query(sql)
    rows = cur.adbc_statement.execute_update()
    return time.perf_counter() - started, rows


def start(args, work):
    """The server (or, with --cluster, the cluster) to load into: (URI, the pids whose CPU time
    counts, a function that stops it)."""
    if not args.cluster:
        proc, uri, _ = start_server(args.bin, work)
        return uri, [proc.pid], lambda: stop_server(proc, work)
    procs = Processes(args.bin, work)
    try:
        uri = start_cluster(procs, types.SimpleNamespace(tservers=REPLICAS, memory_limit_mb=None))
    except BaseException:
        procs.stop(show_logs=True)
        raise
    return uri, [p.pid for _, p, _, _ in procs.procs], lambda: procs.stop(quiet=True)


def create_table(cur, sql, cluster, ready_secs=60):
    """Creates a table; in a cluster, with replicas, retried until the tablet servers have
    registered with the master."""
    if not cluster:
        cur.execute(sql)
        return
    create_retried(cur, f"{sql} WITH (replicas = {REPLICAS})", ready_secs)


def duckdb_baseline(parquet, arrow_rows, columns_sql, work):
    """(load seconds, write seconds, ingest seconds, checksums) of DuckDB on the same rows."""
    import duckdb
    con = duckdb.connect(os.path.join(work, "duck.db"))
    checks = []
    con.execute(f"CREATE TABLE lineitem ({columns_sql})")
    started = time.perf_counter()
    con.execute(f"INSERT INTO lineitem SELECT * FROM read_parquet('{parquet}')")
    load_secs = time.perf_counter() - started
    checks.append(tuple(con.execute(CHECK.format(table="lineitem")).fetchone()))
    started = time.perf_counter()
    con.execute(f"COPY lineitem TO '{os.path.join(work, 'duck-out.parquet')}' (FORMAT parquet)")
    write_secs = time.perf_counter() - started
    con.execute(f"CREATE TABLE ingested ({columns_sql})")
    con.register("arrow_rows", arrow_rows)
    started = time.perf_counter()
    con.execute("INSERT INTO ingested SELECT * FROM arrow_rows")
    ingest_secs = time.perf_counter() - started
    checks.append(tuple(con.execute(CHECK.format(table="ingested")).fetchone()))
    con.close()
    return load_secs, write_secs, ingest_secs, checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per ingest batch")
    parser.add_argument("--cluster", action="store_true",
                        help=f"a master and {REPLICAS} tablet servers, tables with {REPLICAS} "
                             "replicas")
    add_binary_argument(parser)
    add_json_argument(parser, None)
    args = parser.parse_args()
    name = "copy_cluster" if args.cluster else "copy"
    if args.json is None:
        args.json = default_path(name)
    load_at_start = load_average()
    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow as pa
    import pyarrow.parquet as pq
    parquet = generate_data(args.scale)["lineitem"]
    schema = pq.ParquetFile(parquet).schema_arrow
    create = create_table_sql("lineitem", schema, args.buckets)
    arrow_rows = pq.read_table(parquet)
    work = tempfile.mkdtemp(prefix="nyala-copy-bench.")
    stop = None
    try:
        uri, pids, stop = start(args, work)

        def cpu_now():
            return sum(process_cpu_seconds(pid) for pid in pids)

        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            create_table(cur, create, args.cluster)
            cpu = cpu_now()
            load_secs, rows = update(cur, f"COPY lineitem FROM '{parquet}'")
            load_cpu = cpu_now() - cpu
            log(f"COPY lineitem FROM parquet: {rows:,} rows in {load_secs:.2f} s, "
                f"{rows / load_secs:,.0f} rows/s, server CPU {load_cpu:.1f} s")
            checks = [tuple(query(cur, CHECK.format(table="lineitem"))[0])]
            out = os.path.join(work, "nyala-out.parquet")
            write_secs, written = update(cur, f"COPY lineitem TO '{out}'")
            log(f"COPY lineitem TO parquet: {written:,} rows in {write_secs:.2f} s")
            create_table(cur, create.replace("CREATE TABLE lineitem", "CREATE TABLE ingested", 1),
                         args.cluster)
            batches = arrow_rows.to_batches(max_chunksize=args.batch_rows)
            cpu = cpu_now()
            started = time.perf_counter()
            cur.adbc_ingest("ingested", pa.RecordBatchReader.from_batches(arrow_rows.schema,
                                                                           batches),
                            mode="append")
            ingest_secs = time.perf_counter() - started
            ingest_cpu = cpu_now() - cpu
            log(f"bulk ingest: {rows:,} rows in {ingest_secs:.2f} s, "
                f"{rows / ingest_secs:,.0f} rows/s, server CPU {ingest_cpu:.1f} s")
            checks.append(tuple(query(cur, CHECK.format(table="ingested"))[0]))
        stop()
        stop = None
        # DuckDB's table: the same columns and primary key.
        columns_sql = create[create.index("(") + 1:create.rindex("PRIMARY KEY")]
        columns_sql += f"PRIMARY KEY ({', '.join(PRIMARY_KEYS['lineitem'])})"
        duck_load, duck_write, duck_ingest, duck_checks = duckdb_baseline(
            parquet, arrow_rows, columns_sql, work)
        if duck_checks != checks:
            raise SystemExit(f"the loads differ: Nyala {checks}, DuckDB {duck_checks}")
        log(f"DuckDB INSERT INTO ... SELECT * FROM read_parquet: {duck_load:.2f} s; "
            f"COPY TO: {duck_write:.2f} s; INSERT INTO ... SELECT * FROM <Arrow table>: "
            f"{duck_ingest:.2f} s")
        log(f"COPY FROM: {duck_load / load_secs:.2f}x DuckDB's speed; bulk ingest: "
            f"{duck_ingest / ingest_secs:.2f}x")
    finally:
        if stop is not None:
            stop()
        shutil.rmtree(work, ignore_errors=True)

    import duckdb
    where = f"{REPLICAS} replicas" if args.cluster else "one node"
    report = Report(
        name, f"COPY of TPC-H SF {args.scale:g} lineitem ({rows:,} rows) from and to Parquet, "
              f"and its bulk ingest, {where}",
        baseline=f"DuckDB {duckdb.__version__}: INSERT INTO lineitem SELECT * FROM "
                 "read_parquet(...) into a table with the same primary key in a database file, "
                 "COPY lineitem TO (FORMAT parquet), and INSERT INTO ... SELECT * FROM the "
                 "in-memory Arrow table, same run",
        load_at_start=load_at_start)
    table = report.table("COPY lineitem and its bulk ingest",
                         ["operation", "Nyala s", "DuckDB s", "Nyala rows/s", "DuckDB rows/s",
                          "Nyala speed / DuckDB's", "Nyala server CPU s"])
    for name, ours, theirs, cpu in (
            ("COPY FROM 'lineitem.parquet' (DuckDB: INSERT ... read_parquet)",
             load_secs, duck_load, load_cpu),
            ("COPY TO 'out.parquet'", write_secs, duck_write, None),
            (f"ADBC bulk ingest, {args.batch_rows}-row batches (DuckDB: INSERT ... FROM the "
             "Arrow table)", ingest_secs, duck_ingest, ingest_cpu)):
        table.append([name, round(ours, 2), round(theirs, 2), round(rows / ours),
                      round(rows / theirs), round(theirs / ours, 2),
                      None if cpu is None else round(cpu, 1)])
    setup = (f"A master (the coordinator) and {REPLICAS} tablet servers on this machine, the "
             f"tables with {REPLICAS} replicas; the server CPU is that of all four processes"
             if args.cluster else "One node")
    report.note(f"{setup}; lineitem hash-partitioned into {args.buckets} buckets on l_orderkey "
                "(bench/tpch.py's table). The ingested rows are in the client's memory before "
                "the clock starts (pyarrow reads the file's strings as string_view, which the "
                "server casts to the table's strings). Targets: COPY FROM and bulk ingest "
                ">= 1 M rows/s on one node and >= 300 k rows/s with 3 replicas, COPY FROM >= 0.5x DuckDB's speed. Every load is checked (rows and "
                "a checksum).")
    report.write(args.json)


if __name__ == "__main__":
    main()
