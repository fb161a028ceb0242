"""Atomicity seen through ADBC: concurrent read-modify-write statements lose no update."""

import random
import threading

import adbc_driver_flightsql.dbapi as flightsql
import pytest

from nyala_server import execute_update


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


def test_failed_statements_change_nothing(server, table_name):
    """A statement that fails for any of its rows changes no row, in any number of tablets."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v VARCHAR(3)) "
                    "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 'a' FROM generate_series(1, 20)")

        def contents():
            cur.execute(f"SELECT k, v FROM {table_name} ORDER BY k")
            return cur.fetchall()

        before = contents()
        failing = [
            # A new key in one tablet, an existing key in another.
            (f"INSERT INTO {table_name} VALUES (100, 'x'), (101, 'y'), (102, 'z'), (5, 'dup')",
             "duplicate"),
            # Thousands of rows, one key repeated far apart.
            (f"INSERT INTO {table_name} SELECT value, 'z' FROM generate_series(1000, 30999) "
             f"UNION ALL SELECT 1003, 'z'", "duplicate"),
            # One value too long for VARCHAR(3).
            (f"INSERT INTO {table_name} VALUES (200, 'ok'), (201, 'too long'), (202, 'ok')",
             "too long"),
            # A NULL key among good rows (refused while planning).
            (f"INSERT INTO {table_name} VALUES (300, 'a'), (NULL, 'b')", "null"),
            # A NULL key computed from the rows (refused while writing).
            (f"INSERT INTO {table_name} SELECT CASE WHEN value < 50 THEN value END, 'n' "
             "FROM generate_series(40, 60)", "null"),
            # An UPDATE of every tablet that fails for some rows.
            (f"UPDATE {table_name} SET v = CASE WHEN k > 15 THEN 'too long' ELSE 'b' END", "too long"),
        ]
        for sql, error in failing:
            with pytest.raises(Exception) as failure:
                cur.execute(sql)
            assert error in str(failure.value).lower(), sql
            assert contents() == before, f"{sql} left rows behind"


def test_rows_outside_every_range_leave_nothing(server, table_name):
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY) DISTRIBUTE BY "
                    "RANGE (k) (PARTITION VALUES < 100, PARTITION 100 <= VALUES < 200)")
        with pytest.raises(Exception):
            cur.execute(f"INSERT INTO {table_name} VALUES (1), (150), (500)")
        cur.execute(f"SELECT count(*) FROM {table_name}")
        assert cur.fetchall() == [(0,)]


def test_a_statement_over_several_tablets_commits_at_one_timestamp(server, table_name):
    """Readers running while multi-tablet UPDATEs commit never see half of one: every
    snapshot sees all rows with the same value."""
    rows = 64
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 8 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 0 FROM generate_series(1, {rows})")
    stop = threading.Event()
    seen = []
    errors = []

    def reader():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute(f"SELECT count(DISTINCT v), count(*) FROM {table_name}")
                    seen.append(cur.fetchall()[0])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
            for i in range(1, 30):
                assert execute_update(cur, f"UPDATE {table_name} SET v = {i}") == rows
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert seen and all(s == (1, rows) for s in seen), [s for s in seen if s != (1, rows)][:5]


def test_concurrent_statements_over_all_tablets_all_count(server, table_name):
    """Clients that each increment every row (one statement over all tablets) while others
    upsert single rows: every increment counts once, no statement fails or waits for long."""
    rows, clients, rounds = 32, 4, 8
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v BIGINT, w BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 8 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 0 AS v, 0 AS w FROM generate_series(1, {rows})")
    errors = []

    def incrementer():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                for _ in range(rounds):
                    assert execute_update(cur, f"UPDATE {table_name} SET v = v + 1") == rows
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def upserter():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                for i in range(rounds * 4):
                    k = i % rows + 1
                    execute_update(cur, f"UPDATE {table_name} SET w = w + 1 WHERE k = {k}")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=incrementer) for _ in range(clients)]
    threads.append(threading.Thread(target=upserter))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT min(v), max(v), sum(w) FROM {table_name}")
        assert cur.fetchall() == [(clients * rounds, clients * rounds, rounds * 4)]

