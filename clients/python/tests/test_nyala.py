"""The `nyala` Python client against a real `nyala serve` process."""

import datetime

import pandas as pd
import pyarrow as pa
import pytest

import nyala

T_DDL = (
    "CREATE TABLE {name} (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
    "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS"
)
ROWS = [(i, f"name-{i}", float(i % 5) - 1.0) for i in range(1, 101)]


@pytest.fixture
def conn(server):
    with nyala.connect(server) as conn:
        yield conn


def execute(conn, sql, params=None):
    cur = conn.cursor()
    try:
        if params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
    finally:
        cur.close()


@pytest.fixture
def t(conn, table_name):
    """A 4-bucket table holding ROWS."""
    execute(conn, T_DDL.format(name=table_name))
    execute(conn, f"INSERT INTO {table_name} VALUES " + ", ".join(f"({i}, '{n}', {s})" for i, n, s in ROWS))
    return table_name


def rows(table, *columns):
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


# --- connecting ---

def test_module_is_a_dbapi_module(conn):
    assert nyala.apilevel == "2.0"
    assert nyala.paramstyle == "qmark"
    assert isinstance(conn, nyala.Connection)
    assert issubclass(nyala.ProgrammingError, nyala.Error)


def test_url_forms(server):
    host_port = server.split("://", 1)[1]
    for url in (host_port, "grpc+tcp://" + host_port):
        with nyala.connect(url) as conn:
            assert nyala.query_arrow(conn, "SELECT 1 AS one").column("one").to_pylist() == [1]
    with pytest.raises(ValueError, match="scheme"):
        nyala.connect("http://" + host_port)
    with pytest.raises(ValueError, match="password"):
        nyala.connect(server, username="alice")


def test_dbapi_cursor(conn, t):
    cur = conn.cursor()
    cur.execute(f"SELECT id, name FROM {t} WHERE id <= 3 ORDER BY id")
    assert [d[0] for d in cur.description] == ["id", "name"]
    assert cur.fetchall() == [(1, "name-1"), (2, "name-2"), (3, "name-3")]
    cur.close()


# --- queries ---

def test_write_and_query_arrow(conn, table_name):
    execute(conn, T_DDL.format(name=table_name))
    execute(conn, f"INSERT INTO {table_name} VALUES (1, 'a', 1.5), (2, 'b', 2.5), (3, 'c', 10.0)")
    execute(conn, f"UPDATE {table_name} SET score = score * 2 WHERE id < 3")
    execute(conn, f"DELETE FROM {table_name} WHERE score > 9")
    execute(conn, f"UPSERT INTO {table_name} VALUES (4, 'd', 0.5)")
    table = nyala.query_arrow(conn, f"SELECT id, name, score FROM {table_name} ORDER BY id")
    assert isinstance(table, pa.Table)
    assert table.to_pylist() == [
        {"id": 1, "name": "a", "score": 3.0},
        {"id": 2, "name": "b", "score": 5.0},
        {"id": 4, "name": "d", "score": 0.5},
    ]
    assert table.schema.field("id").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    execute(conn, f"DROP TABLE {table_name}")


def test_plain_scan_reads_every_tablet(conn, t):
    # A plain scan of a 4-bucket table comes back as one endpoint per tablet.
    table = nyala.query_arrow(conn, f"SELECT id, name FROM {t} WHERE score > 0")
    assert rows(table, "id", "name") == [(i, n) for i, n, s in ROWS if s > 0]
    assert nyala.query_arrow(conn, f"SELECT id FROM {t}").num_rows == len(ROWS)


def test_query_pandas(conn, t):
    df = nyala.query_pandas(conn, f"SELECT id, name, score FROM {t} WHERE id <= 3 ORDER BY id")
    assert isinstance(df, pd.DataFrame)
    expected = pd.DataFrame({"id": [1, 2, 3], "name": ["name-1", "name-2", "name-3"], "score": [0.0, 1.0, 2.0]})
    pd.testing.assert_frame_equal(df, expected)


def test_errors(conn, t):
    with pytest.raises(nyala.Error, match="no_such_table"):
        nyala.query_arrow(conn, "SELECT * FROM no_such_table")
    with pytest.raises(nyala.Error, match="duplicate primary key"):
        execute(conn, f"INSERT INTO {t} VALUES (1, 'again', 0.0)")
    assert nyala.query_arrow(conn, f"SELECT name FROM {t} WHERE id = 1").column("name").to_pylist() == ["name-1"]


# --- parameters ---

def test_question_mark_parameters(conn, t):
    assert nyala.query_arrow(conn, f"SELECT name FROM {t} WHERE id = ?", (5,)).column("name").to_pylist() == ["name-5"]
    table = nyala.query_arrow(conn, f"SELECT id FROM {t} WHERE id > ? AND name <> ? ORDER BY id", [97, "name-99"])
    assert table.column("id").to_pylist() == [98, 100]
    table = nyala.query_arrow(conn, f"SELECT count(*) AS n FROM {t} WHERE score >= ?", (2.5,))
    assert table.column("n").to_pylist() == [sum(1 for _, _, s in ROWS if s >= 2.5)]


def test_dollar_parameters(conn, t):
    table = nyala.query_arrow(conn, f"SELECT id, name FROM {t} WHERE id = $1 OR id = $2 ORDER BY id", (7, 3))
    assert rows(table, "id", "name") == [(3, "name-3"), (7, "name-7")]
    table = nyala.query_arrow(conn, f"SELECT id FROM {t} WHERE id BETWEEN $1 AND $1 + 2 ORDER BY id", (10,))
    assert table.column("id").to_pylist() == [10, 11, 12]


def test_parameters_in_a_plain_scan(conn, t):
    # Parameterised plain scan: still every tablet's rows.
    table = nyala.query_arrow(conn, f"SELECT id FROM {t} WHERE score > ?", (1.5,))
    assert sorted(table.column("id").to_pylist()) == [i for i, _, s in ROWS if s > 1.5]


def test_parameters_in_query_pandas(conn, t):
    df = nyala.query_pandas(conn, f"SELECT name FROM {t} WHERE id = ?", (42,))
    assert df["name"].tolist() == ["name-42"]


def test_parameters_in_writes(conn, t):
    execute(conn, f"UPDATE {t} SET name = ? WHERE id = ?", ("renamed", 4))
    execute(conn, f"DELETE FROM {t} WHERE id = ?", (5,))
    execute(conn, f"INSERT INTO {t} VALUES (?, ?, ?)", (1000, "new", 9.5))
    table = nyala.query_arrow(conn, f"SELECT id, name, score FROM {t} WHERE id IN (4, 5, 1000) ORDER BY id")
    assert table.to_pylist() == [
        {"id": 4, "name": "renamed", "score": ROWS[3][2]},
        {"id": 1000, "name": "new", "score": 9.5},
    ]


def test_null_parameter(conn, t):
    execute(conn, f"INSERT INTO {t} VALUES (?, ?, ?)", (2000, None, 1.0))
    assert nyala.query_arrow(conn, f"SELECT name FROM {t} WHERE id = 2000").column("name").to_pylist() == [None]


def test_executemany_insert(conn, table_name):
    execute(conn, T_DDL.format(name=table_name))
    cur = conn.cursor()
    cur.executemany(f"INSERT INTO {table_name} VALUES (?, ?, ?)", [(i, f"n{i}", i / 2) for i in range(50)])
    cur.close()
    table = nyala.query_arrow(conn, f"SELECT id, name, score FROM {table_name}")
    assert rows(table, "id", "name", "score") == [(i, f"n{i}", i / 2) for i in range(50)]


def test_executemany_stops_at_a_duplicate_key(conn, t):
    cur = conn.cursor()
    with pytest.raises(nyala.Error, match="duplicate primary key"):
        cur.executemany(f"INSERT INTO {t} VALUES (?, ?, ?)", [(500, "a", 0.0), (1, "dup", 0.0)])
    cur.close()
    assert nyala.query_arrow(conn, f"SELECT name FROM {t} WHERE id = 1").column("name").to_pylist() == ["name-1"]


# --- bulk loading ---

def sample(n=3, start=1):
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "name": [f"x{i}" for i in range(start, start + n)],
        "score": [i * 0.5 for i in range(start, start + n)],
    })


def test_load_create_takes_the_first_column_as_key(conn, table_name):
    assert nyala.load(conn, table_name, sample(3), mode="create") == 3
    table = nyala.query_arrow(conn, f"SELECT id, name, score FROM {table_name} ORDER BY id")
    assert table.to_pylist() == sample(3).to_pylist()
    with pytest.raises(nyala.Error, match="duplicate primary key"):
        nyala.load(conn, table_name, sample(1, start=2))
    with pytest.raises(nyala.Error, match="duplicate primary key"):
        execute(conn, f"INSERT INTO {table_name} VALUES (1, 'again', 0.0)")
    with pytest.raises(nyala.Error):
        nyala.load(conn, table_name, sample(1, start=10), mode="create")
    assert nyala.query_arrow(conn, f"SELECT count(*) AS n FROM {table_name}").column("n").to_pylist() == [3]


def test_load_append(conn, t):
    assert nyala.load(conn, t, sample(10, start=1001)) == 10
    assert nyala.query_arrow(conn, f"SELECT count(*) AS n FROM {t}").column("n").to_pylist() == [len(ROWS) + 10]
    # Every tablet's share of the loaded rows is read back by a plain scan.
    table = nyala.query_arrow(conn, f"SELECT id FROM {t} WHERE id > 1000")
    assert sorted(table.column("id").to_pylist()) == list(range(1001, 1011))


def test_load_append_to_a_missing_table_fails(conn, table_name):
    with pytest.raises(nyala.Error, match=table_name):
        nyala.load(conn, table_name, sample(2), mode="append")


def test_load_replace(conn, table_name):
    nyala.load(conn, table_name, sample(5), mode="create")
    assert nyala.load(conn, table_name, sample(2, start=100), mode="replace") == 2
    assert nyala.query_arrow(conn, f"SELECT id FROM {table_name} ORDER BY id").column("id").to_pylist() == [100, 101]
    # replace also creates.
    other = table_name + "_new"
    assert nyala.load(conn, other, sample(1), mode="replace") == 1
    assert nyala.query_arrow(conn, f"SELECT id FROM {other}").column("id").to_pylist() == [1]


def test_load_create_append(conn, table_name):
    assert nyala.load(conn, table_name, sample(2), mode="create_append") == 2
    assert nyala.load(conn, table_name, sample(2, start=3), mode="create_append") == 2
    assert nyala.query_arrow(conn, f"SELECT id FROM {table_name} ORDER BY id").column("id").to_pylist() == [1, 2, 3, 4]


def test_load_pandas_without_its_index(conn, table_name):
    df = pd.DataFrame({"id": [10, 20, 30], "name": ["a", "b", None], "score": [1.0, None, 3.0]}, index=[7, 8, 9])
    assert nyala.load(conn, table_name, df, mode="create") == 3
    back = nyala.query_pandas(conn, f"SELECT * FROM {table_name} ORDER BY id")
    assert list(back.columns) == ["id", "name", "score"]
    assert back["id"].tolist() == [10, 20, 30]
    assert back["name"].tolist() == ["a", "b", None]
    assert back["score"].isna().tolist() == [False, True, False]


def test_load_record_batch_dict_and_row_dicts(conn, table_name):
    batch = sample(2).to_batches()[0]
    assert isinstance(batch, pa.RecordBatch)
    assert nyala.load(conn, table_name, batch, mode="create") == 2
    assert nyala.load(conn, table_name, {"id": [3], "name": ["c"], "score": [1.0]}) == 1
    assert nyala.load(conn, table_name, [{"id": 4, "name": "d", "score": 2.0}]) == 1
    reader = pa.RecordBatchReader.from_batches(sample(2, start=5).schema, sample(2, start=5).to_batches())
    assert nyala.load(conn, table_name, reader) == 2
    assert nyala.query_arrow(conn, f"SELECT id FROM {table_name} ORDER BY id").column("id").to_pylist() == [1, 2, 3, 4, 5, 6]


def test_load_types_round_trip(conn, table_name):
    data = pa.table({
        "k": pa.array(["a", "b"], pa.string()),
        "i8": pa.array([1, -2], pa.int8()),
        "i16": pa.array([300, None], pa.int16()),
        "i32": pa.array([70000, 3], pa.int32()),
        "i64": pa.array([2**40, -1], pa.int64()),
        "f32": pa.array([1.5, None], pa.float32()),
        "f64": pa.array([2.25, -0.5], pa.float64()),
        "b": pa.array([True, False], pa.bool_()),
        "bin": pa.array([b"\x00\x01", None], pa.binary()),
        "d": pa.array([datetime.date(2026, 1, 2), None], pa.date32()),
        "ts": pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us")),
    })
    assert nyala.load(conn, table_name, data, mode="create") == 2
    back = nyala.query_arrow(conn, f"SELECT * FROM {table_name} ORDER BY k")
    assert back.schema.names == data.schema.names
    for name in data.schema.names:
        column = back.column(name)
        if column.type != data.schema.field(name).type:
            column = column.cast(data.schema.field(name).type)
        assert column.to_pylist() == data.column(name).to_pylist(), name


def test_load_pandas_nanosecond_timestamps(conn, table_name):
    df = pd.DataFrame({"id": [1, 2], "at": pd.to_datetime(["2026-01-01 00:00:00", "2026-01-01 00:00:01.5"], format="ISO8601")})
    assert nyala.load(conn, table_name, df, mode="create") == 2
    back = nyala.query_pandas(conn, f"SELECT id, at FROM {table_name} ORDER BY id")
    at = back["at"].dt.tz_convert(None) if back["at"].dt.tz is not None else back["at"]
    assert at.tolist() == df["at"].tolist()


def test_load_rejects_bad_input(conn, table_name):
    with pytest.raises(ValueError, match="mode"):
        nyala.load(conn, table_name, sample(1), mode="upsert")
    with pytest.raises(TypeError, match="cannot load"):
        nyala.load(conn, table_name, 42)


# --- authentication ---

def test_authenticated_connection(auth_server, credentials, table_name):
    user, password = credentials
    with nyala.connect(auth_server, username=user, password=password) as conn:
        execute(conn, T_DDL.format(name=table_name))
        assert nyala.load(conn, table_name, sample(20)) == 20
        # Multi-endpoint read: every endpoint fetched with the session's token.
        table = nyala.query_arrow(conn, f"SELECT id FROM {table_name} WHERE score > 0")
        assert sorted(table.column("id").to_pylist()) == list(range(1, 21))
        assert nyala.query_arrow(conn, f"SELECT name FROM {table_name} WHERE id = ?", (3,)).column("name").to_pylist() == ["x3"]


def test_wrong_password_is_refused(auth_server, credentials):
    user, _ = credentials
    with pytest.raises(nyala.Error, match="(?i)unauthenticated|invalid username or password"):
        with nyala.connect(auth_server, username=user, password="wrong") as conn:
            nyala.query_arrow(conn, "SELECT 1")


def test_no_credentials_are_refused(auth_server):
    with pytest.raises(nyala.Error, match="(?i)unauthenticated|authentication required"):
        with nyala.connect(auth_server) as conn:
            nyala.query_arrow(conn, "SELECT 1")
