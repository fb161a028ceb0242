"""One session per client: SQL settings and prepared statements belong to the client that made
them, against a real `nyala serve` process.

A session is named by the `arrow_flight_session_id` cookie when the client sends it back (the
server sets it on a new session's first call), else by the bearer token when the server needs
a password, else by the gRPC connection: ADBC and plain pyarrow clients keep no cookies, so
there one connection is one session. Flight's session actions (SetSessionOptions,
GetSessionOptions, CloseSession) read and change the caller's session; their option names are
SQL setting names.
"""

import contextlib
import re

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flight_sql_messages import (
    CLOSED,
    END_COMMIT,
    END_ROLLBACK,
    ERROR,
    INVALID_NAME,
    INVALID_VALUE,
    begin_transaction,
    close_prepared_statement,
    close_session,
    close_session_status,
    create_prepared_statement,
    end_transaction,
    get_session_options,
    prepared_statement_handle,
    prepared_statement_query,
    session_options,
    set_session_options,
    set_session_options_errors,
    statement_query,
    statement_update,
    transaction_id,
)
from nyala_server import PASSWORD, USER

BATCH_SIZE = "datafusion.execution.batch_size"
DEFAULT_BATCH_SIZE = "8192"
SESSION_COOKIE = "arrow_flight_session_id"


class Client:
    """One pyarrow.flight connection, reading every result on that connection (so on its own
    session), with optional call headers and client middleware."""

    def __init__(self, url, headers=(), middleware=()):
        self.flight = flight.FlightClient(url.replace("grpc://", "grpc+tcp://"), middleware=list(middleware))
        self.options = flight.FlightCallOptions(headers=list(headers))

    def close(self):
        self.flight.close()

    def update(self, sql, transaction_id=None):
        """CommandStatementUpdate through DoPut."""
        descriptor = statement_update(sql, transaction_id)
        writer, reader = self.flight.do_put(descriptor, pa.schema([]), self.options)
        writer.done_writing()
        reader.read()
        writer.close()

    def read(self, descriptor):
        """GetFlightInfo of `descriptor`, then every endpoint through this connection."""
        info = self.flight.get_flight_info(descriptor, self.options)
        tables = [self.flight.do_get(e.ticket, self.options).read_all() for e in info.endpoints]
        return pa.concat_tables(tables) if tables else info.schema.empty_table()

    def setting(self, name):
        """The value of SQL setting `name` as this client's session sees it."""
        return self.read(statement_query(f"SHOW {name}")).column("value").to_pylist()[0]

    def action(self, action):
        """The bodies of a DoAction's results."""
        return [r.body.to_pybytes() for r in self.flight.do_action(action, self.options)]

    def prepare(self, sql):
        (body,) = self.action(create_prepared_statement(sql))
        return prepared_statement_handle(body)

    def run_prepared(self, handle):
        return self.read(prepared_statement_query(handle))


@pytest.fixture
def clients(server):
    """Makes Client(server, ...) and closes them all afterwards."""
    made = []

    def connect(headers=(), middleware=()):
        made.append(Client(server, headers, middleware))
        return made[-1]

    yield connect
    for c in made:
        c.close()


def adbc_setting(conn, name):
    with conn.cursor() as cur:
        cur.execute(f"SHOW {name}")
        return cur.fetch_arrow_table().column("value").to_pylist()[0]


# --- Settings ---

def test_show_reads_a_setting(clients):
    # Every test below reads settings with SHOW; this one fails alone if SHOW itself breaks.
    table = clients().read(statement_query(f"SHOW {BATCH_SIZE}"))
    assert table.to_pylist() == [{"name": BATCH_SIZE, "value": DEFAULT_BATCH_SIZE}]


def test_set_in_one_adbc_connection_is_invisible_in_another(server):
    with flightsql.connect(server, autocommit=True) as a, flightsql.connect(server, autocommit=True) as b:
        with a.cursor() as cur:
            cur.execute(f"SET {BATCH_SIZE} = 1234")
        assert adbc_setting(a, BATCH_SIZE) == "1234"
        assert adbc_setting(b, BATCH_SIZE) == DEFAULT_BATCH_SIZE, "B sees A's SET: the connections share a session"
    # A new connection starts from the defaults too.
    with flightsql.connect(server, autocommit=True) as c:
        assert adbc_setting(c, BATCH_SIZE) == DEFAULT_BATCH_SIZE


def test_statement_timeout_ends_a_query_with_resource_exhausted(server):
    """A session's statement_timeout ends its long query with a clear, typed error (gRPC
    RESOURCE_EXHAUSTED, a limit of the statement), and the session goes on."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SET statement_timeout = '200ms'")
        with pytest.raises(flightsql.Error) as failed:
            cur.execute("SELECT sum(value) FROM generate_series(1, 3000000000)")
            cur.fetchall()
        message = str(failed.value)
        assert "statement timeout" in message and "ResourceExhausted" in message, message
        cur.execute("SELECT 1")
        assert cur.fetchall() == [(1,)]


def test_an_insert_stopped_by_its_timeout_or_its_client_leaves_nothing(server, clients):
    """A statement that changes rows is never cut in the middle of a write. An INSERT that has
    written some of its rows when its statement_timeout passes, or when its client goes away,
    leaves none of them, and no lock on them either (a write to a locked row waits 10 s for it,
    then fails)."""
    endless = "INSERT INTO stopped SELECT value + {}, 0 FROM generate_series(1, 3000000000)"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE stopped (k BIGINT PRIMARY KEY, v BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
        cur.execute("SET statement_timeout = '300ms'")
        with pytest.raises(flightsql.Error) as failed:
            cur.execute(endless.format(0))
        assert "statement timeout" in str(failed.value), failed.value
        cur.execute("SET statement_timeout = 0")
        cur.execute("INSERT INTO stopped VALUES (1, 1)")

        # A client whose call has a deadline of 300 ms: gRPC cancels the call then (the
        # client's deadline or the server's, which honours the call's grpc-timeout and answers
        # CANCELLED, whichever comes first).
        gone = clients()
        gone.options = flight.FlightCallOptions(timeout=0.3)
        with pytest.raises((flight.FlightTimedOutError, flight.FlightCancelledError)):
            gone.update(endless.format(10))
        cur.execute("INSERT INTO stopped VALUES (11, 11)")
        cur.execute("SELECT k FROM stopped ORDER BY k")
        assert cur.fetchall() == [(1,), (11,)]


def test_set_in_one_pyarrow_connection_is_invisible_in_another(clients):
    a, b = clients(), clients()
    a.update(f"SET {BATCH_SIZE} = 2222")
    assert a.setting(BATCH_SIZE) == "2222"
    assert b.setting(BATCH_SIZE) == DEFAULT_BATCH_SIZE, "B sees A's SET: the connections share a session"


# --- Prepared statements ---

def test_prepared_statement_belongs_to_its_connection(clients):
    a, b = clients(), clients()
    handle = a.prepare("SELECT 42 AS answer")
    assert a.run_prepared(handle).column("answer").to_pylist() == [42]

    # NOT_FOUND, which pyarrow raises as ArrowKeyError.
    with pytest.raises(pa.ArrowKeyError):
        b.run_prepared(handle)
    # Closing it from B must not close it for A (B may be told it does not exist).
    with contextlib.suppress(flight.FlightError, pa.ArrowException):
        b.action(close_prepared_statement(handle))
    assert a.run_prepared(handle).column("answer").to_pylist() == [42], "A's statement survives B"


def test_prepared_statement_handles_are_unguessable(clients):
    a = clients()
    first, second = a.prepare("SELECT 1"), a.prepare("SELECT 2")
    for handle in (first, second):
        assert not re.fullmatch(rb"\D*\d+", handle), f"a counter: {handle!r}"
        assert len(handle) >= 16, f"too short to be random: {handle!r}"
    assert first != second
    # Random handles differ almost everywhere; a counter changes only its last digits.
    differing = sum(x != y for x, y in zip(first, second))
    assert differing >= 8, f"handles share a pattern: {first!r}, {second!r}"


# --- Session actions ---

def test_close_session_drops_prepared_statements_and_settings(clients):
    a = clients()
    a.update(f"SET {BATCH_SIZE} = 2345")
    handle = a.prepare("SELECT 1 AS one")
    assert a.setting(BATCH_SIZE) == "2345"

    (body,) = a.action(close_session())
    assert close_session_status(body) == CLOSED

    with pytest.raises(pa.ArrowKeyError):
        a.run_prepared(handle)
    # The connection's next call starts a fresh session.
    assert a.setting(BATCH_SIZE) == DEFAULT_BATCH_SIZE


def test_session_options_round_trip_and_stay_in_the_session(clients):
    a, b = clients(), clients()
    (body,) = a.action(set_session_options({BATCH_SIZE: "3456", "nyala.runtime_filters": "minmax"}))
    assert set_session_options_errors(body) == {}, "DataFusion's and Nyala's settings are both options"

    (body,) = a.action(get_session_options())
    options = session_options(body)
    assert options[BATCH_SIZE] == "3456"
    assert options["nyala.runtime_filters"] == "minmax"
    assert a.setting(BATCH_SIZE) == "3456", "SQL in the session sees the option"
    assert a.setting("nyala.runtime_filters") == "minmax"

    (body,) = b.action(get_session_options())
    assert session_options(body)[BATCH_SIZE] == DEFAULT_BATCH_SIZE
    assert b.setting(BATCH_SIZE) == DEFAULT_BATCH_SIZE

    # SET is seen by GetSessionOptions just the same.
    a.update(f"SET {BATCH_SIZE} = 3457")
    (body,) = a.action(get_session_options())
    assert session_options(body)[BATCH_SIZE] == "3457"


def test_session_options_of_other_types_come_back_as_strings(clients):
    a = clients()
    (body,) = a.action(set_session_options({BATCH_SIZE: 4567, "datafusion.optimizer.prefer_hash_join": False}))
    assert set_session_options_errors(body) == {}
    (body,) = a.action(get_session_options())
    options = session_options(body)
    assert options[BATCH_SIZE] == "4567"
    assert options["datafusion.optimizer.prefer_hash_join"] == "false"


def test_session_option_errors_are_per_name(clients):
    a = clients()
    (body,) = a.action(set_session_options({"nyala.no_such_option": "1", BATCH_SIZE: "5000"}))
    assert set_session_options_errors(body) == {"nyala.no_such_option": INVALID_NAME}
    assert a.setting(BATCH_SIZE) == "5000", "the valid option in the same request is set"

    (body,) = a.action(set_session_options({"nyala.runtime_filters": "sometimes"}))
    errors = set_session_options_errors(body)
    assert errors.get("nyala.runtime_filters") in (INVALID_VALUE, ERROR), f"a known name with a bad value: {errors}"
    assert a.setting("nyala.runtime_filters") == "bloom", "a rejected value changes nothing"


# --- How a session is named ---

class HeaderRecorder(flight.ClientMiddlewareFactory):
    """Keeps the response headers of every call a client makes."""

    def __init__(self):
        self.received = []

    def start_call(self, info):
        return _Recording(self.received)


class _Recording(flight.ClientMiddleware):
    def __init__(self, received):
        self.received = received

    def received_headers(self, headers):
        self.received.append(headers)


def session_cookie(received):
    """The session id of the first `set-cookie: arrow_flight_session_id=<id>; ...` seen."""
    for headers in received:
        for value in headers.get("set-cookie", []):
            value = value.decode() if isinstance(value, bytes) else value
            name, _, rest = value.partition("=")
            if name.strip() == SESSION_COOKIE:
                return rest.split(";")[0].strip()
    return None


def test_the_session_cookie_names_the_session_across_connections(clients):
    recorder = HeaderRecorder()
    a = clients(middleware=[recorder])
    a.update(f"SET {BATCH_SIZE} = 6789")
    session_id = session_cookie(recorder.received)
    assert session_id, f"no set-cookie {SESSION_COOKIE}=... in the responses: {recorder.received}"

    # Another connection that sends the cookie back is in A's session; one that does not is not.
    b = clients(headers=[(b"cookie", f"{SESSION_COOKIE}={session_id}".encode())])
    assert b.setting(BATCH_SIZE) == "6789", "B sends A's cookie, so it is in A's session"
    assert a.setting(BATCH_SIZE) == "6789", "A keeps its session after B joins it"
    handle = a.prepare("SELECT 7 AS seven")
    assert b.run_prepared(handle).column("seven").to_pylist() == [7], "A's statement is in the shared session"
    assert clients().setting(BATCH_SIZE) == DEFAULT_BATCH_SIZE


def test_the_bearer_token_names_the_session_across_connections(auth_server):
    def login():
        client = Client(auth_server)
        token = client.flight.authenticate_basic_token(USER, PASSWORD)
        client.options = flight.FlightCallOptions(headers=[token])
        return client, token

    (a, token), (b, _) = login(), login()
    a_again = Client(auth_server, [token])
    try:
        a.update(f"SET {BATCH_SIZE} = 7777")
        assert a_again.setting(BATCH_SIZE) == "7777", "a new connection with A's token is A's session"
        assert b.setting(BATCH_SIZE) == DEFAULT_BATCH_SIZE, "another login is another session"
    finally:
        for c in (a, b, a_again):
            c.close()


def test_a_sql_transaction_belongs_to_its_session(clients, table_name):
    """A SQL BEGIN opens a transaction in the session it was sent in, and every statement of
    that session runs in it until COMMIT or ROLLBACK, as on a PostgreSQL connection: the
    statements of a client with a session cookie, or, without one, of its gRPC connection.
    Clients that share one connection between threads therefore share its transaction; each
    thread should have its own connection (or session)."""
    recorder = HeaderRecorder()
    a = clients(middleware=[recorder])
    a.update(f"CREATE TABLE {table_name} (k INT PRIMARY KEY)")
    session_id = session_cookie(recorder.received)
    a.update("BEGIN")
    a.update(f"INSERT INTO {table_name} VALUES (1)")
    count = f"SELECT count(*) AS n FROM {table_name}"
    same_session = clients(headers=[(b"cookie", f"{SESSION_COOKIE}={session_id}".encode())])
    other = clients()
    assert a.read(statement_query(count)).column("n").to_pylist() == [1]
    assert same_session.read(statement_query(count)).column("n").to_pylist() == [1]
    assert other.read(statement_query(count)).column("n").to_pylist() == [0]
    same_session.update("COMMIT")
    assert other.read(statement_query(count)).column("n").to_pylist() == [1]


def test_a_flight_sql_transaction_holds_only_the_requests_that_name_it(clients, table_name):
    """A transaction begun by BeginTransaction runs only the requests that carry its id; on
    the same session (the same connection here), requests without one commit on their own,
    as the Flight SQL spec has it. EndTransaction commits or rolls it back; an ended id is
    refused."""
    a = clients()
    a.update(f"CREATE TABLE {table_name} (k INT PRIMARY KEY)")
    (body,) = a.action(begin_transaction())
    txn = transaction_id(body)
    a.update(f"INSERT INTO {table_name} VALUES (1)", txn)
    a.update(f"INSERT INTO {table_name} VALUES (2)")
    keys = f"SELECT k FROM {table_name} ORDER BY k"
    # The transaction reads at its snapshot (taken by its first statement) and its own rows.
    assert a.read(statement_query(keys, txn)).column("k").to_pylist() == [1]
    assert a.read(statement_query(keys)).column("k").to_pylist() == [2]
    assert clients().read(statement_query(keys)).column("k").to_pylist() == [2]
    a.action(end_transaction(txn, END_COMMIT))
    assert clients().read(statement_query(keys)).column("k").to_pylist() == [1, 2]
    with pytest.raises(pa.ArrowKeyError, match="not open in this session"):  # NOT_FOUND
        a.update(f"INSERT INTO {table_name} VALUES (3)", txn)
    (body,) = a.action(begin_transaction())
    txn = transaction_id(body)
    a.update(f"DELETE FROM {table_name} WHERE k = 1", txn)
    a.action(end_transaction(txn, END_ROLLBACK))
    assert a.read(statement_query(keys)).column("k").to_pylist() == [1, 2]
