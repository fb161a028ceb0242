"""Bytes on disk per row after a bulk load, against Parquet (snappy) of the same rows.

    python3 bench/bytes_per_row.py <nyala binary> [rows]     # SETTLE=<seconds> (default 50)

Starts `nyala serve` on a temporary directory, loads EventIndex-like rows (run, event, lumi,
guid, trigger, payload; key (run, event), 8 hash buckets) through ADBC bulk ingest in batches
of 100 000, and prints the data directory's bytes per row right after the load and after the
server has settled (idle tablets flushed, their logs dropped), with the part that is Raft log.
Needs pyarrow and adbc-driver-flightsql (tests/python/requirements.txt).
"""
import os, subprocess, sys, time, shutil, tempfile
import pyarrow as pa, pyarrow.parquet as pq
import adbc_driver_flightsql.dbapi as flightsql

binary, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
work = tempfile.mkdtemp()
data = os.path.join(work, "data")
proc = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", "127.0.0.1:50996", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2)
def batch(start, n):
    i = pa.array(range(start, start + n), pa.int64())
    return pa.table({
        "run": pa.array([f"run{(k // 100000):06d}" for k in range(start, start + n)]),
        "event": i,
        "lumi": pa.array([k % 5000 for k in range(start, start + n)], pa.int64()),
        "guid": pa.array([f"{k:032x}-file-guid-0000-aaaa-bbbb" for k in range(start, start + n)]),
        "trigger": pa.array([f"HLT_mu{(k % 40)}_iso_tight_{'x' * (k % 17)}" for k in range(start, start + n)]),
        "payload": pa.array([f"{k * 2654435761 % 10**12:012d};stream=physics_Main;tag={k % 97}" for k in range(start, start + n)]),
    })
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
    def du(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    print(f"right after the load: {du(data) / rows:.1f} bytes/row")
    time.sleep(int(os.environ.get("SETTLE", "50")))
    total = du(data)
    wal = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs if f.endswith(".seg"))
    print(f"after settling: {total / rows:.1f} bytes/row ({wal / rows:.1f} of it log), Parquet (snappy) {os.path.getsize(parquet) / rows:.1f} bytes/row")
finally:
    proc.terminate(); proc.wait(); shutil.rmtree(work)
