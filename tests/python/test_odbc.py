"""ODBC through psqlODBC (Debian's odbc-postgresql, unixODBC) and pyodbc, against a real
`nyala serve`: what Excel, Power BI, Tableau, R's odbc and pyodbc do to list tables and
columns and to run parameterised statements."""

import pyodbc
import pytest

from nyala_server import nyala_serve


@pytest.fixture(scope="module")
def odbc():
    """An ODBC connection string of a server's PostgreSQL protocol."""
    if "PostgreSQL Unicode" not in pyodbc.drivers():
        pytest.fail("psqlODBC is not installed (apt-get install odbc-postgresql unixodbc)")
    with nyala_serve(postgres=True) as (_, _, (host, port)):
        yield (f"DRIVER={{PostgreSQL Unicode}};SERVER={host};PORT={port};DATABASE=nyala;"
               f"UID=nyala;PWD=;")


def test_parameterised_statements(odbc, table_name):
    with pyodbc.connect(odbc, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {table_name} (k INT PRIMARY KEY, s STRING, v DOUBLE)")
        cur.executemany(f"INSERT INTO {table_name} VALUES (?, ?, ?)",
                        [(1, "one", 1.5), (2, "two", 2.5), (3, "three", 3.5)])
        cur.execute(f"SELECT s, v FROM {table_name} WHERE k >= ? ORDER BY k", 2)
        assert [tuple(r) for r in cur.fetchall()] == [("two", 2.5), ("three", 3.5)]
        cur.execute(f"UPDATE {table_name} SET v = ? WHERE k = ?", 9.0, 1)
        assert cur.rowcount == 1


def test_tables_and_columns_are_listed(odbc, table_name):
    """SQLTables and SQLColumns, as BI tools call them to show what there is."""
    with pyodbc.connect(odbc, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, name STRING, "
                    f"price DECIMAL(10, 2))")
        tables = [row.table_name for row in cur.tables(tableType="TABLE")]
        assert table_name in tables
        columns = [(row.column_name, row.type_name)
                   for row in cur.columns(table=table_name)]
        assert columns == [("k", "int8"), ("name", "text"), ("price", "numeric")]


def test_primary_keys_and_the_key_index(odbc, table_name):
    """SQLPrimaryKeys and SQLStatistics: the key in key order, and the unique index behind
    it, as BI tools read them to tell rows apart."""
    with pyodbc.connect(odbc, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {table_name} (host STRING, ts BIGINT, v DOUBLE, "
                    f"PRIMARY KEY (host, ts))")
        keys = [(row.column_name, row.key_seq, row.pk_name)
                for row in cur.primaryKeys(table_name)]
        assert keys == [("host", 1, f"{table_name}_pkey"), ("ts", 2, f"{table_name}_pkey")]
        index = [(row.index_name, row.non_unique, row.ordinal_position, row.column_name)
                 for row in cur.statistics(table_name) if row.index_name]
        assert index == [(f"{table_name}_pkey", 0, 1, "host"),
                         (f"{table_name}_pkey", 0, 2, "ts")]
