"""Atomicity seen through ADBC: concurrent read-modify-write statements lose no update."""

import random
import threading

import adbc_driver_flightsql.dbapi as flightsql


def execute_update(cur, sql):
    """Runs `sql` as an update (DB-API's execute() runs everything as a query, whose row
    count ADBC reports as -1) and returns the rows it changed."""
    cur.adbc_statement.set_sql_query(sql)
    return cur.adbc_statement.execute_update()


def test_concurrent_increments_are_not_lost(server, table_name):
    clients, increments, keys = 16, 30, 10
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 0 FROM generate_series(0, {keys - 1})")
    done = [0] * keys
    failures = []
    lock = threading.Lock()

    def client(seed):
        rng = random.Random(seed)
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                for _ in range(increments):
                    k = rng.randrange(keys)
                    n = execute_update(cur, f"UPDATE {table_name} SET v = v + 1 WHERE k = {k}")
                    with lock:
                        done[k] += 1
                        if n != 1:
                            failures.append(f"UPDATE of key {k} reported {n} rows")
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            failures.append(repr(e))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT k, v FROM {table_name} ORDER BY k")
        assert cur.fetchall() == [(k, done[k]) for k in range(keys)], "an increment was lost"


def test_concurrent_deletes_and_updates_agree(server, table_name):
    """Rows deleted by one client while another updates them: every row ends deleted, and the
    updates that report a row changed are exactly those that found it still there."""
    rows = 200
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 0 FROM generate_series(0, {rows - 1})")
    updated = []
    errors = []

    def updater():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                for k in range(rows):
                    updated.append(execute_update(cur, f"UPDATE {table_name} SET v = v + 1 WHERE k = {k}"))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def deleter():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                for k in range(rows):
                    assert execute_update(cur, f"DELETE FROM {table_name} WHERE k = {k}") == 1
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=updater), threading.Thread(target=deleter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(updated) <= {0, 1} and len(updated) == rows
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table_name}")
        assert cur.fetchall() == [(0,)]
