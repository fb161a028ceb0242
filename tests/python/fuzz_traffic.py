#!/usr/bin/env python3
"""Fuzzing traffic against a real `nyala serve`: several concurrent clients, each with its own
connections, send a seeded random mix of valid and broken requests, and the server must come
out whole: alive throughout, answering `SELECT 1` at the end, no error that reads like a crash
or a bug, no reset connection, no panic in its log, and no partial effect of a failed request.

Traffic (per client thread, chosen by a random.Random seeded from --seed and the thread's number):
- SQL through ADBC: statements from templates against the thread's own scratch table
  `s_<thread>` (INSERT, INSERT IGNORE, UPSERT, UPDATE, DELETE, SELECT with joins against the
  shared reference table, aggregates, windows, CTEs, DDL on a junk table and a view, metadata),
  the same statements mutated (tokens dropped, duplicated, swapped, truncated, random keywords,
  operators and literals inserted, literals replaced by extreme values), token soups, deep
  expressions (long `+` and `OR` chains, nested parentheses, functions, subqueries, CTE chains),
  prepared statements with good and bad parameters, `executemany` batches, and transactions
  (BEGIN ... COMMIT / ROLLBACK, or a connection closed in the middle of one).
- Raw Flight / Flight SQL over pyarrow.flight: garbage, truncated and bit-flipped commands in
  GetFlightInfo / GetSchema / DoPut descriptors, garbage and bit-flipped tickets (tickets carrying
  SQL and raw Arrow IPC parameter messages), garbage DoAction bodies, DoPut ingests of corrupted
  Arrow IPC and of batches whose schema does not match the table, corrupted and mismatched
  parameters for prepared statements, streams abandoned after their first batch.

Checks (each failure is a violation, printed with the request, the error and the seed):
- the server process stays alive (polled), answers `SELECT 1` quickly, and at the end the
  reference table, which no traffic writes, holds exactly its rows;
- no error text contains one of test_bad_input.FORBIDDEN (or the server's own words for a caught
  panic), and no error has a gRPC code that only a crash, a bug or a broken connection gives
  (INTERNAL, UNKNOWN, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED, CANCELLED without the server
  saying why, DEADLINE_EXCEEDED: a request that got no answer in RPC_TIMEOUT seconds);
- no partial effects: each thread is the only writer of its table and keeps its contents'
  fingerprint (key, md5 of v, n per row; the table is kept at most MAX_ROWS rows). After a
  failed request that names the table, the table must be as it was; after a successful one the
  fingerprint is taken again. `executemany` batches, which run once per parameter row, are
  checked against a model of the rows the error says were applied. In a transaction, a failed
  statement must leave the transaction's view unchanged, and after COMMIT / ROLLBACK the table
  must hold what the transaction last saw (committed) or what it held at BEGIN (anything else);
- the server's stderr (captured to a file) has no "panicked" (a panic the server catches and
  answers with an error is reported as such, but still reported);
- no request goes unanswered: RPC_TIMEOUT seconds without an answer is a hang (the server's
  thread stacks are then saved with gdb, when it is installed, next to its log).

Run as a script: `python3 tests/python/fuzz_traffic.py --seconds 600 [--bin PATH] [--clients 4]
[--seed N]` starts its own server (the release binary of $CARGO_TARGET_DIR, default
~/.cache/nyala-target, unless --bin or $NYALA_BIN says otherwise), prints a summary and exits 1
on any violation. Under pytest, `test_fuzz_traffic_leaves_the_server_whole` runs it for
$NYALA_FUZZ_TRAFFIC_SECS seconds (default 15) against the binary nyala_server.py picks, with the
seed $NYALA_FUZZ_SEED if set.
"""

import argparse
import hashlib
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script from anywhere: the helpers live next to it
    sys.path.insert(0, _HERE)

import adbc_driver_flightsql.dbapi as flight_sql  # noqa: E402
import adbc_driver_manager  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.flight as flight  # noqa: E402

from flight_sql_messages import (  # noqa: E402
    EXISTS_APPEND,
    EXISTS_FAIL,
    EXISTS_REPLACE,
    NOT_EXIST_CREATE,
    NOT_EXIST_FAIL,
    any_message,
    close_prepared_statement,
    close_session,
    create_prepared_statement,
    get_session_options,
    length_delimited,
    prepared_statement_handle,
    prepared_statement_query,
    prepared_statement_update,
    set_session_options,
    statement_ingest,
    statement_query,
    statement_update,
    varint_field,
)
from nyala_server import REPO, nyala_bin  # noqa: E402
from test_bad_input import FORBIDDEN, any_of, ipc_messages, ipc_stream, query_ticket  # noqa: E402

# What only a crash or a bug puts into an error: test_bad_input's list, and the words the server
# answers a caught panic with ("the server failed to handle this request (a bug; please report
# it)").
FORBIDDEN_TEXTS = tuple(FORBIDDEN) + ("please report it",)

# gRPC codes a bad request may get. Anything else is a violation; CANCELLED only when the server
# says why (statement timeout, a cancelled statement).
REFUSALS = {
    "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
}
GRPC_CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]
# pyarrow.flight's wording of each gRPC code (libarrow_flight's FromGrpcStatus).
PYARROW_WORDS = [
    ("Flight returned internal error", "INTERNAL"),
    ("Flight returned invalid argument error", "INVALID_ARGUMENT"),
    ("Flight returned timeout error", "DEADLINE_EXCEEDED"),
    ("Flight returned not found error", "NOT_FOUND"),
    ("Flight returned already exists error", "ALREADY_EXISTS"),
    ("Flight cancelled call", "CANCELLED"),
    ("Flight returned unauthenticated error", "UNAUTHENTICATED"),
    ("Flight returned unauthorized error", "PERMISSION_DENIED"),
    ("Flight returned unimplemented error", "UNIMPLEMENTED"),
    ("Flight returned unavailable error", "UNAVAILABLE"),
    ("gRPC returned resource exhausted error", "RESOURCE_EXHAUSTED"),
    ("gRPC returned precondition failed error", "FAILED_PRECONDITION"),
    ("gRPC returned aborted error", "ABORTED"),
    ("gRPC returned out-of-range error", "OUT_OF_RANGE"),
    ("gRPC returned data loss error", "DATA_LOSS"),
]
PYARROW_CLASSES = [
    (flight.FlightUnavailableError, "UNAVAILABLE"),
    (flight.FlightInternalError, "INTERNAL"),
    (flight.FlightCancelledError, "CANCELLED"),
    (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
    (flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
]

RPC_TIMEOUT = 60          # seconds without an answer: a hang
STATEMENT_TIMEOUT = "5s"  # SET statement_timeout on every session
SLOW_PING = 30            # seconds a monitoring SELECT 1 may take before it is a violation
MAX_ROWS = 200            # a scratch table is cut back to 100 rows above this
MAX_FETCH_ROWS = 200_000  # rows read from one result before the stream is dropped
KEYS = 400                # scratch-table keys are mostly in [0, KEYS)

REF = "fuzz_ref"
REF_ROWS = [(i, f"ref {i}", i * 0.25) for i in range(1, 101)]

ADBC_OPTIONS = {
    "adbc.flight.sql.rpc.timeout_seconds.query": str(RPC_TIMEOUT),
    "adbc.flight.sql.rpc.timeout_seconds.fetch": str(RPC_TIMEOUT),
    "adbc.flight.sql.rpc.timeout_seconds.update": str(RPC_TIMEOUT),
}

# Statements that change the session rather than data (a transaction begun or ended, a setting):
# mutated text starting with one of them is not sent, so the harness knows each session's state.
SESSION_WORDS = {
    "BEGIN", "START", "COMMIT", "ROLLBACK", "END", "ABORT", "SET", "RESET", "SAVEPOINT",
    "RELEASE", "PREPARE", "EXECUTE", "DEALLOCATE", "USE", "DISCARD",
}
WRITE_WORDS = {
    "INSERT", "UPSERT", "UPDATE", "DELETE", "DROP", "ALTER", "CREATE", "TRUNCATE", "MERGE",
    "COPY", "REPLACE", "CLONE", "GRANT", "REVOKE", "ANALYZE",
} | SESSION_WORDS
DDL_WORDS = {"CREATE", "DROP", "ALTER", "TRUNCATE", "RENAME"}
DML_WORDS = {"INSERT", "UPSERT", "UPDATE", "DELETE", "SELECT", "WITH"}

TOKEN = re.compile(
    r"'(?:[^']|'')*'|\d+\.\d*(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?|\$\d+"
    r"|[A-Za-z_][A-Za-z_0-9]*|<=|>=|<>|!=|\|\||::|->>|->|\S"
)
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")

KEYWORDS = """SELECT FROM WHERE GROUP BY ORDER HAVING LIMIT OFFSET JOIN LEFT RIGHT FULL OUTER INNER
    CROSS NATURAL ON USING AS AND OR NOT IN IS NULL LIKE ILIKE SIMILAR BETWEEN CASE WHEN THEN ELSE
    END DISTINCT ALL ANY SOME UNION INTERSECT EXCEPT EXISTS INSERT INTO VALUES UPSERT IGNORE UPDATE
    SET DELETE CREATE TABLE VIEW DROP ALTER ADD COLUMN RENAME TO PRIMARY KEY IF WITH RECURSIVE OVER
    PARTITION ROWS RANGE PRECEDING FOLLOWING UNBOUNDED CURRENT ROW CAST TRY_CAST ASC DESC NULLS
    FIRST LAST FILTER WINDOW LATERAL UNNEST EXPLAIN ANALYZE VERBOSE DESCRIBE SHOW TABLES DEFAULT OF
    TIMESTAMP DATE INTERVAL BIGINT STRING DOUBLE INT BOOL BOOLEAN DECIMAL VARCHAR BINARY FLOAT
    DISTRIBUTE HASH BUCKETS SPLIT TRUE FALSE COLLATE ESCAPE AT TIME ZONE SYSTEM_TIME FOR QUALIFY
    BEGIN COMMIT ROLLBACK TRANSACTION""".split()
OPERATORS = "+ - * / % = <> != < <= > >= || ( ) ( ) , , . ; :: ? $1 $2 $0 @ # ~ ^ & | << >> -> ->> [ ] { } :".split()
FUNCTIONS = """count( sum( avg( min( max( length( upper( lower( substr( coalesce( abs( md5( concat(
    repeat( generate_series( range( now() random() isnan( array_agg( string_agg( make_array(
    unnest( row_number() nullif( greatest( least( sqrt( ln( power( to_timestamp( date_trunc(
    regexp_replace( regexp_match( split_part( array_length( struct( named_struct( arrow_cast(
    arrow_typeof( cardinality( first_value( lag( lead( ntile( cume_dist() tail(""".split()
LITERALS = ["0", "1", "-1", "2", "42", "1.5", "'a'", "''", "'x'", "NULL", "TRUE", "FALSE", "'NaN'",
            "1e10", "0.0"]


def extreme_literal(rng):
    """A literal at or beyond some edge: huge numbers, NaN strings, very long strings, NULLs,
    values of the wrong type."""
    r = rng.random()
    if r < 0.03:
        return "'" + "x" * 1_100_000 + "'"  # over the 1 MiB statement limit
    if r < 0.12:
        return "'" + rng.choice("xy\u00e9\u4e2d") * rng.choice([1000, 100_000]) + "'"
    return rng.choice([
        "9223372036854775807", "-9223372036854775808", "9223372036854775808",
        "-9223372036854775809", "18446744073709551616", "99999999999999999999999999999999999999",
        "99999999999999999999.99999999999999999999", "1e308", "1e309", "-1e309", "4.9e-324",
        "1.7976931348623157e308", "0", "-0", "-1", "0.0", "'NaN'", "'nan'", "'Infinity'",
        "'-Infinity'", "NULL", "''", "'\\0'", "TRUE", "FALSE", "'abc'", "'12abc'",
        "CAST('NaN' AS DOUBLE)", "'2024-02-30'", "DATE '9999-12-31'",
        "TIMESTAMP '1677-09-21 00:12:43'", "TIMESTAMP '9999-12-31 23:59:59.999999'",
        "INTERVAL '1000000 years'", "X'FF'", "'\u00fcn\u00efc\u00f8d\u00e9 \u2713 \U0001F600'",
        "'it''s'", "1/0", "0/0", "[1, 2]", "{'a': 1}", "make_array(1, 2)", "(1, 2)", "?", "$1",
        "$99999", "DEFAULT", "-(-9223372036854775808)", "CAST(1e300 AS BIGINT)",
        "CAST(-1 AS DECIMAL(38, 37))",
    ])


def tokens_of(sql):
    return TOKEN.findall(sql)


def is_literal(token):
    return token[0] in "'0123456789" or token.upper() in ("NULL", "TRUE", "FALSE")


def first_word(sql):
    match = WORD.search(sql)
    return match.group(0).upper() if match else ""


def words(sql):
    return {w.upper() for w in WORD.findall(sql)}


def mentions(sql, name):
    return re.search(rf"\b{re.escape(name)}\b", sql, re.IGNORECASE) is not None


def is_read_only(sql):
    return first_word(sql) in ("SELECT", "WITH", "VALUES") and not words(sql) & WRITE_WORDS


def short(text, limit=300):
    text = str(text).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + f"... [{len(text)} chars]"


def classify(error):
    """(gRPC code or CLIENT..., message) of an exception from ADBC or pyarrow.flight."""
    text = str(error)
    if isinstance(error, adbc_driver_manager.Error):
        # "INVALID_ARGUMENT: [FlightSQL] message (InvalidArgument; ExecuteQuery)": the gRPC code
        # in the parentheses at the end; errors of the Go driver itself say "arrow/flightsql:".
        if "] arrow/flightsql:" in text:
            return "CLIENT:" + type(error).__name__, text
        match = re.search(r"\(([A-Za-z]+); [^()]*\)(?:\. Vendor code: -?\d+)?\s*$", text)
        if match:
            code = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).upper()
            if code in GRPC_CODES:
                return code, text
        match = re.match(r"([A-Z_]+): ", text)
        if match and match.group(1) in GRPC_CODES:
            return match.group(1), text
        return "CLIENT:" + type(error).__name__, text
    match = re.search(r"grpc_status:(\d+)", text)
    if match and int(match.group(1)) < len(GRPC_CODES):
        return GRPC_CODES[int(match.group(1))], text
    for words_, code in PYARROW_WORDS:
        if words_ in text:
            return code, text
    for cls, code in PYARROW_CLASSES:
        if isinstance(error, cls):
            return code, text
    return "CLIENT:" + type(error).__name__, text


def norm_float(x):
    if x is None:
        return None
    return "NaN" if math.isnan(x) else repr(float(x))


def row_image(v, n):
    """A row's (md5 of v, n) as the fingerprint query returns them, from Python values."""
    return (hashlib.md5(v.encode("utf-8")).hexdigest() if v is not None else None, norm_float(n))


class ControlFailure(Exception):
    """A statement the harness needs (a fingerprint, a cleanup) failed."""


class Shared:
    """What the threads and the monitor share."""

    def __init__(self, url, seed, out):
        self.url = url
        self.seed = seed
        self.out = out
        self.lock = threading.Lock()
        self.violations = []
        self.notes = []
        self.stop = threading.Event()
        self.ops = ()  # the kinds of traffic sent (empty: all)
        self.server_dead = threading.Event()
        self.alive = lambda: True  # the server process's liveness, set by run()

    def say(self, line):
        with self.lock:
            self.out(line)

    def violation(self, what, request, error="", thread=None, thread_seed=None, force=False):
        if not force and what != "server died" and (self.server_dead.is_set() or not self.alive()):
            return  # errors after a death are its consequences; the death is reported
        limit = 3000 if what == "server died" else 600 if "effect" in what else 300
        entry = {
            "what": what, "request": short(request, limit), "error": short(error, limit * 2),
            "thread": thread, "thread_seed": thread_seed,
        }
        with self.lock:
            self.violations.append(entry)
            if len(self.violations) <= 30:
                self.out(f"VIOLATION [{what}] thread {thread} (seed {self.seed}, thread seed "
                         f"{thread_seed})\n  request: {entry['request']}\n  error: {entry['error']}")

    def note(self, line):
        with self.lock:
            self.notes.append(line)


class Raw:
    """Flight SQL over raw pyarrow.flight, one gRPC connection (hence one session)."""

    def __init__(self, url):
        self.client = flight.FlightClient(url.replace("grpc://", "grpc+tcp://"))
        self.options = flight.FlightCallOptions(timeout=RPC_TIMEOUT)

    def close(self):
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing a broken client
            pass

    def put(self, descriptor, data):
        """DoPut of `data` (a RecordBatch, or a Schema for no batches); the server's answer."""
        schema = data if isinstance(data, pa.Schema) else data.schema
        writer, reader = self.client.do_put(descriptor, schema, options=self.options)
        try:
            if not isinstance(data, pa.Schema):
                writer.write_batch(data)
            writer.done_writing()
            answer = reader.read()
        finally:
            writer.close()
        return answer.to_pybytes() if answer is not None else b""

    def update(self, sql):
        return self.put(statement_update(sql), pa.schema([]))

    def info(self, descriptor):
        return self.client.get_flight_info(descriptor, self.options)

    def get(self, ticket, max_rows=MAX_FETCH_ROWS):
        """Reads a DoGet stream, dropping it after `max_rows`; the rows read."""
        reader = self.client.do_get(ticket, self.options)
        rows = 0
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                return rows
            if chunk.data is not None:
                rows += chunk.data.num_rows
            if rows > max_rows:
                reader.cancel()
                return rows

    def read(self, info, max_rows=MAX_FETCH_ROWS):
        return sum(self.get(e.ticket, max_rows) for e in info.endpoints)

    def action(self, action):
        return [r.body.to_pybytes() for r in self.client.do_action(action, self.options)]


# --- Arrow IPC corruption ---

def _pad8(n):
    return (n + 7) // 8 * 8


def header_pairs(batch):
    """The (offset, length) of each buffer and the (length, null count) of each array that
    pyarrow writes into an IPC record-batch header of `batch` (flat columns of fixed-width
    types and strings), with what each is: [(kind, column, pair)]."""
    pairs, offset, n = [], 0, batch.num_rows
    for i, col in enumerate(batch.columns):
        pairs.append(("node", i, (n, col.null_count)))
        sizes = [("validity", 0 if col.null_count == 0 else (n + 7) // 8)]
        if pa.types.is_string(col.type):
            offsets = struct.unpack(f"<{n + 1}i", col.buffers()[1].to_pybytes()[: 4 * (n + 1)])
            sizes += [("offsets", 4 * (n + 1)), ("data", offsets[-1] - offsets[0])]
        elif pa.types.is_boolean(col.type):
            sizes.append(("values", (n + 7) // 8))
        else:
            sizes.append(("values", col.type.bit_width // 8 * n))
        for kind, size in sizes:
            pairs.append((kind, i, (offset, size)))
            offset += _pad8(size)
    return pairs


def corrupted(batch, rng):
    """`batch` read back from its IPC stream with one header value changed so that pyarrow,
    which does not validate what it reads, hands over arrays whose buffers are too short or
    whose null counts exceed their lengths; (batch, what was done) or None. Only changes that
    pyarrow can write back without reading out of bounds itself."""
    stream = ipc_stream(batch)
    choices = []
    for kind, i, (a, b) in header_pairs(batch):
        packed = struct.pack("<qq", a, b)
        if stream.count(packed) != 1:
            continue
        col = batch.column(i)
        name = batch.schema.field(i).name
        fixed = not pa.types.is_string(col.type)
        if kind == "validity" and b > 1:
            choices.append(((a, b), (a, rng.randrange(1, b)), f"{name}: validity bitmap shorter"))
        elif kind == "values" and fixed and b > 8 and not pa.types.is_boolean(col.type):
            width = col.type.bit_width // 8
            new = width * rng.randrange(1, b // width)
            choices.append(((a, b), (a, new), f"{name}: values buffer shorter"))
        elif kind == "node" and b > 0:
            choices.append(((a, b), (a, a + rng.randrange(1, 1000)), f"{name}: more nulls than rows"))
    if not choices:
        return None
    old, new, what = rng.choice(choices)
    stream = stream.replace(struct.pack("<qq", *old), struct.pack("<qq", *new))
    try:
        return pa.ipc.open_stream(stream).read_next_batch(), what
    except (pa.ArrowException, ValueError):
        return None


def mutate_bytes(data, rng):
    """`data` truncated, bit-flipped, overwritten, extended or spliced."""
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(7)
        if op == 0 and data:
            del data[rng.randrange(len(data) + 1):]
        elif op == 1 and data:
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif op == 2 and data:
            i = rng.randrange(len(data))
            data[i] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 3:
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 4:
            data += rng.randbytes(rng.randint(1, 64))
        elif op == 5 and len(data) > 2:
            i = rng.randrange(len(data))
            j = rng.randrange(i, len(data))
            data[i:i] = data[i:j + 1]
        elif op == 6 and len(data) > 1:
            # A length or a varint made huge.
            i = rng.randrange(len(data))
            data[i:i + 1] = bytes([0xFF] * rng.randint(1, 9) + [0x7F])
    return bytes(data)


class Worker(threading.Thread):
    """One client: its own ADBC connection, two raw Flight connections and its own table."""

    def __init__(self, index, shared, deadline, seed):
        super().__init__(name=f"fuzz-{index}", daemon=True)
        self.index = index
        self.shared = shared
        self.deadline = deadline
        self.seed = seed
        self.rng = random.Random(seed)
        self.table = f"s_{index}"
        self.junk = f"junk_{index}_zz"
        self.view = f"w_{index}_zz"
        self.requests = Counter()   # kind -> requests
        self.failed = Counter()     # kind -> refused requests
        self.codes = Counter()      # gRPC code -> errors
        self.skipped = 0
        self.fp = None              # fingerprint of self.table, as last seen
        self.current = None         # (kind, request, started) of the request in flight
        self.recent = deque(maxlen=40)  # the last requests sent
        self.history = []               # every request sent, for a kept directory
        self.harness_errors = []
        self.db = self.cur = self.raw = self.rawput = None

    # --- connections ---

    def connect(self):
        self.db = flight_sql.connect(self.shared.url, db_kwargs=ADBC_OPTIONS, autocommit=True)
        self.cur = self.db.cursor()
        self.control(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        self.raw = self.raw_connect()
        self.rawput = self.raw_connect()

    def raw_connect(self):
        raw = Raw(self.shared.url)
        self.track("control", "SET statement_timeout (raw)",
                   lambda: raw.update(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'"))
        return raw

    def disconnect(self):
        for closing in (self.cur, self.db):
            try:
                if closing is not None:
                    closing.close()
            except Exception:  # noqa: BLE001 - closing what may be broken
                pass
        for raw in (self.raw, self.rawput):
            if raw is not None:
                raw.close()
        self.db = self.cur = self.raw = self.rawput = None

    def reconnect_db(self):
        for closing in (self.cur, self.db):
            try:
                closing.close()
            except Exception:  # noqa: BLE001
                pass
        self.db = flight_sql.connect(self.shared.url, db_kwargs=ADBC_OPTIONS, autocommit=True)
        self.cur = self.db.cursor()
        self.control(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")

    def fresh_cursor(self):
        try:
            self.cur.close()
        except Exception:  # noqa: BLE001
            pass
        self.cur = self.db.cursor()

    # --- requests and their outcomes ---

    def violation(self, what, request, error=""):
        if what.startswith(("partial effect", "executemany", "transaction")):
            # Newest first: a long report is cut at its end.
            before = list(reversed(self.recent))[1:]
            error = f"{error}\n  this thread's requests before, newest first: {before}"
        self.shared.violation(what, request, error, self.index, self.seed)

    def judge(self, kind, request, error):
        """Counts a refused request and checks its error; returns (code, text)."""
        code, text = classify(error)
        self.failed[kind] += 1
        self.codes[code] += 1
        lowered = text.lower()
        bad = [w for w in FORBIDDEN_TEXTS if w in lowered]
        if bad:
            self.violation(f"forbidden text {bad!r} ({code})", request, text)
        elif code.startswith("CLIENT"):
            pass
        elif code == "CANCELLED":
            if not any(w in lowered for w in ("statement timeout", "was cancelled")):
                self.violation("cancelled without the server saying why (a reset stream?)",
                               request, text)
        elif code == "DEADLINE_EXCEEDED":
            self.violation(f"no answer within {RPC_TIMEOUT} s (hang)", request, text)
        elif code not in REFUSALS:
            self.violation(f"gRPC {code}", request, text)
        return code, text

    def track(self, kind, request, call, client_errors=()):
        """Runs call() as one request of `kind`: (True, result) or (False, (code, text)).
        `client_errors` are exceptions the client raises before sending anything (parameters it
        cannot convert), counted as CLIENT."""
        self.requests[kind] += 1
        self.current = (kind, request, time.monotonic())
        outcome = "(no answer)"
        try:
            answer = True, call()
            outcome = "ok"
            return answer
        except (adbc_driver_manager.Error, pa.ArrowException, flight.FlightError, OSError) as e:
            answer = False, self.judge(kind, request, e)
            outcome = answer[1][0]
            return answer
        except client_errors as e:
            answer = False, self.judge(kind, request, e)
            outcome = answer[1][0]
            return answer
        finally:
            self.current = None
            now = time.time()
            at = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
            self.recent.append(f"{at} {short(request, 150)} -> {outcome}")
            self.history.append(f"{at} {kind} {short(request, 400)} -> {outcome}")

    def execute(self, sql, params=None, many=False, update=False):
        """Runs a statement on the ADBC cursor; the rows of its result (bounded) or None."""
        if update:
            # CommandStatementUpdate, on a cursor of its own: a DB-API cursor does not know of
            # SQL set on its ADBC statement behind its back, and would run it again.
            with self.db.cursor() as cur:
                cur.adbc_statement.set_sql_query(sql)
                return cur.adbc_statement.execute_update()
        cur = self.cur
        if many:
            cur.executemany(sql, params)
            return None
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        if cur.description is None:
            return None
        reader = cur.fetch_record_batch()
        rows = 0
        for batch in reader:
            rows += batch.num_rows
            if rows > MAX_FETCH_ROWS:
                reader.close()
                break
        return rows

    def sql(self, kind, sql, params=None, many=False, update=None):
        if update is None:
            update = params is None and self.rng.random() < 0.15
        ok, result = self.track(kind, sql, lambda: self.execute(sql, params, many, update),
                                client_errors=(TypeError, ValueError, OverflowError) if params else ())
        if not ok and result[0].startswith("CLIENT"):
            self.fresh_cursor()  # the cursor may be left half-way
        return ok, result

    def control(self, sql):
        """A statement the harness needs; its rows. ControlFailure if it fails."""
        ok, result = self.track("control", sql, lambda: self._rows(sql))
        if not ok:
            raise ControlFailure(f"{sql}: {result[1]}")
        return result

    def _rows(self, sql):
        self.cur.execute(sql)
        return self.cur.fetchall() if self.cur.description is not None else []

    # --- the scratch table and its fingerprint ---

    def create_table(self):
        self.control(f"DROP TABLE IF EXISTS {self.table}")
        self.control(f"CREATE TABLE {self.table} (k BIGINT PRIMARY KEY, v STRING, n DOUBLE) "
                     f"DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
        rows = ", ".join(f"({k}, 'seed {k}', {k / 2})" for k in range(0, KEYS, 7))
        self.control(f"INSERT INTO {self.table} VALUES {rows}")
        self.fp = self.fingerprint()

    def fingerprint(self):
        rows = self.control(f"SELECT k, md5(v), n FROM {self.table} ORDER BY k")
        return tuple((k, h, norm_float(n)) for k, h, n in rows)

    def columns(self):
        self.control(f"SELECT * FROM {self.table} LIMIT 0")
        return [d[0] for d in self.cur.description or ()]

    def keys(self):
        return [row[0] for row in self.fp or ()]

    def after(self, ok, request, error=None, shape_may_change=False):
        """After a request that may have written self.table: a failed one must have changed
        nothing; a successful one gives the new fingerprint."""
        try:
            now = self.fingerprint()
        except ControlFailure as e:
            if ok and re.search(r"not found|no field|schema error", str(e), re.IGNORECASE):
                # A successful statement dropped, renamed or reshaped the table: start it again.
                self.shared.note(f"thread {self.index}: {short(request, 120)} succeeded and "
                                 f"the table no longer reads ({short(e, 120)}); recreated")
                self.recreate()
            elif ok:
                self.violation("table unreadable after a successful request", request, e)
                self.recreate()
            else:
                self.violation("table unreadable after a failed request", request,
                               f"{error}\n  then: {e}")
                self.recreate()
            return
        if not ok and now != self.fp:
            self.violation("partial effect: a failed request changed the table", request,
                           f"{error}\n  {self.diff(self.fp, now)}")
        self.fp = now
        if ok and shape_may_change and self.columns() != ["k", "v", "n"]:
            # DDL that succeeded on the table (ALTER ... ADD COLUMN ...): start it again so the
            # templates' column lists hold.
            self.shared.note(f"thread {self.index}: DDL reshaped its table: {short(request, 120)}")
            self.recreate()
        elif len(self.fp) > MAX_ROWS:
            self.shrink()

    def recreate(self):
        try:
            self.control("ROLLBACK")
            self.create_table()
        except ControlFailure as e:
            self.violation("could not recreate the scratch table", self.table, e)
            self.fp = None

    def shrink(self):
        cut = self.fp[99][0]
        try:
            self.control(f"DELETE FROM {self.table} WHERE k > {cut}")
            self.fp = self.fingerprint()
        except ControlFailure as e:
            self.violation("cleanup DELETE failed", f"DELETE FROM {self.table} WHERE k > {cut}", e)
            self.recreate()

    @staticmethod
    def diff(before, after):
        b, a = {r[0]: r[1:] for r in before or ()}, {r[0]: r[1:] for r in after or ()}
        gone = sorted(set(b) - set(a))
        new = sorted(set(a) - set(b))
        changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
        return (f"rows {len(b)} -> {len(a)}; keys gone {gone[:10]}, new {new[:10]}, "
                f"changed {[(k, b[k], a[k]) for k in changed[:3]]}{'...' if len(changed) > 3 else ''}")

    # --- SQL generation ---

    def value(self):
        r = self.rng
        return r.choice(["'a'", "'bb'", "'hello world'", "''", "'it''s'", "'\u00fcn\u00ef'",
                         "NULL", f"'v{r.randrange(1000)}'", "'NaN'"])

    def number(self):
        r = self.rng
        return r.choice(["NULL", "0", "-1.5", "'NaN'", f"{r.uniform(-1e6, 1e6):.4f}",
                         str(r.randrange(100)), "1e300"])

    def key(self):
        r = self.rng
        if self.fp and r.random() < 0.3:
            return r.choice(self.fp)[0]
        return r.randrange(KEYS)

    def rows(self, count):
        return ", ".join(f"({self.key()}, {self.value()}, {self.number()})" for _ in range(count))

    def valid_statement(self, with_ref=True):
        """A well-formed statement against the thread's table (and maybe the reference table)."""
        r, t = self.rng, self.table
        k, k2 = sorted((self.key(), self.key()))
        templates = [
            lambda: f"INSERT INTO {t} VALUES {self.rows(r.randint(1, 20))}",
            lambda: f"INSERT INTO {t} (k, v) VALUES ({k}, {self.value()})",
            lambda: f"INSERT IGNORE INTO {t} VALUES {self.rows(r.randint(1, 20))}",
            lambda: f"UPSERT INTO {t} VALUES {self.rows(r.randint(1, 20))}",
            lambda: f"UPDATE {t} SET v = {self.value()}, n = n + 1 WHERE k = {k}",
            lambda: f"UPDATE {t} SET n = n * 2 WHERE k BETWEEN {k} AND {k2}",
            lambda: f"UPDATE {t} SET v = concat(v, 'y') WHERE k IN ({k}, {k2}, {self.key()})",
            lambda: f"UPDATE {t} SET v = upper(v) WHERE n > {r.randrange(100)} AND k < {k2}",
            lambda: f"DELETE FROM {t} WHERE k = {k}",
            lambda: f"DELETE FROM {t} WHERE k BETWEEN {k} AND {k + r.randrange(5)}",
            lambda: f"DELETE FROM {t} WHERE v IS NULL AND k > {k2}",
            lambda: f"SELECT count(*), sum(n), min(v), max(k) FROM {t}",
            lambda: f"SELECT k, v FROM {t} WHERE k > {k} ORDER BY k LIMIT 10",
            lambda: f"SELECT v, count(*) FROM {t} GROUP BY v ORDER BY 2 DESC, 1 LIMIT 5",
            lambda: f"SELECT k, row_number() OVER (ORDER BY n, k) AS rn FROM {t} LIMIT 10",
            lambda: f"WITH c AS (SELECT k, n FROM {t} WHERE n > 0) SELECT count(*), avg(n) FROM c",
            lambda: f"SELECT * FROM {t} WHERE v LIKE 'v1%' OR k = {k} LIMIT 5",
            lambda: f"SELECT a.k, b.k FROM {t} a JOIN {t} b ON b.k = a.k + 1 ORDER BY a.k LIMIT 10",
            lambda: f"SELECT k FROM {t} WHERE k IN (SELECT k FROM {t} WHERE n IS NULL) LIMIT 10",
            lambda: f"SELECT CAST(k AS STRING) || v, abs(n), coalesce(v, 'none') FROM {t} LIMIT 5",
            lambda: f"SELECT count(*) FROM generate_series(1, {r.randrange(10000)})",
            lambda: f"SELECT k, lag(k) OVER (ORDER BY k) FROM {t} ORDER BY k DESC LIMIT 3",
            lambda: "SELECT 1",
            lambda: f"DESCRIBE {t}",
            lambda: f"SHOW PARTITIONS {t}",
            lambda: f"EXPLAIN SELECT * FROM {t} WHERE k = {k}",
            lambda: f"SELECT count(*) FROM {t} WHERE k IN ({', '.join(str(self.key()) for _ in range(20))})",
        ]
        ref_templates = [
            lambda: f"SELECT t.k, r.name FROM {t} t JOIN {REF} r ON r.id = t.k ORDER BY t.k LIMIT 20",
            lambda: f"SELECT r.id, count(t.k) FROM {REF} r LEFT JOIN {t} t ON t.k = r.id "
                    f"GROUP BY r.id ORDER BY r.id LIMIT 10",
            lambda: f"UPDATE {t} SET v = r.name FROM {REF} r WHERE r.id = {t}.k AND {t}.k < {k2}",
            lambda: f"DELETE FROM {t} WHERE k IN (SELECT id FROM {REF} WHERE id % 7 = {r.randrange(7)})",
            lambda: f"INSERT INTO {t} SELECT id + {r.randrange(KEYS)}, name, score FROM {REF} "
                    f"WHERE id < {r.randrange(1, 5)}",
            lambda: f"UPSERT INTO {t} SELECT id, name, score FROM {REF} WHERE id BETWEEN {k} AND {k + 3}",
            lambda: f"SELECT sum(score) FROM {REF} WHERE id > {r.randrange(100)}",
            lambda: f"SELECT * FROM {REF} WHERE id = (SELECT max(k) FROM {t}) OR id = 1",
        ]
        if with_ref and r.random() < 0.25:
            return r.choice(ref_templates)()
        return r.choice(templates)()

    def ddl_statement(self):
        r, t, j, w = self.rng, self.table, self.junk, self.view
        return r.choice([
            f"CREATE TABLE IF NOT EXISTS {j} (k BIGINT PRIMARY KEY, v STRING) "
            f"DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
            f"DROP TABLE IF EXISTS {j}",
            f"CREATE TABLE {j} PRIMARY KEY (k) AS SELECT k, v FROM {t} WHERE k < {r.randrange(KEYS)}",
            f"ALTER TABLE {j} ADD COLUMN IF NOT EXISTS z BIGINT DEFAULT 7",
            f"ALTER TABLE {j} DROP COLUMN IF EXISTS z",
            f"ALTER TABLE {j} RENAME COLUMN v TO w",
            f"ALTER TABLE {j} RENAME COLUMN w TO v",
            f"INSERT INTO {j} (k, v) VALUES ({r.randrange(100)}, 'j')",
            f"CREATE OR REPLACE VIEW {w} AS SELECT k, v FROM {t} WHERE n > 0",
            f"SELECT * FROM {w} ORDER BY k LIMIT 5",
            f"DROP VIEW IF EXISTS {w}",
            f"CREATE TABLE {j} CLONE {t}",
            f"SHOW CREATE TABLE {t}",
            "SHOW TABLES",
            f"SELECT table_name, estimated_rows FROM sys.partitions WHERE table_name = '{t}'",
        ])

    def mutate(self, sql):
        """`sql` with 1-3 token-level mutations."""
        r = self.rng
        tokens = tokens_of(sql)
        vocabulary = KEYWORDS + OPERATORS + FUNCTIONS + LITERALS + ["k", "v", "n", self.table, "*"]
        for _ in range(r.choice([1, 1, 1, 2, 2, 3])):
            if not tokens:
                tokens = [r.choice(vocabulary)]
            i = r.randrange(len(tokens))
            op = r.randrange(9)
            if op == 0:
                del tokens[i]
            elif op == 1:
                tokens.insert(i, tokens[i])
            elif op == 2:
                j = r.randrange(len(tokens))
                tokens[i], tokens[j] = tokens[j], tokens[i]
            elif op == 3:
                tokens[i], tokens[min(i + 1, len(tokens) - 1)] = tokens[min(i + 1, len(tokens) - 1)], tokens[i]
            elif op == 4:
                tokens.insert(i, r.choice(vocabulary))
            elif op == 5:
                tokens[i] = r.choice(vocabulary)
            elif op in (6, 7):
                literals = [j for j, tok in enumerate(tokens) if is_literal(tok)] or [i]
                tokens[r.choice(literals)] = extreme_literal(r)
            else:
                del tokens[i:]
        return " ".join(tokens)

    def soup(self):
        r = self.rng
        vocabulary = KEYWORDS + OPERATORS + FUNCTIONS + LITERALS + ["k", "v", "n", self.table, "*"]
        words_ = [r.choice(vocabulary) for _ in range(r.randint(1, 40))]
        if r.random() < 0.3:
            words_[r.randrange(len(words_))] = extreme_literal(r)
        if r.random() < 0.5:
            words_.insert(0, "SELECT")
        return " ".join(words_)

    def deep_statement(self):
        r, t = self.rng, self.table
        n = int(math.exp(r.uniform(math.log(10), math.log(6000))))
        keys = [r.randrange(KEYS * 10) for _ in range(n)]
        return r.choice([
            lambda: "SELECT " + "+".join(["1"] * n),
            lambda: "SELECT " + "(" * n + "1" + ")" * n,
            lambda: f"SELECT k FROM {t} WHERE " + " OR ".join(f"k = {x}" for x in keys),
            lambda: f"DELETE FROM {t} WHERE " + " OR ".join(f"k = {x}" for x in keys),
            lambda: f"UPDATE {t} SET n = 0 WHERE " + " OR ".join(f"k = {x}" for x in keys),
            lambda: f"UPDATE {t} SET v = 'deep' WHERE " + " AND ".join(["k > -1"] * n),
            lambda: f"SELECT count(*) FROM {t} WHERE k IN ({', '.join(map(str, keys))})",
            lambda: f"DELETE FROM {t} WHERE k IN ({', '.join(str(x + KEYS * 20) for x in keys)})",
            lambda: "SELECT " + "abs(" * n + "1" + ")" * n,
            lambda: "SELECT " + "CASE WHEN true THEN " * n + "1" + " END" * n,
            lambda: "SELECT " + "NOT (" * n + "true" + ")" * n,
            lambda: "SELECT " + "- " * n + "1",
            lambda: "SELECT " + " || ".join(["'a'"] * n),
            lambda: "SELECT " + "(SELECT " * n + "1" + ")" * n,
            lambda: "SELECT " + "make_array(" * n + "1" + ")" * n,
            lambda: "WITH c0 AS (SELECT 1 AS x)" + "".join(
                f", c{i} AS (SELECT x + 1 AS x FROM c{i - 1})" for i in range(1, min(n, 1500)))
                + f" SELECT x FROM c{min(n, 1500) - 1}",
            lambda: " UNION ALL ".join([f"SELECT {i} AS x" for i in range(min(n, 2000))]),
            lambda: "SELECT " + ", ".join(f"{i} AS c{i}" for i in range(n)),
            lambda: f"INSERT INTO {t} VALUES ({self.key()}, 'deep', " + "+".join(["1"] * n) + ")",
            lambda: f"INSERT INTO {t} VALUES " + ", ".join(
                f"({x + KEYS * 30}, 'wide', {x})" for x in range(n)) + (
                f", ({self.key()}, 'dup', 0)" if r.random() < 0.5 else ""),
            lambda: "SELECT " + "a" * (n * 50),
            lambda: "SELECT 1 WHERE 1 IN (" + ", ".join(["?"] * (n * 12)) + ")",
            lambda: "SELECT 1 -- " + "x" * (1 << 20),
            lambda: f"SELECT * FROM {t} t0" + "".join(
                f" JOIN {t} t{i} ON t{i}.k = t{i - 1}.k" for i in range(1, min(n, 60))) + " LIMIT 1",
        ])()

    def guarded(self, sql):
        """None when mutated text would change the session's state (a transaction, a setting)
        or reaches the reference table."""
        if first_word(sql) in SESSION_WORDS or mentions(sql, REF):
            self.skipped += 1
            return None
        return sql

    # --- operations ---

    def statement(self, kind, sql, params=None):
        """Runs a statement outside a transaction and checks its effect on the table."""
        ok, result = self.sql(kind, sql, params)
        if mentions(sql, self.table):
            self.after(ok, sql, None if ok else result[1], shape_may_change=self.reshapes(sql))
        return ok

    @staticmethod
    def reshapes(sql):
        return first_word(sql) in DDL_WORDS or bool(words(sql) & {"RENAME", "ALTER"})

    def op_valid(self):
        self.statement("sql.valid", self.valid_statement())

    def op_mutated(self):
        source = self.valid_statement(with_ref=False) if self.rng.random() < 0.85 else self.ddl_statement()
        sql = self.guarded(self.mutate(source))
        if sql is not None:
            self.statement("sql.mutated", sql)

    def op_soup(self):
        sql = self.guarded(self.soup())
        if sql is not None:
            self.statement("sql.soup", sql)

    def op_deep(self):
        self.statement("sql.deep", self.deep_statement())

    def op_ddl(self):
        self.statement("sql.ddl", self.ddl_statement())

    def param_value(self, kind):
        r = self.rng
        if r.random() < 0.75:
            return {"k": self.key(), "v": r.choice(["p", "", "\u00e9t\u00e9", None, f"p{r.randrange(99)}"]),
                    "n": r.choice([None, 1.5, float(r.randrange(100)), -0.0])}[kind]
        return r.choice([None, "x" * 100_000, -(2 ** 63), 2 ** 63 - 1, 2 ** 63, float("nan"),
                         float("inf"), "abc", b"\x00\xff", True, 1.5, 7, [], {"a": 1}, "NaN"])

    def op_prepared(self):
        r, t = self.rng, self.table
        p = self.param_value
        templates = [
            (f"INSERT INTO {t} VALUES (?, ?, ?)", lambda: (p("k"), p("v"), p("n"))),
            (f"UPSERT INTO {t} VALUES ($1, $2, $3)", lambda: (p("k"), p("v"), p("n"))),
            (f"UPDATE {t} SET v = ?, n = ? WHERE k = ?", lambda: (p("v"), p("n"), p("k"))),
            (f"DELETE FROM {t} WHERE k = ?", lambda: (p("k"),)),
            (f"SELECT k, v, n FROM {t} WHERE k >= ? AND k < ? ORDER BY k LIMIT 20",
             lambda: (p("k"), p("k"))),
            ("SELECT ? + 1, ? || 'x'", lambda: (p("k"), p("v"))),
            (f"SELECT count(*) FROM {t} t JOIN {REF} r ON r.id = t.k WHERE r.score > ?",
             lambda: (p("n"),)),
            (f"SELECT * FROM {t} WHERE v = $1 OR k = $2 LIMIT 5", lambda: (p("v"), p("k"))),
        ]
        sql, make = r.choice(templates)
        params = make()
        if r.random() < 0.2:
            mutated = self.guarded(self.mutate(sql))
            if mutated is None:
                return
            sql = mutated
        if r.random() < 0.1:
            params = params[:-1] if r.random() < 0.5 else params + (p("k"),)
        self.statement("sql.prepared", sql, params)

    def op_executemany(self):
        """Several parameter rows, each run on its own (the server applies the rows before a
        failing one): the table must match a model of what the error says was applied."""
        r, t = self.rng, self.table
        shape = r.choice(["insert", "upsert", "update", "delete"])
        count = r.randint(2, 12)
        rows = []
        for _ in range(count):
            k = self.key()
            v = r.choice(["m", "", None, f"m{r.randrange(99)}", "\u00e9"])
            n = r.choice([None, 2.5, float(r.randrange(50))])
            rows.append({"insert": (k, v, n), "upsert": (k, v, n), "update": (v, n, k),
                         "delete": (k,)}[shape])
        sql = {
            "insert": f"INSERT INTO {t} VALUES (?, ?, ?)",
            "upsert": f"UPSERT INTO {t} VALUES (?, ?, ?)",
            "update": f"UPDATE {t} SET v = ?, n = ? WHERE k = ?",
            "delete": f"DELETE FROM {t} WHERE k = ?",
        }[shape]
        request = f"{sql} with rows {rows}"
        ok, result = self.sql("sql.executemany", sql, rows, many=True)
        applied = len(rows)
        if not ok:
            match = re.search(r"the (\d+) rows? before it (?:was|were) applied", result[1])
            applied = int(match.group(1)) if match else 0
        model = {row[0]: row[1:] for row in self.fp}
        first_failure = None
        for i, row in enumerate(rows):
            if shape == "insert":
                if row[0] in model:
                    first_failure = i if first_failure is None else first_failure
                    break
                model[row[0]] = row_image(row[1], row[2])
            elif shape == "upsert":
                model[row[0]] = row_image(row[1], row[2])
            elif shape == "update":
                if row[2] in model:
                    model[row[2]] = row_image(row[0], row[1])
            else:
                model.pop(row[0], None)
            if i + 1 == applied:
                break
        if applied == 0:
            model = {row[0]: row[1:] for row in self.fp}
        try:
            now = self.fingerprint()
        except ControlFailure as e:
            self.violation("table unreadable after executemany", request, e)
            self.recreate()
            return
        expected = tuple((k, *model[k]) for k in sorted(model))
        if ok and first_failure is not None:
            self.violation("executemany INSERT of an existing key succeeded", request)
        elif not ok and result[0].startswith("CLIENT"):
            expected = self.fp
        if now != expected:
            self.violation("executemany: the table is not what the applied rows make it", request,
                           f"{result[1] if not ok else 'succeeded'}\n  applied per the error: "
                           f"{applied}; expected vs now: {self.diff(expected, now)}")
        self.fp = now
        if len(self.fp) > MAX_ROWS:
            self.shrink()

    def op_transaction(self):
        """BEGIN; 1-5 statements; COMMIT, ROLLBACK or a dropped connection; the table must hold
        what the transaction last saw if it committed, else what it held at BEGIN."""
        r = self.rng
        start = self.fp
        log = []
        ok, result = self.sql("sql.txn", r.choice(["BEGIN", "START TRANSACTION", "BEGIN TRANSACTION"]))
        if not ok:
            self.violation("BEGIN failed", "BEGIN", result[1])
            self.control("ROLLBACK")
            return
        seen, aborted = start, False
        for _ in range(r.randint(1, 5)):
            if r.random() < 0.7:
                sql = self.valid_statement()
            else:
                sql = self.mutate(self.valid_statement(with_ref=False))
                if first_word(sql) not in DML_WORDS or words(sql) & (DDL_WORDS | SESSION_WORDS):
                    self.skipped += 1
                    continue
            log.append(sql)
            ok, result = self.sql("sql.txn", sql)
            if aborted:
                continue
            try:
                now = self.fingerprint()
            except ControlFailure as e:
                if not ok and "rolled back" in str(e):
                    aborted = True  # documented: a failed write rolls the transaction back
                    log.append("(rolled back)")
                    continue
                self.violation("transaction: the table no longer reads", sql, e)
                aborted = True
                continue
            if ok:
                seen = now
            elif now != seen:
                self.violation("partial effect in a transaction: a failed statement changed what "
                               "it sees", sql, f"{result[1]}\n  {self.diff(seen, now)}")
                seen = now
        end = r.random()
        if end < 0.6:
            ok, result = self.sql("sql.txn", "COMMIT")
            expected = seen if ok and not aborted else start
            log.append("COMMIT" if ok else f"COMMIT refused: {short(result[1], 120)}")
        elif end < 0.9:
            self.sql("sql.txn", "ROLLBACK")
            expected = start
            log.append("ROLLBACK")
        else:
            self.reconnect_db()  # the session ends, and its transaction with it
            expected = start
            log.append("(connection closed)")
        self.control("ROLLBACK")  # nothing open from here on
        now = self.fingerprint()
        if log[-1].startswith("COMMIT refused") and "outcome is unknown" in log[-1]:
            # Committed or rolled back within seconds, as the status table decides: either
            # state is right, once the transaction has ended.
            deadline = time.monotonic() + 15
            while now not in (seen, start) and time.monotonic() < deadline:
                time.sleep(0.2)
                now = self.fingerprint()
            expected = now if now in (seen, start) else start
        if now != expected:
            what = "committed" if expected is seen and expected is not start else "begun"
            self.violation(f"transaction: the table is not as the transaction {what} it",
                           " ; ".join(short(s, 100) for s in log),
                           f"expected vs now: {self.diff(expected, now)}")
        self.fp = now
        if len(self.fp) > MAX_ROWS:
            self.shrink()

    # --- raw Flight ---

    def read_queries(self):
        t, r = self.table, self.rng
        return [
            f"SELECT k, v FROM {t} WHERE k < {r.randrange(KEYS)}",
            f"SELECT * FROM {REF} WHERE id > {r.randrange(100)}",
            f"SELECT count(*) FROM {t}",
            "SELECT 1",
            f"SELECT k, n FROM {t} WHERE k = $1 AND v <> $2",
        ]

    def command_descriptor(self):
        """A FlightDescriptor of garbage: random bytes, or a Flight SQL command (read-only SQL,
        metadata) truncated, bit-flipped or with unknown fields."""
        r = self.rng
        sql = r.choice(self.read_queries())
        s = lambda: r.choice(["", "%", "nyala", "public", self.table, REF, "s\\_%", "\x00", "\uffff"])  # noqa: E731
        bodies = [
            any_message("CommandStatementQuery", length_delimited(1, sql)),
            any_message("CommandStatementQuery", length_delimited(1, sql) + length_delimited(2, r.randbytes(8))),
            any_message("CommandGetCatalogs", b""),
            any_message("CommandGetDbSchemas", length_delimited(1, s()) + length_delimited(2, s())),
            any_message("CommandGetTables", length_delimited(1, s()) + length_delimited(2, s())
                        + length_delimited(3, s()) + length_delimited(4, r.choice(["TABLE", "VIEW", ""]))
                        + varint_field(5, r.randrange(2))),
            any_message("CommandGetTableTypes", b""),
            any_message("CommandGetPrimaryKeys", length_delimited(3, s())),
            any_message("CommandGetExportedKeys", length_delimited(3, s())),
            any_message("CommandGetImportedKeys", length_delimited(3, s())),
            any_message("CommandGetCrossReference", length_delimited(3, s()) + length_delimited(6, s())),
            any_message("CommandGetSqlInfo", b"".join(varint_field(1, r.choice([0, 1, 500, 2 ** 32 - 1, r.randrange(1 << 32)]))
                                                       for _ in range(r.randint(0, 5)))),
            any_message("CommandGetXdbcTypeInfo", varint_field(1, r.randrange(1 << 32))),
            any_message("CommandPreparedStatementQuery", length_delimited(1, r.randbytes(16))),
            any_message("CommandStatementSubstraitPlan", length_delimited(1, length_delimited(1, r.randbytes(40)))),
            any_message("TicketStatementQuery", length_delimited(1, r.randbytes(30))),
            any_of("type.googleapis.com/nope.Nope", r.randbytes(10)),
            r.randbytes(r.randint(0, 200)),
        ]
        body = r.choice(bodies)
        if r.random() < 0.8:
            body = mutate_bytes(body, r)
        if r.random() < 0.1:
            return flight.FlightDescriptor.for_path(*[r.choice(["ref", self.table, "", "\x00", "a/b"])
                                                      for _ in range(r.randint(1, 3))])
        return flight.FlightDescriptor.for_command(body)

    def op_flight_command(self):
        r = self.rng
        descriptor = self.command_descriptor()
        request = f"{descriptor!r}"[:300]
        call = r.random()
        if call < 0.6:
            ok, info = self.track("flight.command", "GetFlightInfo " + request,
                                  lambda: self.raw.info(descriptor))
            if ok:
                self.track("flight.command", "DoGet of " + request,
                           lambda: self.raw.read(info, max_rows=10_000))
        elif call < 0.8:
            self.track("flight.command", "GetSchema " + request, lambda: self.raw.client.get_schema(descriptor, self.raw.options))
        else:
            # Columns no table has: whatever the descriptor turned into, nothing can load them.
            batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", None])],
                                    names=["zz_nope", "zz_nada"])
            self.track("flight.command", "DoPut " + request, lambda: self.raw.put(descriptor, batch))

    def param_messages(self):
        """(header, body) IPC messages of a parameter batch ($1 BIGINT, $2 STRING), maybe
        mutated: the raw bytes a ticket carries."""
        r = self.rng
        n = r.randint(1, 40)
        batch = pa.record_batch(
            [pa.array([self.key() for _ in range(n)], pa.int64()),
             pa.array([None if i % 3 == 1 else f"p{i}" for i in range(n)])],
            names=["$1", "$2"])
        messages = ipc_messages(ipc_stream(batch))
        choice = r.random()
        if choice < 0.2:
            return messages
        if choice < 0.35:
            return r.sample(messages, len(messages))
        if choice < 0.45:
            return [messages[0]] * r.randint(2, 3) + messages[1:]
        i = r.randrange(len(messages))
        header, body = messages[i]
        if r.random() < 0.6:
            header = mutate_bytes(header, r)
        else:
            body = mutate_bytes(body, r)
        messages[i] = (header, body)
        if r.random() < 0.1:
            messages.append((r.randbytes(r.randint(0, 64)), r.randbytes(r.randint(0, 64))))
        return messages

    def ticket(self):
        r = self.rng
        choice = r.random()
        if choice < 0.15:
            return flight.Ticket(r.randbytes(r.randint(0, 200)))
        if choice < 0.45:
            ok, info = self.track("flight.ticket", "GetFlightInfo for a ticket",
                                  lambda: self.raw.info(statement_query(r.choice(self.read_queries()[:4]))))
            if not ok or not info.endpoints:
                return None
            return flight.Ticket(mutate_bytes(r.choice(info.endpoints).ticket.ticket, r))
        sql = r.choice(self.read_queries())
        if r.random() < 0.3:
            mutated = self.mutate(sql)
            sql = mutated if is_read_only(mutated) else sql
        snapshot = r.choice([None, None, 0, 1, (1 << 64) - 1, r.randrange(1 << 64),
                             int(time.time() * 1e6) << 12, (int(time.time() * 1e6) - 3_600_000_000) << 12])
        partitions = r.choice([0, 0, 1, 4, r.randrange(1 << 32)])
        partition = r.choice([None, None, 0, 3, 99, r.randrange(1 << 32)])
        params = self.param_messages() if "$1" in sql or r.random() < 0.2 else ()
        ticket = query_ticket(sql, params, partition, partitions, snapshot,
                              session=r.choice(["", "", r.randbytes(16).hex()]))
        if r.random() < 0.3:
            ticket = flight.Ticket(mutate_bytes(ticket.ticket, r))
        return ticket

    def op_flight_ticket(self):
        ticket = self.ticket()
        if ticket is not None:
            self.track("flight.ticket", f"DoGet {ticket.ticket!r}", lambda: self.raw.get(ticket, 10_000))

    def action(self):
        r = self.rng
        sql = r.choice(self.read_queries())
        names = ["CreatePreparedStatement", "ClosePreparedStatement", "CreatePreparedSubstraitPlan",
                 "BeginTransaction", "EndTransaction", "BeginSavepoint", "EndSavepoint",
                 "CancelQuery", "CancelFlightInfo", "RenewFlightEndpoint", "SetSessionOptions",
                 "GetSessionOptions", "CloseSession", "NoSuchAction", "", "\x00\xff"]
        bodies = {
            "CreatePreparedStatement": create_prepared_statement(sql).body.to_pybytes(),
            "ClosePreparedStatement": close_prepared_statement(r.randbytes(16)).body.to_pybytes(),
            "CreatePreparedSubstraitPlan": any_message("ActionCreatePreparedSubstraitPlanRequest",
                                                       length_delimited(1, r.randbytes(20))),
            "BeginTransaction": any_message("ActionBeginTransactionRequest", b""),
            "EndTransaction": any_message("ActionEndTransactionRequest", length_delimited(1, r.randbytes(8))
                                          + varint_field(2, r.randrange(4))),
            "BeginSavepoint": any_message("ActionBeginSavepointRequest", length_delimited(1, r.randbytes(8))
                                          + length_delimited(2, "sp")),
            "EndSavepoint": any_message("ActionEndSavepointRequest", length_delimited(1, r.randbytes(8))
                                        + varint_field(2, r.randrange(4))),
            "CancelQuery": any_message("ActionCancelQueryRequest", length_delimited(1, r.randbytes(30))),
            "SetSessionOptions": set_session_options(r.choice([
                {"statement_timeout": r.choice(["5s", "-1s", "1e308s", "", "NaN", "99999999999999999999ms",
                                                "5", "0.5min", "\u00e9"])},
                {"statement_timeout": r.choice([5, -5, 2 ** 62, 1.5, float("nan"), True, ["a", "b"]])},
                {"nope.nope": "1", "": ""},
            ])).body.to_pybytes(),
            "GetSessionOptions": get_session_options().body.to_pybytes(),
            "CloseSession": close_session().body.to_pybytes(),
        }
        name = r.choice(names)
        if name in ("CancelFlightInfo", "RenewFlightEndpoint") or r.random() < 0.1:
            ok, info = self.track("flight.action", "GetFlightInfo for an action",
                                  lambda: self.raw.info(statement_query(r.choice(self.read_queries()[:4]))))
            if ok:
                if name == "RenewFlightEndpoint" and info.endpoints:
                    bodies[name] = length_delimited(1, r.choice(info.endpoints).serialize())
                else:
                    bodies["CancelFlightInfo"] = length_delimited(1, info.serialize())
                    bodies["CancelQuery"] = any_message("ActionCancelQueryRequest", info.serialize())
        body = bodies.get(name, r.randbytes(r.randint(0, 100)))
        if r.random() < 0.7:
            body = mutate_bytes(body, r)
        return flight.Action(name, body)

    def op_flight_action(self):
        action = self.action()
        request = f"DoAction {action.type!r} {action.body.to_pybytes()!r}"
        ok, bodies = self.track("flight.action", request, lambda: self.raw.action(action))
        if ok:
            if action.type == "CreatePreparedStatement":
                try:
                    handle = prepared_statement_handle(bodies[0])
                    self.track("flight.action", "ClosePreparedStatement",
                               lambda: self.raw.action(close_prepared_statement(handle)))
                except Exception:  # noqa: BLE001 - an answer that does not decode: let it be
                    pass
            # Whatever it did to the session (a transaction, a setting), start a new one.
            self.track("flight.action", "CloseSession", lambda: self.raw.action(close_session()))
            self.track("control", "SET statement_timeout (raw)",
                       lambda: self.raw.update(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'"))

    def table_batch(self, n, first_key):
        r = self.rng
        keys = pa.array(range(first_key, first_key + n), pa.int64())
        values = pa.array([None if r.random() < 0.3 else f"i{r.randrange(1000)}" for _ in range(n)])
        numbers = pa.array([None if r.random() < 0.3 else r.uniform(-10, 10) for _ in range(n)], pa.float64())
        return pa.record_batch([keys, values, numbers], names=["k", "v", "n"])

    def op_ingest_corrupt(self):
        """DoPut ingest into the thread's table of a batch with broken buffers (new keys: were
        it loaded, rows would appear)."""
        r = self.rng
        made = corrupted(self.table_batch(r.randint(9, 300), KEYS * 40 + r.randrange(1000)), r)
        if made is None:
            return
        batch, what = made
        request = f"DoPut ingest into {self.table} of a batch with {what}"
        ok, result = self.track("flight.ingest_corrupt", request,
                                lambda: self.rawput.put(statement_ingest(self.table), batch))
        if ok:
            self.violation("corrupted Arrow data was ingested", request)
        self.after(ok, request, None if ok else result[1])

    def mismatched_batch(self):
        r = self.rng
        n = r.randint(0, 30)
        base = r.choice([KEYS * 50, 0])
        keys = [base + r.randrange(KEYS) for _ in range(n)]
        if self.fp and n and r.random() < 0.3:
            keys[r.randrange(n)] = r.choice(self.fp)[0]  # an existing key
        if n > 1 and r.random() < 0.2:
            keys[-1] = keys[0]  # a key twice
        columns = {
            "k64": lambda: pa.array(keys, pa.int64()),
            "k32": lambda: pa.array([x % (1 << 31) for x in keys], pa.int32()),
            "kstr": lambda: pa.array([str(x) for x in keys]),
            "kjunk": lambda: pa.array(["x" + str(x) for x in keys]),
            "kf": lambda: pa.array([x + 0.5 for x in keys], pa.float64()),
            "knull": lambda: pa.nulls(n, pa.int64()),
            "kts": lambda: pa.array(keys, pa.timestamp("us")),
            "v": lambda: pa.array([f"m{x}" for x in keys]),
            "vint": lambda: pa.array(keys, pa.int64()),
            "vbin": lambda: pa.array([b"\xff\x00" for _ in keys], pa.binary()),
            "vbool": lambda: pa.array([True for _ in keys]),
            "vlong": lambda: pa.array(["L" * 100_000 for _ in keys]),
            "vdict": lambda: pa.array([f"d{x % 3}" for x in keys]).dictionary_encode(),
            "n": lambda: pa.array([float(x) for x in keys]),
            "nstr": lambda: pa.array([r.choice(["1.5", "abc", "NaN", ""]) for _ in keys]),
            "nlist": lambda: pa.array([[1.0] for _ in keys], pa.list_(pa.float64())),
            "nstruct": lambda: pa.array([{"a": 1} for _ in keys]),
            "ndec": lambda: pa.array([1 for _ in keys], pa.decimal128(38, 10)),
            "nnull": lambda: pa.nulls(n),
            "zz": lambda: pa.array(keys, pa.int64()),
        }
        names_of = {"k": "k", "v": "v", "n": "n", "z": "zz"}
        picks = r.sample(sorted(columns), r.randint(0, 4))
        if r.random() < 0.1 and picks:
            picks.append(picks[0])
        arrays = [columns[p]() for p in picks]
        names = [names_of[p[0]] for p in picks]
        if r.random() < 0.1 and names:
            names[r.randrange(len(names))] = r.choice(["K", "k ", "", "\x00", "v\u00e9"])
        return pa.record_batch(arrays, names=names) if arrays else pa.record_batch([], names=[]), picks

    def op_ingest_mismatch(self):
        """DoPut ingest into the thread's table of one batch whose columns do not (quite) match
        it: refused without loading anything, or loaded whole."""
        batch, picks = self.mismatched_batch()
        data = batch if self.rng.random() < 0.9 else batch.schema
        request = f"DoPut ingest into {self.table} of {picks} ({batch.num_rows} rows)"
        ok, result = self.track("flight.ingest_mismatch", request,
                                lambda: self.rawput.put(statement_ingest(self.table), data))
        self.after(ok, request, None if ok else result[1])

    def op_ingest_junk(self):
        """Ingest descriptors bit-flipped (into the junk table, never the scratch one: a flip
        could make one thread's table name another's)."""
        r = self.rng
        options = r.choice([(NOT_EXIST_CREATE, EXISTS_APPEND), (NOT_EXIST_CREATE, EXISTS_REPLACE),
                            (NOT_EXIST_FAIL, EXISTS_FAIL), (NOT_EXIST_CREATE, EXISTS_FAIL)])
        descriptor = statement_ingest(self.junk, *options)
        command = mutate_bytes(descriptor.command, r) if r.random() < 0.7 else descriptor.command
        batch = self.table_batch(r.randint(0, 20), r.randrange(KEYS)).rename_columns(["k", "v", "zz_n"])
        request = f"DoPut ingest {command!r}"
        self.track("flight.ingest_junk", request,
                   lambda: self.rawput.put(flight.FlightDescriptor.for_command(command), batch))

    def op_params(self):
        """A prepared statement on the raw session given corrupted, mismatched or valid
        parameters by DoPut."""
        r, t = self.rng, self.table
        sql, update = r.choice([
            (f"DELETE FROM {t} WHERE k = ? AND (v = ? OR true)", True),
            (f"UPDATE {t} SET n = 7 WHERE k = $1 AND (v <> $2 OR v IS NULL OR true)", True),
            (f"SELECT k FROM {t} WHERE k = ? AND v <> ?", False),
            (f"INSERT INTO {t} VALUES ($1, $2, 1.0)", True),
        ])
        ok, bodies = self.track("flight.params", f"CreatePreparedStatement {sql}",
                                lambda: self.rawput.action(create_prepared_statement(sql)))
        if not ok:
            return
        handle = prepared_statement_handle(bodies[0])
        try:
            keys = self.keys() or [0]
            n = r.randint(16, 200)
            batch = pa.record_batch(
                [pa.array([r.choice(keys) for _ in range(n)], pa.int64()),
                 pa.array([None if i % 3 == 1 else f"p{i}" for i in range(n)])],
                names=["$1", "$2"])
            choice = r.random()
            if choice < 0.6:
                made = corrupted(batch, r)
                if made is None:
                    return
                params, what = made
            elif choice < 0.85:
                params, picks = self.mismatched_batch()
                what = f"parameters {picks}"
                params = params.rename_columns([f"${i + 1}" for i in range(params.num_columns)])
            else:
                params, what = batch.slice(0, 1), "one valid parameter row"
            request = f"{sql} with {what}"
            descriptor = prepared_statement_update(handle) if update else prepared_statement_query(handle)
            ok, result = self.track("flight.params", "DoPut " + request,
                                    lambda: self.rawput.put(descriptor, params))
            if ok and not update:
                ok, result = self.track("flight.params", "GetFlightInfo " + request, lambda: self.rawput.read(
                    self.rawput.info(prepared_statement_query(handle)), 10_000))
            is_corrupt = what.endswith("shorter") or "more nulls" in what
            if ok and is_corrupt:
                self.violation("corrupted Arrow parameters were accepted", request)
            applied = not ok and re.search(r"the (\d+) rows? before it", str(result[1]))
            if applied and is_corrupt:
                self.violation("corrupted parameters applied in part", request, result[1])
            # Parameter rows run one by one: rows before a failing one stay applied (documented).
            self.after(ok or bool(applied), request, None if ok else result[1])
        finally:
            self.track("flight.params", "ClosePreparedStatement",
                       lambda: self.rawput.action(close_prepared_statement(handle)))

    def op_raw_sql(self):
        """Statements over the raw session: CommandStatementUpdate by DoPut, or a prepared
        statement run without parameters."""
        r = self.rng
        sql = self.valid_statement(with_ref=False)
        if r.random() < 0.6:
            sql = self.guarded(self.mutate(sql))
            if sql is None:
                return
        if r.random() < 0.6:
            ok, result = self.track("flight.raw_sql", "DoPut update " + sql, lambda: self.rawput.update(sql))
        else:
            def prepared():
                handle = prepared_statement_handle(self.rawput.action(create_prepared_statement(sql))[0])
                try:
                    return self.rawput.read(self.rawput.info(prepared_statement_query(handle)), 10_000)
                finally:
                    self.rawput.action(close_prepared_statement(handle))
            ok, result = self.track("flight.raw_sql", "prepared " + sql, prepared)
        if mentions(sql, self.table):
            self.after(ok, sql, None if ok else result[1], shape_may_change=self.reshapes(sql))

    def op_abandon(self):
        """A result stream dropped after its first batch: cancelled, or its connection closed."""
        r = self.rng
        sql = r.choice([f"SELECT value FROM generate_series(1, {r.randrange(10 ** 5, 10 ** 7)})",
                        f"SELECT * FROM {self.table}", f"SELECT * FROM {REF}"])
        if r.random() < 0.3:
            def adbc():
                self.cur.execute(sql)
                reader = self.cur.fetch_record_batch()
                next(iter(reader), None)
                reader.close()
            self.track("flight.abandon", "ADBC " + sql, adbc)
            return
        raw = Raw(self.shared.url)
        try:
            def drop():
                info = raw.info(statement_query(sql))
                reader = raw.client.do_get(info.endpoints[0].ticket, raw.options)
                try:
                    reader.read_chunk()
                except StopIteration:  # an empty result
                    return
                if r.random() < 0.5:
                    reader.cancel()
            self.track("flight.abandon", sql, drop)
        finally:
            raw.close()

    def op_reconnect(self):
        self.disconnect()
        self.connect()

    OPS = [
        ("op_valid", 14), ("op_mutated", 20), ("op_soup", 8), ("op_deep", 5), ("op_ddl", 3),
        ("op_prepared", 7), ("op_executemany", 4), ("op_transaction", 7),
        ("op_flight_command", 6), ("op_flight_ticket", 6), ("op_flight_action", 5),
        ("op_ingest_corrupt", 3), ("op_ingest_mismatch", 3), ("op_ingest_junk", 1),
        ("op_params", 3), ("op_raw_sql", 3), ("op_abandon", 1), ("op_reconnect", 1),
    ]

    def run(self):
        ops = [(name, w) for name, w in self.OPS if not self.shared.ops or name in self.shared.ops]
        names = [name for name, _ in ops]
        weights = [w for _, w in ops]
        try:
            self.connect()
            self.create_table()
        except Exception as e:  # noqa: BLE001 - reported
            self.violation("thread setup failed", "connect / CREATE TABLE", e)
            return
        while time.monotonic() < self.deadline and not self.shared.stop.is_set():
            op = self.rng.choices(names, weights)[0]
            try:
                getattr(self, op)()
            except ControlFailure as e:
                self.violation("a harness statement failed", op, e)
                self.recreate_after_failure()
            except Exception as e:  # noqa: BLE001 - the harness's own mistakes, reported
                import traceback
                self.harness_errors.append(f"{op}: {traceback.format_exc()}")
                self.shared.say(f"harness error in thread {self.index} ({op}): {e!r}")
                self.recreate_after_failure()
        self.disconnect()

    def recreate_after_failure(self):
        if self.shared.stop.is_set():
            return
        try:
            self.disconnect()
            self.connect()
            self.fp = self.fingerprint()
        except Exception as e:  # noqa: BLE001
            self.violation("could not reconnect", "connect", e)
            self.shared.stop.wait(1)


# --- the server ---

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_panics(log):
    """{(where, a message, who caught it): count} of the panics in a server log. Rust's panic
    hook prints `thread '...' panicked at FILE:LINE:COL:` and the message on the next line; a
    panic the server catches is also logged by the server, with the same message."""
    lines = log.splitlines()
    caught_messages = {}
    for line in lines:
        for marker, who in (("arrow panicked on uploaded data ", "caught by upload.rs (answered "
                             "`malformed Arrow data`)"),
                            ("request handler panicked", "caught by catch_panics (answered INTERNAL)")):
            if marker in line:
                caught_messages[line.split(marker, 1)[1].strip()] = who
    panics, samples = Counter(), {}
    for i, line in enumerate(lines):
        match = re.search(r"panicked at (\S+?):?$", line)
        if not match:
            if "panicked" in line.lower() and not any(m in line for m in (
                    "arrow panicked on uploaded data", "request handler panicked")):
                panics[(line.strip()[:200], "")] += 1
            continue
        message = lines[i + 1].strip() if i + 1 < len(lines) else ""
        caught = next((who for m, who in caught_messages.items() if message and message in m), "")
        key = (match.group(1), caught)
        samples.setdefault(key, message[:300])
        panics[key] += 1
    return Counter({(where, samples.get((where, caught), ""), caught): count
                    for (where, caught), count in panics.items()})


def release_bin():
    """$NYALA_BIN, else the release build in $CARGO_TARGET_DIR (default ~/.cache/nyala-target),
    else in the repository's target/."""
    if os.environ.get("NYALA_BIN"):
        return os.environ["NYALA_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/nyala-target")
    for path in (os.path.join(target, "release", "nyala"), os.path.join(REPO, "target", "release", "nyala")):
        if os.path.exists(path):
            return path
    return os.path.join(target, "release", "nyala")


class Server:
    """`nyala serve` on a fresh data directory, its stdout and stderr in files."""

    def __init__(self, binary, workdir):
        self.binary = binary
        self.stdout_path = os.path.join(workdir, "stdout.log")
        self.stderr_path = os.path.join(workdir, "stderr.log")
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")  # a panic's log names where
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [binary, "serve", "--data-dir", os.path.join(workdir, "data"),
                 "--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
                stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + 60
        while True:
            with open(self.stdout_path) as f:
                line = f.readline()
            if " on grpc" in line and line.endswith("\n"):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nyala serve did not start: {line!r} {self.log()[-2000:]}")
            time.sleep(0.05)
        self.url = next(w.rstrip(",)") for w in line.split() if w.startswith("grpc://"))

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def in_flight(workers):
    return "; ".join(f"thread {w.index}: now {w.current[:2] if w.current else None}, before "
                     f"{list(w.recent)}" for w in workers)


def ref_intact(cursor):
    cursor.execute(f"SELECT id, name, score FROM {REF} ORDER BY id")
    return cursor.fetchall() == REF_ROWS


class Monitor(threading.Thread):
    """Sends SELECT 1 every second and reads the reference table every 30 s, on a connection
    of its own; a failure or a slow answer is a violation (once per outage), reported with
    what every client thread was doing and, the first time, the server's thread stacks."""

    def __init__(self, server, shared, workers, workdir):
        super().__init__(name="fuzz-monitor", daemon=True)
        self.server, self.shared, self.workers, self.workdir = server, shared, workers, workdir
        self.pings, self.slowest = 0, 0.0
        self.conn = self.cur = None
        self.dumped = False

    def dump_stacks(self, why):
        """The server's threads' stacks (gdb), into the work directory, once."""
        if self.dumped or not self.server.alive() or not shutil.which("gdb"):
            return
        self.dumped = True
        path = os.path.join(self.workdir, f"stacks-{why}.txt")
        with open(path, "w") as f:
            subprocess.run(["gdb", "-p", str(self.server.proc.pid), "-batch", "-ex",
                            "thread apply all bt 30"], stdout=f, stderr=subprocess.STDOUT,
                           timeout=120, check=False)
        self.shared.say(f"  (the server's thread stacks are in {path})")

    def close(self):
        for closing in (self.cur, self.conn):
            try:
                if closing is not None:
                    closing.close()
            except Exception:  # noqa: BLE001 - a broken connection
                pass
        self.conn = self.cur = None

    def run(self):
        failing_since = None
        next_ref = time.monotonic()
        while not self.shared.stop.wait(1):
            if not self.server.alive():
                return
            t0 = time.monotonic()
            try:
                if self.conn is None:
                    self.conn = flight_sql.connect(self.shared.url, db_kwargs=ADBC_OPTIONS,
                                                   autocommit=True)
                    self.cur = self.conn.cursor()
                self.cur.execute("SELECT 1")
                self.cur.fetchall()
                took = time.monotonic() - t0
                self.pings += 1
                self.slowest = max(self.slowest, took)
                if took > SLOW_PING:
                    self.shared.violation(f"SELECT 1 took {took:.1f} s", "SELECT 1 (monitor)",
                                          f"in flight: {in_flight(self.workers)}")
                if failing_since is not None:
                    self.shared.say(f"  the server answers again after "
                                    f"{time.monotonic() - failing_since:.0f} s")
                    failing_since = None
                if time.monotonic() >= next_ref:
                    if not ref_intact(self.cur):
                        self.shared.violation("reference table changed", f"SELECT * FROM {REF}")
                    next_ref = time.monotonic() + 30
            except adbc_driver_manager.Error as e:
                self.close()
                if failing_since is None and self.server.alive():
                    failing_since = t0
                    self.shared.violation("the server does not answer SELECT 1",
                                          f"SELECT 1 (monitor), after {time.monotonic() - t0:.0f} s",
                                          f"{e}\n  in flight: {in_flight(self.workers)}")
                    self.dump_stacks("unresponsive")
        self.close()


# --- a run ---

class Result:
    """What a run found, and what it printed."""

    def __init__(self):
        self.violations = []
        self.harness_errors = []
        self.lines = []

    def report(self):
        return "\n".join(self.lines)


def run(seconds, binary, clients=4, seed=None, out=print, keep_dir=False, ops=()):
    """Starts a server, runs `clients` threads of traffic for `seconds` and checks the server
    afterwards; a Result whose `violations` lists every one found."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    result = Result()

    def say(line):
        result.lines.append(line)
        out(line)

    workdir = tempfile.mkdtemp(prefix="nyala-fuzz-traffic-")
    server = Server(binary, workdir)
    shared = Shared(server.url, seed, say)
    shared.alive = server.alive
    shared.ops = ops
    say(f"fuzz_traffic: seed {seed}, {clients} clients, {seconds:g} s, {binary}, server "
        f"{server.url} (pid {server.proc.pid}, dir {workdir})")
    started = time.monotonic()
    workers = []
    ping_max, pings = 0.0, 0
    try:
        with flight_sql.connect(server.url, db_kwargs=ADBC_OPTIONS, autocommit=True) as setup, \
                setup.cursor() as cur:
            cur.execute(f"CREATE TABLE {REF} (id BIGINT PRIMARY KEY, name STRING, score DOUBLE) "
                        f"DISTRIBUTE BY HASH (id) INTO 3 BUCKETS")
            values = ", ".join(f"({i}, '{n}', {s})" for i, n, s in REF_ROWS)
            cur.execute(f"INSERT INTO {REF} VALUES {values}")
            cur.fetchall()

        deadline = time.monotonic() + seconds
        workers = [Worker(i, shared, deadline, random.Random(f"{seed}/{i}").getrandbits(63))
                   for i in range(clients)]
        for w in workers:
            w.start()
        monitor_thread = Monitor(server, shared, workers, workdir)
        monitor_thread.start()
        next_progress = time.monotonic() + 60
        hang_reported = set()
        while any(w.is_alive() for w in workers):
            now = time.monotonic()
            if not server.alive():
                shared.violation("server died", f"exit code {server.proc.returncode}; the last "
                                 f"requests of each thread: {in_flight(workers)}",
                                 server.log()[-3000:])
                shared.server_dead.set()
                shared.stop.set()
                break
            for w in workers:
                current = w.current
                if current and now - current[2] > RPC_TIMEOUT + 30 and id(current) not in hang_reported:
                    hang_reported.add(id(current))
                    shared.violation(f"a request got no answer for {RPC_TIMEOUT + 30} s (hang)",
                                     f"{current[0]}: {current[1]}", "", w.index, w.seed)
                    monitor_thread.dump_stacks("hang")
            if now >= next_progress:
                total = sum(sum(w.requests.values()) for w in workers)
                say(f"  {now - started:5.0f} s: {total} requests, {len(shared.violations)} violations")
                next_progress = now + 60
            if now > deadline + 3 * RPC_TIMEOUT:
                for w in workers:
                    if w.is_alive():
                        shared.violation("a client thread did not finish (hang)",
                                         f"{w.current}", "", w.index, w.seed)
                shared.stop.set()
                break
            time.sleep(0.2)
        shared.stop.set()
        monitor_thread.join(2 * RPC_TIMEOUT)
        pings, ping_max = monitor_thread.pings, monitor_thread.slowest
        for w in workers:
            w.join(RPC_TIMEOUT)

        # The server after the traffic.
        if server.alive():
            try:
                check = flight_sql.connect(server.url, db_kwargs=ADBC_OPTIONS, autocommit=True)
                with check.cursor() as ccur:
                    ccur.execute("SELECT 1")
                    if ccur.fetchall() != [(1,)]:
                        shared.violation("SELECT 1 answered wrongly at the end", "SELECT 1")
                    if not ref_intact(ccur):
                        shared.violation("reference table changed", f"SELECT * FROM {REF}")
                check.close()
            except adbc_driver_manager.Error as e:
                shared.violation("the server does not answer at the end", "SELECT 1", e)
        else:
            shared.violation("server died", f"exit code {server.proc.returncode}", server.log()[-3000:])
    finally:
        shared.stop.set()
        server.stop()
    log = ANSI.sub("", server.log())
    panics = log_panics(log)
    for (where, message, caught), count in panics.items():
        shared.violation(f"the server's log has {count} panic(s)" + (f", {caught}" if caught else ""),
                         f"panicked at {where}", message, force=True)
    elapsed = time.monotonic() - started

    # The summary.
    requests, failed, codes = Counter(), Counter(), Counter()
    skipped = 0
    harness_errors = []
    for w in workers:
        requests.update(w.requests)
        failed.update(w.failed)
        codes.update(w.codes)
        skipped += w.skipped
        harness_errors += w.harness_errors
    say(f"fuzz_traffic: {elapsed:.0f} s, {sum(requests.values())} requests, seed {seed}")
    say("requests per kind (total / refused):")
    for kind in sorted(requests):
        say(f"  {kind:24} {requests[kind]:8} {failed[kind]:8}")
    say(f"  (mutated statements not sent because they would change the session: {skipped})")
    say("errors per gRPC code:")
    for code, count in codes.most_common():
        say(f"  {code:24} {count:8}")
    say(f"monitor: {pings} SELECT 1, slowest {ping_max:.2f} s")
    warnings = [line for line in log.splitlines() if re.match(r"\S+\s+(ERROR|WARN) ", line)]
    say(f"server log: {len(log.splitlines())} lines, {len(warnings)} WARN/ERROR, "
        f"{sum(panics.values())} panics")
    for line in list(dict.fromkeys(re.sub(r"^\S+\s+", "", w)[:200] for w in warnings))[:10]:
        say(f"  {line}")
    for note in shared.notes[:20]:
        say(f"note: {note}")
    if harness_errors:
        say(f"harness errors: {len(harness_errors)}")
        for e in harness_errors[:5]:
            say("  " + e.replace("\n", "\n  "))
    result.violations = list(shared.violations)
    result.harness_errors = harness_errors
    say(f"violations: {len(result.violations)}")
    shown = Counter()
    for v in result.violations:
        shown[v["what"]] += 1
        if shown[v["what"]] <= 3:
            say(f"  [{v['what']}] thread {v['thread']} (seed {seed}, thread seed {v['thread_seed']})\n"
                f"    request: {v['request']}\n    error: {v['error']}")
    for what, count in shown.items():
        if count > 3:
            say(f"  ... and {count - 3} more [{what}]")
    if result.violations or harness_errors or keep_dir:
        for w in workers:
            with open(os.path.join(workdir, f"requests-{w.index}.log"), "w") as f:
                f.write("\n".join(w.history) + "\n")
        say(f"server data and logs kept in {workdir} (each client's requests in requests-N.log)")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def test_fuzz_traffic_leaves_the_server_whole():
    seconds = float(os.environ.get("NYALA_FUZZ_TRAFFIC_SECS", "15"))
    seed = os.environ.get("NYALA_FUZZ_SEED")
    result = run(seconds, nyala_bin(), clients=4, seed=int(seed) if seed else None)
    assert not result.violations, result.report()
    assert not result.harness_errors, result.report()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--bin", default=None, help="the nyala binary (default: $NYALA_BIN, else "
                        "the release build in $CARGO_TARGET_DIR or ~/.cache/nyala-target)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the server's data and logs")
    parser.add_argument("--ops", default="", help="only these kinds of traffic, comma-separated "
                        "(Worker.OPS names, e.g. op_prepared,op_transaction), to narrow down a "
                        "violation")
    args = parser.parse_args()
    ops = tuple(o for o in args.ops.split(",") if o)
    unknown = set(ops) - {name for name, _ in Worker.OPS}
    if unknown:
        sys.exit(f"unknown --ops: {', '.join(sorted(unknown))}")
    binary = args.bin or release_bin()
    if not os.path.exists(binary):
        sys.exit(f"no nyala binary at {binary}: build it, or give --bin / NYALA_BIN")
    result = run(args.seconds, binary, args.clients, args.seed, out=lambda s: print(s, flush=True),
                 keep_dir=args.keep, ops=ops)
    sys.exit(1 if result.violations or result.harness_errors else 0)


if __name__ == "__main__":
    main()
