"""Nyala through raw `pyarrow.flight`, with no Flight SQL library: the Flight SQL commands are
protobuf messages encoded by hand (flight_sql_messages.py), as a client in a language without
a Flight SQL library would do it. Multi-endpoint results are read in parallel, each endpoint
from its location, as a distributed reader (Spark, Dask, ...) would."""

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flight_sql_messages import (
    SQL_PREFIX,
    any_message,
    decode_fields,
    length_delimited,
    statement_query,
    statement_update,
    varint,
)
from nyala_server import PASSWORD, USER, host_port

# --- A minimal Flight SQL client on pyarrow.flight ---

class RawClient:
    def __init__(self, url, headers=()):
        self.url = url.replace("grpc://", "grpc+tcp://")
        self.client = flight.FlightClient(self.url)
        self.options = flight.FlightCallOptions(headers=list(headers))
        self.headers = list(headers)

    def close(self):
        self.client.close()

    def update(self, sql):
        """CommandStatementUpdate through DoPut; returns DoPutUpdateResult.record_count."""
        writer, reader = self.client.do_put(statement_update(sql), pa.schema([]), self.options)
        writer.done_writing()
        result = reader.read()
        writer.close()
        assert result is not None, "DoPut of an update must answer a DoPutUpdateResult"
        return decode_fields(result.to_pybytes()).get(1, [0])[0]

    def info(self, sql):
        return self.client.get_flight_info(statement_query(sql), self.options)

    def read_endpoint(self, endpoint):
        """Reads one endpoint: from its location if it has one (a client of its own, as a
        worker on another machine would have), else from this connection."""
        if endpoint.locations:
            uri = endpoint.locations[0].uri.decode()
            client = flight.FlightClient(uri)
            try:
                return client.do_get(endpoint.ticket, self.options).read_all()
            finally:
                client.close()
        return self.client.do_get(endpoint.ticket, self.options).read_all()

    def read_all(self, info):
        """Reads every endpoint of `info` in parallel and concatenates them in endpoint order."""
        with ThreadPoolExecutor(max_workers=max(1, len(info.endpoints))) as pool:
            tables = list(pool.map(self.read_endpoint, info.endpoints))
        return pa.concat_tables(tables) if tables else info.schema.empty_table()

    def query(self, sql):
        return self.read_all(self.info(sql))


ROWS = [(i, f"name-{i}", float(i % 7) - 3.0) for i in range(1, 201)]


@pytest.fixture(scope="module")
def client(server):
    c = RawClient(server)
    assert c.update(
        "CREATE TABLE t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
        "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS"
    ) == 0
    values = ", ".join(f"({i}, '{n}', {s})" for i, n, s in ROWS)
    assert c.update(f"INSERT INTO t VALUES {values}") == len(ROWS)
    yield c
    c.close()


def rows_of(table, *columns):
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


def test_hand_encoded_command_matches_the_protobuf_encoding():
    # The bytes protoc would produce for Any{CommandStatementQuery{query: "SELECT 1"}}.
    expected = (
        b"\x0a\x43type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
        b"\x12\x0a\x0a\x08SELECT 1"
    )
    assert any_message("CommandStatementQuery", length_delimited(1, "SELECT 1")) == expected
    assert varint(300) == b"\xac\x02"
    assert decode_fields(b"\x08\xac\x02\x12\x02hi") == {1: [300], 2: [b"hi"]}


def test_plain_select_has_one_endpoint_per_tablet_with_a_location(client, server):
    info = client.info("SELECT id, name FROM t WHERE score > 0")
    assert len(info.endpoints) == 4
    host, port = host_port(server)
    for endpoint in info.endpoints:
        assert [loc.uri.decode() for loc in endpoint.locations] == [f"grpc+tcp://{host}:{port}"]
        ticket = decode_fields(endpoint.ticket.ticket)
        assert ticket[1][0].decode() == SQL_PREFIX + "TicketStatementQuery"
    assert info.schema.names == ["id", "name"]

    table = client.read_all(info)
    assert table.schema.names == ["id", "name"]
    assert rows_of(table, "id", "name") == [(i, n) for i, n, s in ROWS if s > 0]


def test_every_tablet_endpoint_holds_part_of_the_rows(client):
    info = client.info("SELECT id FROM t")
    assert len(info.endpoints) == 4
    parts = [client.read_endpoint(e).column("id").to_pylist() for e in info.endpoints]
    # Hash distribution over 200 keys: each tablet gets some, no key is in two tablets.
    assert all(parts), [len(p) for p in parts]
    assert sorted(sum(parts, [])) == [i for i, _, _ in ROWS]


def test_plain_select_with_no_matching_rows(client):
    info = client.info("SELECT id, name FROM t WHERE score > 1000")
    assert len(info.endpoints) == 4
    table = client.read_all(info)
    assert table.num_rows == 0
    assert table.schema.names == ["id", "name"]


def test_aggregate_has_one_endpoint(client):
    info = client.info("SELECT count(*) AS n, sum(score) AS total FROM t WHERE score > 0")
    assert len(info.endpoints) == 1
    table = client.read_all(info)
    positive = [s for _, _, s in ROWS if s > 0]
    assert table.column("n").to_pylist() == [len(positive)]
    assert table.column("total").to_pylist() == [sum(positive)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id, name FROM t ORDER BY id",
        "SELECT id, name FROM t WHERE score > 0 LIMIT 5",
        "SELECT a.id, b.name FROM t a JOIN t b ON a.id = b.id WHERE a.score > 0",
    ],
)
def test_other_queries_have_one_endpoint(client, sql):
    info = client.info(sql)
    assert len(info.endpoints) == 1
    table = client.read_all(info)
    assert table.num_rows > 0


def test_ordered_query_keeps_its_order(client):
    table = client.query("SELECT id, score FROM t WHERE id <= 10 ORDER BY id DESC")
    assert table.column("id").to_pylist() == list(range(10, 0, -1))


def test_writes_through_do_put_are_visible_to_the_next_scan(client):
    assert client.update("CREATE TABLE w (id BIGINT NOT NULL, v STRING, PRIMARY KEY (id)) "
                         "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS") == 0
    assert client.update("INSERT INTO w VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(40))) == 40
    assert client.update("UPDATE w SET v = 'odd' WHERE id % 2 = 1") == 20
    assert client.update("DELETE FROM w WHERE id >= 30") == 10
    assert client.update("UPSERT INTO w VALUES (0, 'zero'), (100, 'hundred')") == 2
    table = client.query("SELECT id, v FROM w")
    expected = {i: ("odd" if i % 2 else f"v{i}") for i in range(30)}
    expected[0], expected[100] = "zero", "hundred"
    assert rows_of(table, "id", "v") == sorted(expected.items())
    assert client.update("DROP TABLE w") == 0


def test_errors_are_flight_errors_naming_the_problem(client):
    with pytest.raises((flight.FlightError, pa.ArrowInvalid), match="no_such_table"):
        client.info("SELECT * FROM no_such_table")
    with pytest.raises((flight.FlightError, pa.ArrowInvalid), match="duplicate primary key"):
        client.update("INSERT INTO t VALUES (1, 'again', 0.0)")
    # Nothing changed.
    assert rows_of(client.query("SELECT id, name FROM t WHERE id = 1"), "id", "name") == [(1, "name-1")]


# --- Authentication ---

@pytest.fixture(scope="module")
def auth_client(auth_server):
    plain = flight.FlightClient(auth_server.replace("grpc://", "grpc+tcp://"))
    header = plain.authenticate_basic_token(USER, PASSWORD)
    plain.close()
    assert header[0].lower() == b"authorization" and header[1].startswith(b"Bearer ")
    c = RawClient(auth_server, headers=[header])
    c.update("CREATE TABLE t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
             "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
    c.update("INSERT INTO t VALUES " + ", ".join(f"({i}, '{n}', {s})" for i, n, s in ROWS))
    yield c
    c.close()


def test_authenticated_multi_endpoint_read(auth_client):
    info = auth_client.info("SELECT id, name FROM t WHERE score > 0")
    assert len(info.endpoints) == 4
    # Each endpoint is read on a fresh connection to its location with the bearer token.
    table = auth_client.read_all(info)
    assert rows_of(table, "id", "name") == [(i, n) for i, n, s in ROWS if s > 0]


def test_no_credentials_are_refused(auth_client, auth_server):
    anonymous = RawClient(auth_server)
    try:
        with pytest.raises(flight.FlightUnauthenticatedError):
            anonymous.info("SELECT count(*) FROM t")
        with pytest.raises(flight.FlightUnauthenticatedError):
            anonymous.update("DROP TABLE t")
        # A ticket handed to an authenticated client is no key by itself.
        info = auth_client.info("SELECT id FROM t")
        with pytest.raises(flight.FlightUnauthenticatedError):
            anonymous.client.do_get(info.endpoints[0].ticket).read_all()
    finally:
        anonymous.close()
    assert auth_client.query("SELECT count(*) AS n FROM t").column("n").to_pylist() == [len(ROWS)]


def test_wrong_password_and_made_up_token_are_refused(auth_server):
    c = flight.FlightClient(auth_server.replace("grpc://", "grpc+tcp://"))
    try:
        with pytest.raises(flight.FlightUnauthenticatedError):
            c.authenticate_basic_token(USER, "wrong")
        with pytest.raises(flight.FlightUnauthenticatedError):
            c.authenticate_basic_token("mallory", PASSWORD)
        forged = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer 0123456789abcdef")])
        with pytest.raises(flight.FlightUnauthenticatedError):
            c.get_flight_info(statement_query("SELECT 1"), forged)
    finally:
        c.close()
