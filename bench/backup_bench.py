#!/usr/bin/env python3
"""Backup and restore of TPC-H against DuckDB's EXPORT DATABASE and IMPORT DATABASE.

    python3 bench/backup_bench.py [--scale 1] [--buckets 8] [--bin PATH] [--settle 90]

Loads TPC-H (bench/tpch.py's tables and data, generated once into ~/.cache/nyala-tpch) into a
fresh `nyala serve` (release build: --bin, default $NYALA_BIN, else
$CARGO_TARGET_DIR/release/nyala) through ADBC bulk ingest, waits for the idle flush (at most
--settle seconds), then, over ADBC Flight SQL:

1. `BACKUP DATABASE` (full), against DuckDB's `EXPORT DATABASE ... (FORMAT parquet)` of the
   same tables from a DuckDB database file holding them, same run;
2. `UPDATE lineitem` of 1 % of its rows spread over the table (l_orderkey % 100 = 0), then
   `BACKUP DATABASE ... INCREMENTAL FROM` the full backup; then of 1 % next to each other
   (l_orderkey <= 60000) and another incremental backup from the first: their times and bytes
   against the full backup's;
3. `RESTORE DATABASE` of the full backup into a second fresh server, against DuckDB's `IMPORT
   DATABASE` into a new database file, and of the chain (full and two incrementals) into a third; every
   restored table's row count and a checksum compared with the source.

Targets (for reference, never asserted): full backup <= 1.5x DuckDB's export, restore <= 1.5x
DuckDB's import; the incremental backup <= 10 % of the full one's time and bytes.
Writes bench/results/backup.json (--json) for docs/benchmarks.md.
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
from tpch import TABLES, generate_data, load, settle  # noqa: E402

# The two updates of 1 % of lineitem before each incremental backup: rows spread over the whole
# table (a row in every 4 096-row page: every page is read again) and rows next to each other.
UPDATES = [("rows spread over the table", "l_orderkey % 100 = 0"),
           ("rows next to each other", "l_orderkey <= 60000")]

# A checksum of each table a restore must give back: its row count and a sum over its key.
CHECKS = {
    "region": "sum(r_regionkey)", "nation": "sum(n_nationkey)", "supplier": "sum(s_suppkey)",
    "customer": "sum(c_custkey)", "part": "sum(p_partkey)",
    "partsupp": "sum(ps_partkey * 7 + ps_suppkey)", "orders": "sum(o_orderkey)",
    "lineitem": "sum(l_orderkey * 7 + l_linenumber) + sum(length(l_comment))",
}


def log(msg=""):
    print(msg, flush=True)


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def checksums(cur):
    return {t: tuple(query(cur, f"SELECT count(*), CAST({CHECKS[t]} AS BIGINT) FROM {t}")[0])
            for t in TABLES}


def timed(cur, sql):
    started = time.perf_counter()
    cur.execute(sql)
    steps = cur.fetchall()
    return time.perf_counter() - started, steps


def nyala(binary, work, name):
    """A fresh server in work/name; (process, ADBC connection, its work directory)."""
    import adbc_driver_flightsql.dbapi as flightsql
    path = os.path.join(work, name)
    os.makedirs(path)
    proc, uri, _ = start_server(binary, path)
    return proc, flightsql.connect(uri, autocommit=True), path


def duckdb_baseline(files, work):
    """(export seconds, export bytes, import seconds, checksums) of DuckDB on the same tables."""
    import duckdb
    source = duckdb.connect(os.path.join(work, "duck.db"))
    for t in TABLES:
        source.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{files[t]}')")
    source.execute("CHECKPOINT")
    exported = os.path.join(work, "duck-export")
    started = time.perf_counter()
    source.execute(f"EXPORT DATABASE '{exported}' (FORMAT parquet)")
    export_secs = time.perf_counter() - started
    source.close()
    target = duckdb.connect(os.path.join(work, "duck-restored.db"))
    started = time.perf_counter()
    target.execute(f"IMPORT DATABASE '{exported}'")
    target.execute("CHECKPOINT")
    import_secs = time.perf_counter() - started
    sums = {t: tuple(target.execute(f"SELECT count(*), CAST({CHECKS[t]} AS BIGINT) FROM {t}")
                     .fetchone()) for t in TABLES}
    target.close()
    return export_secs, dir_bytes(exported), import_secs, sums


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--batch-rows", type=int, default=65536)
    parser.add_argument("--settle", type=float, default=90)
    add_binary_argument(parser)
    add_json_argument(parser, "backup")
    args = parser.parse_args()
    load_at_start = load_average()
    files = generate_data(args.scale)
    work = tempfile.mkdtemp(prefix="nyala-backup-bench.")
    servers = []
    try:
        proc, conn, source_dir = nyala(args.bin, work, "source")
        servers.append((proc, source_dir))
        log(f"loading TPC-H SF {args.scale:g} through ADBC bulk ingest ({args.buckets} buckets)")
        load(conn, files, args.buckets, args.batch_rows)
        settle(conn, args.settle)
        cur = conn.cursor()
        source = checksums(cur)

        full = os.path.join(work, "full")
        full_secs, _ = timed(cur, f"BACKUP DATABASE TO '{full}'")
        full_bytes = dir_bytes(full)
        log(f"BACKUP DATABASE: {full_secs:.2f} s, {full_bytes / 1e6:.1f} MB")

        incrementals = []
        parent = full
        for shape, where in UPDATES:
            started = time.perf_counter()
            cur.execute(f"UPDATE lineitem SET l_comment = 'changed' WHERE {where}")
            updated = cur.fetchall()[0][0]
            log(f"UPDATE of {updated:,} lineitem rows ({shape}) in "
                f"{time.perf_counter() - started:.1f} s")
            path = os.path.join(work, f"incremental-{len(incrementals) + 1}")
            secs, _ = timed(cur, f"BACKUP DATABASE TO '{path}' INCREMENTAL FROM '{parent}'")
            incrementals.append((shape, updated, secs, dir_bytes(path)))
            log(f"incremental BACKUP: {secs:.2f} s, {dir_bytes(path) / 1e6:.1f} MB")
            parent = path
        changed = checksums(cur)
        cur.close()
        conn.close()
        stop_server(proc, source_dir)
        servers.clear()

        restores = {}
        for name, backup, expected in (("full", full, source), ("chain", parent, changed)):
            proc, conn, path = nyala(args.bin, work, f"restore-{name}")
            servers.append((proc, path))
            cur = conn.cursor()
            secs, _ = timed(cur, f"RESTORE DATABASE FROM '{backup}'")
            got = checksums(cur)
            if got != expected:
                raise SystemExit(f"restore of the {name} backup: {got} != {expected}")
            log(f"RESTORE DATABASE ({name}): {secs:.2f} s, every table checked")
            restores[name] = secs
            cur.close()
            conn.close()
            stop_server(proc, path)
            servers.clear()

        export_secs, export_bytes, import_secs, duck_sums = duckdb_baseline(files, work)
        if duck_sums != source:
            raise SystemExit(f"DuckDB's import differs from the source: {duck_sums} != {source}")
        log(f"DuckDB EXPORT DATABASE: {export_secs:.2f} s, {export_bytes / 1e6:.1f} MB; "
            f"IMPORT DATABASE: {import_secs:.2f} s")
    finally:
        for proc, path in servers:
            stop_server(proc, path)
        shutil.rmtree(work, ignore_errors=True)

    import duckdb
    rows = sum(v[0] for v in source.values())
    report = Report(
        "backup", f"Backup and restore of TPC-H SF {args.scale:g} ({rows:,} rows) against DuckDB",
        baseline=f"DuckDB {duckdb.__version__} EXPORT/IMPORT DATABASE (FORMAT parquet) of the "
                 "same tables from its own database file, same run",
        load_at_start=load_at_start)
    table = report.table("Full backup and restore", ["operation", "Nyala s", "DuckDB s",
                                                    "Nyala / DuckDB", "Nyala MB", "DuckDB MB"])
    table.append(["backup (DuckDB: EXPORT DATABASE)", round(full_secs, 2), round(export_secs, 2),
                  round(full_secs / export_secs, 2), round(full_bytes / 1e6, 1),
                  round(export_bytes / 1e6, 1)])
    table.append(["restore (DuckDB: IMPORT DATABASE)", round(restores["full"], 2),
                  round(import_secs, 2), round(restores["full"] / import_secs, 2), None, None])
    table = report.table("Incremental backups after updating 1 % of lineitem",
                         ["backup", "rows updated", "seconds", "MB",
                          "% of the full backup's time", "% of its bytes"])
    table.append(["full", None, round(full_secs, 2), round(full_bytes / 1e6, 1), 100.0, 100.0])
    for shape, updated, secs, size in incrementals:
        table.append([f"incremental: {shape}", updated, round(secs, 2), round(size / 1e6, 1),
                      round(100 * secs / full_secs, 1), round(100 * size / full_bytes, 1)])
    table.append([f"restore of the chain (full + {len(incrementals)} incremental)", None,
                  round(restores["chain"], 2), None,
                  round(100 * restores["chain"] / restores["full"], 1), None])
    report.note("Targets: backup <= 1.5x DuckDB's export, restore <= 1.5x its import; an "
                "incremental backup after 1 % of lineitem changed <= 10 % of the full backup's "
                "time and bytes. Every restore is checked table by table (rows and a checksum).")
    report.write(args.json)


if __name__ == "__main__":
    main()
