"""The PostgreSQL protocol, as psycopg 3 and psql use it against a real `nyala serve`: the simple
and extended protocols, every Nyala type in text and binary, SQLSTATEs, transactions across
statements, and the same data as Flight SQL clients see."""

import datetime
import decimal
import json
import os
import subprocess
import sys
import threading

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import psycopg.errors
import pytest

from nyala_server import PASSWORD, USER, nyala_serve


@pytest.fixture(scope="module")
def servers():
    """(grpc URL, (host, port) of the PostgreSQL protocol) of a server without authentication."""
    with nyala_serve(postgres=True) as (grpc, _, pg):
        yield grpc, pg


@pytest.fixture
def pg(servers):
    return servers[1]


def connect(pg, **kwargs):
    host, port = pg
    return psycopg.connect(host=host, port=port, user="nyala", dbname="nyala", **kwargs)


def test_simple_and_extended_queries(pg, table_name):
    """Statements as text (psycopg's `execute` without parameters uses the simple protocol)
    and with parameters (Parse/Bind/Execute), reading what they wrote."""
    with connect(pg, autocommit=True) as conn:
        assert conn.execute("SELECT 1 AS one, 'x' AS s").fetchall() == [(1, "x")]
        conn.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, name STRING, v DOUBLE) "
                     f"DISTRIBUTE BY HASH (k) INTO 2 BUCKETS")
        cur = conn.execute(f"INSERT INTO {table_name} VALUES (1, 'one', 1.5), (2, 'two', 2.5)")
        assert cur.rowcount == 2
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table_name} VALUES (%s, %s, %s)",
                            [(k, f"n{k}", k / 2) for k in range(3, 8)])
        rows = conn.execute(f"SELECT k, name FROM {table_name} WHERE k > %s ORDER BY k",
                            (5,)).fetchall()
        assert rows == [(6, "n6"), (7, "n7")]
        # A lookup by the whole key, prepared once and run again (psycopg prepares after 5).
        for k in range(1, 8):
            row = conn.execute(f"SELECT v FROM {table_name} WHERE k = %s", (k,),
                               prepare=True).fetchone()
            assert row == ((1.5 if k == 1 else 2.5 if k == 2 else k / 2),)
        cur = conn.execute(f"UPDATE {table_name} SET v = v * 2 WHERE k <= %s", (2,))
        assert cur.rowcount == 2
        cur = conn.execute(f"DELETE FROM {table_name} WHERE k = 7")
        assert cur.rowcount == 1
        assert conn.execute(f"SELECT count(*), sum(v) FROM {table_name}").fetchone() == (6, 17.0)


def test_several_statements_in_one_query(pg, table_name):
    """One Query message with several statements runs them in order; one that fails stops
    the rest, as in PostgreSQL."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY); "
                     f"INSERT INTO {table_name} VALUES (1); INSERT INTO {table_name} VALUES (2)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(f"INSERT INTO {table_name} VALUES (3); INSERT INTO {table_name} "
                         f"VALUES (1); INSERT INTO {table_name} VALUES (4)")
        assert conn.execute(f"SELECT k FROM {table_name} ORDER BY k").fetchall() == [
            (1,), (2,), (3,)]


@pytest.mark.parametrize("binary", [False, True])
def test_types_round_trip(pg, table_name, binary):
    """Every Nyala column type goes in as a parameter and comes back equal, in text and in
    binary format."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"""CREATE TABLE {table_name} (
            k INT PRIMARY KEY, b BOOLEAN, i8 TINYINT, i16 SMALLINT, i64 BIGINT, f FLOAT,
            d DOUBLE, s STRING, vc VARCHAR(10), bin BINARY, dec DECIMAL(12, 3), dt DATE,
            ts TIMESTAMP)""")
        # A Nyala TIMESTAMP is an instant (Kudu's UNIXTIME_MICROS): a PostgreSQL timestamptz.
        row = (1, True, 7, -300, 2 ** 40, 1.5, -2.25, "naïve ✓", "short", b"\x00\xffab",
               decimal.Decimal("12345.678"), datetime.date(2026, 11, 28),
               datetime.datetime(2026, 11, 28, 10, 5, 7, 123456, tzinfo=datetime.timezone.utc))
        with conn.cursor(binary=binary) as cur:
            cur.execute(f"INSERT INTO {table_name} VALUES "
                        f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", row)
            cur.execute(f"INSERT INTO {table_name} (k) VALUES (2)")
            cur.execute(f"SELECT * FROM {table_name} ORDER BY k")
            got = cur.fetchall()
        assert got[0] == row
        assert got[1] == (2,) + (None,) * 12


def test_errors_have_sqlstates_and_the_session_goes_on(pg, table_name):
    """Clients act on SQLSTATEs: psycopg raises its error classes by code. After an error the
    connection stays usable."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, v INT)")
        conn.execute(f"INSERT INTO {table_name} VALUES (1, 1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(f"INSERT INTO {table_name} VALUES (%s, %s)", (1, 2))
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELEC 1")
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        assert conn.execute(f"SELECT v FROM {table_name}").fetchall() == [(1,)]


def test_transactions_span_statements(pg, table_name):
    """psycopg opens a transaction with its first statement (autocommit off): what it writes
    is its own until commit; rollback discards it; the status it reports follows."""
    with connect(pg, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, v INT)")
        admin.execute(f"INSERT INTO {table_name} VALUES (1, 10), (2, 20)")
    with connect(pg) as conn, connect(pg, autocommit=True) as other:
        conn.execute(f"UPDATE {table_name} SET v = v + 1 WHERE k = 1")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute(f"SELECT v FROM {table_name} WHERE k = 1").fetchone() == (11,)
        assert other.execute(f"SELECT v FROM {table_name} WHERE k = 1").fetchone() == (10,)
        conn.rollback()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert other.execute(f"SELECT v FROM {table_name} WHERE k = 1").fetchone() == (10,)
        conn.execute(f"INSERT INTO {table_name} VALUES (3, 30)")
        conn.commit()
        assert other.execute(f"SELECT count(*) FROM {table_name}").fetchone() == (3,)


def test_savepoints_around_reads_and_writes(pg, table_name):
    """psycopg's nested `transaction()` is a savepoint. Around reads (as drivers use it to
    look types up) it is released or rolled back to; after a write since the savepoint,
    ROLLBACK TO is refused (the tablets cannot undo part of a transaction) and the whole
    transaction is rolled back."""
    with connect(pg, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY)")
    with connect(pg) as conn:
        with conn.transaction():
            conn.execute(f"INSERT INTO {table_name} VALUES (1)")
            with conn.transaction():
                assert conn.execute("SELECT 1").fetchone() == (1,)
            with pytest.raises(psycopg.errors.UndefinedTable):
                with conn.transaction():
                    conn.execute("SELECT * FROM no_such_table")
            conn.execute(f"INSERT INTO {table_name} VALUES (2)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="ROLLBACK"):
            with conn.transaction():
                conn.execute(f"INSERT INTO {table_name} VALUES (3)")
                conn.execute("SAVEPOINT before_four")
                conn.execute(f"INSERT INTO {table_name} VALUES (4)")
                conn.execute("ROLLBACK TO SAVEPOINT before_four")
        with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
            with conn.transaction():
                conn.execute("RELEASE SAVEPOINT never_set")
    with connect(pg, autocommit=True) as conn:
        assert conn.execute(f"SELECT k FROM {table_name} ORDER BY k").fetchall() == [(1,), (2,)]
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute("SAVEPOINT outside")


def test_write_write_conflict_is_a_serialization_failure(pg, table_name):
    """Two transactions writing one row: the second to write gets 40001 (retry it)."""
    with connect(pg, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, v INT)")
        admin.execute(f"INSERT INTO {table_name} VALUES (1, 0)")
    with connect(pg) as first, connect(pg) as second:
        first.execute(f"SELECT v FROM {table_name} WHERE k = 1").fetchone()
        second.execute(f"SELECT v FROM {table_name} WHERE k = 1").fetchone()
        first.execute(f"UPDATE {table_name} SET v = 1 WHERE k = 1")
        first.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            second.execute(f"UPDATE {table_name} SET v = 2 WHERE k = 1")
            second.commit()
        second.rollback()
    with connect(pg, autocommit=True) as conn:
        assert conn.execute(f"SELECT v FROM {table_name}").fetchone() == (1,)


def test_flight_sql_and_postgres_share_the_data(servers, table_name):
    """A row written over one protocol is read over the other."""
    grpc, pg = servers
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING)")
        conn.execute(f"INSERT INTO {table_name} VALUES (%s, %s)", (1, "from postgres"))
    with flightsql.connect(grpc, autocommit=True) as fconn, fconn.cursor() as cur:
        cur.execute(f"INSERT INTO {table_name} VALUES (2, 'from flight')")
        cur.execute(f"SELECT k, s FROM {table_name} ORDER BY k")
        assert cur.fetchall() == [(1, "from postgres"), (2, "from flight")]
    with connect(pg, autocommit=True) as conn:
        assert conn.execute(f"SELECT s FROM {table_name} WHERE k = 2").fetchone() == (
            "from flight",)


def psql(pg, script, tuples_only=True):
    """Runs `script` with psql as an operator does (unaligned, stop on error; tuples only
    unless told otherwise)."""
    host, port = pg
    return subprocess.run(
        ["psql", "-h", host, "-p", str(port), "-U", "nyala", "-d", "nyala", "-X", "-A",
         *(["-t"] if tuples_only else []), "-v", "ON_ERROR_STOP=1"],
        input=script, capture_output=True, text=True, timeout=60)


def test_psql_runs_a_script(pg, table_name):
    """psql, as an operator runs it: a script of statements and a query printed unaligned."""
    script = (f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING);\n"
              f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b');\n"
              f"SELECT k, s FROM {table_name} ORDER BY k;\n")
    out = psql(pg, script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["CREATE", "TABLE", "INSERT", "0", "2", "1|a", "2|b"], out.stdout


# SQLAlchemy 2 (whose `postgresql+psycopg` dialect is psycopg 3's) cannot be installed beside
# the SQLAlchemy 1.4 that flightsql-dbapi pins: it goes to a folder of its own, which only the
# process that uses it puts on its path.
SQLALCHEMY2 = os.path.expanduser("~/.cache/nyala-test-sqlalchemy2")

SQLALCHEMY2_REFLECTION = """
import json, sys
import sqlalchemy as sa
assert sa.__version__.startswith("2."), sa.__version__
table, view = sys.argv[2], sys.argv[3]
engine = sa.create_engine(sys.argv[1])
inspector = sa.inspect(engine)
reflected = sa.Table(table, sa.MetaData(), autoload_with=engine)
print(json.dumps({
    "tables": [t for t in inspector.get_table_names() if t in (table, view)],
    "views": [v for v in inspector.get_view_names() if v in (table, view)],
    "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
    "key": inspector.get_pk_constraint(table)["constrained_columns"],
    "key_name": inspector.get_pk_constraint(table)["name"],
    "reflected_key": [c.name for c in reflected.primary_key],
}))
"""


@pytest.fixture(scope="module")
def sqlalchemy2():
    if not os.path.isdir(os.path.join(SQLALCHEMY2, "sqlalchemy")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", SQLALCHEMY2,
                        "sqlalchemy>=2.0,<2.1"], check=True, capture_output=True)
    return SQLALCHEMY2


def test_sqlalchemy2_psycopg_reflects_tables_views_and_keys(pg, table_name, sqlalchemy2):
    """SQLAlchemy 2's `postgresql+psycopg` dialect, as ORMs and BI tools (Superset) use it:
    table and view names, columns and the primary key, and a Table reflected whole."""
    host, port = pg
    view = f"{table_name}_v"
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (host STRING, ts BIGINT, v DOUBLE, "
                     f"PRIMARY KEY (host, ts))")
        conn.execute(f"CREATE VIEW {view} AS SELECT host, v FROM {table_name}")
    env = dict(os.environ, PYTHONPATH=sqlalchemy2)
    url = f"postgresql+psycopg://nyala@{host}:{port}/nyala"
    out = subprocess.run([sys.executable, "-c", SQLALCHEMY2_REFLECTION, url, table_name, view],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    reflected = json.loads(out.stdout)
    assert reflected == {
        "tables": [table_name],
        "views": [view],
        "columns": [["host", "TEXT", False], ["ts", "BIGINT", False],
                    ["v", "DOUBLE PRECISION", True]],
        "key": ["host", "ts"],
        "key_name": f"{table_name}_pkey",
        "reflected_key": ["host", "ts"],
    }


def test_psql_describes_a_table_and_its_key(pg, table_name):
    """psql's `\\dt` lists the table and `\\d` shows its columns and the key's index."""
    psql(pg, f"CREATE TABLE {table_name} (host STRING, ts BIGINT, v DOUBLE, "
             f"PRIMARY KEY (host, ts));\n")
    listed = psql(pg, "\\dt\n")
    assert listed.returncode == 0, listed.stderr
    assert f"public|{table_name}|table|" in listed.stdout, listed.stdout
    described = psql(pg, f"\\d {table_name}\n", tuples_only=False)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert "host|text||not null|" in lines, described.stdout
    assert "v|double precision|||" in lines, described.stdout
    assert f'    "{table_name}_pkey" PRIMARY KEY, btree (host, ts)' in lines, described.stdout


def test_passwords_and_privileges():
    """With users in the catalog, clients log in with SCRAM-SHA-256; a wrong password is
    refused, and a user without a privilege gets 42501."""
    with nyala_serve("--user", USER, "--password", PASSWORD, postgres=True) as (_, _, pg):
        host, port = pg
        with pytest.raises(psycopg.OperationalError, match="(?i)password authentication"):
            psycopg.connect(host=host, port=port, user=USER, password="wrong", dbname="nyala")
        # An unknown user is refused as a wrong password is: the answer names no user.
        with pytest.raises(psycopg.OperationalError, match="(?i)password authentication"):
            psycopg.connect(host=host, port=port, user="nobody", password="x", dbname="nyala")
        with psycopg.connect(host=host, port=port, user=USER, password=PASSWORD,
                             dbname="nyala", autocommit=True) as admin:
            admin.execute("CREATE TABLE secret (k INT PRIMARY KEY)")
            admin.execute("CREATE USER bob WITH PASSWORD 'bob-secret'")
        with psycopg.connect(host=host, port=port, user="bob", password="bob-secret",
                             dbname="nyala", autocommit=True) as bob:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                bob.execute("SELECT * FROM secret")
            assert bob.execute("SELECT 41 + 1").fetchone() == (42,)


def test_cancel_stops_the_running_statement(pg, table_name):
    """A CancelRequest (psycopg's `cancel()`, psql's Ctrl-C) stops the connection's statement
    with 57014; the connection goes on."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY)")
        conn.execute(f"INSERT INTO {table_name} SELECT value FROM generate_series(1, 3000)")
        timer = threading.Timer(1.0, conn.cancel)
        timer.start()
        try:
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute(f"SELECT count(*) FROM {table_name} a, {table_name} b, "
                             f"{table_name} c").fetchall()
        finally:
            timer.cancel()
        assert conn.execute(f"SELECT count(*) FROM {table_name}").fetchone() == (3000,)


def test_postgres_parameters_are_set_and_shown(pg):
    """What drivers and BI tools set and read as they connect."""
    with connect(pg, autocommit=True) as conn:
        conn.execute("SET extra_float_digits = 3")
        conn.execute("SET application_name = 'reports'")
        assert conn.execute("SHOW application_name").fetchone() == ("reports",)
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        assert conn.execute("SHOW server_version").fetchone()[0].startswith("16")
        conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        with pytest.raises(psycopg.Error, match="unrecognized configuration parameter"):
            conn.execute("SET no_such_parameter = 1")
        conn.execute("SET statement_timeout = 60000")
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_copy_in_and_out(pg, table_name):
    """COPY FROM STDIN loads every row or none; COPY TO STDOUT gives them back as PostgreSQL
    writes them (psycopg reads and writes the text format)."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING, b BINARY, "
                     f"d DECIMAL(8, 2))")
        rows = [(i, None if i % 7 == 0 else f"row\t{i}, \"q\"\n", bytes([i % 256, 0]),
                 decimal.Decimal(i) / 4) for i in range(1, 1001)]
        with conn.cursor() as cur:
            with cur.copy(f"COPY {table_name} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            assert cur.rowcount == 1000
            got = []
            with cur.copy(f"COPY (SELECT k, s, b, d FROM {table_name} ORDER BY k) "
                          f"TO STDOUT") as copy:
                for row in copy.rows():
                    got.append(row)
        assert len(got) == 1000
        assert got[6] == ("7", None, "\\x0700", "1.75")
        assert got[0][1] == 'row\t1, "q"\n'
        # A row that does not fit: nothing of the COPY is loaded.
        with pytest.raises(psycopg.errors.UniqueViolation), conn.cursor() as cur:
            with cur.copy(f"COPY {table_name} (k, s) FROM STDIN") as copy:
                copy.write_row((5000, "new"))
                copy.write_row((1, "duplicate"))
        assert conn.execute(f"SELECT count(*) FROM {table_name}").fetchone() == (1000,)


def test_copy_csv(pg, table_name):
    """CSV in and out: quotes, embedded delimiters and newlines, an empty field as NULL."""
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING)")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {table_name} FROM STDIN WITH (FORMAT csv, HEADER true)") as copy:
                copy.write('k,s\n1,"a, ""quoted""\nline"\n2,\n3,plain\n')
            assert cur.rowcount == 3
            out = b""
            with cur.copy(f"COPY {table_name} TO STDOUT WITH (FORMAT csv)") as copy:
                for chunk in copy:
                    out += bytes(chunk)
        assert conn.execute(f"SELECT s FROM {table_name} ORDER BY k").fetchall() == [
            ('a, "quoted"\nline',), (None,), ("plain",)]
        lines = sorted(out.decode().replace('\nline', ' line').splitlines())
        assert lines == ['1,"a, ""quoted"" line"', "2,", "3,plain"], out


def test_copy_binary(pg, table_name):
    """The binary format in and out, as psycopg writes and reads it with the types named:
    NULLs, a negative decimal, text with tabs and non-ASCII characters, an empty result."""
    types = ["int8", "text", "float8", "numeric"]
    rows = [(1, "one", 1.5, decimal.Decimal("12.34")),
            (2, None, -0.25, decimal.Decimal("-7.50")),
            (3, "tab\tand ünïcode", None, None),
            (4, "", 1e300, decimal.Decimal("-0.01"))]
    with connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, s STRING, v DOUBLE, "
                     f"d DECIMAL(10, 2))")
        with conn.cursor() as cur:
            with cur.copy(f"COPY {table_name} (k, s, v, d) FROM STDIN "
                          f"WITH (FORMAT BINARY)") as copy:
                copy.set_types(types)
                for row in rows:
                    copy.write_row(row)
            assert cur.rowcount == len(rows)
            cur.execute(f"SELECT k, s, v, d FROM {table_name} ORDER BY k")
            assert cur.fetchall() == rows
            with cur.copy(f"COPY (SELECT k, s, v, d FROM {table_name} ORDER BY k) "
                          f"TO STDOUT WITH (FORMAT BINARY)") as copy:
                copy.set_types(types)
                got = list(copy.rows())
            assert got == rows
            with cur.copy(f"COPY (SELECT k FROM {table_name} WHERE k < 0) "
                          f"TO STDOUT WITH (FORMAT BINARY)") as copy:
                copy.set_types(["int8"])
                assert list(copy.rows()) == []


def test_psql_copy_from_a_file(pg, table_name, tmp_path):
    """psql's \\copy reads a client-side CSV file through COPY FROM STDIN."""
    data = tmp_path / "rows.csv"
    data.write_text("k,s\n1,one\n2,\"two, too\"\n")
    script = (f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING);\n"
              f"\\copy {table_name} FROM '{data}' WITH (FORMAT csv, HEADER true)\n"
              f"SELECT s FROM {table_name} ORDER BY k;\n")
    out = psql(pg, script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["CREATE TABLE", "COPY 2", "one", "two, too"], out.stdout


def test_sqlalchemy_reflects_tables_columns_and_keys(pg, table_name):
    """SQLAlchemy's PostgreSQL dialect (psycopg2 under SQLAlchemy 1.4, which the Flight SQL
    dialect pins) connects, reads the server version and reflects tables, columns and
    primary keys."""
    import sqlalchemy as sa
    host, port = pg
    engine = sa.create_engine(f"postgresql+psycopg2://nyala@{host}:{port}/nyala")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table_name} (id BIGINT PRIMARY KEY, "
                                 f"name STRING, price DOUBLE)"))
        inspector = sa.inspect(engine)
        assert table_name in inspector.get_table_names()
        columns = [(c["name"], str(c["type"]), c["nullable"])
                   for c in inspector.get_columns(table_name)]
        assert columns == [("id", "BIGINT", False), ("name", "TEXT", True),
                           ("price", "DOUBLE_PRECISION", True)]
        key = inspector.get_pk_constraint(table_name)
        assert key == {"constrained_columns": ["id"], "name": f"{table_name}_pkey"}
        reflected = sa.Table(table_name, sa.MetaData(), autoload_with=engine)
        assert [c.name for c in reflected.primary_key] == ["id"]
    finally:
        engine.dispose()
