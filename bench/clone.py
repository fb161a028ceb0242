#!/usr/bin/env python3
"""Table clones: what `CREATE TABLE c CLONE t` costs in time and disk, against CTAS.

    python3 bench/clone.py [--rows 2000000] [--buckets 8] [--bin PATH] [--settle 90]
                           [--update-percent 1] [--keep-data-dir]

Starts `nyala serve` on a fresh temporary data directory (the binary is --bin, default
$NYALA_BIN, else $CARGO_TARGET_DIR/release/nyala, CARGO_TARGET_DIR defaulting to
~/.cache/nyala-target) and loads --rows rows of an orders-like table through ADBC bulk ingest
(batches of 100 000):

    CREATE TABLE orders (o_id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE,
                         status STRING, note STRING) DISTRIBUTE BY HASH (o_id) INTO 8 BUCKETS

It waits (up to --settle seconds) for the server to flush the idle table, as a table that is
not being loaded would be, then measures, over ADBC Flight SQL:

1. `CREATE TABLE c2 CLONE orders`, and the data directory's disk usage just before and after it
   (blocks of every file, each inode counted once however many hard links it has): the growth,
   as a percentage of the bytes of orders' tablet files;
2. `CREATE TABLE c1 PRIMARY KEY (o_id) AS SELECT * FROM orders` (CTAS, a copy of every row),
   dropped afterwards (its background flushes would disturb the next disk measurement);
3. after `UPDATE orders ... WHERE o_id % 100 = 0` (--update-percent of the rows), the time of
   `CREATE TABLE c3 CLONE orders AS OF to_timestamp_nanos(<before the update>)`, and its growth.
   The clone flushes the updates first (into REDO files); the AS OF clone links every rowset
   whose base data predates that time without those newer REDO files, and rewrites only the
   rowsets flushed or compacted after it.

Prints each time, the ratio clone / CTAS and the growth, with the targets for reference
(clone <= 10 % of CTAS, growth <= 5 % of the table's bytes); timings are never asserted. It
checks that the tables hold what they should (count(*) and exact sums over the columns of c1
and c2 equal those of orders, c3's those of orders AS OF that time, none of c3's rows
updated): FAILED lines and a non-zero exit code otherwise. The server is stopped on exit, also
after an error or Ctrl-C. Client and server share this machine's CPUs. Writes the run's
results to bench/results/clone.json (clone_20m.json with --rows 20000000; --json) for
docs/benchmarks.md. Needs pyarrow and adbc-driver-flightsql (tests/python/requirements.txt).
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Report, add_json_argument, default_path  # noqa: E402

BATCH = 100_000
DEFAULT_ROWS = 2_000_000
STATUSES = ("open", "paid", "shipped", "delivered", "returned")
TARGETS = ("targets (for reference, not asserted): clone <= 10 % of CTAS time, "
           "clone disk growth <= 5 % of the table's bytes")


def log(msg=""):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# The server


def add_binary_argument(parser):
    """--bin: the release build of `nyala` to start (default $NYALA_BIN, else
    $CARGO_TARGET_DIR/release/nyala)."""
    target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/nyala-target"))
    parser.add_argument("--bin", default=os.environ.get("NYALA_BIN")
                        or os.path.join(target_dir, "release", "nyala"))


def _die_with_parent():
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL (Linux)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (ImportError, OSError, AttributeError):
        pass


def start_server(binary, work, timeout=120):
    """Starts `nyala serve` with its data in work/data, logging to work/serve.log; returns
    (process, grpc URL, data directory)."""
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"clone: no nyala binary at {binary} (build it with `cargo build "
                         f"--release -p nyala-flight --bin nyala`, or set NYALA_BIN, or give --bin)")
    data = os.path.join(work, "data")
    path = os.path.join(work, "serve.log")
    out = open(path, "w")
    # Its own session: Ctrl-C reaches this script only, which stops the server itself.
    proc = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", "127.0.0.1:0",
                             "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "NO_COLOR": "1"},
                            preexec_fn=_die_with_parent)
    out.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Warnings of a restart (a log segment it removed) may come before the address.
        with open(path) as f:
            for line in f:
                m = re.search(r"Nyala listening on (grpc://\S+)", line)
                if m:
                    return proc, m.group(1), data
        if proc.poll() is not None:
            raise RuntimeError(f"nyala serve exited with code {proc.returncode} before listening")
        time.sleep(0.05)
    raise RuntimeError(f"nyala serve did not announce its address within {timeout} s")


def stop_server(proc, work, grace=10):
    """SIGTERM, then SIGKILL after `grace` seconds; shows the end of the log after a failure."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.returncode not in (0, -signal.SIGTERM):
        with open(os.path.join(work, "serve.log"), errors="replace") as f:
            tail = f.read().splitlines()[-20:]
        print(f"--- last lines of the server's log (exit code {proc.returncode})", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# SQL and disk


def query(cur, sql):
    cur.execute(sql)
    return cur.fetchall()


def timed(cur, sql):
    """Seconds `sql` took, its result fetched."""
    t = time.perf_counter()
    query(cur, sql)
    return time.perf_counter() - t


def restart_server(proc, binary, work):
    """Stops the server and starts it again on the same data: stopping flushes the
    MemRowSets, so the rows are in DiskRowSets after it. (process, grpc URL, data directory)"""
    stop_server(proc, work)
    return start_server(binary, work)


def execute_update(cur, sql):
    """Runs `sql` as an update (no prepare round trip); the rows it reports."""
    cur.adbc_statement.set_sql_query(sql)
    return cur.adbc_statement.execute_update()


def best(run, runs, warm_up=False):
    """The best of `runs` timings of `run()` (after one untimed run with `warm_up`), and the
    last result."""
    result = run() if warm_up else None
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return min(times), result


def disk_bytes(paths):
    """The disk space the files under `paths` take (st_blocks), each inode counted once."""
    seen, total = set(), 0
    for path in paths:
        for directory, _, names in os.walk(path):
            for name in names:
                try:
                    st = os.lstat(os.path.join(directory, name))
                except FileNotFoundError:  # replaced by a flush or compaction meanwhile
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def tablet_dirs(cur, data_dir, table):
    """The directories of `table`'s tablets (<data>/.../tablets/<tablet id>)."""
    ids = {i for (i,) in query(cur, f"SELECT tablet_id FROM sys.partitions "
                                    f"WHERE table_name = '{table}'")}
    return [os.path.join(d, i) for d, subdirs, _ in os.walk(data_dir)
            if os.path.basename(d) == "tablets" for i in subdirs if i in ids]


def table_bytes(cur, data_dir, table):
    """Disk bytes of `table`'s tablet data files (its rowsets and deltas, not its logs)."""
    return disk_bytes([os.path.join(d, "data") for d in tablet_dirs(cur, data_dir, table)])


def unflushed_bytes(cur, table):
    return int(query(cur, f"SELECT coalesce(sum(memory_bytes), 0) FROM sys.partitions "
                          f"WHERE table_name = '{table}'")[0][0])


def mb(n):
    return f"{n / 1e6:,.1f} MB"


def batch(start, n):
    import pyarrow as pa
    ids = range(start, start + n)
    return pa.table({
        "o_id": pa.array(ids, pa.int64()),
        "customer": pa.array([f"customer#{i * 2654435761 % 150_000:09d}" for i in ids]),
        "amount": pa.array([(i * 7919 % 1_000_000) / 100 for i in ids], pa.float64()),
        "status": pa.array([STATUSES[i * 31 % len(STATUSES)] for i in ids]),
        "note": pa.array([f"order {i}: deliver to dock {i % 97}, ref {i * 104729 % 10**9:09d}"
                          for i in ids]),
    })


# ---------------------------------------------------------------------------------------------


def results_name(rows):
    """The results file's name: clone (the default 2 000 000 rows), else e.g. clone_20m."""
    if rows == DEFAULT_ROWS:
        return "clone"
    return f"clone_{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"clone_{rows}"


def results_report(args, source_bytes, ctas, clone, growth, clone_as_of, growth_as_of, failed,
                   load_at_start=None):
    """The run as bench/results/clone.json holds it (see bench/results.py): seconds and disk
    growth in bytes of each statement, `source_bytes` the source table's tablet files."""
    title = (f"CREATE TABLE ... CLONE against CTAS on {args.rows:,} rows "
             f"({args.buckets} hash buckets)")
    report = Report(results_name(args.rows), title.replace(",", " "),
                    baseline="CREATE TABLE c1 PRIMARY KEY (o_id) AS SELECT * FROM orders (a copy "
                             "of every row) of the same table, same run",
                    load_at_start=load_at_start)
    rows = report.table("Time and disk growth", ["statement", "seconds", "% of CTAS",
                                                 "disk growth bytes", "% of the table's bytes"])

    def pct(part, whole):
        return round(100 * part / whole, 2) if part is not None and whole else None

    rows.append(["CREATE TABLE c1 PRIMARY KEY (o_id) AS SELECT * FROM orders", round(ctas, 3),
                 100.0, None, None])
    rows.append(["CREATE TABLE c2 CLONE orders", round(clone, 3), pct(clone, ctas), growth,
                 pct(growth, source_bytes)])
    if clone_as_of is not None:
        rows.append([f"CREATE TABLE c3 CLONE orders AS OF <before {args.update_percent:g} % "
                     f"were updated>", round(clone_as_of, 3), pct(clone_as_of, ctas),
                     growth_as_of, pct(growth_as_of, source_bytes)])
    report.note(f"orders: {source_bytes:,} bytes of tablet files.".replace(",", " "))
    if failed:
        report.note(f"{failed} checks of the tables' contents FAILED (see the output).")
    report.note("Targets: a clone takes at most 10 % of a CTAS's time and grows the disk by at "
                "most 5 % of the table's bytes.")
    return report


def run(args, cur, data_dir):
    """The measurements; returns the number of failed checks."""
    failed = 0

    def check(ok, what):
        nonlocal failed
        if ok:
            log(f"  checked: {what}")
        else:
            failed += 1
            log(f"  FAILED: {what}")

    # Exact sums (a sum of DOUBLEs depends on the order it adds them in).
    summary = ("count(*), sum(o_id), sum(CAST(round(amount * 100) AS BIGINT)), "
               "sum(length(note)), count(DISTINCT status)")
    query(cur, "CREATE TABLE orders (o_id BIGINT PRIMARY KEY, customer STRING, amount DOUBLE, "
               f"status STRING, note STRING) DISTRIBUTE BY HASH (o_id) INTO {args.buckets} BUCKETS")
    t = time.perf_counter()
    for start in range(0, args.rows, BATCH):
        cur.adbc_ingest("orders", batch(start, min(BATCH, args.rows - start)), mode="append")
    secs = time.perf_counter() - t
    log(f"load: {args.rows:,} rows in {secs:.1f} s ({args.rows / secs:,.0f} rows/s, bulk ingest)")

    t = time.perf_counter()
    while unflushed_bytes(cur, "orders") > 0 and time.perf_counter() - t < args.settle:
        time.sleep(1)
    left = unflushed_bytes(cur, "orders")
    log(f"settle: {time.perf_counter() - t:.0f} s for the idle table to be flushed; "
        f"{mb(left)} still unflushed" + (" (the clone flushes it: its time and growth include "
                                        "that flush)" if left else ""))
    expected = query(cur, f"SELECT {summary} FROM orders")[0]
    check(expected[0] == args.rows, f"orders holds {expected[0]:,} rows")
    source_bytes = table_bytes(cur, data_dir, "orders")
    log(f"orders: {mb(source_bytes)} of tablet files ({source_bytes / args.rows:.1f} bytes/row), "
        f"data directory {mb(disk_bytes([data_dir]))}")

    # The clone first: the CTAS table's flushes and log cleanup would change the data
    # directory while the clone's growth is measured.
    log("\nclone: CREATE TABLE c2 CLONE orders")
    before = disk_bytes([data_dir])
    clone = timed(cur, "CREATE TABLE c2 CLONE orders")
    after = disk_bytes([data_dir])
    growth = after - before
    log(f"  {clone:.3f} s")
    log(f"  data directory {mb(before)} -> {mb(after)}: {growth:+,} bytes = "
        f"{100 * growth / source_bytes:.3f} % of orders' {mb(source_bytes)}")
    check(query(cur, f"SELECT {summary} FROM c2")[0] == expected,
          "c2 agrees with orders (count(*) and sums)")

    log("\nCTAS: CREATE TABLE c1 PRIMARY KEY (o_id) AS SELECT * FROM orders")
    ctas = timed(cur, "CREATE TABLE c1 PRIMARY KEY (o_id) AS SELECT * FROM orders")
    log(f"  {ctas:.3f} s; the clone took {100 * clone / ctas:.2f} % of that")
    check(query(cur, f"SELECT {summary} FROM c1")[0] == expected, "c1 agrees with orders")
    query(cur, "DROP TABLE c1")  # its flushes would disturb the next disk measurement

    n_updates = round(args.rows * args.update_percent / 100)
    modulus = max(round(100 / args.update_percent), 1) if args.update_percent > 0 else 0
    log(f"\nAS OF clone: UPDATE of {args.update_percent:g} % of the rows, then "
        "CREATE TABLE c3 CLONE orders AS OF <before the update>")
    time.sleep(0.01)
    then = query(cur, "SELECT CAST(now() AS BIGINT)")[0][0]
    time.sleep(0.01)
    t = time.perf_counter()
    updated = (query(cur, f"UPDATE orders SET status = 'updated', amount = amount + 1 "
                          f"WHERE o_id % {modulus} = 0")[0][0] if modulus else 0)
    log(f"  UPDATE of {updated:,} rows (o_id % {modulus} = 0): {time.perf_counter() - t:.3f} s")
    if modulus:
        check(abs(updated - n_updates) <= 1, f"the UPDATE changed {updated:,} rows")
    as_of = f"AS OF to_timestamp_nanos({then})"
    old = query(cur, f"SELECT {summary} FROM orders {as_of}")[0]
    before = disk_bytes([data_dir])
    clone_as_of = timed(cur, f"CREATE TABLE c3 CLONE orders {as_of}")
    growth_as_of = disk_bytes([data_dir]) - before
    log(f"  {clone_as_of:.3f} s = {100 * clone_as_of / ctas:.2f} % of CTAS; data directory "
        f"{growth_as_of:+,} bytes = {100 * growth_as_of / source_bytes:.2f} % of orders' bytes")
    check(old == expected, "orders AS OF that time reads the rows before the update")
    check(query(cur, f"SELECT {summary} FROM c3")[0] == old
          and query(cur, "SELECT count(*) FROM c3 WHERE status = 'updated'")[0][0] == 0,
          "c3 holds the rows as of that time, without the update")
    if modulus:
        check(query(cur, "SELECT count(*) FROM orders WHERE status = 'updated'")[0][0] == updated,
              "orders keeps the update")

    log(f"\nsummary: {args.rows:,} rows, {args.buckets} buckets: CTAS {ctas:.3f} s, clone "
        f"{clone:.3f} s ({100 * clone / ctas:.2f} % of CTAS), clone growth "
        f"{100 * growth / source_bytes:.3f} % of the table's bytes; AS OF clone after "
        f"{args.update_percent:g} % updated {clone_as_of:.3f} s")
    log(TARGETS)
    results_report(args, source_bytes, ctas, clone, growth, clone_as_of, growth_as_of, failed,
                   args.load_at_start).write(args.json)
    return failed


def main():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/nyala-target")
    default_bin = os.environ.get("NYALA_BIN") or os.path.join(target, "release", "nyala")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--bin", default=default_bin,
                   help="the nyala binary to start (default: $NYALA_BIN or %(default)s)")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help="rows of orders (default 2 000 000; other counts write "
                        "bench/results/clone_<millions>m.json)")
    p.add_argument("--buckets", type=int, default=8, help="hash buckets of orders (default 8)")
    p.add_argument("--settle", type=float, default=90,
                   help="seconds to wait at most for the loaded table to be flushed (default 90; "
                        "0: clone what is in memory too)")
    p.add_argument("--update-percent", type=float, default=1,
                   help="percentage of rows updated before the AS OF clone (default 1)")
    p.add_argument("--keep-data-dir", action="store_true",
                   help="keep the server's data directory and log")
    add_json_argument(p, None)
    args = p.parse_args()
    if args.json is None:
        args.json = default_path(results_name(args.rows))
    args.load_at_start = os.getloadavg()[0]
    if args.rows < 1 or args.buckets < 1 or not 0 <= args.update_percent <= 100:
        p.error("--rows and --buckets must be positive, --update-percent within 0..100")

    import adbc_driver_flightsql
    import adbc_driver_flightsql.dbapi as flightsql
    import pyarrow as pa

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    work = tempfile.mkdtemp(prefix="nyala-clone.")
    proc = None
    failed = 1
    try:
        proc, uri, data_dir = start_server(args.bin, work)
        log(f"clone benchmark: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"ADBC Flight SQL driver {adbc_driver_flightsql.__version__}, pyarrow {pa.__version__}")
        log(f"Nyala: {args.bin}: nyala serve at {uri}, fresh data directory in {work}")
        if f"{os.sep}debug{os.sep}" in os.path.abspath(args.bin):
            log("note: a debug build: the times mean little")
        with flightsql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
            failed = run(args, cur, data_dir)
        log(f"load average at the end {os.getloadavg()[0]:.2f}")
    except KeyboardInterrupt:
        log("interrupted")
    except Exception as e:  # noqa: BLE001 - reported, non-zero exit
        log(f"FAILED: {' '.join(str(e).split())[:500]}")
    finally:
        if proc is not None:
            stop_server(proc, work)
        if args.keep_data_dir:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
