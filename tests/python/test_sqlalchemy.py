"""Nyala through SQLAlchemy 1.4 and pandas, with the `flightsql-dbapi` package's Flight SQL
dialect (`datafusion+flightsql://`): reflection (GetSqlInfo, GetTables with schemas,
GetDbSchemas, GetPrimaryKeys), queries and pandas.read_sql.

flightsql-dbapi's cursor runs every statement as CommandStatementQuery and reads the first
endpoint of the FlightInfo only; with parameters it prepares the statement and binds each
value as a one-row dense union (int64 | float64 | utf8 | binary | bool)."""

import flightsql
import flightsql.sqlalchemy  # noqa: F401  registers the datafusion+flightsql dialect
import pandas as pd
import pytest
import sqlalchemy
from sqlalchemy import create_engine, inspect, text

from nyala_server import PASSWORD, USER, host_port

ROWS = [(i, f"name-{i}", i * 1.5) for i in range(1, 41)]


def engine_for(url, user=None, password=None, **query):
    host, port = host_port(url)
    credentials = f"{user}:{password}@" if user else ""
    # flightsql-dbapi reads only a query's first endpoint: ask Nyala for a single one (extra
    # URL parameters travel as request headers).
    defaults = {"insecure": "true", "x-nyala-single-endpoint": "true"}
    params = "&".join(f"{k}={v}" for k, v in {**defaults, **query}.items())
    return create_engine(f"datafusion+flightsql://{credentials}{host}:{port}?{params}")


@pytest.fixture(scope="module")
def engine(server):
    engine = engine_for(server)
    with engine.connect() as conn:
        conn.execute(text(
            "CREATE TABLE t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
            "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS"
        ))
        conn.execute(text("INSERT INTO t VALUES " + ", ".join(f"({i}, '{n}', {s})" for i, n, s in ROWS)))
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def prepared_engine(server, engine):
    # Bound parameters need the dialect's prepared-statements feature: without it flightsql-dbapi
    # 0.2.2 renders parameters into the SQL when the statement is compiled for its cache, before
    # any value is known, so `:id` becomes NULL (seen in its echo: `WHERE id = NULL`).
    prepared = engine_for(server, **{"feature-sqlalchemy-prepared-statements": "on"})
    yield prepared
    prepared.dispose()


def test_versions_are_the_pinned_ones():
    assert sqlalchemy.__version__.startswith("1.4.")
    assert flightsql.__version__ == "0.2.2"


def test_dialect_initialises_from_sql_info(engine):
    with engine.connect() as conn:
        info = conn.connection.flightsql_get_sql_info([0, 3, 504])
    assert info[0] == "Nyala"  # FLIGHT_SQL_SERVER_NAME
    assert info[3] is False  # FLIGHT_SQL_SERVER_READ_ONLY
    assert info[504] == '"'  # SQL_IDENTIFIER_QUOTE_CHAR
    assert engine.dialect.identifier_preparer.initial_quote == '"'
    assert engine.dialect.supports_delete


def test_table_names_and_schemas(engine):
    insp = inspect(engine)
    assert "t" in insp.get_table_names()
    assert "t" in insp.get_table_names(schema="public")
    assert insp.get_table_names(schema="no_such_schema") == []
    assert insp.get_schema_names() == ["public"]
    assert insp.has_table("t")
    assert not insp.has_table("no_such_table")


def test_columns(engine):
    columns = inspect(engine).get_columns("t")
    assert [c["name"] for c in columns] == ["id", "name", "score"]
    assert [type(c["type"]) for c in columns] == [
        sqlalchemy.types.BIGINT,
        sqlalchemy.types.TEXT,
        sqlalchemy.types.FLOAT,
    ]
    assert [c["nullable"] for c in columns] == [False, True, True]


def test_primary_key_reflection(server, engine):
    # flightsql-dbapi only asks GetPrimaryKeys when this feature flag is on.
    keyed = engine_for(server, **{"feature-sqlalchemy-primary-keys": "on"})
    try:
        assert inspect(keyed).get_pk_constraint("t")["constrained_columns"] == ["id"]
    finally:
        keyed.dispose()


def test_table_reflection(engine):
    table = sqlalchemy.Table("t", sqlalchemy.MetaData(), autoload_with=engine)
    assert [c.name for c in table.columns] == ["id", "name", "score"]
    with engine.connect() as conn:
        rows = conn.execute(
            sqlalchemy.select(table.c.id, table.c.name).where(table.c.id <= 3).order_by(table.c.id)
        ).fetchall()
    assert [tuple(r) for r in rows] == [(1, "name-1"), (2, "name-2"), (3, "name-3")]


def test_text_query(engine):
    with engine.connect() as conn:
        result = conn.execute(text("SELECT id, name, score FROM t WHERE score > 30 ORDER BY id"))
        assert list(result.keys()) == ["id", "name", "score"]
        rows = [tuple(r) for r in result]
    assert rows == [r for r in ROWS if r[2] > 30]


def test_bound_parameters_through_prepared_statements(prepared_engine):
    with prepared_engine.connect() as conn:
        rows = conn.execute(text("SELECT name FROM t WHERE id = :id ORDER BY id"), {"id": 7}).fetchall()
        assert [r[0] for r in rows] == ["name-7"]
        # A plain scan with a parameter: the header keeps it to one endpoint on this path too.
        ids = sorted(r[0] for r in conn.execute(text("SELECT id FROM t WHERE score >= :lo"), {"lo": 30.0}))
        assert ids == [i for i, _, s in ROWS if s >= 30.0]


def test_aggregate(engine):
    with engine.connect() as conn:
        n, total = conn.execute(text("SELECT count(*), sum(score) FROM t")).one()
    assert (n, total) == (len(ROWS), sum(s for _, _, s in ROWS))


def test_prepared_statement_parameters_as_dense_unions(prepared_engine):
    # With the feature on, values go to the server as prepared-statement parameters, each
    # a one-row dense union column.
    with prepared_engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id, name FROM t WHERE id = :id OR name = :name ORDER BY id"),
            {"id": 3, "name": "name-5"},
        ).fetchall()
        assert [tuple(r) for r in rows] == [(3, "name-3"), (5, "name-5")]
        (n,) = conn.execute(text("SELECT count(*) FROM t WHERE score > :s"), {"s": 30.0}).one()
        assert n == sum(1 for _, _, s in ROWS if s > 30.0)


def test_dbapi_cursor_with_parameters_and_executemany(server, engine):
    host, port = host_port(server)
    client = flightsql.FlightSQLClient(host=host, port=port, insecure=True)
    conn = flightsql.connect(client)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE p (id BIGINT NOT NULL, v STRING, PRIMARY KEY (id))")
        cur.executemany("INSERT INTO p VALUES (?, ?)", [(1, "one"), (2, "two"), (3, "three")])
        cur.execute("SELECT v FROM p WHERE id >= ? ORDER BY id", (2,))
        assert cur.fetchall() == [["two"], ["three"]]
        cur.execute("SELECT id FROM p WHERE v = ?", ("one",))
        assert cur.fetchall() == [[1]]
        cur.execute("DROP TABLE p")
    finally:
        conn.close()
        client.close()


def test_pandas_read_sql(engine):
    df = pd.read_sql("SELECT id, name, score FROM t WHERE id <= 5 ORDER BY id", engine)
    assert list(df.columns) == ["id", "name", "score"]
    assert df["id"].tolist() == [1, 2, 3, 4, 5]
    assert df["name"].tolist() == [f"name-{i}" for i in range(1, 6)]
    assert df["score"].tolist() == [1.5, 3.0, 4.5, 6.0, 7.5]


def test_pandas_read_sql_with_params(prepared_engine):
    df = pd.read_sql(text("SELECT id FROM t WHERE score >= :lo ORDER BY id"), prepared_engine, params={"lo": 57.0})
    assert df["id"].tolist() == [38, 39, 40]


def test_plain_select_returns_every_tablets_rows(engine):
    # A plain scan of a 4-bucket table: the server answers one endpoint per tablet, and
    # flightsql-dbapi reads only the first one. Every row must still come back.
    with engine.connect() as conn:
        ids = sorted(r[0] for r in conn.execute(text("SELECT id FROM t WHERE score > 0")))
    assert ids == [i for i, _, _ in ROWS]


def test_pandas_read_sql_table(engine):
    df = pd.read_sql_table("t", engine)
    assert sorted(df["id"].tolist()) == [i for i, _, _ in ROWS]


def test_write_through_the_engine(engine):
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE w (id BIGINT NOT NULL, v STRING, PRIMARY KEY (id))"))
        conn.execute(text("INSERT INTO w VALUES (1, 'a'), (2, 'b')"))
        conn.execute(text("UPDATE w SET v = 'z' WHERE id = 2"))
        conn.execute(text("DELETE FROM w WHERE id = 1"))
        assert [tuple(r) for r in conn.execute(text("SELECT id, v FROM w"))] == [(2, "z")]
        conn.execute(text("DROP TABLE w"))
    assert "w" not in inspect(engine).get_table_names()


def test_errors_surface(engine):
    with engine.connect() as conn:
        with pytest.raises(Exception, match="no_such_table"):
            conn.execute(text("SELECT * FROM no_such_table"))
        with pytest.raises(Exception, match="duplicate primary key"):
            conn.execute(text("INSERT INTO t VALUES (1, 'again', 0.0)"))


def test_authenticated_engine(auth_server):
    good = engine_for(auth_server, USER, PASSWORD)
    try:
        with good.connect() as conn:
            conn.execute(text("CREATE TABLE a (id BIGINT NOT NULL, PRIMARY KEY (id))"))
            conn.execute(text("INSERT INTO a VALUES (1), (2)"))
            assert conn.execute(text("SELECT count(*) FROM a")).scalar() == 2
        assert "a" in inspect(good).get_table_names()
    finally:
        good.dispose()
    # flightsql-dbapi authenticates when the engine is created; without credentials it sends
    # `authorization: Bearer None`.
    for credentials in ((USER, "wrong"), ()):
        with pytest.raises(Exception, match="(?i)unauthenticated|invalid|authentication"):
            bad = engine_for(auth_server, *credentials)
            try:
                with bad.connect() as conn:
                    conn.execute(text("SELECT 1"))
            finally:
                bad.dispose()
