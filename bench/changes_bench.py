#!/usr/bin/env python3
"""Change streams: how fast `changes()` reads a window and how soon a long poll wakes.

    python3 bench/changes_bench.py [--rows 1000000] [--polls 200] [--bin PATH] [--settle 90]

Starts `nyala serve` (release build: --bin, default $NYALA_BIN, else
$CARGO_TARGET_DIR/release/nyala) on a fresh data directory and measures, over ADBC Flight SQL:

1. Reading a window of --rows changed rows: the rows are loaded by ADBC bulk ingest into
   `orders` (8 hash buckets; bench/clone.py's table) after a time t0, then
   `SELECT * FROM changes('orders', t0, NULL)` is fetched whole, against
   `SELECT * FROM orders` (the same rows, a plain scan) in the same run: rows per second of
   each, while the rows are in memory and again after the server flushed the idle table
   (waiting up to --settle seconds).
2. Long-poll wake-up, in both states: a consumer follows `changes('orders', last, NULL,
   10000)` while a writer inserts one row every 20 ms (--polls rows); the time from the
   INSERT's acknowledgement to the consumer's answer (p50, p99), against `tail()` on a queue
   table followed the same way, same run.

Targets (for reference, never asserted): a window read at >= 1 M rows/s; wake-up p99 <= 10 ms.
Writes bench/results/changes.json (--json) for docs/benchmarks.md. Needs pyarrow and
adbc-driver-flightsql (tests/python/requirements.txt).
"""
import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clone import batch, query, start_server, stop_server, unflushed_bytes  # noqa: E402
from results import Report, add_json_argument, load_average  # noqa: E402

BATCH = 100_000


def log(msg=""):
    print(msg, flush=True)


def literal(time_value):
    return f"TIMESTAMP '{time_value:%Y-%m-%d %H:%M:%S.%f}'"


def server_now(cur):
    return query(cur, "SELECT CAST(now() AS TIMESTAMP)")[0][0]


def rows_per_second(cur, sql, expected):
    """(rows per second, seconds) of fetching `sql` whole as Arrow; checks the row count."""
    started = time.perf_counter()
    cur.execute(sql)
    table = cur.fetch_arrow_table()
    seconds = time.perf_counter() - started
    if table.num_rows != expected:
        raise SystemExit(f"{sql}: {table.num_rows} rows, expected {expected}")
    return expected / seconds, seconds


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def wake_ups(connect, poll_sql, insert_sql, count):
    """Milliseconds from each acknowledged INSERT to the long poll's answer holding its row.
    `poll_sql(last)` is the consumer's statement after `last`; it returns (key, next last)
    rows; `insert_sql(i)` inserts row i."""
    acknowledged = {}
    received = {}
    done = threading.Event()

    def consumer():
        conn = connect()
        cur = conn.cursor()
        last = None
        while not done.is_set():
            found = query(cur, poll_sql(last))
            now = time.perf_counter()
            for key, position in found:
                received.setdefault(key, now)
                last = position
            if len(received) >= count:
                done.set()
        cur.close()
        conn.close()

    thread = threading.Thread(target=consumer)
    thread.start()
    conn = connect()
    cur = conn.cursor()
    time.sleep(0.2)
    for i in range(count):
        cur.execute(insert_sql(i))
        acknowledged[i] = time.perf_counter()
        time.sleep(0.02)
    done.wait(30)
    done.set()
    thread.join()
    cur.close()
    conn.close()
    return [max(0.0, received[i] - acknowledged[i]) * 1000 for i in range(count) if i in received]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--settle", type=float, default=90)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/nyala-target"))
    parser.add_argument("--bin", default=os.environ.get("NYALA_BIN",
                                                        os.path.join(target, "release", "nyala")))
    add_json_argument(parser, "changes")
    args = parser.parse_args()

    import adbc_driver_flightsql.dbapi as flightsql

    load_at_start = load_average()
    with tempfile.TemporaryDirectory() as work:
        proc, url, _ = start_server(args.bin, work)
        try:
            def connect():
                return flightsql.connect(url, autocommit=True)

            conn = connect()
            cur = conn.cursor()
            cur.execute("CREATE TABLE orders (o_id BIGINT PRIMARY KEY, customer STRING, "
                        "amount DOUBLE, status STRING, note STRING) "
                        "DISTRIBUTE BY HASH (o_id) INTO 8 BUCKETS")
            t0 = server_now(cur)
            for start in range(0, args.rows, BATCH):
                cur.adbc_ingest("orders", batch(start, min(BATCH, args.rows - start)),
                                mode="append")
            log(f"loaded {args.rows:,} rows")
            window = f"SELECT * FROM changes('orders', {literal(t0)}, NULL)"
            cur.execute("CREATE TABLE q (k STRING, pos BIGINT GENERATED ALWAYS AS POSITION, "
                        "v BIGINT, PRIMARY KEY (k, pos))")
            reads, wakes = [], {}
            for round_, state in enumerate(("in memory", "flushed")):
                if state == "flushed":
                    deadline = time.monotonic() + args.settle
                    while unflushed_bytes(cur, "orders") and time.monotonic() < deadline:
                        time.sleep(1)
                    if unflushed_bytes(cur, "orders"):
                        log("the table was not flushed in time; skipping the flushed reads")
                        break
                unflushed = unflushed_bytes(cur, "orders")
                # (The rows the earlier round's long poll inserted are changes of the window.)
                rows = args.rows + round_ * args.polls
                changes, changes_s = rows_per_second(cur, window, rows)
                scan, scan_s = rows_per_second(cur, "SELECT * FROM orders", rows)
                log(f"{state} ({unflushed / 1e6:.0f} MB unflushed): changes() {changes:,.0f} "
                    f"rows/s ({changes_s:.3f} s), scan {scan:,.0f} rows/s ({scan_s:.3f} s)")
                reads.append((state, unflushed, changes, changes_s, scan, scan_s))
                # The long poll, while the table's rows are where they are now (the polled
                # inserts keep the table from being idle, so an unflushed table stays so).
                start = server_now(cur)
                base = args.rows + 10 + round_ * (args.polls + 10)

                def changes_poll(last, start=start, base=base):
                    since = literal(last or start)
                    return (f"SELECT o_id - {base}, _commit_time FROM changes('orders', "
                            f"{since}, NULL, 10000) WHERE o_id >= {base}")

                wakes[f"changes(), rows {state}"] = wake_ups(
                    connect, changes_poll,
                    lambda i, base=base: (f"INSERT INTO orders (o_id, customer) "
                                          f"VALUES ({base + i}, 'x')"),
                    args.polls)

            def tail_poll(last):
                return f"SELECT v, pos FROM tail('q', {last or 0}, 10000) WHERE k = 'k'"

            wakes["tail() (baseline)"] = wake_ups(
                connect, tail_poll, lambda i: f"INSERT INTO q (k, v) VALUES ('k', {i})",
                args.polls)
            for name, values in wakes.items():
                log(f"wake-up {name}: p50 {pct(values, 50):.2f} ms, p99 {pct(values, 99):.2f} ms "
                    f"({len(values)} of {args.polls} received)")
            cur.close()
            conn.close()
        finally:
            stop_server(proc, work)

    rows = f"{args.rows:,}".replace(",", " ")
    report = Report("changes", f"changes(): reading a window of {rows} changed rows; long-poll "
                               "wake-up",
                    baseline="SELECT * FROM orders (the same rows, a plain scan) and tail() on a "
                             "queue table, same run",
                    load_at_start=load_at_start)
    table = report.table("Reading a window", ["the rows are", "unflushed MB", "changes() rows/s",
                                              "changes() s", "scan rows/s", "scan s",
                                              "changes() / scan time"])
    for state, unflushed, changes, changes_s, scan, scan_s in reads:
        table.append([state, round(unflushed / 1e6), round(changes), round(changes_s, 3),
                      round(scan), round(scan_s, 3), round(changes_s / scan_s, 2)])
    table = report.table("Long-poll wake-up after a commit", ["poll", "p50 ms", "p99 ms",
                                                              "received"])
    for name, values in wakes.items():
        table.append([name, round(pct(values, 50), 2), round(pct(values, 99), 2),
                      f"{len(values)} of {args.polls}"])
    report.note("Targets: a window read at >= 1 M rows/s; wake-up p99 <= 10 ms.")
    report.write(args.json)


if __name__ == "__main__":
    main()
