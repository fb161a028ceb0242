"""Bad input over Flight SQL, against a real server: malformed SQL, wrong types, duplicate keys,
unknown names, oversized statements, too many parameters, garbage commands, tickets and actions,
corrupted Arrow IPC in DoPut and in tickets, ingests that do not match their table, errors that
would quote a megabyte the client sent.

Each request must be refused with a clear error — never a reset stream or a panic's message —
and leave the server serving and the database as it was: after every test, `SELECT 1` answers,
the reference table holds exactly its rows and no table appeared or went away.

Arrow IPC is corrupted by editing the flatbuffer header of a valid message (a buffer's length,
an array's null count) and reading it back with pyarrow, which takes such data as it is: that
is how a batch with, say, a validity bitmap shorter than its array reaches the server. A ticket
carries its parameter rows as raw IPC messages, which lets the tests send any bytes at all.
"""

import random
import struct

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flight_sql_messages import (
    EXISTS_APPEND,
    EXISTS_FAIL,
    NOT_EXIST_CREATE,
    NOT_EXIST_FAIL,
    any_message,
    close_prepared_statement,
    create_prepared_statement,
    decode_fields,
    length_delimited,
    prepared_statement_handle,
    prepared_statement_query,
    prepared_statement_update,
    statement_ingest,
    statement_query,
    statement_update,
    ticket_statement_query,
    varint_field,
)

# The server's limits (flight-server/src/limits.rs).
MAX_STATEMENT_BYTES = 1 << 20
MAX_PARAMETERS = 65_535
MAX_PARAMETER_ROWS = 10_000
MAX_PREPARED_STATEMENTS = 1024

# The longest error message (flight-server/src/errors.rs). Statuses travel in HTTP/2 headers,
# which clients limit: gRPC C++ refuses more than 16 KiB ("received metadata size exceeds hard
# limit"), so an error quoting what a client sent is cut.
MAX_ERROR_BYTES = 1024

# Text that only a crash or a bug puts into an error.
FORBIDDEN = ("panicked", "internal error", "rust_backtrace", "backtrace", "rst_stream")


class Client:
    """Flight SQL over raw pyarrow.flight (messages encoded by flight_sql_messages)."""

    def __init__(self, url):
        self.client = flight.FlightClient(url.replace("grpc://", "grpc+tcp://"))

    def close(self):
        self.client.close()

    def put(self, descriptor, data):
        """DoPut of `data` (a RecordBatch, or a Schema for no batches); the server's answer."""
        schema = data if isinstance(data, pa.Schema) else data.schema
        writer, reader = self.client.do_put(descriptor, schema)
        try:
            if not isinstance(data, pa.Schema):
                writer.write_batch(data)
            writer.done_writing()
            answer = reader.read()
        finally:
            writer.close()
        return answer.to_pybytes() if answer is not None else b""

    def update(self, sql):
        return decode_fields(self.put(statement_update(sql), pa.schema([]))).get(1, [0])[0]

    def read(self, info):
        tables = [self.client.do_get(e.ticket).read_all() for e in info.endpoints]
        return pa.concat_tables(tables) if tables else info.schema.empty_table()

    def query(self, sql):
        return self.read(self.client.get_flight_info(statement_query(sql)))

    def prepare(self, sql):
        [result] = self.client.do_action(create_prepared_statement(sql))
        return prepared_statement_handle(result.body.to_pybytes())

    def close_prepared(self, handle):
        list(self.client.do_action(close_prepared_statement(handle)))


REF_ROWS = [(i, f"name {i}", i % 2 == 0, i / 4) for i in range(1, 101)]


@pytest.fixture(scope="module")
def client(server):
    c = Client(server)
    c.update("CREATE TABLE ref (id BIGINT PRIMARY KEY, name STRING, flag BOOL, score DOUBLE)")
    values = ", ".join(f"({i}, '{n}', {str(f).lower()}, {s})" for i, n, f, s in REF_ROWS)
    assert c.update(f"INSERT INTO ref VALUES {values}") == len(REF_ROWS)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def unharmed(client):
    """After each test: the server answers, `ref` holds its rows, no table came or went."""
    yield
    assert client.query("SELECT 1 AS one").column("one").to_pylist() == [1]
    rows = client.query("SELECT id, name, flag, score FROM ref ORDER BY id")
    assert list(zip(*(rows.column(c).to_pylist() for c in range(4)))) == REF_ROWS
    tables = client.query("SHOW TABLES")
    assert tables.column(tables.num_columns - 1).to_pylist() == ["ref"]


def refused(call, *needles):
    """Runs `call`, which must fail with a Flight error naming `needles`; its message."""
    with pytest.raises(pa.ArrowException) as info:
        call()
    error = info.value
    text = str(error)
    # A reset stream or a dead server, not an answer.
    assert not isinstance(error, (flight.FlightCancelledError, flight.FlightUnavailableError)), text
    assert not isinstance(error, flight.FlightInternalError), text
    for word in FORBIDDEN:
        assert word not in text.lower(), text
    for needle in needles:
        assert needle in text, text
    return text


# --- Statements ---

def run_prepared(client, sql):
    """Prepares `sql`, runs it once without parameters and closes it."""
    handle = client.prepare(sql)
    try:
        return client.read(client.client.get_flight_info(prepared_statement_query(handle)))
    finally:
        client.close_prepared(handle)


def statement_paths(client):
    """The three ways a statement's text reaches the server."""
    return {
        "query": client.query,
        "update": client.update,
        "prepare": lambda sql: run_prepared(client, sql),
    }


PATHS = ["query", "update", "prepare"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "sql, needle",
    [
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM", "syntax error"),
        ("INSERT INTO ref VALUES (", "syntax error"),
        ("SELECT 'unterminated", "syntax error"),
        ("\x00\x01\x02\x7f", "syntax error"),
        ("SELECT " + "(" * 5000 + "1" + ")" * 5000, ""),
        ("", ""),
        ("SELECT 1; DROP TABLE ref", ""),
    ],
)
def test_malformed_sql(client, path, sql, needle):
    refused(lambda: statement_paths(client)[path](sql), needle)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO ref VALUES ('x', 'a', true, 1.0)",
        "INSERT INTO ref VALUES (500, 'a', 'maybe', 1.0)",
        "UPDATE ref SET score = 'abc' WHERE id = 1",
        "SELECT * FROM ref WHERE id = 'abc'",
        "INSERT INTO ref VALUES (99999999999999999999999, 'a', true, 1.0)",
        "INSERT INTO ref VALUES (NULL, 'a', true, 1.0)",
        "UPDATE ref SET id = 7 WHERE id = 1",
    ],
)
def test_wrong_types_and_values(client, path, sql):
    refused(lambda: statement_paths(client)[path](sql))


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO ref VALUES (1, 'again', true, 0.0)",
        "INSERT INTO ref VALUES (1000, 'new', true, 0.0), (1, 'again', true, 0.0)",
        "INSERT INTO ref VALUES (1000, 'new', true, 0.0), (1000, 'twice', true, 0.0)",
        "INSERT INTO ref SELECT * FROM ref",
    ],
)
def test_duplicate_keys(client, sql):
    refused(lambda: client.update(sql), "duplicate")


@pytest.mark.parametrize(
    "sql, needle",
    [
        ("SELECT * FROM nope", "nope"),
        ("INSERT INTO nope VALUES (1)", "nope"),
        ("DELETE FROM nope", "nope"),
        ("DROP TABLE nope", "nope"),
        ("ALTER TABLE nope ADD COLUMN c INT", "nope"),
        ("SELECT nope FROM ref", "nope"),
        ("UPDATE ref SET nope = 1", "nope"),
        ("ALTER TABLE ref DROP COLUMN nope", "nope"),
    ],
)
def test_unknown_tables_and_columns(client, sql, needle):
    refused(lambda: client.update(sql), needle)


@pytest.mark.parametrize("path", PATHS)
def test_oversized_statements(client, path):
    sql = "SELECT 1 -- " + "x" * MAX_STATEMENT_BYTES
    text = refused(lambda: statement_paths(client)[path](sql), f"at most {MAX_STATEMENT_BYTES}")
    # The error quotes none of it.
    assert len(text) < 2000, len(text)


@pytest.mark.parametrize("path", PATHS)
def test_too_many_parameters(client, path):
    sql = "SELECT 1 WHERE 1 IN (" + ", ".join(["?"] * (MAX_PARAMETERS + 1)) + ")"
    refused(lambda: statement_paths(client)[path](sql), f"at most {MAX_PARAMETERS}")


def parameter_rows(n, first_id=1_000_000):
    return pa.record_batch(
        [pa.array(range(first_id, first_id + n), pa.int64()), pa.array(["p"] * n)],
        names=["$1", "$2"],
    )


def test_too_many_parameter_rows(client):
    handle = client.prepare("INSERT INTO ref VALUES (?, ?, true, 0.0)")
    try:
        too_many = parameter_rows(MAX_PARAMETER_ROWS + 1)
        needle = f"at most {MAX_PARAMETER_ROWS}"
        refused(lambda: client.put(prepared_statement_update(handle), too_many), needle)
        refused(lambda: client.put(prepared_statement_query(handle), too_many), needle)
        # Nothing was bound: running the statement now binds no rows.
        refused(lambda: client.client.get_flight_info(prepared_statement_query(handle)), "parameter")
    finally:
        client.close_prepared(handle)


def test_wrong_parameter_count_and_types(client):
    handle = client.prepare("SELECT name FROM ref WHERE id = ?")
    try:
        for params in [
            parameter_rows(1),
            pa.record_batch([pa.array(["not a number"])], names=["$1"]),
            pa.record_batch([pa.array([[1, 2]], pa.list_(pa.int64()))], names=["$1"]),
        ]:
            client.put(prepared_statement_query(handle), params)
            refused(lambda: client.client.get_flight_info(prepared_statement_query(handle)),
                    "parameter")
    finally:
        client.close_prepared(handle)


def test_prepared_statements_per_session_are_bounded(server):
    own = Client(server)  # a session of its own
    try:
        handles = [own.prepare("SELECT 1") for _ in range(MAX_PREPARED_STATEMENTS)]
        refused(lambda: own.prepare("SELECT 1"), f"{MAX_PREPARED_STATEMENTS} prepared statements")
        own.close_prepared(handles.pop())
        handles.append(own.prepare("SELECT 1"))
        assert own.read(own.client.get_flight_info(prepared_statement_query(handles[-1])))
    finally:
        own.close()


def test_queries_never_fetched_do_not_pile_up(client):
    infos = [client.client.get_flight_info(statement_query("SELECT id FROM ref WHERE id = 3"))
             for _ in range(300)]
    # The oldest were forgotten to make room; their tickets still run, planned again.
    for info in (infos[0], infos[-1]):
        assert client.read(info).column("id").to_pylist() == [3]


# --- Garbage commands, tickets and actions ---

def any_of(type_url, value):
    return length_delimited(1, type_url) + length_delimited(2, value)


GARBAGE = [
    random.Random(7).randbytes(64),
    b"",
    any_of("type.googleapis.com/nope.Nope", b"\x0a\x03abc"),
    any_message("CommandStatementQuery", b"\xff\xff\xff"),
    any_message("CommandStatementQuery", length_delimited(1, "SELECT 1"))[:-4],
    any_message("CommandPreparedStatementQuery", length_delimited(1, "no such handle")),
    any_message("CommandStatementIngest", b"\x12"),
    any_message("TicketStatementQuery", length_delimited(1, b"\xff" * 20)),
]


@pytest.mark.parametrize("command", GARBAGE)
def test_garbage_commands(client, command):
    descriptor = flight.FlightDescriptor.for_command(command)
    refused(lambda: client.client.get_flight_info(descriptor))
    refused(lambda: client.client.get_schema(descriptor))
    refused(lambda: client.put(descriptor, pa.record_batch([pa.array([1])], names=["x"])))


def test_path_descriptors(client):
    descriptor = flight.FlightDescriptor.for_path("ref")
    refused(lambda: client.client.get_flight_info(descriptor))
    refused(lambda: client.put(descriptor, pa.record_batch([pa.array([1])], names=["x"])))


def query_ticket(sql="SELECT 1", params=(), partition=None, partitions=0, snapshot=None,
                 session=""):
    """A ticket as the server hands them out (tickets.rs QueryTicket{id = 1, sql = 2,
    partition = 4, partitions = 5, snapshot = 8, session = 9, params = 10 (FlightData
    {data_header = 2, data_body = 1000})}), made up."""
    handle = varint_field(1, 12345) + length_delimited(2, sql)
    if partition is not None:
        handle += varint_field(4, partition)
    handle += varint_field(5, partitions)
    if snapshot is not None:
        handle += varint_field(8, snapshot)
    handle += length_delimited(9, session)
    for header, body in params:
        handle += length_delimited(10, length_delimited(2, header) + length_delimited(1000, body))
    return ticket_statement_query(handle)


@pytest.mark.parametrize(
    "ticket, needle",
    [
        (flight.Ticket(random.Random(8).randbytes(100)), ""),
        (flight.Ticket(b""), ""),
        (flight.Ticket(any_of("type.googleapis.com/nope.Nope", b"")), "nope.Nope"),
        (flight.Ticket(any_message("TicketStatementQuery", b"\xff\xff")), ""),
        (ticket_statement_query(random.Random(9).randbytes(50)), ""),
        (query_ticket(sql="SELEC 1"), "syntax error"),
        (query_ticket(sql="SELECT id FROM ref", partition=99, partitions=4), "tablets changed"),
        # A made-up snapshot far ahead would move the tablets' clocks, and every later write.
        (query_ticket(sql="SELECT id FROM ref", partition=0, partitions=1,
                      snapshot=(1 << 64) - 1), "in the future"),
        (query_ticket(sql="SELECT id FROM ref", partition=0, partitions=1,
                      snapshot=4_102_444_800_000_000 << 12), "2100-01-01"),
        (query_ticket(sql="SELECT 1 -- " + "x" * MAX_STATEMENT_BYTES),
         f"at most {MAX_STATEMENT_BYTES}"),
    ],
)
def test_garbage_tickets(client, ticket, needle):
    refused(lambda: client.client.do_get(ticket).read_all(), needle)


@pytest.mark.parametrize(
    "action",
    [
        flight.Action("NoSuchAction", b""),
        flight.Action("CreatePreparedStatement", random.Random(10).randbytes(30)),
        flight.Action("CreatePreparedStatement",
                      any_of("type.googleapis.com/nope.Nope", b"")),
        flight.Action("CancelFlightInfo", b"\xff\xff\xff"),
        flight.Action("CancelQuery", any_message("ActionCancelQueryRequest", b"\x0a\x05\xff")),
        flight.Action("SetSessionOptions", b"\x0a\xff"),
    ],
)
def test_garbage_actions(client, action):
    refused(lambda: list(client.client.do_action(action)))


# --- Errors that would quote a megabyte ---

def refused_briefly(call, *needles):
    """`refused`, with an error cut to a few KB that still names `needles`."""
    text = refused(call, *needles)
    # pyarrow shows the message twice: as the error's, and in gRPC's debug context.
    assert len(text.encode()) < 4 * MAX_ERROR_BYTES, len(text)
    return text


def test_a_megabyte_type_url_gets_a_short_error(client):
    """What fuzzing found: arrow-flight quotes an unknown command's type URL whole, and an
    error of a megabyte never reached the client."""
    command = any_of("type.googleapis.com/" + "x" * 1_000_000, b"")
    descriptor = flight.FlightDescriptor.for_command(command)
    for call in [
        lambda: client.client.get_flight_info(descriptor),
        lambda: client.put(descriptor, pa.record_batch([pa.array([1])], names=["x"])),
        lambda: client.client.do_get(flight.Ticket(command)).read_all(),
    ]:
        refused_briefly(call, "type.googleapis.com/xxx", "bytes cut")


def test_a_megabyte_action_type_gets_a_short_error(client):
    action = flight.Action("x" * 1_000_000, b"")
    refused_briefly(lambda: list(client.client.do_action(action)), "unknown action xxx")


@pytest.mark.parametrize("path", PATHS)
def test_a_megabyte_identifier_gets_a_short_error(client, path):
    sql = "SELECT * FROM missing_" + "x" * 1_000_000
    refused_briefly(lambda: statement_paths(client)[path](sql), "missing_xxx", "bytes cut")


# --- Corrupted Arrow IPC ---

def sample(first_id):
    """300 rows: an id column without nulls, a flag column with a third of them NULL."""
    ids = pa.array(range(first_id, first_id + 300), pa.int64())
    flags = pa.array([None if i % 3 == 1 else i % 2 == 0 for i in range(300)], pa.bool_())
    return pa.record_batch([ids, flags], names=["id", "flag"])


def ipc_stream(batch):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def rewritten(stream, old, new):
    """`stream` with the one pair of little-endian int64 `old` in its headers replaced by `new`:
    a buffer's (offset, length) or an array's (length, null count)."""
    old, new = struct.pack("<qq", *old), struct.pack("<qq", *new)
    assert stream.count(old) == 1, old
    return stream.replace(old, new)


# (what is wrong, the pair in the headers of sample()'s stream, what it becomes). Buffers, in
# order: id's validity (0, 0) and values (0, 2400), flag's validity (2400, 38) and values
# (2440, 38). Field nodes: id (300, 0), flag (300, 100).
CORRUPTIONS = {
    "validity bitmap shorter than its array": ((2400, 38), (2400, 1)),
    "values buffer shorter than its array": ((0, 2400), (0, 8)),
    "more nulls than values": ((300, 100), (300, 400)),
}


def corrupted_batch(kind, first_id):
    old, new = CORRUPTIONS[kind]
    return pa.ipc.open_stream(rewritten(ipc_stream(sample(first_id)), old, new)).read_next_batch()


def ipc_messages(stream):
    """The (header, body) of each message of an IPC stream, as FlightData carries them."""
    reader = pa.ipc.MessageReader.open_stream(stream)
    messages = []
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return messages
        body = message.body.to_pybytes() if message.body is not None else b""
        messages.append((message.metadata.to_pybytes(), body))


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupted_ipc_in_an_ingest(client, kind):
    # Keys not in ref: were the batch loaded, rows would appear.
    batch = corrupted_batch(kind, first_id=5000)
    refused(lambda: client.put(statement_ingest("ref"), batch), "malformed Arrow data")


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupted_ipc_as_parameters(client, kind):
    # ref's keys: were the parameters bound, rows would go.
    batch = corrupted_batch(kind, first_id=1).rename_columns(["$1", "$2"])
    handle = client.prepare("DELETE FROM ref WHERE id = ? AND (flag = ? OR true)")
    try:
        refused(lambda: client.put(prepared_statement_update(handle), batch), "malformed Arrow data")
        refused(lambda: client.put(prepared_statement_query(handle), batch), "malformed Arrow data")
    finally:
        client.close_prepared(handle)


def test_corrupted_nested_array(client):
    pairs = pa.StructArray.from_arrays([pa.array(range(300), pa.int64())], names=["n"],
                                       mask=pa.array([i % 4 == 0 for i in range(300)]))
    batch = pa.record_batch([pa.array(range(7000, 7300), pa.int64()), pairs], names=["id", "pair"])
    stream = ipc_stream(batch)
    # Buffers: id's validity and values (0, 2400), the struct's validity (2400, 38), ...
    batch = pa.ipc.open_stream(rewritten(stream, (2400, 38), (2400, 2))).read_next_batch()
    refused(lambda: client.put(statement_ingest("ref"), batch), "malformed Arrow data")


def test_raw_ipc_messages_in_a_ticket(client):
    stream = ipc_stream(sample(1).rename_columns(["$1", "$2"]))
    schema, batch = ipc_messages(stream)
    sql = "SELECT name FROM ref WHERE id = $1 AND flag <> $2"
    # The untouched messages run: ids 1 to 300, flags alternating with NULLs.
    assert client.client.do_get(query_ticket(sql, [schema, batch])).read_all().num_rows > 0
    short_bitmap = ipc_messages(rewritten(stream, (2400, 38), (2400, 1)))
    for params, needle in [
        ([schema, (random.Random(11).randbytes(40), batch[1])], "unreadable message header"),
        ([batch], "prior to Schema"),
        ([schema, schema, batch], "multiple Schema"),
        ([schema, (batch[0], batch[1][:100])], "outside the message body"),
        (short_bitmap, "malformed Arrow data"),
        # An empty flatbuffer reads as a message without content: no parameters at all.
        ([(b"\x00" * 16, b"")], "0 value(s) were bound"),
    ]:
        ticket = query_ticket(sql, params)
        refused(lambda: client.client.do_get(ticket).read_all(), needle)


# --- Ingest that does not match its table ---

@pytest.mark.parametrize(
    "data, needles",
    [
        (pa.schema([("zz", pa.binary())]), ["no column 'zz'", "no column 'id'"]),
        (pa.record_batch([pa.array([b"z"])], names=["zz"]), ["no column 'zz'"]),
        (pa.record_batch([pa.array([5001]), pa.array([b"z"])], names=["id", "zz"]),
         ["no column 'zz'"]),
        (pa.record_batch([pa.array(["no key"])], names=["name"]), ["no column 'id'"]),
        (pa.record_batch([pa.array([5001]), pa.array([b"\x01"])], names=["id", "flag"]),
         ["'flag' is BOOL"]),
        (pa.record_batch([pa.array([5001]), pa.array([[1.0]])], names=["id", "score"]),
         ["'score' is DOUBLE"]),
        (pa.record_batch([pa.array([5001]), pa.array([5002])], names=["id", "id"]),
         ["appears twice"]),
    ],
)
def test_ingest_with_a_mismatched_schema(client, data, needles):
    text = refused(lambda: client.put(statement_ingest("ref"), data), *needles)
    assert "nothing was loaded" in text, text


@pytest.mark.parametrize(
    "descriptor, needle",
    [
        (statement_ingest("ref", NOT_EXIST_CREATE, EXISTS_FAIL), "already exists"),
        (statement_ingest("nope", NOT_EXIST_FAIL, EXISTS_APPEND), "does not exist"),
        (statement_ingest("nope", NOT_EXIST_FAIL, EXISTS_FAIL), "fail both"),
    ],
)
def test_ingest_with_options_that_cannot_hold(client, descriptor, needle):
    data = pa.record_batch([pa.array([5001], pa.int64())], names=["id"])
    refused(lambda: client.put(descriptor, data), needle)
