"""changes(table, from, to [, wait_ms]) followed from outside: over the PostgreSQL protocol
(psycopg) while writers insert, update, delete and commit transactions across tablets, through
a kill -9 of the server; and over Flight SQL (ADBC)."""

import random
import tempfile
import threading

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import pytest

from nyala_server import PASSWORD, USER, nyala_serve

KEYS = 60


def connect(pg, **kwargs):
    host, port = pg
    return psycopg.connect(host=host, port=port, user="nyala", dbname="nyala", **kwargs)


def literal(time):
    """A _commit_time (a datetime, UTC) as a TIMESTAMP literal, to the microsecond."""
    return f"TIMESTAMP '{time:%Y-%m-%d %H:%M:%S.%f}'"


def server_now(conn):
    return conn.execute("SELECT CAST(now() AS TIMESTAMP)").fetchone()[0]


def table_rows(conn, table):
    return {k: v for k, v in conn.execute(f"SELECT k, v FROM {table}").fetchall()}


class Consumer:
    """Follows a table's changes from `since`, replaying them into `rows`."""

    def __init__(self, table, since):
        self.table, self.last, self.rows = table, since, {}
        self.received = 0

    def poll(self, conn, wait_ms):
        # `from` as a parameter: psycopg binds it server-side (Parse/Bind/Execute).
        found = conn.execute(
            f"SELECT k, v, _change, _commit_time FROM "
            f"changes('{self.table}', %s, NULL, {wait_ms})", (self.last,)).fetchall()
        times = [row[3] for row in found]
        assert times == sorted(times), times
        for k, v, change, _ in found:
            if change == "delete":
                self.rows.pop(k, None)
            else:
                assert change in ("insert", "update"), change
                self.rows[k] = v
        if found:
            self.last = times[-1]
        self.received += len(found)
        return len(found)

    def follow(self, pg, stop):
        """Long-polls until `stop` is set, then until a poll finds nothing; returns quietly if
        the server goes away."""
        try:
            with connect(pg, autocommit=True) as conn:
                while not stop.is_set():
                    self.poll(conn, 500)
        except psycopg.OperationalError:
            pass


def write(pg, table, seed, count, stop_on_error=False):
    """`count` random statements on keys 0..KEYS: inserts, upserts, updates, deletes, and
    transactions of several across tablets. Returns how many were acknowledged."""
    rng = random.Random(seed)
    done = 0
    try:
        with connect(pg, autocommit=True) as conn:
            for i in range(count):
                k, v = rng.randrange(KEYS), rng.randrange(1000)
                op = rng.randrange(6)
                try:
                    if op == 0:
                        conn.execute(f"INSERT INTO {table} VALUES ({k}, {v})")
                    elif op == 1:
                        conn.execute(f"UPSERT INTO {table} VALUES ({k}, {v})")
                    elif op == 2:
                        conn.execute(f"UPDATE {table} SET v = {v} WHERE k = {k}")
                    elif op == 3:
                        conn.execute(f"DELETE FROM {table} WHERE k = {k}")
                    else:
                        others = rng.sample(range(KEYS), 3)
                        with conn.transaction():
                            conn.execute(f"UPSERT INTO {table} VALUES " +
                                         ", ".join(f"({o}, {v + j})" for j, o in enumerate(others)))
                            conn.execute(f"DELETE FROM {table} WHERE k = {k}")
                    done += 1
                except psycopg.errors.UniqueViolation:
                    done += 1  # a refused INSERT changes nothing
                except psycopg.errors.SerializationFailure:
                    pass  # rolled back
    except psycopg.OperationalError:
        if not stop_on_error:
            raise
    return done


def test_a_consumer_replays_every_change_exactly_once_across_a_kill(table_name):
    table = table_name
    with tempfile.TemporaryDirectory() as data:
        with nyala_serve(data_dir=data, postgres=True) as (_, _, pg):
            with connect(pg, autocommit=True) as conn:
                conn.execute(f"CREATE TABLE {table} (k BIGINT PRIMARY KEY, v BIGINT) "
                             "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
                consumer = Consumer(table, server_now(conn))
            stop = threading.Event()
            follower = threading.Thread(target=consumer.follow, args=(pg, stop))
            follower.start()
            writers = [threading.Thread(target=write, args=(pg, table, s, 150)) for s in (1, 2)]
            for w in writers:
                w.start()
            for w in writers:
                w.join()
            stop.set()
            follower.join()
            # More writes the consumer has not read yet when the server is killed (SIGKILL
            # as the context ends).
            write(pg, table, 3, 60)
        with nyala_serve(data_dir=data, postgres=True) as (_, _, pg):
            write(pg, table, 4, 60)
            with connect(pg, autocommit=True) as conn:
                while consumer.poll(conn, 0):
                    pass
                assert consumer.rows == table_rows(conn, table)
                assert consumer.received > 0
                # Nothing more, and a long poll wakes for the next commit.
                assert consumer.poll(conn, 0) == 0
                waiter = threading.Thread(target=consumer.poll, args=(conn, 60000))
                waiter.start()
                with connect(pg, autocommit=True) as writer:
                    writer.execute(f"UPSERT INTO {table} VALUES (1000, 1)")
                waiter.join()
                assert consumer.rows.get(1000) == 1


@pytest.fixture(scope="module")
def auth():
    with nyala_serve("--user", USER, "--password", PASSWORD) as (grpc, _):
        yield grpc


def test_changes_over_flight_sql_need_select_and_a_recent_time(auth, table_name):
    def connect_as(user, password):
        return flightsql.connect(auth, db_kwargs={"username": user, "password": password},
                                 autocommit=True)

    with connect_as(USER, PASSWORD) as conn, conn.cursor() as cur:
        cur.execute("SELECT CAST(now() AS TIMESTAMP)")
        since = cur.fetchone()[0]
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v STRING)")
        cur.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
        cur.execute(f"UPDATE {table_name} SET v = 'c' WHERE k = 2")
        cur.execute(f"SELECT k, v, _change FROM changes('{table_name}', {literal(since)}, NULL)"
                    " ORDER BY k")
        assert cur.fetchall() == [(1, "a", "insert"), (2, "c", "insert")]
        with pytest.raises(Exception, match="history retention"):
            cur.execute(f"SELECT * FROM changes('{table_name}', "
                        "TIMESTAMP '2001-01-01 00:00:00', NULL)")
            cur.fetchall()
        cur.execute("CREATE USER bob WITH PASSWORD 'bob-secret'")
    with connect_as("bob", "bob-secret") as conn, conn.cursor() as cur:
        with pytest.raises(Exception, match="(?i)privilege|permission|denied"):
            cur.execute(f"SELECT * FROM changes('{table_name}', now(), NULL)")
            cur.fetchall()
