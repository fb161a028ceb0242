#!/usr/bin/env python3
"""Queue tables: enqueue throughput and commit-to-consumer latency, one node or 3 replicas.

    python3 bench/queue_bench.py [--seconds 10 | --messages N] [--threads 8,48] [--queues 6]
                           [--cluster | --connect grpc://HOST:PORT [--replicas N]]
                           [--batch-shapes spread,per-queue] [--rate 200] [--latency-seconds 5]
                           [--latency-clients adbc,pyarrow]
                           [--keep-data-dir]

Starts its own `nyala serve` on a fresh temporary data directory (the binary is $NYALA_BIN,
default $CARGO_TARGET_DIR/release/nyala, CARGO_TARGET_DIR defaulting to ~/.cache/nyala-target),
or with --cluster a `nyala master` and three `nyala tserver`s on this machine (tables created
WITH (replicas = 3), statements through the master's Flight SQL), or uses a running server
(--connect). Each measurement runs on a fresh queue table

    CREATE TABLE <t> (queue STRING, pos BIGINT GENERATED ALWAYS AS POSITION, body STRING,
                      PRIMARY KEY (queue, pos)) DISTRIBUTE BY HASH (queue) INTO 6 BUCKETS

and measures, over Flight SQL (the ADBC driver; for bulk ingest also pyarrow's Flight client):

1. enqueue throughput as the Kafka-vs-Kudu comparison tests it: batches of 1 024 messages with
   100-byte bodies, in each shape of --batch-shapes: spread over the queues (row i to queue
   i mod --queues: a batch writes several tablets, so it is a transaction), and one queue per
   batch (the blog's enqueueMessages(queue, messages); the producers' batches take the queues in
   turn, and each is one tablet's single write); --threads producers with a connection each (each count of a list in turn, on a fresh table: a log round
   carries the batches that arrive while the previous one is written, so the server's
   throughput shows at enough producers), for --seconds (or --messages in all); with bulk ingest
   (a Flight SQL CommandStatementIngest per batch, the database assigning the positions) from
   each client of --ingest-clients: `adbc_ingest` of the ADBC driver (written in Go), and
   `do_put` of pyarrow's Flight client (C++), which takes about a third of the ADBC driver's CPU
   per message on this machine's shared cores; and with
   multi-row INSERT statements (--insert prepared: a prepared INSERT with the batch bound as its
   parameters). Prints messages/s, MB/s of bodies, the latency of one call and the CPU time
   this process (the producers) took per message; then checks that
   the table holds every message acknowledged.
2. commit-to-consumer latency: one consumer per queue (a connection each) long-polls
   `SELECT pos, body FROM tail(t, <last>, 5000) WHERE queue = '<q>' LIMIT 1000`; one producer
   inserts single messages at --rate for --latency-seconds, round robin over the queues, each
   body carrying its send time (time.perf_counter_ns of this process, taken just before the
   INSERT). The consumer takes the time when the answer arrives: receive minus send includes the
   INSERT's round trip, the wake-up and the tail's reply. Prints p50/p90/p99/max in ms, and
   the CPU this process and (when this script started them) each server process took per
   message while the producer sent, with how busy the machine's CPUs were. Checks
   that every queue received each message exactly once, in the order sent, at increasing
   positions (a correctness check: FAILED lines and a non-zero exit code otherwise). Runs
   once per client of --latency-clients, each on a fresh table: the ADBC driver, then
   pyarrow's Flight client (GetFlightInfo and DoGet per poll, DoPut per INSERT). On this
   2-core machine the client shares the servers' CPUs, and the ADBC driver (Go, called
   through cgo) takes about three times pyarrow's CPU per message and adds a millisecond to
   each query's round trip, so the two show the server's part and the whole of one Python
   user's path.

Ends with a summary line and the targets for reference (not asserted), and writes the run's
results to bench/results/queue.json (queue_cluster.json with --cluster; --json) for
docs/benchmarks.md. Timings are never asserted: the exit code is non-zero only when a check fails or a statement fails. Every
process the script started is stopped on exit, also after an error or Ctrl-C. Client and
servers share this machine's CPUs; the load average is printed at the start and the end.
Needs pyarrow and adbc-driver-flightsql (tests/python/requirements.txt).
"""
import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# The Flight SQL messages the tests encode by hand (pyarrow has none): a bulk ingest's
# descriptor and its answer, for the pyarrow producers.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from flight_sql_messages import (decode_fields, statement_ingest, statement_query,  # noqa: E402
                                 statement_update)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import Report, default_path, process_cpu_seconds  # noqa: E402

BATCH = 1024          # messages per enqueue call
BODY_BYTES = 100      # bytes of each message body
TAIL_LIMIT = 1000     # rows a long poll returns at most
TARGETS = ("targets (for reference, not asserted): >= 1 M msg/s one node, >= 300 k msg/s with "
           "3 replicas, wake-up p99 <= 10 ms")


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Processes

try:
    import ctypes
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except (ImportError, OSError):
    _LIBC = None


def _die_with_parent():
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL (Linux)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Processes:
    """The nyala processes this script started, each logging to a file in `work`."""

    def __init__(self, binary, work):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"queue: no nyala binary at {binary} (build it with `cargo build "
                             f"--release -p nyala-flight --bin nyala`, or set NYALA_BIN, or give "
                             f"--connect URI)")
        self.binary = binary
        self.work = work
        self.procs = []  # (name, Popen, log path, log file)

    def start(self, name, args, pattern, timeout=120):
        """Starts `nyala ARGS`; waits for its first line, which must match `pattern`; returns
        the match."""
        path = os.path.join(self.work, f"{name}.log")
        out = open(path, "w")
        # Its own session: Ctrl-C reaches this script only, which stops the servers itself.
        proc = subprocess.Popen([self.binary, *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "NO_COLOR": "1"},
                                preexec_fn=_die_with_parent)
        self.procs.append((name, proc, path, out))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(path) as f:
                first = f.readline()
            if first.endswith("\n"):
                m = re.search(pattern, first)
                if m:
                    return m
                raise RuntimeError(f"{name}: unexpected first line {first.strip()!r}")
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} before listening")
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not announce its address within {timeout} s")

    def dead(self):
        return [(n, p.returncode) for n, p, _, _ in self.procs if p.poll() is not None]

    def stop(self, show_logs=False, quiet=False, grace=10):
        """SIGTERM, then SIGKILL after `grace` seconds. Prints the end of each log if
        `show_logs`, or (unless `quiet`) of a process that did not exit cleanly."""
        for _, proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for name, proc, path, out in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()
            if show_logs or (not quiet and proc.returncode not in (0, -signal.SIGTERM)):
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-20:]
                if tail:
                    print(f"--- last lines of {path} (exit code {proc.returncode})",
                          file=sys.stderr)
                    print("\n".join(tail), file=sys.stderr)
        self.procs = []


def start_single(procs, args):
    data = os.path.join(procs.work, "data")
    extra = ["--memory-limit-mb", str(args.memory_limit_mb)] if args.memory_limit_mb else []
    m = procs.start("serve", ["serve", "--data-dir", data, "--listen", "127.0.0.1:0",
                              "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0", *extra],
                    r"Nyala listening on (grpc://\S+)")
    return m.group(1)


def start_cluster(procs, args):
    """A master and `args.tservers` tablet servers, all on loopback ports the OS picks."""
    m = procs.start("master", ["master", "--rpc-addr", "127.0.0.1:0", "--flight-addr",
                               "127.0.0.1:0", "--data-dir", os.path.join(procs.work, "master")],
                    r"Nyala master listening on (grpc://\S+).*internal RPC ([^\s,]+)")
    uri, rpc = m.group(1), m.group(2)
    extra = ["--memory-limit-mb", str(args.memory_limit_mb)] if args.memory_limit_mb else []
    for i in range(args.tservers):
        procs.start(f"tserver{i + 1}",
                    ["tserver", "--rpc-addr", "127.0.0.1:0", "--masters", rpc, "--data-dir",
                     os.path.join(procs.work, f"tserver{i + 1}"), *extra],
                    r"Nyala tablet server \d+ listening on (\S+)")
    return uri


# ---------------------------------------------------------------------------------------------
# SQL helpers (statements run without a prepare round trip: the DB-API cursor prepares each new
# statement text, which would add a request to every INSERT and every poll)


def connect(uri):
    import adbc_driver_flightsql.dbapi as flightsql
    return flightsql.connect(uri, autocommit=True)


def query(cur, sql):
    import pyarrow as pa
    stmt = cur.adbc_statement
    stmt.set_sql_query(sql)
    handle, _ = stmt.execute_query()
    return pa.RecordBatchReader._import_from_c(handle.address).read_all()


def update(cur, sql):
    stmt = cur.adbc_statement
    stmt.set_sql_query(sql)
    return stmt.execute_update()


def one_line(e):
    return " ".join(str(e).split())[:500]


def create_queue_table(cur, name, queues_buckets, replicas, ready_secs):
    """Drops and creates the queue table; retries CREATE for `ready_secs` (a cluster's tablet
    servers register with their first heartbeats)."""
    update(cur, f"DROP TABLE IF EXISTS {name}")
    sql = (f"CREATE TABLE {name} (queue STRING, pos BIGINT GENERATED ALWAYS AS POSITION, "
           f"body STRING, PRIMARY KEY (queue, pos)) DISTRIBUTE BY HASH (queue) INTO "
           f"{queues_buckets} BUCKETS")
    if replicas:
        sql += f" WITH (replicas = {replicas})"
    return create_retried(cur, sql, ready_secs)


def create_retried(cur, sql, ready_secs):
    """Runs CREATE TABLE `sql`, retried for `ready_secs` (a cluster's tablet servers register
    with their first heartbeats); returns the tries it took."""
    deadline = time.monotonic() + ready_secs
    tries = 0
    while True:
        tries += 1
        try:
            update(cur, sql)
            return tries
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            if time.monotonic() >= deadline:
                raise RuntimeError(f"CREATE TABLE failed for {ready_secs:g} s: {one_line(e)}")
            time.sleep(0.2)


def warm_up(cur, table, queues, ready_secs):
    """One INSERT of a row per queue, retried for `ready_secs`: a new table's tablets may still
    be electing leaders. Returns the rows written."""
    values = ", ".join(f"('{q}', 'warm-up')" for q in queues)
    deadline = time.monotonic() + ready_secs
    while True:
        try:
            update(cur, f"INSERT INTO {table} (queue, body) VALUES {values}")
            return len(queues)
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the first INSERT failed for {ready_secs:g} s: {one_line(e)}")
            time.sleep(0.2)


def drop_table(cur, name):
    try:
        update(cur, f"DROP TABLE IF EXISTS {name}")
    except Exception:  # noqa: BLE001 - best effort
        pass


def count_rows(cur, table, expected, wait_secs=5.0):
    """The table's row count; read again for a few seconds while it differs from `expected`.
    Returns (count, the counts read before, seconds until the last read)."""
    t0 = time.perf_counter()
    earlier = []
    while True:
        n = query(cur, f"SELECT count(*) FROM {table}").column(0)[0].as_py()
        waited = time.perf_counter() - t0
        if n == expected or waited >= wait_secs:
            return n, earlier, waited
        earlier.append(n)
        time.sleep(0.2)


def cpu_snapshot(procs):
    """CPU seconds used so far by this process and by each server process `procs` started
    (by name), and the machine's busy and total CPU seconds (from /proc/stat; None where
    that cannot be read)."""
    times = os.times()
    servers = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name, proc, _, _ in (procs.procs if procs else []):
        try:
            servers[name] = process_cpu_seconds(proc.pid)
        except (OSError, ValueError, IndexError):
            pass
    try:
        with open("/proc/stat") as f:
            jiffies = [int(x) for x in f.readline().split()[1:9]]
        machine = ((sum(jiffies) - jiffies[3] - jiffies[4]) / tick, sum(jiffies) / tick)
    except (OSError, ValueError, IndexError):
        machine = None
    return times.user + times.system, servers, machine


def cpu_per_message(before, after, messages):
    """What `cpu_snapshot`s `before` and `after` say per message, as text."""
    per = lambda secs: f"{secs * 1e3 / max(messages, 1):.2f}"  # noqa: E731
    text = f"this client {per(after[0] - before[0])}"
    servers = {n: after[1][n] - before[1][n] for n in after[1] if n in before[1]}
    if servers:
        text += f", Nyala {per(sum(servers.values()))} (" + ", ".join(
            f"{n} {per(secs)}" for n, secs in servers.items()) + ")"
    text += " ms of CPU per message"
    if before[2] and after[2]:
        busy, total = after[2][0] - before[2][0], after[2][1] - before[2][1]
        text += f"; the machine's CPUs {100 * busy / max(total, 1e-9):.0f} % busy"
    return text


def pct(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(math.ceil(p / 100 * len(sorted_values)) - 1, 0)
    return sorted_values[min(k, len(sorted_values) - 1)]


def fmt_rate(v):
    return f"{v:,.0f}".replace(",", " ")


def queue_names(n):
    return [f"q{i}" for i in range(n)]


# ---------------------------------------------------------------------------------------------
# 1. Enqueue throughput


# How a batch's messages are assigned to queues: spread (row i to queue i mod --queues: its
# rows go to several tablets, so each batch is a transaction), or one queue per batch, as the
# blog's enqueueMessages(queue, messages) sends them (each batch is one tablet's single write).
BATCH_SHAPES = {"spread": "spread over the queues", "per-queue": "one queue each"}


def make_batches(queues, count, seed, shape):
    """`count` distinct batches of BATCH messages: (pyarrow table, VALUES SQL text). With
    shape per-queue, batch j goes to queue seed + j (mod the queues), so the producers' batches
    take the queues in turn."""
    import random
    import pyarrow as pa
    rnd = random.Random(seed)
    out = []
    for j in range(count):
        if shape == "spread":
            qs = [queues[i % len(queues)] for i in range(BATCH)]
        else:
            qs = [queues[(seed + j) % len(queues)]] * BATCH
        bodies = [rnd.getrandbits(BODY_BYTES * 4).to_bytes(BODY_BYTES // 2, "big").hex()
                  for _ in range(BATCH)]
        table = pa.table({"queue": pa.array(qs, pa.string()), "body": pa.array(bodies, pa.string())})
        values = ", ".join(f"('{q}', '{b}')" for q, b in zip(qs, bodies))
        out.append((table, values))
    return out


class EnqueueWorker(threading.Thread):
    def __init__(self, uri, table, method, shape, queues, quota, barrier, clock, seed):
        super().__init__(daemon=True)
        self.uri, self.table, self.method, self.shape = uri, table, method, shape
        self.queues, self.quota, self.barrier, self.clock, self.seed = \
            queues, quota, barrier, clock, seed
        self.sent = 0
        self.calls = []
        self.error = None      # why the producer stopped early
        self.failures = []     # (seconds the call took, error) of each failed call
        self.unknown = 0       # messages of failed calls whose outcome the server did not know
        self.finished = None

    def call(self, cur, table, values):
        if self.method == "ingest":
            n = cur.adbc_ingest(self.table, table, mode="append")
            if n not in (-1, None, BATCH):
                raise RuntimeError(f"adbc_ingest reported {n} rows for a batch of {BATCH}")
        elif self.method == "flight":
            client, descriptor = cur
            writer, reader = client.do_put(descriptor, table.schema)
            try:
                writer.write_table(table)
                writer.done_writing()
                # DoPutUpdateResult{record_count = 1}
                answer = reader.read()
                n = decode_fields(answer.to_pybytes() if answer else b"").get(1, [None])[0]
            finally:
                writer.close()
            if n != BATCH:
                raise RuntimeError(f"do_put reported {n} rows for a batch of {BATCH}")
        elif self.method == "prepared":
            cur.executemany(f"INSERT INTO {self.table} (queue, body) VALUES (?, ?)", table)
        else:
            update(cur, f"INSERT INTO {self.table} (queue, body) VALUES {values}")

    def run(self):
        conn = cur = None
        try:
            if self.method == "flight":
                import pyarrow.flight as flight
                conn = flight.FlightClient(self.uri)
                cur = (conn, statement_ingest(self.table))  # (a tuple has no close: skipped)
            else:
                conn = connect(self.uri)
                cur = conn.cursor()
            batches = make_batches(self.queues, 8, self.seed, self.shape)
        except Exception as e:  # noqa: BLE001
            self.error = f"connect: {one_line(e)}"
            self.barrier.abort()
            return
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            i = 0
            in_a_row = 0
            while not self.clock["stop"].is_set():
                if self.quota is not None and self.sent >= self.quota:
                    break
                if self.quota is None and time.perf_counter() >= self.clock["deadline"]:
                    break
                table, values = batches[i % len(batches)]
                i += 1
                t = time.perf_counter()
                try:
                    self.call(cur, table, values)
                except Exception as e:  # noqa: BLE001 - counted; the producer goes on
                    # A failed call is sent again, as a producer would (the batches are alike).
                    text = one_line(e)
                    self.failures.append((time.perf_counter() - t, text))
                    if "outcome is unknown" in text:
                        self.unknown += BATCH
                    in_a_row += 1
                    if in_a_row >= 20:
                        self.error = f"gave up after {in_a_row} failed calls in a row"
                        break
                    time.sleep(0.01)
                    continue
                in_a_row = 0
                self.calls.append(time.perf_counter() - t)
                self.sent += BATCH
        except Exception as e:  # noqa: BLE001 - reported as a failure of the phase
            self.error = one_line(e)
        finally:
            self.finished = time.perf_counter()
            for c in (cur, conn):
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass


def producers(n):
    return f"{n} producer{'s' if n != 1 else ''}"


def producer_counts(text):
    """--threads: one positive count or a comma-separated list of them."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a list of counts: {text!r}")
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"producer counts must be positive: {text!r}")
    return counts


INGEST_CLIENTS = {"adbc": ("ingest", "bulk ingest (ADBC)"),
                  "pyarrow": ("flight", "bulk ingest (pyarrow Flight)")}


def client_list(choices):
    """The parser of an option that takes a comma-separated list of the keys of `choices`."""
    def parse(text):
        clients = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [c for c in clients if c not in choices]
        if not clients or unknown:
            raise argparse.ArgumentTypeError(f"not a list of {', '.join(choices)}: {text!r}")
        return clients
    return parse


def enqueue(uri, setup_cur, args, method, shape, label, threads, stop, rows=None):
    """One enqueue measurement with `threads` producers sending batches of `shape` on a fresh
    table; returns (messages/s or None, failed). Appends its figures to `rows` (a results
    table's, see ENQUEUE_COLUMNS)."""
    table = f"{args.table}_{method}"
    create_queue_table(setup_cur, table, args.buckets, args.replicas, args.ready_secs)
    queues = queue_names(args.queues)
    t = time.perf_counter()
    warm = warm_up(setup_cur, table, queues, args.ready_secs)
    log(f"  ({table}: created; its first INSERT took {time.perf_counter() - t:.2f} s)")
    if args.messages:
        calls = math.ceil(args.messages / BATCH)
        quotas = [(calls // threads + (1 if i < calls % threads else 0)) * BATCH
                  for i in range(threads)]
    else:
        quotas = [None] * threads
    barrier = threading.Barrier(threads + 1)
    clock = {"stop": stop, "deadline": math.inf}
    workers = [EnqueueWorker(uri, table, method, shape, queues, quotas[i], barrier, clock, seed=i)
               for i in range(threads)]
    for w in workers:
        w.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    t0, cpu0 = time.perf_counter(), os.times()
    clock["deadline"] = t0 + args.seconds
    for w in workers:
        while w.is_alive():
            w.join(0.2)
    ends = [w.finished for w in workers if w.finished is not None]
    secs = max(max(ends, default=t0) - t0, 1e-9)
    sent = sum(w.sent for w in workers)
    calls = sorted(c for w in workers for c in w.calls)
    rate = sent / secs
    cpu1 = os.times()
    client_cpu = cpu1.user + cpu1.system - cpu0.user - cpu0.system
    log(f"  {label:<62} {sent:>11,} msgs in {secs:6.2f} s: {fmt_rate(rate):>11} msg/s "
        f"{sent * BODY_BYTES / 1e6 / secs:8.1f} MB/s; one call p50 {pct(calls, 50) * 1e3:.1f} ms "
        f"p99 {pct(calls, 99) * 1e3:.1f} ms max {max(calls, default=0) * 1e3:.1f} ms; "
        f"producers' CPU {client_cpu * 1e6 / max(sent, 1):.2f} µs/msg")
    if rows is not None:
        rows.append([label.split(", ")[0], BATCH_SHAPES[shape], threads, round(rate),
                     round(sent * BODY_BYTES / 1e6 / secs, 1),
                     round(pct(calls, 50) * 1e3, 2) if calls else None,
                     round(pct(calls, 99) * 1e3, 2) if calls else None,
                     round(client_cpu * 1e6 / max(sent, 1), 2)])
    failed = False
    failures = [f for w in workers for f in w.failures]
    if failures:
        kinds = {}
        for took, text in failures:
            kinds.setdefault(text, []).append(took)
        log(f"  FAILED: {label}: {len(failures)} of {len(failures) + len(calls)} calls failed "
            f"(each sent again):")
        for text, times in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            log(f"    {len(times)}x after {min(times):.2f}-{max(times):.2f} s: {text}")
        failed = True
    for i, w in enumerate(workers):
        if w.error:
            log(f"  FAILED: {label} producer {i + 1}: {w.error}")
            failed = True
    unknown = sum(w.unknown for w in workers)
    try:
        stored, earlier, waited = count_rows(setup_cur, table, sent + warm)
        stored -= warm
        earlier = [n - warm for n in earlier]
        if sent < stored <= sent + unknown:
            log(f"  note: {label}: the table holds {stored:,} rows: {sent:,} acknowledged and "
                f"{stored - sent:,} of calls whose outcome was unknown")
        elif stored != sent:
            log(f"  FAILED: {label}: the table holds {stored:,} rows, {sent:,} were acknowledged "
                f"(still {waited:.1f} s after the last acknowledgement)")
            failed = True
        elif earlier:
            log(f"  note: {label}: count(*) read {', '.join(f'{n:,}' for n in earlier[:3])} "
                f"first and matched the acknowledged {sent:,} rows {waited:.1f} s later")
    except Exception as e:  # noqa: BLE001
        log(f"  FAILED: {label}: counting the rows: {one_line(e)}")
        failed = True
    if not args.keep_tables:
        drop_table(setup_cur, table)
    return (None if failed and sent == 0 else rate), failed


# ---------------------------------------------------------------------------------------------
# 2. Commit-to-consumer latency


def make_body(kind, seq, send_ns):
    head = f"{kind}:{seq}:{send_ns}:"
    return head + "x" * max(BODY_BYTES - len(head), 0)


class AdbcSession:
    """A connection of the ADBC Flight SQL driver (written in Go, called through cgo)."""

    def __init__(self, uri):
        self.conn = connect(uri)
        self.cur = self.conn.cursor()

    def query(self, sql):
        return query(self.cur, sql)

    def update(self, sql):
        update(self.cur, sql)

    def close(self):
        for c in (self.cur, self.conn):
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


class FlightSession:
    """pyarrow's Flight client (C++) speaking Flight SQL: a statement's GetFlightInfo and
    DoGet, an update's DoPut."""

    def __init__(self, uri):
        import pyarrow.flight as flight
        self.client = flight.FlightClient(uri)

    def query(self, sql):
        info = self.client.get_flight_info(statement_query(sql))
        tables = [self.client.do_get(e.ticket).read_all() for e in info.endpoints]
        import pyarrow as pa
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def update(self, sql):
        import pyarrow as pa
        writer, reader = self.client.do_put(statement_update(sql), pa.schema([]))
        try:
            writer.done_writing()
            reader.read()
        finally:
            writer.close()

    def close(self):
        self.client.close()


# --latency-clients: the client each consumer and the producer of the latency phase use.
LATENCY_CLIENTS = {"adbc": (AdbcSession, "ADBC"), "pyarrow": (FlightSession, "pyarrow Flight")}


class Consumer(threading.Thread):
    """Long-polls one queue from position 0 until the producer's end marker, checking that
    messages arrive exactly once, in the order sent, at increasing positions."""

    def __init__(self, client, uri, table, queue, wait_ms, stop):
        super().__init__(daemon=True)
        self.client, self.uri, self.table, self.queue, self.wait_ms, self.stop = \
            client, uri, table, queue, wait_ms, stop
        self.ready = threading.Event()
        self.latencies_ns = []
        self.problems = []
        self.received = 0
        self.next_seq = 0
        self.ended = False
        self.polls = 0
        self.empty_polls = 0
        self.error = None
        self.recv_ns = 0

    def problem(self, text):
        if len(self.problems) < 10:
            self.problems.append(text)
        elif len(self.problems) == 10:
            self.problems.append("(more problems left out)")

    def check(self, rows, last):
        """Checks the rows of one poll, (pos, body) pairs received at self.recv_ns; returns the
        new last position."""
        for pos, body in rows:
            if pos is None or pos <= last:
                self.problem(f"position {pos} after {last} (positions must increase)")
            else:
                last = pos
            try:
                kind, seq, send_ns, _ = body.split(":", 3)
                seq, send_ns = int(seq), int(send_ns)
            except (ValueError, AttributeError):
                self.problem(f"unreadable body at position {pos}: {body!r:.60}")
                continue
            self.received += 1
            if self.ended:
                self.problem(f"message {seq} at position {pos} after the end marker")
            if seq < self.next_seq:
                self.problem(f"message {seq} again at position {pos} (expected {self.next_seq})")
            elif seq > self.next_seq:
                self.problem(f"messages {self.next_seq}..{seq - 1} missing before message {seq} "
                             f"at position {pos}")
            self.next_seq = max(self.next_seq, seq + 1)
            if kind == "e":
                self.ended = True
            elif kind == "m":
                self.latencies_ns.append(self.recv_ns - send_ns)
        return last

    def run(self):
        session = None
        last = 0
        try:
            session = LATENCY_CLIENTS[self.client][0](self.uri)
            while not self.stop.is_set():
                sql = (f"SELECT pos, body FROM tail('{self.table}', {last}, {self.wait_ms}) "
                       f"WHERE queue = '{self.queue}' LIMIT {TAIL_LIMIT}")
                self.ready.set()
                result = session.query(sql)
                self.recv_ns = time.perf_counter_ns()
                self.polls += 1
                if result.num_rows == 0:
                    self.empty_polls += 1
                    continue
                rows = zip(result.column("pos").to_pylist(), result.column("body").to_pylist())
                last = self.check(rows, last)
                if self.ended:
                    break
            if self.ended:
                # Nothing may follow the end marker (a duplicate delivered late, for one).
                late = session.query(f"SELECT pos, body FROM tail('{self.table}', {last}, 0) "
                                     f"WHERE queue = '{self.queue}' LIMIT {TAIL_LIMIT}")
                if late.num_rows:
                    self.problem(f"{late.num_rows} rows after the end marker")
        except Exception as e:  # noqa: BLE001
            self.error = one_line(e)
        finally:
            self.ready.set()
            if session is not None:
                session.close()


class Producer(threading.Thread):
    """Inserts single messages at `rate` per second, round robin over the queues: first one
    warm-up message per queue (not measured), then the measured ones, then an end marker per
    queue."""

    def __init__(self, client, uri, table, queues, rate, seconds, stop, ready_secs):
        super().__init__(daemon=True)
        self.client, self.uri, self.table, self.queues, self.rate, self.seconds, self.stop = \
            client, uri, table, queues, rate, seconds, stop
        self.ready_secs = ready_secs
        self.sent = {q: 0 for q in queues}  # messages of each queue, end markers included
        self.measured = 0
        self.insert_secs = []
        self.error = None
        self.elapsed = 0.0

    def send(self, session, queue, kind):
        seq = self.sent[queue]
        t = time.perf_counter_ns()
        session.update(f"INSERT INTO {self.table} (queue, body) VALUES "
                       f"('{queue}', '{make_body(kind, seq, t)}')")
        self.sent[queue] += 1
        if kind == "m":
            self.insert_secs.append((time.perf_counter_ns() - t) / 1e9)
            self.measured += 1

    def run(self):
        session = None
        try:
            session = LATENCY_CLIENTS[self.client][0](self.uri)
            # The warm-up INSERTs are retried for a while: a new table's tablets may still be
            # electing leaders.
            deadline = time.monotonic() + self.ready_secs
            for q in self.queues:
                while True:
                    try:
                        self.send(session, q, "w")
                        break
                    except Exception:  # noqa: BLE001
                        if time.monotonic() >= deadline or self.stop.is_set():
                            raise
                        time.sleep(0.2)
            time.sleep(0.2)
            total = max(int(self.rate * self.seconds), 1)
            t0 = time.perf_counter()
            for i in range(total):
                if self.stop.is_set():
                    break
                delay = t0 + i / self.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self.send(session, self.queues[i % len(self.queues)], "m")
            self.elapsed = time.perf_counter() - t0
            for q in self.queues:
                self.send(session, q, "e")
        except Exception as e:  # noqa: BLE001
            self.error = one_line(e)
        finally:
            if session is not None:
                session.close()


def latency(uri, setup_cur, args, stop, procs, client, rows=None):
    """Returns (p99 ms or None, failed). `procs`: the server processes this run started (their
    CPU is reported), or None; `client`: the consumers' and the producer's (LATENCY_CLIENTS).
    Appends its figures to `rows` (a results table's, see LATENCY_COLUMNS)."""
    table = f"{args.table}_latency"
    create_queue_table(setup_cur, table, args.buckets, args.replicas, args.ready_secs)
    queues = queue_names(args.queues)
    consumers_stop = threading.Event()
    consumers = [Consumer(client, uri, table, q, args.wait_ms, consumers_stop) for q in queues]
    for c in consumers:
        c.start()
    for c in consumers:
        while not c.ready.wait(0.2):
            pass
    time.sleep(0.2)  # the first long polls reach the server
    producer = Producer(client, uri, table, queues, args.rate, args.latency_seconds, stop,
                        args.ready_secs)
    producer.start()
    cpu_before = cpu_snapshot(procs)
    while producer.is_alive():
        producer.join(0.2)
    cpu_after = cpu_snapshot(procs)
    # Every consumer ends at its queue's end marker; one that has not within the grace period
    # is stopped (after its current poll) and counts as failed.
    grace = time.monotonic() + (2 if producer.error else args.drain_secs)
    for c in consumers:
        while c.is_alive() and time.monotonic() < grace and not stop.is_set():
            c.join(0.2)
    consumers_stop.set()
    for c in consumers:
        c.join(args.wait_ms / 1000 + 10)

    failed = False
    lat = sorted(ns / 1e6 for c in consumers for ns in c.latencies_ns)
    ins = sorted(s * 1e3 for s in producer.insert_secs)
    achieved = producer.measured / producer.elapsed if producer.elapsed else 0
    polls = sum(c.polls for c in consumers)
    empty = sum(c.empty_polls for c in consumers)
    log(f"  producer: {producer.measured:,} messages at {achieved:,.0f}/s (asked {args.rate:g}/s) "
        f"over {len(queues)} queues; INSERT round trip p50 {pct(ins, 50):.2f} ms "
        f"p99 {pct(ins, 99):.2f} ms max {max(ins, default=float('nan')):.2f} ms")
    log(f"  consumers: {len(lat):,} measured messages received in {polls:,} polls "
        f"({empty:,} ended empty after {args.wait_ms} ms)")
    log(f"  while the producer sent: {cpu_per_message(cpu_before, cpu_after, producer.measured)}")
    if lat:
        log(f"  send -> receive ms: p50 {pct(lat, 50):.2f}  p90 {pct(lat, 90):.2f}  "
            f"p99 {pct(lat, 99):.2f}  max {lat[-1]:.2f}  (count {len(lat):,})")
    if rows is not None:
        def ms(values, p):
            return round(pct(values, p), 2) if values else None
        rows.append([LATENCY_CLIENTS[client][1], len(lat), ms(ins, 50), ms(ins, 99),
                     ms(lat, 50), ms(lat, 90), ms(lat, 99), round(lat[-1], 2) if lat else None])
    if producer.error:
        log(f"  FAILED: producer: {producer.error}")
        failed = True
    for c in consumers:
        expected = producer.sent[c.queue]
        if c.error:
            log(f"  FAILED: consumer of {c.queue}: {c.error}")
            failed = True
        for p in c.problems:
            log(f"  FAILED: consumer of {c.queue}: {p}")
            failed = True
        if not c.error and (not c.ended or c.next_seq != expected or c.received != expected):
            if not producer.error:
                log(f"  FAILED: consumer of {c.queue}: received {c.received} messages"
                    f"{'' if c.ended else ' and no end marker'}, {expected} were sent")
                failed = True
    if not failed:
        total = sum(producer.sent.values())
        log(f"  checked: all {total:,} messages (warm-up and end markers included) received "
            f"exactly once, in the order sent, at increasing positions")
    if not args.keep_tables:
        drop_table(setup_cur, table)
    return (pct(lat, 99) if lat else None), failed


# ---------------------------------------------------------------------------------------------
# Results

ENQUEUE_COLUMNS = ["method", "batches", "producers", "msg/s", "MB/s of bodies", "call p50 ms",
                   "call p99 ms", "producers' CPU µs/msg"]
LATENCY_COLUMNS = ["client", "messages", "INSERT p50 ms", "INSERT p99 ms", "wake-up p50 ms",
                   "wake-up p90 ms", "wake-up p99 ms", "wake-up max ms"]


def results_report(args, mode, load_at_start=None):
    """The run's Report (see bench/results.py), and its enqueue and latency tables' rows."""
    report = Report("queue_cluster" if args.cluster else "queue",
                    f"Queue tables, {mode}: enqueue throughput in batches of {BATCH} messages of "
                    f"{BODY_BYTES} bytes over {args.queues} queues, and commit-to-consumer latency "
                    f"of tail() long polls",
                    baseline=None, load_at_start=load_at_start)
    enqueue_rows = report.table(f"Enqueue, {args.seconds:g} s each" if not args.messages else
                                f"Enqueue, {args.messages} messages each", ENQUEUE_COLUMNS)
    latency_rows = report.table(f"Commit-to-consumer latency: one producer inserting single "
                                f"messages at {args.rate:g}/s for {args.latency_seconds:g} s, "
                                f"one consumer per queue", LATENCY_COLUMNS)
    report.note("A spread batch writes several tablets, so it is a transaction; a batch of one "
                "queue is one tablet's single write.")
    report.note("Targets: at least 1 M msg/s on one node and 300 k msg/s with 3 replicas; "
                "wake-up p99 at most 10 ms.")
    return report, enqueue_rows, latency_rows


def main():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/nyala-target")
    default_bin = os.environ.get("NYALA_BIN") or os.path.join(target, "release", "nyala")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cluster", action="store_true",
                       help="start a master and 3 tablet servers on this machine; tables get "
                            "WITH (replicas = 3)")
    where.add_argument("--connect", metavar="URI",
                       help="use a running server (grpc://HOST:PORT) instead of starting one; "
                            "the benchmark's tables (--table prefix) are dropped and created")
    p.add_argument("--nyala", default=default_bin,
                   help="the nyala binary to start (default: $NYALA_BIN or %(default)s)")
    p.add_argument("--replicas", type=int,
                   help="WITH (replicas = N) on the tables (default: 3 with --cluster, none "
                        "otherwise)")
    p.add_argument("--tservers", type=int, default=3,
                   help="tablet servers of --cluster (default 3)")
    p.add_argument("--seconds", type=float, default=10,
                   help="seconds of each enqueue measurement (default 10)")
    p.add_argument("--messages", type=int,
                   help="enqueue this many messages in all (rounded up to whole batches) "
                        "instead of for --seconds")
    p.add_argument("--threads", type=producer_counts, default=[8, 48],
                   help="producer threads of the enqueue measurements, a connection each; a "
                        "comma-separated list measures each count in turn (default 8,48)")
    p.add_argument("--queues", type=int, default=6, help="queues (default 6)")
    p.add_argument("--buckets", type=int, default=6, help="hash buckets of the table (default 6)")
    p.add_argument("--ingest-clients", type=client_list(INGEST_CLIENTS), default=["adbc", "pyarrow"],
                   help="the clients bulk ingest is measured with, comma-separated: adbc "
                        "(adbc_ingest), pyarrow (Flight do_put) (default adbc,pyarrow)")
    p.add_argument("--batch-shapes", type=client_list(BATCH_SHAPES), default=["spread", "per-queue"],
                   help="how the enqueue batches take their queues, comma-separated, each "
                        "measured in turn: spread (row i to queue i mod --queues, so a batch "
                        "writes several tablets: a transaction) and per-queue (a batch to one "
                        "queue, the producers' batches taking the queues in turn: the blog's "
                        "enqueueMessages(queue, messages)) (default spread,per-queue)")
    p.add_argument("--latency-clients", type=client_list(LATENCY_CLIENTS), default=["adbc", "pyarrow"],
                   help="the clients of the latency phase, each in turn on a fresh table: "
                        "adbc, pyarrow or both (default adbc,pyarrow)")
    p.add_argument("--insert", choices=["values", "prepared"], default="values",
                   help="how the INSERT comparison sends a batch: one multi-row INSERT "
                        "statement (values, default) or a prepared INSERT with the batch bound "
                        "as parameters (prepared)")
    p.add_argument("--skip", default="",
                   help="measurements to leave out, comma-separated: ingest, insert, latency")
    p.add_argument("--rate", type=float, default=200,
                   help="messages per second of the latency producer (default 200)")
    p.add_argument("--latency-seconds", type=float, default=5,
                   help="seconds the latency producer sends (default 5)")
    p.add_argument("--wait-ms", type=int, default=5000,
                   help="wait_ms of each long poll (default 5000)")
    p.add_argument("--drain-secs", type=float, default=30,
                   help="how long consumers may take after the producer ends (default 30)")
    p.add_argument("--ready-secs", type=float, default=30,
                   help="how long CREATE TABLE is retried (default 30)")
    p.add_argument("--table", default="queue_bench",
                   help="prefix of the tables (default queue_bench)")
    p.add_argument("--memory-limit-mb", type=int,
                   help="--memory-limit-mb of the started servers (default: theirs)")
    p.add_argument("--keep-tables", action="store_true", help="do not drop the tables")
    p.add_argument("--keep-data-dir", action="store_true",
                   help="keep the started servers' data directories and logs")
    p.add_argument("--json", metavar="PATH",
                   help="write the run's results here as JSON for docs/benchmarks.md (default: "
                        "bench/results/queue.json, with --cluster queue_cluster.json; '' writes "
                        "nothing)")
    args = p.parse_args()
    if args.json is None:
        args.json = default_path("queue_cluster" if args.cluster else "queue")
    load_at_start = os.getloadavg()[0]
    if args.queues < 1 or args.buckets < 1 or args.rate <= 0:
        p.error("--queues, --buckets and --rate must be positive")
    if args.replicas is None and args.cluster:
        args.replicas = 3
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    def measured(key):
        """The --skip name of the measurement of results key `key`."""
        return "ingest" if key == "flight" else key

    if skip - {"ingest", "insert", "latency"}:
        p.error(f"--skip: unknown measurement {sorted(skip - {'ingest', 'insert', 'latency'})[0]}")

    import adbc_driver_flightsql
    import pyarrow as pa

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with it ignored
    stop = threading.Event()
    work = procs = None
    failed = False
    interrupted = False
    results = {}
    setup = None
    try:
        if args.connect:
            uri = args.connect
            mode = "connected server" + (f", {args.replicas} replicas" if args.replicas else "")
        else:
            work = tempfile.mkdtemp(prefix="nyala-queue.")
            procs = Processes(args.nyala, work)
            if args.cluster:
                uri = start_cluster(procs, args)
                mode = f"{args.replicas} replicas"
            else:
                uri = start_single(procs, args)
                mode = "one node" + (f", {args.replicas} replicas" if args.replicas else "")
        log(f"queue benchmark: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"ADBC Flight SQL driver {adbc_driver_flightsql.__version__}, pyarrow {pa.__version__}")
        if args.connect:
            log(f"Nyala: running server at {uri}")
        elif args.cluster:
            log(f"Nyala: {args.nyala}: a master and {args.tservers} tablet servers on this machine, "
                f"Flight SQL of the master at {uri}, fresh data directories in {work}")
        else:
            log(f"Nyala: {args.nyala}: nyala serve at {uri}, fresh data directory in {work}")
        if not args.connect and f"{os.sep}debug{os.sep}" in os.path.abspath(args.nyala):
            log("note: a debug build: the numbers mean nothing")
        log(f"table: {args.buckets} hash buckets on queue"
            + (f", WITH (replicas = {args.replicas})" if args.replicas else "")
            + f"; {args.queues} queues; bodies of {BODY_BYTES} bytes")
        report, enqueue_rows, latency_rows = results_report(args, mode, load_at_start)
        setup = connect(uri)
        setup_cur = setup.cursor()
        try:
            query(setup_cur, "SELECT 1")
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"cannot run a statement at {uri}: {one_line(e)}")

        amount = (f"{math.ceil(args.messages / BATCH) * BATCH:,} messages" if args.messages
                  else f"{args.seconds:g} s")
        if not {"ingest", "insert"} <= skip:
            log(f"\nenqueue: batches of {BATCH} messages over {args.queues} queues "
                f"({' then '.join(BATCH_SHAPES[s] for s in args.batch_shapes)}), "
                f"{' then '.join(map(str, args.threads))} producer threads (a connection each), "
                f"{amount} each way and count:")
        insert_label = ("prepared INSERT" if args.insert == "prepared" else "multi-row INSERT")
        ingests = [INGEST_CLIENTS[c] for c in args.ingest_clients]
        for method, label in ingests + [(args.insert, insert_label)]:
            key = method if method in ("ingest", "flight") else "insert"
            if measured(key) in skip:
                continue
            for shape in args.batch_shapes:
                for threads in args.threads:
                    counted = f"{label}, {BATCH_SHAPES[shape]}, {producers(threads)}"
                    try:
                        rate, bad = enqueue(uri, setup_cur, args, method, shape, counted,
                                            threads, stop, enqueue_rows)
                    except Exception as e:  # noqa: BLE001
                        log(f"  FAILED: {counted}: {one_line(e)}")
                        rate, bad = None, True
                    if rate and rate > results.get((key, shape), (0, 0))[0]:
                        results[(key, shape)] = (rate, threads)
                    failed |= bad
                    if procs and procs.dead():
                        raise RuntimeError(f"server processes exited: {procs.dead()}")
        for shape in args.batch_shapes:
            for key, label in INGEST_CLIENTS.values():
                best, insert = results.get((key, shape)), results.get(("insert", shape))
                if best and insert:
                    log(f"  {label} / {insert_label}, {BATCH_SHAPES[shape]}, the best of each: "
                        f"{best[0] / insert[0]:.2f}x")

        for client in ([] if "latency" in skip else args.latency_clients):
            log(f"\ncommit-to-consumer latency, {LATENCY_CLIENTS[client][1]} clients: one "
                f"consumer per queue long-polling tail(..., {args.wait_ms}) LIMIT {TAIL_LIMIT}; "
                f"one producer inserting single messages at {args.rate:g}/s for "
                f"{args.latency_seconds:g} s:")
            try:
                results[f"p99 {client}"], bad = latency(uri, setup_cur, args, stop, procs, client,
                                                        latency_rows)
            except Exception as e:  # noqa: BLE001
                log(f"  FAILED: latency: {one_line(e)}")
                results[f"p99 {client}"], bad = None, True
            failed |= bad
            if procs and procs.dead():
                raise RuntimeError(f"server processes exited: {procs.dead()}")

        def rate_text(key, shape, how):
            if (key, shape) in results:
                rate, threads = results[(key, shape)]
                return f"{rate:.0f} msg/s ({how}, {producers(threads)})"
            return f"- ({how} {'skipped' if measured(key) in skip else 'failed'})"

        def wake_text(client):
            p99 = results.get(f"p99 {client}")
            text = f"{p99:.1f} ms" if p99 is not None else "- (failed)"
            return f"{text} ({LATENCY_CLIENTS[client][1]})"

        wake = ("wake-up p99 - (skipped)" if "latency" in skip else
                "wake-up p99 " + ", ".join(wake_text(c) for c in args.latency_clients))
        log(f"\nload average at the end {os.getloadavg()[0]:.2f}")
        insert_how = "INSERT" if args.insert == "values" else "prepared INSERT"
        enqueued = "; ".join(
            f"batches {BATCH_SHAPES[shape]}: "
            + ", ".join([rate_text(key, shape, f"ingest, {client}")
                         for client, (key, _) in INGEST_CLIENTS.items()
                         if client in args.ingest_clients]
                        + [rate_text("insert", shape, insert_how)])
            for shape in args.batch_shapes)
        log(f"summary: {mode} enqueue {enqueued}; {wake}"
            + ("; FAILED checks above" if failed else ""))
        log(TARGETS)
        if failed:
            report.note("Some checks FAILED in this run (see its output).")
        report.write(args.json)
    except KeyboardInterrupt:
        print("queue: interrupted", file=sys.stderr)
        interrupted = True
    except Exception as e:  # noqa: BLE001
        print(f"queue: FAILED: {one_line(e)}", file=sys.stderr)
        failed = True
    finally:
        stop.set()
        if setup is not None:
            try:
                setup.close()
            except Exception:  # noqa: BLE001
                pass
        if procs is not None:
            if interrupted:
                procs.stop(quiet=True, grace=3)
            else:
                procs.stop(show_logs=failed)
        if work is not None:
            if args.keep_data_dir:
                print(f"kept the data directories and logs in {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
    if interrupted:
        sys.exit(130)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
