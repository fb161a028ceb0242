"""Bytes on disk per row after a bulk load, against Parquet (snappy) of the same rows.

    python3 bench/bytes_per_row.py <nyala binary> [rows] [--json PATH]   # SETTLE=<seconds> (default 50)

Starts `nyala serve` on a temporary directory, loads EventIndex-like rows (run, event, lumi,
guid, trigger, payload; key (run, event), 8 hash buckets) through ADBC bulk ingest in batches
of 100 000, and prints the data directory's bytes per row right after the load and after the
server has settled (idle tablets flushed, their logs dropped), with the part that is Raft log.
Writes the run's results to bench/results/bytes_per_row.json (--json) for docs/benchmarks.md.
Needs pyarrow and adbc-driver-flightsql (tests/python/requirements.txt).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Report, add_json_argument  # noqa: E402


def batch(start, n):
    import pyarrow as pa
    i = pa.array(range(start, start + n), pa.int64())
    return pa.table({
        "run": pa.array([f"run{(k // 100000):06d}" for k in range(start, start + n)]),
        "event": i,
        "lumi": pa.array([k % 5000 for k in range(start, start + n)], pa.int64()),
        "guid": pa.array([f"{k:032x}-file-guid-0000-aaaa-bbbb" for k in range(start, start + n)]),
        "trigger": pa.array([f"HLT_mu{(k % 40)}_iso_tight_{'x' * (k % 17)}" for k in range(start, start + n)]),
        "payload": pa.array([f"{k * 2654435761 % 10**12:012d};stream=physics_Main;tag={k % 97}" for k in range(start, start + n)]),
    })


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def results_report(rows, after_load, settled, log_bytes, parquet, load_at_start=None):
    """The run as bench/results/bytes_per_row.json holds it (see bench/results.py): the data
    directory's bytes right after the load and once settled, the log's part of the latter, and
    the Parquet file's bytes."""
    report = Report("bytes_per_row",
                    f"Bytes on disk per row after a bulk load of {rows} EventIndex-like rows "
                    f"(8 hash buckets)",
                    baseline="the same rows written as one Parquet file (Snappy) by pyarrow, "
                             "same run", load_at_start=load_at_start)
    table = report.table("Data directory", ["when", "bytes/row", "of it log", "/ Parquet"])
    table.append(["right after the load", round(after_load / rows, 1), None,
                  round(after_load / parquet, 2)])
    table.append(["after settling", round(settled / rows, 1), round(log_bytes / rows, 1),
                  round(settled / parquet, 2)])
    table.append(["Parquet (Snappy)", round(parquet / rows, 1), None, 1.0])
    report.note("Target: at most 1.1x the same rows in Parquet with LZ4, also right after a bulk "
                "load settles.")
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("binary", help="the nyala binary to start")
    p.add_argument("rows", type=int, nargs="?", default=1_000_000, help="rows (default 1 000 000)")
    add_json_argument(p, "bytes_per_row")
    args = p.parse_args()
    binary, rows = args.binary, args.rows
    load_at_start = os.getloadavg()[0]

    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow.parquet as pq

    work = tempfile.mkdtemp()
    data = os.path.join(work, "data")
    proc = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", "127.0.0.1:50996", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    try:
        with flightsql.connect("grpc://127.0.0.1:50996", autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE events (run STRING, event BIGINT, lumi BIGINT, guid STRING, trigger STRING, "
                        "payload STRING, PRIMARY KEY (run, event)) DISTRIBUTE BY HASH (run, event) INTO 8 BUCKETS")
            parquet = os.path.join(work, "events.parquet")
            writer = None
            t0 = time.time()
            for start in range(0, rows, 100_000):
                t = batch(start, min(100_000, rows - start))
                cur.adbc_ingest("events", t, mode="append")
                if writer is None:
                    writer = pq.ParquetWriter(parquet, t.schema, compression="snappy")
                writer.write_table(t)
            writer.close()
            print(f"loaded {rows} rows in {time.time() - t0:.1f} s")
        after_load = du(data)
        print(f"right after the load: {after_load / rows:.1f} bytes/row")
        time.sleep(int(os.environ.get("SETTLE", "50")))
        total = du(data)
        wal = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs if f.endswith(".seg"))
        parquet_bytes = os.path.getsize(parquet)
        print(f"after settling: {total / rows:.1f} bytes/row ({wal / rows:.1f} of it log), Parquet (snappy) {parquet_bytes / rows:.1f} bytes/row")
        results_report(rows, after_load, total, wal, parquet_bytes, load_at_start).write(args.json)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
