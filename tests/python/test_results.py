"""What every kind of statement answers, and how errors read, through ADBC and raw pyarrow.flight
against a real `nyala serve` process.

A FlightInfo's schema is a promise about its streams: clients build their readers from it and
reject a stream whose schema differs ("inconsistent schema"). So every statement kind delivers
exactly the schema its FlightInfo announced: DDL and SET no columns and no rows, DML one row
with a UInt64 `count`, queries their result. Errors come back as short, readable messages even
when the statement is huge, instead of overflowing gRPC's header limits.
"""

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flight_sql_messages import statement_query, statement_update

ROWS = [(1, "a"), (2, "b"), (3, "c")]


def nothing(table, names, rows):
    assert (names, rows) == ([], [])


def count(n):
    def check(table, names, rows):
        assert (names, rows) == (["count"], [(n,)])

    return check


def some_rows(table, names, rows):
    assert names and rows


def mentions_table(table, names, rows):
    assert any(table in str(value) for row in rows for value in row), rows


def rows_of(table, names, rows):
    assert names == ["id", "name"]
    assert sorted(rows) == ROWS


# Each statement runs on a fresh table {t} holding ROWS; `check(t, column names, rows)`.
STATEMENTS = {
    "create_table": ("CREATE TABLE {t}_new (id BIGINT NOT NULL, v STRING, PRIMARY KEY (id))", nothing),
    "insert": ("INSERT INTO {t} VALUES (10, 'x'), (11, 'y')", count(2)),
    "update": ("UPDATE {t} SET name = 'z' WHERE id <= 2", count(2)),
    "delete": ("DELETE FROM {t} WHERE id = 1", count(1)),
    "upsert": ("UPSERT INTO {t} VALUES (1, 'again'), (12, 'new')", count(2)),
    "select": ("SELECT id, name FROM {t}", rows_of),
    "show_tables": ("SHOW TABLES", mentions_table),
    "describe": ("DESCRIBE {t}", some_rows),
    "show_create_table": ("SHOW CREATE TABLE {t}", mentions_table),
    "show_partitions": ("SHOW PARTITIONS {t}", some_rows),
    "explain": ("EXPLAIN SELECT id FROM {t} WHERE id > 1", some_rows),
    "set": ("SET datafusion.execution.batch_size = 4096", nothing),
    "alter_table_add_column": ("ALTER TABLE {t} ADD COLUMN score DOUBLE", nothing),
    "drop_table": ("DROP TABLE {t}", nothing),
}


@pytest.fixture
def table(server, table_name):
    """A table holding ROWS, made with DoPut updates (which never depend on a FlightInfo)."""
    client = flight.FlightClient(server.replace("grpc://", "grpc+tcp://"))
    try:
        for sql in [
            f"CREATE TABLE {table_name} (id BIGINT NOT NULL, name STRING, PRIMARY KEY (id)) "
            "DISTRIBUTE BY HASH (id) INTO 2 BUCKETS",
            f"INSERT INTO {table_name} VALUES " + ", ".join(f"({i}, '{n}')" for i, n in ROWS),
        ]:
            writer, reader = client.do_put(statement_update(sql), pa.schema([]))
            writer.done_writing()
            reader.read()
            writer.close()
    finally:
        client.close()
    return table_name


@pytest.fixture
def conn(server):
    with flightsql.connect(server, autocommit=True) as conn:
        yield conn


@pytest.fixture
def raw(server):
    client = flight.FlightClient(server.replace("grpc://", "grpc+tcp://"))
    yield client
    client.close()


@pytest.mark.parametrize("kind", STATEMENTS)
def test_adbc_fetches_every_statement_kind(conn, table, kind):
    sql, check = STATEMENTS[kind]
    with conn.cursor() as cur:
        cur.execute(sql.format(t=table))
        rows = cur.fetchall()
        names = [column[0] for column in cur.description or []]
    check(table, names, [tuple(row) for row in rows])


@pytest.mark.parametrize("kind", STATEMENTS)
def test_every_stream_has_the_schema_of_its_flight_info(raw, table, kind):
    sql, check = STATEMENTS[kind]
    info = raw.get_flight_info(statement_query(sql.format(t=table)))
    assert info.endpoints
    tables = []
    for endpoint in info.endpoints:
        # Every endpoint's location (if any) is this server; read them all on this connection.
        reader = raw.do_get(endpoint.ticket)
        assert reader.schema == info.schema, f"FlightInfo says {info.schema}, the stream {reader.schema}"
        tables.append(reader.read_all())
    result = pa.concat_tables(tables)
    check(table, result.schema.names, [tuple(row.values()) for row in result.to_pylist()])
    if result.schema.names == ["count"]:
        assert result.schema.field("count").type == pa.uint64()


# --- Errors ---

HUGE = 1_000_000
# 1 MB statements; the errors of the last two name a 1 MB identifier.
HUGE_STATEMENTS = {
    "malformed": "SELECT " + "x" * HUGE + " FROM",
    "unknown_table": "SELECT * FROM no_such_table WHERE id IN (" + ", ".join(["1234567"] * (HUGE // 9)) + ")",
    "unknown_huge_table_name": "SELECT * FROM t" + "t" * HUGE,
    "unknown_huge_column_name": "SELECT " + "x" * HUGE,
}
MAX_MESSAGE = 4096


def assert_readable(error, kind):
    message = str(error)
    assert "metadata size" not in message, f"a transport failure, not the server's error: {message[:300]}"
    assert len(message) < MAX_MESSAGE, f"{len(message)} characters: {message[:300]}..."
    if kind == "unknown_table":
        assert "no_such_table" in message, message


@pytest.mark.parametrize("kind", HUGE_STATEMENTS)
def test_adbc_error_of_a_huge_statement_is_short(conn, kind):
    with conn.cursor() as cur:
        with pytest.raises(Exception) as error:
            cur.execute(HUGE_STATEMENTS[kind])
            cur.fetchall()
        assert_readable(error.value, kind)
        cur.execute("SELECT 1 AS one")
        assert cur.fetchall() == [(1,)]


@pytest.mark.parametrize("kind", HUGE_STATEMENTS)
def test_pyarrow_error_of_a_huge_statement_is_short(raw, kind):
    with pytest.raises((flight.FlightError, pa.ArrowException)) as error:
        raw.get_flight_info(statement_query(HUGE_STATEMENTS[kind]))
    assert_readable(error.value, kind)
    info = raw.get_flight_info(statement_query("SELECT 1 AS one"))
    assert raw.do_get(info.endpoints[0].ticket).read_all().column("one").to_pylist() == [1]


def test_a_statement_sent_again_sees_what_changed_since(conn, table_name):
    """The server keeps each session's statements planned by their text; sending one again must
    still see new rows, new columns, a recreated table, and system tables of the moment."""
    cur = conn.cursor()

    def run(sql):
        cur.execute(sql)
        return cur.fetchall()

    run(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS")
    select = f"SELECT * FROM {table_name} WHERE k = 1"
    partitions = f"SELECT count(*) FROM sys.partitions WHERE table_name = '{table_name}'"
    assert run(select) == []
    assert run(partitions) == [(2,)]
    run(f"INSERT INTO {table_name} VALUES (1, 'a')")
    assert run(select) == [(1, "a")]
    run(f"ALTER TABLE {table_name} ADD COLUMN w BIGINT DEFAULT 7")
    assert run(select) == [(1, "a", 7)]
    run(f"DROP TABLE {table_name}")
    run(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, s DOUBLE) DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
    run(f"INSERT INTO {table_name} VALUES (1, 2.5)")
    assert run(select) == [(1, 2.5)]
    assert run(partitions) == [(3,)]
    cur.close()


def test_a_prepared_lookup_reads_one_tablet_and_sees_changes(conn, table_name):
    """A prepared statement keeps its plan: a lookup bound to new keys finds them, reads the one
    tablet that can hold the key, and DDL on its table makes it plan again."""
    cur = conn.cursor()
    cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (k) INTO 8 BUCKETS")
    cur.executemany(f"INSERT INTO {table_name} VALUES (?, ?)", [(i, f"v{i}") for i in range(50)])
    lookup = f"SELECT v FROM {table_name} WHERE k = ?"
    for key in (3, 17, 42, 99):
        cur.execute(lookup, (key,))
        assert cur.fetchall() == ([] if key >= 50 else [(f"v{key}",)])
    cur.execute(f"EXPLAIN ANALYZE SELECT v FROM {table_name} WHERE k = ?", (17,))
    plan = "\n".join(str(row) for row in cur.fetchall())
    assert "tablets=1 of 8" in plan, plan
    cur.execute(f"ALTER TABLE {table_name} RENAME COLUMN v TO value")
    with pytest.raises(Exception, match="v"):
        cur.execute(lookup, (3,))
    cur.close()
