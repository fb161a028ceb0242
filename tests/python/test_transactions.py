"""Multi-statement transactions with snapshot isolation, seen through ADBC: SQL BEGIN / COMMIT /
ROLLBACK, Flight SQL transactions (ADBC's autocommit=False), first-writer-wins conflicts."""

import random
import threading
import warnings

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

from nyala_server import execute_update

CONFLICT = "could not serialize access"


def rows(cur, sql):
    cur.execute(sql)
    return cur.fetchall()


def create_kv(server, table, keys, buckets=4):
    """A table (k, v) with keys 1..keys, v = 10 * k."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table} (k BIGINT PRIMARY KEY, v BIGINT) "
                    f"DISTRIBUTE BY HASH (k) INTO {buckets} BUCKETS")
        cur.execute(f"INSERT INTO {table} SELECT value, value * 10 FROM generate_series(1, {keys})")


def test_adbc_commit_and_rollback(server, table_name):
    """Without autocommit a connection's writes are its own until commit(); rollback() discards
    them, bulk ingest included; inside, filters, aggregates and joins read them."""
    create_kv(server, table_name, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        txn = flightsql.connect(server)
    assert not [w for w in caught if "autocommit" in str(w.message)]
    with txn, txn.cursor() as cur, flightsql.connect(server, autocommit=True) as other, \
            other.cursor() as ocur:
        before = rows(ocur, f"SELECT k, v FROM {table_name} ORDER BY k")
        cur.execute(f"INSERT INTO {table_name} VALUES (4, 40)")
        assert execute_update(cur, f"UPDATE {table_name} SET v = v + 1 WHERE k <= 2") == 2
        cur.execute(f"DELETE FROM {table_name} WHERE k = 3")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (4, 40)]
        assert rows(cur, f"SELECT k FROM {table_name} WHERE v > 20 ORDER BY k") == [(2,), (4,)]
        assert rows(cur, f"SELECT sum(v), count(k), max(k) FROM {table_name}") == [(72, 3, 4)]
        assert rows(cur, f"SELECT a.k, b.v FROM {table_name} a JOIN {table_name} b "
                         f"ON b.k = a.k + 1 ORDER BY a.k") == [(1, 21)]
        assert rows(ocur, f"SELECT k, v FROM {table_name} ORDER BY k") == before
        txn.commit()
        assert rows(ocur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (4, 40)]

        cur.execute(f"UPSERT INTO {table_name} VALUES (1, 0), (5, 50)")
        cur.adbc_ingest(table_name, pa.table({"k": [6, 7], "v": [60, 70]}), mode="append")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [
            (1, 0), (2, 21), (4, 40), (5, 50), (6, 60), (7, 70)]
        assert rows(ocur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (4, 40)]
        txn.rollback()
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (4, 40)]
        assert rows(ocur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (4, 40)]


def test_sql_begin_commit_rollback_and_snapshot(server, table_name):
    """BEGIN ... COMMIT / ROLLBACK in SQL on an autocommit connection; after the transaction's
    first read, what other sessions commit stays invisible until it ends."""
    create_kv(server, table_name, 2)
    with flightsql.connect(server, autocommit=True) as a, a.cursor() as cur, \
            flightsql.connect(server, autocommit=True) as b, b.cursor() as bcur:
        cur.execute("START TRANSACTION")
        cur.execute(f"INSERT INTO {table_name} VALUES (3, 30)")
        assert rows(cur, f"SELECT k FROM {table_name} ORDER BY k") == [(1,), (2,), (3,)]
        assert rows(bcur, f"SELECT k FROM {table_name} ORDER BY k") == [(1,), (2,)]
        cur.execute("ROLLBACK")
        assert rows(cur, f"SELECT k FROM {table_name} ORDER BY k") == [(1,), (2,)]

        cur.execute("BEGIN")
        assert rows(cur, f"SELECT sum(v) FROM {table_name}") == [(30,)]
        bcur.execute(f"INSERT INTO {table_name} VALUES (10, 100)")
        bcur.execute(f"UPDATE {table_name} SET v = 11 WHERE k = 1")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 20)]
        cur.execute(f"UPDATE {table_name} SET v = v + 1 WHERE k = 2")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 21)]
        cur.execute("COMMIT")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (10, 100)]
        assert rows(bcur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21), (10, 100)]
        # COMMIT and ROLLBACK with no transaction open do nothing.
        cur.execute("COMMIT")
        cur.execute("ROLLBACK")


def run_transaction(conn, body):
    """Runs body(cursor) in `conn`'s transaction and commits it; runs it again from the start
    after a serialization failure. Returns body's result."""
    while True:
        try:
            with conn.cursor() as cur:
                result = body(cur)
            conn.commit()
            return result
        except flightsql.OperationalError as e:
            if CONFLICT not in str(e):
                raise
            conn.rollback()


def run_clients(count, client):
    """Runs client(seed) in `count` threads; returns the errors they raised."""
    errors = []

    def run(seed):
        try:
            client(seed)
        except Exception as e:  # noqa: BLE001 - reported by the caller's assertion
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_bank_transfers_keep_the_total(server, table_name):
    """Transfers between accounts in concurrent transactions: readers always see the total,
    and the final balances and transfer log are exactly those of the acknowledged commits."""
    accounts, clients, transfers = 10, 8, 25
    log = f"{table_name}_log"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (id BIGINT PRIMARY KEY, balance BIGINT) "
                    "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} SELECT value, 100 FROM generate_series(0, {accounts - 1})")
        cur.execute(f"CREATE TABLE {log} (n BIGINT PRIMARY KEY, src BIGINT, dst BIGINT, amount BIGINT) "
                    "DISTRIBUTE BY HASH (n) INTO 2 BUCKETS")
    committed, totals, audit_errors = [], [], []
    lock = threading.Lock()
    stop = threading.Event()

    def client(seed):
        rng = random.Random(seed)
        with flightsql.connect(server) as conn:
            for i in range(transfers):
                src, dst = rng.sample(range(accounts), 2)
                amount, n = rng.randint(1, 30), seed * 1000 + i

                def transfer(cur):
                    cur.execute(f"SELECT id, balance FROM {table_name} WHERE id IN ({src}, {dst})")
                    balance = dict(cur.fetchall())
                    if balance[src] < amount:
                        return None
                    cur.execute(f"UPDATE {table_name} SET balance = {balance[src] - amount} WHERE id = {src}")
                    cur.execute(f"UPDATE {table_name} SET balance = {balance[dst] + amount} WHERE id = {dst}")
                    cur.execute(f"INSERT INTO {log} VALUES ({n}, {src}, {dst}, {amount})")
                    return (n, src, dst, amount)

                done = run_transaction(conn, transfer)
                if done:
                    with lock:
                        committed.append(done)

    def auditor():
        try:
            with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
                while not stop.is_set():
                    totals.append(rows(cur, f"SELECT sum(balance) FROM {table_name}")[0][0])
                    cur.execute("BEGIN READ ONLY")
                    first = rows(cur, f"SELECT sum(balance), min(balance) FROM {table_name}")
                    again = rows(cur, f"SELECT sum(balance), min(balance) FROM {table_name}")
                    cur.execute("COMMIT")
                    assert first == again, "a snapshot changed within a transaction"
                    totals.append(first[0][0])
        except Exception as e:  # noqa: BLE001
            audit_errors.append(repr(e))

    audit = threading.Thread(target=auditor)
    audit.start()
    try:
        assert run_clients(clients, client) == []
    finally:
        stop.set()
        audit.join()
    assert audit_errors == []
    assert totals and set(totals) == {accounts * 100}
    expected = [100] * accounts
    for _, src, dst, amount in committed:
        expected[src] -= amount
        expected[dst] += amount
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        assert rows(cur, f"SELECT id, balance FROM {table_name} ORDER BY id") == list(enumerate(expected))
        assert rows(cur, f"SELECT n, src, dst, amount FROM {log} ORDER BY n") == sorted(committed)


def test_concurrent_increments_in_transactions_are_not_lost(server, table_name):
    """Increments each in its own transaction, retried on conflict: every committed one counts
    once, none is lost."""
    clients, increments, keys = 8, 20, 5
    create_kv(server, table_name, keys)
    done = [0] * (keys + 1)
    lock = threading.Lock()

    def client(seed):
        rng = random.Random(seed)
        with flightsql.connect(server) as conn:
            for _ in range(increments):
                k = rng.randint(1, keys)
                n = run_transaction(
                    conn, lambda cur: execute_update(cur, f"UPDATE {table_name} SET v = v + 1 WHERE k = {k}"))
                assert n == 1, f"UPDATE of key {k} reported {n} rows"
                with lock:
                    done[k] += 1

    assert run_clients(clients, client) == []
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [
            (k, 10 * k + done[k]) for k in range(1, keys + 1)], "an increment was lost"


def test_write_write_conflict(server, table_name):
    """The second writer of a row fails with a retryable error, its transaction is rolled back
    and refuses statements until ROLLBACK; the first writer commits."""
    create_kv(server, table_name, 2)
    with flightsql.connect(server) as winner, winner.cursor() as wcur, \
            flightsql.connect(server) as loser, loser.cursor() as lcur:
        lcur.execute(f"UPDATE {table_name} SET v = 0 WHERE k = 2")
        wcur.execute(f"UPDATE {table_name} SET v = v + 1 WHERE k = 1")
        with pytest.raises(flightsql.OperationalError, match=CONFLICT) as conflict:
            lcur.execute(f"UPDATE {table_name} SET v = v + 100 WHERE k = 1")
        assert "Aborted" in str(conflict.value)
        with pytest.raises(flightsql.Error, match="ROLLBACK"):
            lcur.execute(f"SELECT k FROM {table_name}")
        loser.rollback()
        winner.commit()
        assert rows(lcur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 20)]

    # A row committed by another after the snapshot cannot be overwritten; COMMIT says so.
    with flightsql.connect(server, autocommit=True) as a, a.cursor() as cur, \
            flightsql.connect(server, autocommit=True) as b, b.cursor() as bcur:
        cur.execute("BEGIN")
        assert rows(cur, f"SELECT v FROM {table_name} WHERE k = 2") == [(20,)]
        bcur.execute(f"UPDATE {table_name} SET v = 21 WHERE k = 2")
        with pytest.raises(flightsql.OperationalError, match=CONFLICT):
            cur.execute(f"UPSERT INTO {table_name} VALUES (2, 0)")
        with pytest.raises(flightsql.Error, match="rolled back"):
            cur.execute("COMMIT")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 11), (2, 21)]


def test_failed_statement_rolls_the_transaction_back(server, table_name):
    """A duplicate key after a successful INSERT rolls back both; COMMIT reports it."""
    create_kv(server, table_name, 2)
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table_name} VALUES (3, 30)")
        with pytest.raises(flightsql.Error, match="duplicate"):
            cur.execute(f"INSERT INTO {table_name} VALUES (4, 40), (1, 0)")
        with pytest.raises(flightsql.Error, match="ROLLBACK"):
            cur.execute(f"INSERT INTO {table_name} VALUES (5, 50)")
        with pytest.raises(flightsql.Error, match="rolled back"):
            cur.execute("COMMIT")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 20)]
    # The same through ADBC's commit() (after which the ADBC driver has no transaction left
    # to run statements in: the table is read through another connection).
    with flightsql.connect(server) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table_name} VALUES (3, 30)")
        with pytest.raises(flightsql.Error, match="duplicate"):
            cur.execute(f"INSERT INTO {table_name} VALUES (2, 0)")
        with pytest.raises(flightsql.Error, match="rolled back"):
            conn.commit()
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 20)]


def test_ddl_read_only_and_unsupported_forms(server, table_name):
    """DDL runs at once and only before the transaction writes; READ ONLY refuses writes;
    other isolation levels, AND CHAIN, CTAS and INSERT IGNORE are refused; savepoints are
    refused outside a transaction and rolled back to only where nothing was written since."""
    create_kv(server, table_name, 2)
    early, late = f"{table_name}_early", f"{table_name}_late"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur, \
            flightsql.connect(server, autocommit=True) as other, other.cursor() as ocur:
        cur.execute("BEGIN")
        with pytest.raises(flightsql.Error, match="already in progress"):
            cur.execute("BEGIN")
        cur.execute(f"CREATE TABLE {early} (k BIGINT PRIMARY KEY)")
        assert rows(ocur, f"SELECT * FROM {early}") == []
        cur.execute(f"INSERT INTO {early} VALUES (1)")
        with pytest.raises(flightsql.Error, match="DDL"):
            cur.execute(f"CREATE TABLE {late} (k BIGINT PRIMARY KEY)")
        with pytest.raises(flightsql.Error, match="DDL"):
            cur.execute(f"DROP TABLE {early}")
        cur.execute("ROLLBACK")
        assert rows(ocur, f"SELECT * FROM {early}") == []
        with pytest.raises(flightsql.Error, match="not found"):
            ocur.execute(f"SELECT * FROM {late}")

        for sql in [f"CREATE TABLE {late} PRIMARY KEY (k) AS SELECT k FROM {table_name}",
                    f"INSERT IGNORE INTO {table_name} VALUES (1, 0)"]:
            cur.execute("BEGIN")
            with pytest.raises(flightsql.Error, match="not supported"):
                cur.execute(sql)
            cur.execute("ROLLBACK")
        with pytest.raises(flightsql.Error, match="not found"):
            ocur.execute(f"SELECT * FROM {late}")

        cur.execute("START TRANSACTION READ ONLY ISOLATION LEVEL REPEATABLE READ")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 20)]
        with pytest.raises(flightsql.Error, match="READ ONLY"):
            cur.execute(f"UPDATE {table_name} SET v = 0")
        cur.execute("ROLLBACK")
        cur.execute("BEGIN ISOLATION LEVEL SNAPSHOT")
        cur.execute("COMMIT")
        for sql in ["BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN ISOLATION LEVEL READ COMMITTED",
                    "COMMIT AND CHAIN", "ROLLBACK AND CHAIN"]:
            with pytest.raises(flightsql.NotSupportedError, match="not supported"):
                cur.execute(sql)
        # Savepoints: only in a transaction, and rolled back to only where nothing was
        # written since (the tablets cannot undo part of a transaction's writes).
        with pytest.raises(flightsql.Error, match="transaction blocks"):
            cur.execute("SAVEPOINT s")
        cur.execute("BEGIN")
        cur.execute("SAVEPOINT s")
        assert rows(cur, f"SELECT count(*) FROM {table_name}") == [(2,)]
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute(f"UPDATE {table_name} SET v = 0 WHERE k = 1")
        with pytest.raises(flightsql.NotSupportedError, match="ROLLBACK the whole transaction"):
            cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute("ROLLBACK")
        assert rows(cur, f"SELECT k, v FROM {table_name} ORDER BY k") == [(1, 10), (2, 20)]


def test_count_star_reads_own_writes(server, table_name):
    """count(*) (a scan reading no column) counts the transaction's own rows too."""
    create_kv(server, table_name, 2)
    with flightsql.connect(server) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table_name} VALUES (3, 30)")
        assert rows(cur, f"SELECT count(*) FROM {table_name}") == [(3,)]
        assert rows(cur, f"SELECT count(*) FROM {table_name} WHERE v > 15") == [(2,)]
        conn.rollback()
