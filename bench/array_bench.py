#!/usr/bin/env python3
"""Reading ARRAY columns through Flight SQL against DataFusion reading the same Parquet file.

    python3 bench/array_bench.py [--rows 2000000] [--repeat 5] [--bin PATH]

Writes a Parquet file of `--rows` rows (an id, `tags list<string>` of 0 to 6 short strings,
some NULL, and `scores list<int32>` of 0 to 9 values), starts a fresh `nyala serve` (release
build: --bin, default $NYALA_BIN, else $CARGO_TARGET_DIR/release/nyala), creates
`events (id BIGINT PRIMARY KEY, tags ARRAY<STRING>, scores INT[])` hash-partitioned into 4
buckets, loads the file with COPY and restarts the server, so that the rows are read from
DiskRowSets. Then, over ADBC Flight SQL, it times each query below (best of --repeat, results
fetched); the baseline, same run, is DataFusion (pip) running the same SQL on the Parquet file
registered as `events`. The results are compared.

Target (for reference, never asserted): each query >= 0.8x DataFusion's speed.
Writes bench/results/arrays.json (--json) for docs/benchmarks.md.
"""
import argparse
import os
import random
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import (  # noqa: E402
    add_binary_argument, best, execute_update, query, restart_server, start_server, stop_server)
from results import Report, add_json_argument, load_average  # noqa: E402

QUERIES = [
    ("sum of lengths", "SELECT sum(cardinality(tags)) AS n, sum(cardinality(scores)) AS m "
                       "FROM events"),
    ("array_has", "SELECT count(*) AS n FROM events WHERE array_has(tags, 'tag-7')"),
    ("unnest, group by", "SELECT tag, count(*) AS n FROM (SELECT unnest(tags) AS tag "
                         "FROM events) GROUP BY tag ORDER BY tag"),
    ("element", "SELECT sum(scores[1]) AS s FROM events WHERE tags IS NOT NULL"),
]


def log(msg=""):
    print(msg, flush=True)


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = random.Random(7)
    words = [f"tag-{i}" for i in range(40)]
    chunk = 200_000
    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string())),
                        ("scores", pa.list_(pa.int32()))])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            tags = [None if rng.random() < 0.05 else rng.sample(words, rng.randrange(7))
                    for _ in range(n)]
            scores = [[rng.randrange(1000) for _ in range(rng.randrange(10))] for _ in range(n)]
            writer.write_table(pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                                         "tags": tags, "scores": scores}, schema=schema))


def normalized(rows):
    """Rows with their numbers as ints (engines differ in their sums' types)."""
    return [tuple(v if v is None or isinstance(v, str) else int(v) for v in row) for row in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    add_binary_argument(parser)
    add_json_argument(parser, "arrays")
    args = parser.parse_args()
    load_at_start = load_average()
    import adbc_driver_flightsql.dbapi as flightsql
    import datafusion
    work = tempfile.mkdtemp(prefix="nyala-array-bench.")
    parquet = os.path.join(work, "events.parquet")
    proc = None
    ours = {}
    try:
        write_parquet(parquet, args.rows)
        log(f"{args.rows:,} rows written to {parquet}")
        proc, uri, _ = start_server(args.bin, work)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE events (id BIGINT PRIMARY KEY, tags ARRAY<STRING>, "
                        "scores INT[]) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
            loaded = execute_update(cur, f"COPY events FROM '{parquet}'")
            assert loaded == args.rows, loaded
        proc, uri, _ = restart_server(proc, args.bin, work)
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            for name, sql in QUERIES:
                ours[name] = best(lambda: query(cur, sql), args.repeat)
                log(f"Nyala      {name}: {ours[name][0] * 1000:.0f} ms")
        stop_server(proc, work)
        proc = None
        ctx = datafusion.SessionContext()
        ctx.register_parquet("events", parquet)
        theirs = {}
        for name, sql in QUERIES:
            theirs[name] = best(lambda: ctx.sql(sql).collect(), args.repeat)
            rows = [tuple(r.values()) for b in theirs[name][1] for r in b.to_pylist()]
            if normalized(rows) != normalized(ours[name][1]):
                raise SystemExit(f"{name}: Nyala {ours[name][1][:5]} != DataFusion {rows[:5]}")
            log(f"DataFusion {name}: {theirs[name][0] * 1000:.0f} ms")
    finally:
        if proc is not None:
            stop_server(proc, work)
        shutil.rmtree(work, ignore_errors=True)

    report = Report(
        "arrays", f"Reading ARRAY columns, {args.rows:,} rows",
        baseline=f"DataFusion {datafusion.__version__} (Python) on the same rows in one Parquet "
                 "file, same SQL, same run",
        load_at_start=load_at_start)
    table = report.table("Queries (best of %d)" % args.repeat,
                         ["query", "Nyala ms", "DataFusion ms", "Nyala speed / DataFusion's"])
    for name, sql in QUERIES:
        table.append([f"{name}: {sql}", round(ours[name][0] * 1000, 1),
                      round(theirs[name][0] * 1000, 1),
                      round(theirs[name][0] / ours[name][0], 2)])
    report.note("One node; events (id BIGINT PRIMARY KEY, tags ARRAY<STRING>, scores INT[]) "
                "hash-partitioned into 4 buckets, loaded by COPY from the Parquet file and read "
                "from DiskRowSets after a restart; results fetched over ADBC Flight SQL. Both "
                "engines' results are compared. Target: >= 0.8x DataFusion's speed.")
    report.write(args.json)


if __name__ == "__main__":
    main()
