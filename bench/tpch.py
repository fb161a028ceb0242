#!/usr/bin/env python3
"""TPC-H on Nyala, against DataFusion and DuckDB reading the same Parquet files.

    python3 bench/tpch.py [--scale 1] [--runs 3] [--queries 1,3,15] [--buckets 8]
                          [--nyala PATH | --connect grpc://HOST:PORT] [--keep-data-dir]

Generates the TPC-H data at the scale factor with tpchgen-cli (Parquet, cached under
~/.cache/nyala-tpch/sf<SF>), starts `nyala serve` on a fresh data directory (release binary,
default $CARGO_TARGET_DIR/release/nyala, CARGO_TARGET_DIR defaulting to ~/.cache/nyala-target),
creates the 8 tables with their primary keys (hash-distributed into --buckets buckets; nation and
region one tablet each) and loads them from the Parquet files through Flight SQL bulk ingest
(ADBC). Then it runs the 22 queries of bench/tpch/ through Flight SQL, through DataFusion
(Python package, the same Parquet files registered as tables) and through DuckDB (views over
read_parquet): one warm-up, then the best of --runs, each time including fetching the whole
result into Arrow in the client. It checks that the three results agree and prints a table of
times and ratios, the load rate, and bytes on disk against the Parquet files.

It never asserts timings: the exit code is non-zero only when a query fails or results differ.
It writes the run's results to bench/results/tpch.json (tpch_sf10.json with --scale 10; --json)
for docs/benchmarks.md.
Installs what it needs with pip when missing (tpchgen-cli, duckdb, datafusion, pyarrow,
adbc-driver-flightsql). The server, the client and the other engines share this machine's CPUs.
"""
import argparse
import datetime
import decimal
import importlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results import Report, add_json_argument, default_path  # noqa: E402

QUERY_DIR = os.path.join(HERE, "tpch")
TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]
PRIMARY_KEYS = {
    "lineitem": ["l_orderkey", "l_linenumber"],
    "orders": ["o_orderkey"],
    "customer": ["c_custkey"],
    "part": ["p_partkey"],
    "supplier": ["s_suppkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
    "nation": ["n_nationkey"],
    "region": ["r_regionkey"],
}
UNPARTITIONED = {"nation", "region"}  # one tablet each


# ---------------------------------------------------------------------------------------------
# Packages and data


def pip_install(*specs):
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", *specs]
    print("tpch: " + " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode == 0


def ensure_packages():
    """Installs the Python packages this needs when they are missing."""
    needed = [("pyarrow", "pyarrow"), ("adbc_driver_flightsql", "adbc-driver-flightsql"),
              ("duckdb", "duckdb")]
    missing = []
    for module, spec in needed:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(spec)
    if missing and not pip_install(*missing):
        sys.exit("tpch: pip could not install " + " ".join(missing))
    try:
        importlib.import_module("datafusion")
    except ImportError:
        # The version Nyala is built on (Cargo.toml), else the newest.
        if not pip_install("datafusion==55.*") and not pip_install("datafusion"):
            sys.exit("tpch: pip could not install datafusion")
    if tpchgen_binary() is None and not pip_install("tpchgen-cli"):
        sys.exit("tpch: pip could not install tpchgen-cli")
    importlib.invalidate_caches()


def tpchgen_binary():
    beside_python = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    if os.access(beside_python, os.X_OK):
        return beside_python
    return shutil.which("tpchgen-cli")


def scale_name(scale):
    return f"sf{scale:g}"


def generate_data(scale):
    """The Parquet files of the scale factor, generated once and cached."""
    cache = os.path.join(os.path.expanduser("~/.cache/nyala-tpch"), scale_name(scale))
    files = {t: os.path.join(cache, f"{t}.parquet") for t in TABLES}
    if all(os.path.exists(f) for f in files.values()):
        print(f"data: {cache} (cached)")
        return files
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    partial = cache + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    binary = tpchgen_binary()
    print(f"data: generating TPC-H SF {scale:g} with {binary} into {cache}", flush=True)
    t0 = time.perf_counter()
    # tpchgen-cli 4 takes the format as a subcommand; older versions took --format.
    attempts = [[binary, "parquet", "-s", f"{scale:g}", "--output-dir", partial],
                [binary, "-s", f"{scale:g}", "--format", "parquet", "--output-dir", partial]]
    for cmd in attempts:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode == 0 and all(
                os.path.exists(os.path.join(partial, f"{t}.parquet")) for t in TABLES):
            break
        shutil.rmtree(partial, ignore_errors=True)
    else:
        sys.exit(f"tpch: {' '.join(attempts[-1])} failed:\n{done.stderr}")
    os.rename(partial, cache)
    print(f"data: generated in {time.perf_counter() - t0:.1f} s")
    return files


def lz4_parquet_bytes(files):
    """The bytes of the same rows in Parquet files compressed with LZ4 (the issue's baseline;
    tpchgen-cli writes Snappy), written once with pyarrow's defaults next to the cached data."""
    import pyarrow.parquet as pq
    total = 0
    for table, path in files.items():
        lz4 = os.path.join(os.path.dirname(path), "lz4", f"{table}.parquet")
        if not os.path.exists(lz4):
            os.makedirs(os.path.dirname(lz4), exist_ok=True)
            pq.write_table(pq.read_table(path), lz4 + ".partial", compression="lz4")
            os.rename(lz4 + ".partial", lz4)
        total += os.path.getsize(lz4)
    return total


# ---------------------------------------------------------------------------------------------
# Nyala server


class Server:
    """`nyala serve` on a fresh data directory, stopped (and the directory removed) by stop()."""

    def __init__(self, binary, keep):
        if not os.access(binary, os.X_OK):
            sys.exit(f"tpch: no Nyala binary at {binary} (build it with `cargo build --release "
                     f"-p nyala-flight --bin nyala`, or give --nyala PATH or --connect URI)")
        self.keep = keep
        self.work = tempfile.mkdtemp(prefix="nyala-tpch.")
        self.data_dir = os.path.join(self.work, "data")
        self.log_path = os.path.join(self.work, "nyala.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "serve", "--data-dir", self.data_dir, "--listen", "127.0.0.1:0",
             "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"], stdout=self.log, stderr=subprocess.STDOUT)
        self.uri = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                m = re.search(r"grpc://127\.0\.0\.1:\d+", f.read())
            if m:
                self.uri = m.group(0)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop(failed=True)
        sys.exit("tpch: nyala serve did not announce an address (see above)")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, failed=False):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if failed or self.proc.returncode not in (0, -signal.SIGTERM, None):
            with open(self.log_path) as f:
                tail = f.read().splitlines()[-20:]
            if tail:
                print(f"--- last lines of {self.log_path}", file=sys.stderr)
                print("\n".join(tail), file=sys.stderr)
        if self.keep:
            print(f"kept the data directory: {self.data_dir} (server log {self.log_path})")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def dir_bytes(path):
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(d, n))
            except OSError:
                pass  # removed meanwhile (log segments, compactions)
    return total


# ---------------------------------------------------------------------------------------------
# Loading


def sql_type(arrow_type):
    import pyarrow as pa
    if pa.types.is_int64(arrow_type):
        return "BIGINT"
    if pa.types.is_int32(arrow_type):
        return "INT"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})"
    if pa.types.is_float64(arrow_type):
        return "DOUBLE"
    if pa.types.is_date32(arrow_type):
        return "DATE"
    if (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type)):
        return "STRING"
    raise ValueError(f"no Nyala type for Parquet column type {arrow_type}")


def create_table_sql(table, parquet_schema, buckets):
    """CREATE TABLE with the Parquet file's columns, so all three engines compute on the same
    types (tpchgen-cli writes money as DECIMAL(15, 2))."""
    cols = [f"{f.name} {sql_type(f.type)} NOT NULL" for f in parquet_schema]
    keys = PRIMARY_KEYS[table]
    sql = f"CREATE TABLE {table} ({', '.join(cols)}, PRIMARY KEY ({', '.join(keys)}))"
    if table not in UNPARTITIONED:
        sql += f" DISTRIBUTE BY HASH ({keys[0]}) INTO {buckets} BUCKETS"
    return sql


def execute(cur, sql):
    cur.execute(sql)
    return cur.fetch_arrow_table()


def load(conn, files, buckets, batch_rows):
    """Creates and loads the tables; returns [(table, rows, seconds)]."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tty = sys.stdout.isatty()
    stats = []
    with conn.cursor() as cur:
        for table in TABLES:
            execute(cur, f"DROP TABLE IF EXISTS {table}")
        for table in TABLES:
            pf = pq.ParquetFile(files[table])
            execute(cur, create_table_sql(table, pf.schema_arrow, buckets))
        for table in TABLES:
            pf = pq.ParquetFile(files[table])
            total = pf.metadata.num_rows
            target = conn.adbc_get_table_schema(table)
            cast = pf.schema_arrow.remove_metadata() != target
            sent = [0]
            t0 = time.perf_counter()
            last = [t0]

            def progress(final=False):
                now = time.perf_counter()
                rate = sent[0] / max(now - t0, 1e-9)
                line = (f"  {table:<9} {sent[0]:>11,} of {total:>11,} rows {now - t0:7.1f} s "
                        f"{rate:>11,.0f} rows/s")
                if final:
                    print(("\r" if tty else "") + line + " " * 4, flush=True)
                elif tty and now - last[0] > 0.5:
                    print("\r" + line, end="", flush=True)
                    last[0] = now
                elif not tty and now - last[0] > 30:
                    print(line, flush=True)
                    last[0] = now

            def batches():
                for b in pf.iter_batches(batch_size=batch_rows):
                    if cast:
                        b = b.cast(target)
                    yield b
                    sent[0] += b.num_rows
                    progress()

            reader = pa.RecordBatchReader.from_batches(target, batches())
            cur.adbc_ingest(table, reader, mode="append")
            secs = time.perf_counter() - t0
            progress(final=True)
            stored = execute(cur, f"SELECT count(*) FROM {table}").column(0)[0].as_py()
            if stored != total:
                sys.exit(f"tpch: {table} holds {stored} rows after the load, the file {total}")
            stats.append((table, total, secs))
    return stats


def partition_bytes(conn):
    with conn.cursor() as cur:
        t = execute(cur, "SELECT coalesce(sum(disk_bytes), 0), coalesce(sum(memory_bytes), 0) "
                         f"FROM sys.partitions WHERE table_name IN ({', '.join(repr(t) for t in TABLES)})")
    return t.column(0)[0].as_py(), t.column(1)[0].as_py()


def settle(conn, seconds):
    """Waits (at most `seconds`) until the tablets have flushed what they hold in memory, so the
    queries read the data as it stays: idle tablets flush after 30 s without writes."""
    if seconds <= 0:
        return
    t0 = time.perf_counter()
    while True:
        disk, memory = partition_bytes(conn)
        waited = time.perf_counter() - t0
        if memory == 0 or waited >= seconds:
            state = "all flushed" if memory == 0 else f"{memory / 2**20:.1f} MiB still in memory"
            print(f"settled for {waited:.0f} s: {state}")
            return
        time.sleep(2)


# ---------------------------------------------------------------------------------------------
# Queries


def split_statements(text):
    """The statements of a query file: `--` comments dropped, split on `;` outside quotes."""
    out, cur, i, quote = [], [], 0, None
    while i < len(text):
        c = text[i]
        if quote:
            cur.append(c)
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif text.startswith("--", i):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif c == ";":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur).strip())
    return [s for s in out if s]


def is_query(stmt):
    return re.match(r"(?is)\s*(select|with|values)\b", stmt) is not None


def cleanup_statements(stmts):
    """What undoes a half-run query file: its DROP VIEWs, with IF EXISTS."""
    return [re.sub(r"(?is)^\s*drop\s+view\s+(if\s+exists\s+)?", "drop view if exists ", s)
            for s in stmts if re.match(r"(?is)\s*drop\s+view\b", s)]


class Nyala:
    name = "Nyala"

    def __init__(self, conn):
        self.conn = conn
        self.cur = conn.cursor()

    def run(self, stmts):
        result = None
        for s in stmts:
            self.cur.execute(s)
            t = self.cur.fetch_arrow_table()
            if is_query(s):
                result = t
        return result

    def cleanup(self, stmts):
        for s in cleanup_statements(stmts):
            try:
                execute(self.cur, s)
            except Exception:
                pass


class DataFusion:
    name = "DataFusion"

    def __init__(self, files):
        import datafusion
        self.ctx = datafusion.SessionContext()
        for t, f in files.items():
            self.ctx.register_parquet(t, f)

    def run(self, stmts):
        result = None
        for s in stmts:
            df = self.ctx.sql(s)  # DDL runs here
            if is_query(s):
                result = df.to_arrow_table()
        return result

    def cleanup(self, stmts):
        for s in cleanup_statements(stmts):
            try:
                self.ctx.sql(s)
            except Exception:
                pass


class DuckDB:
    name = "DuckDB"

    def __init__(self, files):
        import duckdb
        self.con = duckdb.connect()
        for t, f in files.items():
            self.con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{f}')")

    def run(self, stmts):
        result = None
        for s in stmts:
            if is_query(s):
                rel = self.con.sql(s)
                result = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
            else:
                self.con.execute(s).fetchall()
        return result

    def cleanup(self, stmts):
        for s in cleanup_statements(stmts):
            try:
                self.con.execute(s)
            except Exception:
                pass


def timed(engine, stmts, runs):
    """One warm-up, then the best of `runs`; returns (seconds, result) or (error text, None)."""
    try:
        result = engine.run(stmts)
        best = math.inf
        for _ in range(runs):
            t0 = time.perf_counter()
            result = engine.run(stmts)
            best = min(best, time.perf_counter() - t0)
        return best, result
    except Exception as e:  # noqa: BLE001 - any failure is reported per query
        engine.cleanup(stmts)
        return " ".join(str(e).split()), None


# ---------------------------------------------------------------------------------------------
# Comparing results


def normalise(table):
    """Rows as tuples of Python values: numbers as floats, dates as ISO text."""
    def value(v):
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, (int, float, decimal.Decimal)):
            return float(v)
        if isinstance(v, datetime.datetime):
            return v.date().isoformat() if v.time() == datetime.time() else v.isoformat()
        if isinstance(v, datetime.date):
            return v.isoformat()
        if isinstance(v, str):
            return v.rstrip()
        return v
    columns = [c.to_pylist() for c in table.columns]
    return [tuple(value(v) for v in row) for row in zip(*columns)]


def values_equal(a, b):
    if isinstance(a, float) and isinstance(b, float):
        # Exact decimals in one engine, doubles or decimals of another scale in another.
        return abs(a - b) <= max(1e-6 * max(abs(a), abs(b)), 1e-4)
    return a == b


def rows_equal(x, y):
    return len(x) == len(y) and all(values_equal(a, b) for a, b in zip(x, y))


def sort_key(row):
    return tuple((0, "") if v is None else (1, round(v, 2), "") if isinstance(v, float)
                 else (2, 0, str(v)) for v in row)


def compare(a, b, a_name, b_name):
    """Returns (difference or None, same order)."""
    if len(a) != len(b):
        return f"{len(a)} rows from {a_name}, {len(b)} from {b_name}", False
    if a and len(a[0]) != len(b[0]):
        return f"{len(a[0])} columns from {a_name}, {len(b[0])} from {b_name}", False
    if all(rows_equal(x, y) for x, y in zip(a, b)):
        return None, True
    for x, y in zip(sorted(a, key=sort_key), sorted(b, key=sort_key)):
        if not rows_equal(x, y):
            return f"{a_name} has {short(x)}, {b_name} {short(y)} (rows sorted)", False
    return None, False


def short(row):
    text = repr(row)
    return text if len(text) <= 200 else text[:200] + "...)"


def check(results):
    """results: engine name -> normalised rows or None. Returns (status, notes)."""
    nyala, refs = results["Nyala"], [(n, r) for n, r in results.items() if n != "Nyala"]
    refs = [(n, r) for n, r in refs if r is not None]
    if nyala is None:
        return "FAILED", []
    if not refs:
        return "unchecked", []
    notes, status = [], "agree"
    ordered = {}
    for name, rows in refs:
        diff, same_order = compare(nyala, rows, "Nyala", name)
        ordered[name] = same_order
        if diff:
            status = "DIFFER"
            notes.append(diff)
    if len(refs) == 2:
        diff, refs_same_order = compare(refs[0][1], refs[1][1], refs[0][0], refs[1][0])
        if diff:
            notes.append(f"the references differ too: {diff}")
        elif status == "agree" and refs_same_order and not all(ordered.values()):
            status = "DIFFER"
            notes.append("same rows in another order than DataFusion and DuckDB")
    return status, notes


# ---------------------------------------------------------------------------------------------


def parse_queries(text):
    if not text:
        return list(range(1, 23))
    out = []
    for part in text.split(","):
        part = part.strip().lower().lstrip("q")
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi.lstrip("q")) + 1))
        elif part:
            out.append(int(part))
    bad = [q for q in out if not 1 <= q <= 22]
    if bad:
        sys.exit(f"tpch: no TPC-H query {bad[0]} (1 to 22)")
    return out


def fmt_secs(v):
    return f"{v:.3f}" if isinstance(v, float) else "error"


def fmt_ratio(a, b):
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def results_name(scale):
    """The results file's name: tpch at scale 1, else e.g. tpch_sf10."""
    return "tpch" if scale == 1 else f"tpch_sf{scale:g}".replace(".", "_")


def results_report(scale, runs, buckets, versions, load_stats, size_rows, query_rows,
                   load_at_start=None):
    """The run as bench/results/tpch.json holds it (see bench/results.py). `versions`:
    DataFusion's and DuckDB's; `load_stats`: load()'s; `size_rows`: [when, tablets on disk
    MiB, in memory MiB, data directory MiB or None, its ratios to the Parquet files (Snappy,
    LZ4) or None]; `query_rows`: [(query, rows, Nyala s, DataFusion s, DuckDB s, result)],
    a time being a float or an error text."""
    def secs(v):
        return round(v, 3) if isinstance(v, float) else None

    def ratio(a, b):
        return round(a / b, 2) if isinstance(a, float) and isinstance(b, float) and b > 0 else None

    report = Report(
        results_name(scale),
        f"TPC-H SF{scale:g} over Flight SQL against DataFusion and DuckDB, best of {runs} runs "
        f"after a warm-up",
        baseline=f"DataFusion {versions[0]} (Python) and DuckDB {versions[1]} reading the same "
                 f"Parquet files, same run", load_at_start=load_at_start)
    rows = report.table("Queries (seconds, each including fetching the whole result)",
                        ["query", "rows", "Nyala s", "DataFusion s", "DuckDB s",
                         "Nyala/DataFusion", "Nyala/DuckDB", "result"])
    for q, count, n, d, k, status in query_rows:
        rows.append([f"q{q:02d}", count, secs(n), secs(d), secs(k), ratio(n, d), ratio(n, k),
                     status])
    ok = [r for r in query_rows if all(isinstance(v, float) for v in r[2:5])]
    if ok:
        tn, td, tk = (sum(r[i] for r in ok) for i in (2, 3, 4))
        rows.append([f"total ({len(ok)} of {len(query_rows)})", None, secs(tn), secs(td),
                     secs(tk), ratio(tn, td), ratio(tn, tk), ""])
    slow = [f"q{r[0]:02d}" for r in ok if r[2] > 1.5 * r[3]]
    report.note(f"Queries above 1.5x DataFusion: {len(slow)}"
                + (f" ({', '.join(slow)})." if slow else "."))
    if load_stats:
        load_rows = report.table(f"Load through Flight SQL bulk ingest, {buckets} hash buckets",
                                 ["table", "rows", "seconds", "rows/s"])
        for table, n, s in load_stats:
            load_rows.append([table, n, round(s, 2), round(n / s) if s > 0 else None])
        n, s = sum(x[1] for x in load_stats), sum(x[2] for x in load_stats)
        load_rows.append(["all", n, round(s, 2), round(n / s) if s > 0 else None])
    report.table("Size", ["when", "tablets on disk MiB", "tablets in memory MiB",
                          "data directory MiB", "data directory / Parquet (Snappy)",
                          "data directory / Parquet (LZ4)"]).extend(size_rows)
    report.note("Targets: the total at most 0.8x DataFusion's; no query above 1.5x DataFusion; "
                "the data directory at most 1.1x the same rows in Parquet with LZ4.")
    return report


def add_run_arguments(parser, runs, buckets, settle):
    """--scale, --runs, --queries, --buckets and --settle, with these defaults."""
    parser.add_argument("--scale", type=float, default=1.0, help="scale factor (default 1)")
    parser.add_argument("--runs", type=int, default=runs,
                        help="timed runs per query after one warm-up; the best counts")
    parser.add_argument("--queries", help="queries to run, e.g. 1,3,15 or 1-5 (default all 22)")
    parser.add_argument("--buckets", type=int, default=buckets,
                        help=f"hash buckets of the six large tables (default {buckets})")
    parser.add_argument("--settle", type=float, default=settle,
                        help="seconds to wait at most after the load for the tablets to flush "
                             f"(default {settle:g}; 0: query at once)")


def main():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/nyala-target")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nyala", default=os.path.join(target, "release", "nyala"),
                   help="the nyala binary to start (default: %(default)s)")
    p.add_argument("--connect", metavar="URI",
                   help="use a running server (grpc://HOST:PORT) instead of starting one; its "
                        "TPC-H tables are dropped and loaded again unless --skip-load")
    p.add_argument("--skip-load", action="store_true",
                   help="with --connect: query the tables as they are")
    add_run_arguments(p, runs=3, buckets=8, settle=60)
    p.add_argument("--batch-rows", type=int, default=65536, help="rows per ingest batch")
    p.add_argument("--timeout", type=float, default=600,
                   help="Nyala statement timeout per statement in seconds (0: none)")
    p.add_argument("--keep-data-dir", action="store_true",
                   help="keep the started server's data directory (and log) after the run")
    add_json_argument(p, None)
    args = p.parse_args()
    args.runs = max(args.runs, 1)
    if args.json is None:
        args.json = default_path(results_name(args.scale))
    if args.skip_load and not args.connect:
        p.error("--skip-load needs --connect (a started server begins empty)")
    queries = parse_queries(args.queries)

    ensure_packages()
    import adbc_driver_flightsql
    import adbc_driver_flightsql.dbapi as flightsql
    import datafusion
    import duckdb
    import pyarrow as pa

    files = generate_data(args.scale)
    parquet_bytes = sum(os.path.getsize(f) for f in files.values())
    lz4_bytes = lz4_parquet_bytes(files)

    texts = {}
    for q in queries:
        with open(os.path.join(QUERY_DIR, f"q{q:02d}.sql")) as f:
            texts[q] = split_statements(f.read())

    server = None
    interrupted = []

    def on_signal(signum, _frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    failed = False
    conn = None
    engines = []
    stats, size_rows, query_rows = [], [], []
    try:
        if args.connect:
            uri = args.connect
        else:
            server = Server(args.nyala, args.keep_data_dir)
            uri = server.uri
        load1 = os.getloadavg()[0]
        print(f"TPC-H SF {args.scale:g}, {args.runs} runs per query after one warm-up (best "
              f"counts), {os.cpu_count()} CPUs, load average {load1:.2f}")
        print(f"Nyala: {args.connect or args.nyala} at {uri}"
              + ("" if args.connect else ", fresh data directory")
              + f"; ADBC Flight SQL driver {adbc_driver_flightsql.__version__}")
        print(f"DataFusion {datafusion.__version__} (Python), DuckDB {duckdb.__version__}, "
              f"pyarrow {pa.__version__}; both read the Parquet files ({parquet_bytes / 2**20:.1f} MiB)")

        conn = flightsql.connect(uri, autocommit=True)
        if not args.skip_load:
            print(f"loading through Flight SQL bulk ingest, {args.batch_rows}-row batches, "
                  f"{args.buckets} hash buckets:")
            stats = load(conn, files, args.buckets, args.batch_rows)
            rows = sum(s[1] for s in stats)
            secs = sum(s[2] for s in stats)
            print(f"  {'all':<9} {rows:>11,} rows in {secs:.1f} s: {rows / secs:,.0f} rows/s, "
                  f"{parquet_bytes / 2**20 / secs:.1f} MiB/s of Parquet")

        def sizes(when):
            disk, memory = partition_bytes(conn)
            line = (f"size {when}: tablets {disk / 2**20:.1f} MiB on disk + {memory / 2**20:.1f} "
                    f"MiB in memory")
            size_rows.append([when, round(disk / 2**20, 1), round(memory / 2**20, 1), None, None,
                              None])
            if server:
                total = dir_bytes(server.data_dir)
                size_rows[-1][3:] = [round(total / 2**20, 1), round(total / parquet_bytes, 2),
                                     round(total / lz4_bytes, 2)]
                line += (f"; data directory {total / 2**20:.1f} MiB = "
                         f"{total / parquet_bytes:.2f}x the Parquet files "
                         f"({parquet_bytes / 2**20:.1f} MiB, Snappy), "
                         f"{total / lz4_bytes:.2f}x the same rows in Parquet with LZ4 "
                         f"({lz4_bytes / 2**20:.1f} MiB)")
            print(line)

        if not args.skip_load:
            sizes("right after the load")
            settle(conn, args.settle)
            sizes("before the queries")

        engines = [Nyala(conn), DataFusion(files), DuckDB(files)]
        if args.timeout > 0:
            execute(engines[0].cur, f"SET statement_timeout = '{int(args.timeout * 1000)}ms'")
        partitions = engines[1].ctx.sql("SHOW datafusion.execution.target_partitions").to_pylist()
        threads = engines[2].con.sql("SELECT current_setting('threads')").fetchall()[0][0]
        print(f"DataFusion target_partitions {partitions[0]['value']}, DuckDB threads {threads}")
        print()
        header = (f"{'query':<6}{'rows':>6}{'Nyala s':>10}{'DataFusion s':>14}{'DuckDB s':>10}"
                  f"{'Nyala/DF':>10}{'Nyala/DuckDB':>14}  result")
        print(header)
        print("-" * len(header))
        rows_out = []
        for q in queries:
            times, results = {}, {}
            for engine in engines:
                secs, table = timed(engine, texts[q], args.runs)
                times[engine.name] = secs
                results[engine.name] = normalise(table) if table is not None else None
            status, notes = check(results)
            for e in engines:
                if results[e.name] is None:
                    notes.insert(0, f"{e.name} failed: {times[e.name]}")
                    if e.name != "Nyala":
                        status = "FAILED" if status == "unchecked" else status
            if status != "agree" or any(results[e.name] is None for e in engines):
                failed = True
            n, d, k = times["Nyala"], times["DataFusion"], times["DuckDB"]
            counts = [len(r) for r in results.values() if r is not None]
            print(f"q{q:02d}  {counts[0] if counts else '-':>6}{fmt_secs(n):>10}{fmt_secs(d):>14}{fmt_secs(k):>10}"
                  f"{fmt_ratio(n, d):>10}{fmt_ratio(n, k):>14}  {status}", flush=True)
            for note in notes:
                print(f"      {note}")
            rows_out.append((q, n, d, k))
            query_rows.append((q, counts[0] if counts else None, n, d, k, status))
            if server and not server.alive():
                print("tpch: nyala serve exited", file=sys.stderr)
                failed = True
                break

        print("-" * len(header))
        ok = [r for r in rows_out if all(isinstance(v, float) for v in r[1:])]
        tn, td, tk = (sum(r[i] for r in ok) for i in (1, 2, 3))
        print(f"{'total':<12}{tn:>10.3f}{td:>14.3f}{tk:>10.3f}{fmt_ratio(tn, td):>10}"
              f"{fmt_ratio(tn, tk):>14}  ({len(ok)} of {len(rows_out)} queries that all three ran)")
        slow = [f"q{r[0]:02d}" for r in ok if r[1] > 1.5 * r[2]]
        print(f"queries above 1.5x DataFusion: {len(slow)}" + (f" ({', '.join(slow)})" if slow else ""))
        if not args.skip_load:
            sizes("after the queries")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        results_report(args.scale, args.runs, args.buckets,
                       (datafusion.__version__, duckdb.__version__), stats, size_rows,
                       query_rows, load1).write(args.json)
    except KeyboardInterrupt:
        print("tpch: interrupted", file=sys.stderr)
        failed = True
    finally:
        for closable in ([engines[0].cur] if engines else []) + ([conn] if conn else []):
            try:
                closable.close()
            except Exception:
                pass
        if server:
            server.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
