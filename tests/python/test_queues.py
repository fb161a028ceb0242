"""Queue tables seen through ADBC: a BIGINT key column GENERATED ALWAYS AS POSITION that the
database assigns in commit order, and tail(table, after_position, wait_ms) long polls."""

import random
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

from nyala_server import nyala_serve

POSITION = "GENERATED ALWAYS AS POSITION"


def create_queue(cur, table, buckets=8):
    cur.execute(f"CREATE TABLE {table} (user_id STRING, pos BIGINT {POSITION}, body STRING, "
                f"PRIMARY KEY (user_id, pos)) DISTRIBUTE BY HASH (user_id) INTO {buckets} BUCKETS")


def rows(cur, sql):
    cur.execute(sql)
    return cur.fetchall()


def tail(cur, table, queue, after, wait_ms, limit=None):
    """The (pos, body) rows of `queue` after position `after`, as tail() returns them."""
    sql = f"SELECT pos, body FROM tail('{table}', {after}, {wait_ms}) WHERE user_id = '{queue}'"
    return rows(cur, sql + (f" LIMIT {limit}" if limit else ""))


def queue_rows(cur, table, queue):
    return rows(cur, f"SELECT pos, body FROM {table} WHERE user_id = '{queue}' ORDER BY pos")


def run_threads(targets, stop):
    """Runs each function in a thread; returns the errors they raised. The first error sets
    `stop`, so that the others need not wait for rows that will never come."""
    errors = []

    def run(target):
        try:
            target()
        except Exception as e:  # noqa: BLE001 - reported by the caller's assertion
            errors.append(repr(e))
            stop.set()

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_producers_and_consumers(server, table_name):
    """Three producers insert into three queues (literal multi-row INSERTs, executemany, a
    prepared multi-row INSERT) while two consumers per queue long-poll tail() from the last
    position they saw: each consumer gets every message of its queue exactly once, positions
    only ever increase, and each producer's messages arrive in the order it sent them."""
    queues, producers, per_producer = ["qa", "qb", "qc"], 3, 200
    plans, expected = [], {q: [] for q in queues}
    for p in range(producers):
        rng = random.Random(p)
        messages = [(rng.choice(queues), f"p{p}-{seq}") for seq in range(per_producer)]
        batches, i = [], 0
        while i < len(messages):
            n = rng.randint(1, 6)
            batches.append(messages[i:i + n])
            i += n
        plans.append(batches)
        for queue, body in messages:
            expected[queue].append(body)
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name)
    stop = threading.Event()
    seen = {q: [] for q in queues}

    def producer(p):
        with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
            for batch in plans[p]:
                if stop.is_set():
                    return
                if p == 0:
                    values = ", ".join(f"('{q}', '{body}')" for q, body in batch)
                    cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES {values}")
                elif p == 1:
                    cur.executemany(f"INSERT INTO {table_name} (user_id, body) VALUES (?, ?)", batch)
                else:
                    marks = ", ".join(["(?, ?)"] * len(batch))
                    cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES {marks}",
                                [v for message in batch for v in message])

    def consumer(queue):
        got, last = [], 0
        deadline = time.monotonic() + 300
        with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
            while len(got) < len(expected[queue]) and not stop.is_set():
                assert time.monotonic() < deadline, f"{queue}: {len(got)} messages after 300 s"
                batch = tail(cur, table_name, queue, last, 2000, limit=50)
                assert len(batch) <= 50
                for pos, body in batch:
                    assert pos > last, f"{queue}: position {pos} after {last}"
                    last = pos
                    got.append((pos, body))
            assert tail(cur, table_name, queue, last, 0) == [], f"{queue}: more than was sent"
        seen[queue].append(got)

    errors = run_threads([lambda p=p: producer(p) for p in range(producers)]
                         + [lambda q=q: consumer(q) for q in queues for _ in range(2)], stop)
    assert errors == []
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        for queue in queues:
            stored = queue_rows(cur, table_name, queue)
            assert sorted(body for _, body in stored) == sorted(expected[queue])
            for got in seen[queue]:
                assert got == stored, f"{queue}: a consumer saw other rows than are stored"
            for p in range(producers):
                seqs = [int(b.split("-")[1]) for _, b in stored if b.startswith(f"p{p}-")]
                assert seqs == sorted(seqs), f"{queue}: producer {p}'s messages out of order"


def test_a_long_poll_wakes_on_commit(server, table_name):
    """tail() on an empty queue waits; a commit to another queue of the table does not end the
    wait, the next commit to its own queue does, and it returns that row long before the
    60 s it may wait."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name, buckets=1)
        assert tail(cur, table_name, "u1", 0, 300) == []
    result, stop = [], threading.Event()

    def consumer():
        with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
            start = time.monotonic()
            result.append(tail(cur, table_name, "u1", 0, 60000))
            result.append(time.monotonic() - start)

    def producer():
        with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
            time.sleep(0.3)
            cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u2', 'not yours')")
            time.sleep(0.3)
            cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'hello')")

    assert run_threads([consumer, producer], stop) == []
    got, elapsed = result
    assert [body for _, body in got] == ["hello"]
    assert elapsed < 30, f"the waiting tail() returned after {elapsed:.1f} s"


def test_a_transactions_rows_take_positions_when_it_commits(server, table_name):
    """A transaction's inserts take positions at COMMIT, after rows others committed meanwhile,
    so a consumer already past those still gets them; rolled-back rows never appear."""
    with flightsql.connect(server, autocommit=True) as a, a.cursor() as cur, \
            flightsql.connect(server, autocommit=True) as b, b.cursor() as bcur:
        create_queue(cur, table_name)
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('q', 'txn-1'), ('q', 'txn-2')")
        bcur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('q', 'auto')")
        [(first, body)] = tail(bcur, table_name, "q", 0, 0)
        assert body == "auto"
        cur.execute("COMMIT")
        got = tail(bcur, table_name, "q", first, 0)
        assert [body for _, body in got] == ["txn-1", "txn-2"]
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('q', 'gone')")
        cur.execute("ROLLBACK")
        assert tail(bcur, table_name, "q", got[-1][0], 200) == []
        assert [body for _, body in queue_rows(bcur, table_name, "q")] == ["auto", "txn-1", "txn-2"]


def test_positions_keep_increasing_after_kill_9(tmp_path):
    """Rows acknowledged before the server is killed with SIGKILL are all there after a restart
    on the same data, and rows inserted then take higher positions in every queue, so a
    consumer goes on from its last position and gets exactly the new rows."""
    data_dir = str(tmp_path / "data")
    queues = ["u1", "u2", "u3"]
    everything = "SELECT user_id, pos, body FROM inbox ORDER BY user_id, pos"
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            create_queue(cur, "inbox", buckets=4)
            for i in range(5):
                values = ", ".join(f"('{q}', 'before-{i}')" for q in queues[: i % 3 + 1])
                cur.execute(f"INSERT INTO inbox (user_id, body) VALUES {values}")
            before = rows(cur, everything)
    # Leaving nyala_serve killed the process with SIGKILL (Popen.kill), no clean shutdown.
    for restart in range(2):
        with nyala_serve(data_dir=data_dir) as (url, _):
            with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
                assert rows(cur, everything) == before
                last = {q: max(p for u, p, _ in before if u == q) for q in queues}
                for i in range(3):
                    values = ", ".join(f"('{q}', 'after{restart}-{i}')" for q in queues)
                    cur.execute(f"INSERT INTO inbox (user_id, body) VALUES {values}")
                for q in queues:
                    new = tail(cur, "inbox", q, last[q], 0)
                    assert [body for _, body in new] == [f"after{restart}-{i}" for i in range(3)]
                before = rows(cur, everything)


def test_errors_change_nothing(server, table_name):
    """Giving the position in INSERT or bulk ingest, UPSERT, and bad queue definitions or tail()
    arguments are refused with a message that says why, and change nothing."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name)
        cur.execute(f"CREATE TABLE {table_name}_plain (k BIGINT PRIMARY KEY)")
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'a'), ('u2', 'b')")
        everything = f"SELECT user_id, pos, body FROM {table_name} ORDER BY user_id, pos"
        before = rows(cur, everything)
        refused = [
            (f"INSERT INTO {table_name} VALUES ('u1', 5, 'x')", POSITION),
            (f"INSERT INTO {table_name} (user_id, pos, body) VALUES ('u3', NULL, 'y'), "
             f"('u1', 5, 'x')", POSITION),
            (f"INSERT INTO {table_name} (user_id, pos, body) SELECT 'u' || CAST(value AS STRING), "
             f"value, 'z' FROM generate_series(1, 20)", POSITION),
            (f"UPSERT INTO {table_name} (user_id, body) VALUES ('u1', 'x')", "UPSERT"),
            (f"UPDATE {table_name} SET pos = 1 WHERE user_id = 'u1'", "primary key"),
            (f"SELECT * FROM tail('{table_name}_plain', 0, 0)", POSITION),
            (f"SELECT * FROM tail('{table_name}', 0, -1)", "wait_ms"),
            (f"SELECT * FROM tail('{table_name}', 0, 600001)", "wait_ms"),
        ]
        for sql, message in refused:
            with pytest.raises(flightsql.Error, match=message):
                cur.execute(sql)
            assert rows(cur, everything) == before, f"{sql} changed the queue"
        with pytest.raises(flightsql.Error, match=POSITION):
            cur.adbc_ingest(table_name, pa.table({"user_id": ["u1"], "pos": pa.array([7], pa.int64()),
                                                  "body": ["x"]}), mode="append")
        assert rows(cur, everything) == before

        bad = f"{table_name}_bad"
        definitions = [
            (f"CREATE TABLE {bad} (k STRING, p BIGINT {POSITION}, PRIMARY KEY (k, p)) "
             "DISTRIBUTE BY HASH (p) INTO 2 BUCKETS", "cannot partition"),
            (f"CREATE TABLE {bad} (k STRING, p INT {POSITION}, PRIMARY KEY (k, p))", "BIGINT"),
            (f"CREATE TABLE {bad} (k STRING, p STRING {POSITION}, PRIMARY KEY (k, p))", "BIGINT"),
            (f"CREATE TABLE {bad} (k STRING, p BIGINT {POSITION}, PRIMARY KEY (k))", "primary key"),
            (f"CREATE TABLE {bad} (k STRING, p BIGINT {POSITION}, q BIGINT {POSITION}, "
             "PRIMARY KEY (k, p, q))", "at most one"),
        ]
        for sql, message in definitions:
            with pytest.raises(flightsql.Error, match=message):
                cur.execute(sql)
            with pytest.raises(flightsql.Error, match="does not exist|not found"):
                cur.execute(f"SELECT * FROM {bad}")


def test_update_and_delete_a_queued_message(server, table_name):
    """A queued message is edited or removed by its key (queue and position): tail() then
    returns the edited body at the same position (LIMIT keeps the lowest), not the deleted
    one, and a consumer past an edited message does not get it again."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name)
        for body in ["one", "two", "three"]:
            cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', '{body}')")
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u2', 'other')")
        (p1, _), (p2, _), (p3, _) = tail(cur, table_name, "u1", 0, 0)
        cur.execute(f"UPDATE {table_name} SET body = 'two, edited' WHERE user_id = 'u1' AND pos = {p2}")
        cur.execute(f"DELETE FROM {table_name} WHERE user_id = 'u1' AND pos = {p1}")
        assert tail(cur, table_name, "u1", 0, 0) == [(p2, "two, edited"), (p3, "three")]
        assert tail(cur, table_name, "u1", 0, 0, limit=1) == [(p2, "two, edited")]
        assert tail(cur, table_name, "u1", p2, 0) == [(p3, "three")]
        assert tail(cur, table_name, "u1", p3, 200) == []
        assert [body for _, body in tail(cur, table_name, "u2", 0, 0)] == ["other"]
        # An edit does not move the message: new messages still come after it.
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'four')")
        [(p4, body)] = tail(cur, table_name, "u1", p3, 0)
        assert body == "four" and p4 > p3


def test_bulk_ingest_assigns_positions(server, table_name):
    """adbc_ingest of messages without the position column appends them to their queues with
    positions assigned, in the order of the ingested rows, after the queue's earlier rows."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name)
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'first'), ('u2', 'first')")
        users = [f"u{i % 3 + 1}" for i in range(30)]
        bodies = [f"m{i}" for i in range(30)]
        cur.adbc_ingest(table_name, pa.table({"user_id": users, "body": bodies}), mode="append")
        cur.adbc_ingest(table_name, pa.table({"user_id": ["u1"], "body": ["last"]}), mode="append")
        for queue in ["u1", "u2", "u3"]:
            got = tail(cur, table_name, queue, 0, 0)
            positions = [pos for pos, _ in got]
            assert positions == sorted(set(positions)), f"{queue}: positions not increasing"
            want = (["first"] if queue != "u3" else []) \
                + [b for u, b in zip(users, bodies) if u == queue] + (["last"] if queue == "u1" else [])
            assert [body for _, body in got] == want
            assert got == queue_rows(cur, table_name, queue)


@pytest.mark.parametrize("poll", [
    "SELECT pos, body FROM tail('{table}', ?, 30000) WHERE user_id = ?",
    "SELECT pos, body FROM tail('{table}', 0, 30000) WHERE pos > ? AND user_id = ?",
])
def test_a_prepared_consumer_passes_its_position_as_a_parameter(server, table_name, poll):
    """A prepared consumer gives its position as tail()'s argument or in WHERE (`pos > ?`):
    either way the long poll waits for rows after it and wakes on the commit."""
    poll = poll.format(table=table_name)
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_queue(cur, table_name, buckets=2)
        cur.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'a'), ('u1', 'b')")
        cur.execute(poll, (0, "u1"))
        seen = cur.fetchall()
        assert [b for _, b in seen] == ["a", "b"]
        cur.execute(poll, (seen[0][0], "u1"))
        assert cur.fetchall() == seen[1:]

        def produce():
            time.sleep(0.3)
            with flightsql.connect(server, autocommit=True) as other, other.cursor() as oc:
                oc.execute(f"INSERT INTO {table_name} (user_id, body) VALUES ('u1', 'c')")

        producer = threading.Thread(target=produce)
        started = time.monotonic()
        producer.start()
        cur.execute(poll, (seen[-1][0], "u1"))
        woken = cur.fetchall()
        producer.join()
        assert [b for _, b in woken] == ["c"] and woken[0][0] > seen[-1][0]
        # A liveness bound: the wait was woken by the commit, not timed out.
        assert time.monotonic() - started < 20
