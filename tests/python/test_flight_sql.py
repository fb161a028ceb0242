"""Nyala through ADBC's Flight SQL driver, against a real `nyala serve` process."""


import adbc_driver_flightsql.dbapi as flightsql
import pytest


@pytest.fixture
def conn(server):
    with flightsql.connect(server, autocommit=True) as conn:
        yield conn


def test_create_insert_update_delete_select(conn):
    cur = conn.cursor()
    cur.execute(
        "CREATE TABLE py_metrics (host STRING, ts TIMESTAMP, value DOUBLE, PRIMARY KEY (host, ts)) "
        "DISTRIBUTE BY HASH (host) INTO 2 BUCKETS"
    )
    cur.execute(
        "INSERT INTO py_metrics VALUES ('a', '2026-01-01T00:00:00', 1.5), "
        "('a', '2026-01-01T00:01:00', 2.5), ('b', '2026-01-01T00:00:00', 10.0)"
    )
    cur.execute("UPDATE py_metrics SET value = value * 2 WHERE host = 'a'")
    cur.execute("DELETE FROM py_metrics WHERE value > 9")
    cur.execute("SELECT host, value FROM py_metrics ORDER BY value")
    table = cur.fetch_arrow_table()
    assert table.column("host").to_pylist() == ["a", "a"]
    assert table.column("value").to_pylist() == [3.0, 5.0]
    cur.close()


def test_errors_are_clear_and_change_nothing(conn):
    cur = conn.cursor()
    cur.execute("CREATE TABLE py_keys (id BIGINT PRIMARY KEY, v STRING)")
    cur.execute("INSERT INTO py_keys VALUES (1, 'x')")
    with pytest.raises(Exception, match="duplicate primary key"):
        cur.execute("INSERT INTO py_keys VALUES (1, 'y')")
    with pytest.raises(Exception, match="no_such_table"):
        cur.execute("SELECT * FROM no_such_table")
    cur.execute("SELECT v FROM py_keys")
    assert cur.fetch_arrow_table().column("v").to_pylist() == ["x"]
    cur.close()


def test_dictionary_encoded_parameters_bind_as_their_values(conn):
    """A parameter column that arrives dictionary-encoded (as pandas categoricals do) binds
    as its values (found by fuzz_traffic.py: it failed with an internal IPC error)."""
    import pyarrow as pa

    cur = conn.cursor()
    cur.execute("CREATE TABLE dict_params (k BIGINT PRIMARY KEY, v STRING)")
    cur.execute("INSERT INTO dict_params VALUES (1, 'a'), (2, 'b')")
    params = pa.record_batch([pa.array(["b"]).dictionary_encode()], names=["p"])
    cur.execute("SELECT k FROM dict_params WHERE v = ?", parameters=params)
    assert cur.fetchall() == [(2,)]
