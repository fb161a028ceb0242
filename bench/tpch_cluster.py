#!/usr/bin/env python3
"""TPC-H on a cluster, distributed against coordinator-only execution in the same run.

    python3 bench/tpch_cluster.py [--scale 1] [--runs 2] [--buckets 12] [--queries 1,3]
                                  [--tservers 3] [--bin PATH]

Starts a `nyala master` (which also serves Flight SQL, the coordinator) and `--tservers` tablet
servers on this machine (release build: --bin, default $NYALA_BIN, else
$CARGO_TARGET_DIR/release/nyala), creates the TPC-H tables with one replica each, hash-
partitioned into --buckets buckets spread over the tablet servers, loads them from tpchgen-cli's
Parquet files through ADBC bulk ingest and waits for them to flush. Then it runs each of the 22
queries (bench/tpch/) with `SET nyala.distributed = 'off'` (every tablet's rows go to the
coordinator, which computes alone) and `'on'` (stages on the tablet servers, the last one on
the coordinator): one warm-up, then the best of --runs, including fetching the result. For each
run it counts the bytes the coordinator received over its TCP connections (`ss`'s
bytes_received of the master's sockets; it holds no tablet, so its scans of tablets and the
stages' results all arrive that way), and it checks that the two modes' results agree.

Targets (for reference, never asserted): all 22 agree; bytes into the coordinator >= 10x fewer
over the 22 queries distributed (q1 >= 100x); total time <= 1.2x coordinator-only on this
machine, where all servers share its CPUs. Writes bench/results/tpch_cluster.json (--json).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tpch  # noqa: E402
from clone import add_binary_argument  # noqa: E402
from queue_bench import Processes, start_cluster  # noqa: E402
from results import Report, add_json_argument  # noqa: E402

MODES = ["off", "on"]


def log(msg=""):
    print(msg, flush=True)


def read_bytes(pid):
    """The bytes process `pid`'s open TCP connections have received (`ss`'s bytes_received:
    the coordinator keeps its connections to the tablet servers open between queries)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    total, ours = 0, False
    for line in out.splitlines():
        if line and not line[0].isspace():
            ours = f"pid={pid}," in line
        if ours:
            m = re.search(r"bytes_received:(\d+)", line)
            total += int(m.group(1)) if m else 0
    return total


def connect(uri, deadline):
    """A connection once the tablet servers have registered (CREATE TABLE needs them)."""
    import adbc_driver_flightsql.dbapi as flightsql
    while True:
        conn = flightsql.connect(uri, autocommit=True)
        try:
            with conn.cursor() as cur:
                tpch.execute(cur, "CREATE TABLE IF NOT EXISTS probe (k BIGINT PRIMARY KEY) "
                                  "DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
                tpch.execute(cur, "DROP TABLE probe")
            return conn
        except Exception:  # noqa: BLE001 (not yet: the servers are registering)
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_query(cur, statements, pid):
    """(seconds, bytes the coordinator received, rows) of one run of a query file's statements."""
    rows = None
    started, before = time.perf_counter(), read_bytes(pid)
    for statement in statements:
        table = tpch.execute(cur, statement)
        if tpch.is_query(statement):
            rows = table
    return time.perf_counter() - started, read_bytes(pid) - before, rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_argument(p)
    tpch.add_run_arguments(p, runs=2, buckets=12, settle=90)
    p.add_argument("--tservers", type=int, default=3, help="tablet servers (default 3)")
    add_json_argument(p, "tpch_cluster")
    args = p.parse_args()
    queries = tpch.parse_queries(args.queries)
    tpch.ensure_packages()
    files = tpch.generate_data(args.scale)
    texts = {}
    for q in queries:
        with open(os.path.join(tpch.QUERY_DIR, f"q{q:02d}.sql")) as f:
            texts[q] = tpch.split_statements(f.read())

    report = Report("tpch_cluster",
                    f"TPC-H SF{args.scale:g} on 1 master + {args.tservers} tablet servers: "
                    f"distributed against coordinator-only",
                    baseline="the same cluster and queries with nyala.distributed = off, "
                             "same run")
    with tempfile.TemporaryDirectory(prefix="nyala-tpch-cluster-") as work:
        procs = Processes(args.bin, work)
        try:
            uri = start_cluster(procs, types.SimpleNamespace(tservers=args.tservers,
                                                             memory_limit_mb=None))
            coordinator = procs.procs[0][1].pid
            conn = connect(uri, time.monotonic() + 60)
            log(f"cluster at {uri} (coordinator: the master, pid {coordinator}); loading "
                f"SF {args.scale:g} into {args.buckets} buckets per table:")
            stats = tpch.load(conn, files, args.buckets, 65536)
            loaded = sum(s[1] for s in stats) / sum(s[2] for s in stats)
            tpch.settle(conn, args.settle)
            cur = conn.cursor()
            results = {}
            log(f"{'query':<6} {'off s':>8} {'on s':>8} {'on/off':>7} {'off MiB':>9} "
                f"{'on MiB':>9} {'fewer':>8}  result")
            for q in queries:
                best = {}
                for mode in MODES:
                    tpch.execute(cur, f"SET nyala.distributed = '{mode}'")
                    runs = [run_query(cur, texts[q], coordinator) for _ in range(args.runs + 1)]
                    seconds = min(r[0] for r in runs[1:])
                    read = min(r[1] for r in runs[1:])
                    best[mode] = (seconds, read, tpch.normalise(runs[-1][2]))
                diff, _ = tpch.compare(best["on"][2], best["off"][2], "on", "off")
                status = "agree" if diff is None else f"DIFFER: {diff}"
                results[q] = (best["off"][:2], best["on"][:2], status)
                (off_s, off_b), (on_s, on_b) = best["off"][:2], best["on"][:2]
                log(f"q{q:02d}   {off_s:8.3f} {on_s:8.3f} {on_s / off_s:7.2f} "
                    f"{off_b / 2**20:9.2f} {on_b / 2**20:9.2f} {off_b / max(on_b, 1):7.1f}x  "
                    f"{status}")
        finally:
            procs.stop()

    rows = report.table("Per query: best of the runs; MiB the coordinator received",
                        ["query", "off s", "on s", "on / off", "off MiB", "on MiB",
                         "off / on bytes", "result"])
    for q, ((off_s, off_b), (on_s, on_b), status) in results.items():
        rows.append([f"q{q:02d}", round(off_s, 3), round(on_s, 3), round(on_s / off_s, 2),
                     round(off_b / 2**20, 2), round(on_b / 2**20, 2),
                     round(off_b / max(on_b, 1), 1), status])
    off_s = sum(r[0][0] for r in results.values())
    on_s = sum(r[1][0] for r in results.values())
    off_b = sum(r[0][1] for r in results.values())
    on_b = sum(r[1][1] for r in results.values())
    agree = sum(1 for r in results.values() if r[2] == "agree")
    rows.append(["total", round(off_s, 3), round(on_s, 3), round(on_s / off_s, 2),
                 round(off_b / 2**20, 2), round(on_b / 2**20, 2),
                 round(off_b / max(on_b, 1), 1), f"{agree} of {len(results)} agree"])
    log(f"total  {off_s:8.3f} {on_s:8.3f} {on_s / off_s:7.2f} {off_b / 2**20:9.2f} "
        f"{on_b / 2**20:9.2f} {off_b / max(on_b, 1):7.1f}x  {agree} of {len(results)} agree")
    report.note(f"load through ADBC bulk ingest into the cluster: {loaded:,.0f} rows/s")
    report.note("targets: all 22 agree; the coordinator reads >= 10x fewer bytes over the 22 "
                "queries distributed (q1: >= 100x); total time <= 1.2x coordinator-only (all "
                "servers share this machine's CPUs, so no speed-up is possible here)")
    report.write(args.json)
    return 0 if agree == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
