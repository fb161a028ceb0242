"""COPY to and from files on the server, over Flight SQL (ADBC) and the PostgreSQL protocol
(psycopg): files written by pyarrow and DuckDB loaded, results read back by pyarrow and DuckDB,
and the administrator's privilege."""

import os
import tempfile

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nyala_server import PASSWORD, USER, nyala_serve

COLUMNS = "k BIGINT PRIMARY KEY, d DATE, amount DECIMAL(12, 2), name STRING, ok BOOLEAN"


def test_copy_loads_what_duckdb_and_pyarrow_write(table_name):
    t = table_name
    with tempfile.TemporaryDirectory() as files, nyala_serve(postgres=True) as (grpc, _, pg):
        duck = duckdb.connect()
        duck.execute(f"CREATE TABLE src AS SELECT range AS k, DATE '2024-01-01' + "
                     "CAST(range % 365 AS INTEGER) AS d, CAST(range * 1.25 AS DECIMAL(12, 2)) "
                     "AS amount, 'name-' || range AS name, range % 3 = 0 AS ok FROM range(30000)")
        # DuckDB writes two Parquet files and a CSV file; pyarrow a Parquet file with NULLs.
        duck.execute(f"COPY (SELECT * FROM src WHERE k < 10000) TO '{files}/p-1.parquet'")
        duck.execute(f"COPY (SELECT * FROM src WHERE k >= 10000 AND k < 20000) "
                     f"TO '{files}/p-2.parquet'")
        duck.execute(f"COPY (SELECT * FROM src WHERE k >= 20000) TO '{files}/rest.csv' "
                     "(HEADER, DELIMITER '|')")
        pq.write_table(pa.table({"k": [-1, -2], "name": ["x", None]}), f"{files}/nulls.parquet")
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} ({COLUMNS}) DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
            for sql in (f"COPY {t} FROM '{files}/p-*.parquet'",
                        f"COPY {t} FROM '{files}/rest.csv' (FORMAT csv, HEADER, DELIMITER '|')",
                        f"COPY {t} FROM '{files}/nulls.parquet'"):
                cur.adbc_statement.set_sql_query(sql)
                cur.adbc_statement.execute_update()
            cur.execute(f"SELECT * FROM {t} WHERE k >= 0 ORDER BY k")
            loaded = cur.fetchall()
            cur.execute(f"SELECT k, name, d FROM {t} WHERE k < 0 ORDER BY k")
            assert cur.fetchall() == [(-2, None, None), (-1, "x", None)]
        assert loaded == duck.execute("SELECT * FROM src ORDER BY k").fetchall()

        # Over the PostgreSQL protocol: COPY TO files pyarrow and DuckDB read back.
        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            cur = conn.execute(f"COPY {t} TO '{files}/out.parquet'")
            assert cur.statusmessage == "COPY 30002"
            cur = conn.execute(f"COPY (SELECT k, name FROM {t} WHERE ok) TO '{files}/out.csv' "
                               "(FORMAT csv, HEADER)")
            assert cur.statusmessage == "COPY 10000"
            # A bad row: the whole COPY fails, naming the file and line, and loads nothing.
            with open(f"{files}/bad.csv", "w") as f:
                f.write("k,d,amount,name,ok\n1000000,2024-01-01,1.5,a,true\n"
                        "1000001,not a date,1.5,b,false\n")
            with pytest.raises(psycopg.Error, match=r"bad\.csv.*at line 3"):
                conn.execute(f"COPY {t} FROM '{files}/bad.csv' (FORMAT csv, HEADER)")
            count = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
            assert count == (30002,)
        written = pq.read_table(f"{files}/out.parquet").sort_by("k")
        assert written.num_rows == 30002
        assert written.column("name").to_pylist()[:3] == [None, "x", "name-0"]
        back = duck.execute(f"SELECT count(*), sum(k) FROM read_csv('{files}/out.csv')")
        assert back.fetchone() == (10000, sum(range(0, 30000, 3)))


def test_only_the_administrator_copies_files(table_name):
    with tempfile.TemporaryDirectory() as files, \
            nyala_serve("--user", USER, "--password", PASSWORD) as (grpc, _):
        def connect_as(user, password):
            return flightsql.connect(grpc, db_kwargs={"username": user, "password": password},
                                     autocommit=True)

        with connect_as(USER, PASSWORD) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY)")
            cur.execute("CREATE USER bob WITH PASSWORD 'bob-secret'")
            cur.execute(f"GRANT ALL ON {table_name} TO bob")
        with connect_as("bob", "bob-secret") as conn, conn.cursor() as cur:
            for sql in (f"COPY {table_name} TO '{files}/mine.csv'",
                        f"COPY {table_name} FROM '/etc/hostname' (FORMAT csv)"):
                with pytest.raises(Exception, match="only the administrator"):
                    cur.execute(sql)
                    cur.fetchall()
        assert not os.path.exists(f"{files}/mine.csv")
