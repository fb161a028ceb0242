"""Table clones seen through ADBC: `CREATE TABLE c CLONE src [AS OF <time>]` makes a table with
the source's schema, partitioning and rows (as of now, or as of a time within the history),
sharing the source's immutable files through hard links, so a clone takes next to no disk.
Writes to either table never show in the other; dropping the source keeps the clone; clones
survive a kill -9 and a restart; mistakes are clear errors that create nothing; cloning needs
SELECT on the source, and the user who clones owns the clone."""

import os
import time

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

from nyala_server import PASSWORD, USER, nyala_serve

PERMISSION_DENIED = "PermissionDenied"  # how ADBC's Go driver names the gRPC code


def rows(cur, sql):
    cur.execute(sql)
    return cur.fetchall()


def contents(cur, table, as_of=None):
    """Every row of `table` (as of `as_of` nanoseconds, with SELECT ... AS OF), by key."""
    at = f" AS OF to_timestamp_nanos({as_of})" if as_of is not None else ""
    return rows(cur, f"SELECT k, v, note FROM {table}{at} ORDER BY k")


def now_ns(cur):
    """The server's time in nanoseconds (UTC)."""
    return rows(cur, "SELECT CAST(now() AS BIGINT)")[0][0]


def tables(cur):
    return sorted(name for (name,) in rows(cur, "SHOW TABLES"))


def create_kv(cur, table, keys, buckets=4):
    """A table (k, v, note) with keys 1..keys, hash-partitioned on k."""
    cur.execute(f"CREATE TABLE {table} (k BIGINT PRIMARY KEY, v BIGINT, note STRING) "
                f"DISTRIBUTE BY HASH (k) INTO {buckets} BUCKETS")
    cur.execute(f"INSERT INTO {table} SELECT value, value * 10, 'row ' || value "
                f"FROM generate_series(1, {keys})")


def change(cur, table, tag):
    """An INSERT, an UPDATE and a DELETE, each of several rows, all marked with `tag`."""
    cur.execute(f"INSERT INTO {table} SELECT value, -value, '{tag} new' "
                f"FROM generate_series(10001, 10020)")
    cur.execute(f"UPDATE {table} SET v = v + 1, note = '{tag} updated' WHERE k % 7 = 0")
    cur.execute(f"DELETE FROM {table} WHERE k % 11 = 0")


def disk_bytes(paths):
    """The disk space the files under `paths` take, each file (inode) counted once however
    many names it has."""
    seen, total = set(), 0
    for path in paths:
        for directory, _, names in os.walk(path):
            for name in names:
                try:
                    st = os.lstat(os.path.join(directory, name))
                except FileNotFoundError:  # a file a flush or compaction just replaced
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def tablet_dirs(cur, data_dir, table):
    """The data directories (<tablets>/<tablet id>/data) of `table`'s tablets."""
    ids = {i for (i,) in rows(cur, f"SELECT tablet_id FROM sys.partitions "
                                  f"WHERE table_name = '{table}'")}
    found = [os.path.join(d, i, "data") for d, subdirs, _ in os.walk(data_dir)
             if os.path.basename(d) == "tablets" for i in subdirs if i in ids]
    assert len(found) == len(ids) > 0, (table, ids, found)
    return found


def rowset_files(dirs):
    """{(st_dev, st_ino): st_nlink} of the rowset-* files in `dirs`."""
    files = {}
    for d in dirs:
        for name in os.listdir(d):
            if name.startswith("rowset-"):
                st = os.stat(os.path.join(d, name))
                files[(st.st_dev, st.st_ino)] = st.st_nlink
    return files


def test_a_clone_and_its_source_are_independent(server, table_name):
    """A clone of a hash-partitioned table has its schema, partitioning and rows; INSERT,
    UPDATE and DELETE on the clone leave the source as it was, and the same on the source
    leave the clone as it was, also once both have been flushed (by cloning each again)."""
    clone = f"{table_name}_clone"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_kv(cur, table_name, 300)
        original = contents(cur, table_name)
        assert len(original) == 300
        cur.execute(f"CREATE TABLE {clone} CLONE {table_name}")
        assert contents(cur, clone) == original
        shown = rows(cur, f"SHOW CREATE TABLE {clone}")[0][1]
        assert shown == rows(cur, f"SHOW CREATE TABLE {table_name}")[0][1].replace(
            f"TABLE {table_name} (", f"TABLE {clone} (")
        assert "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS" in shown
        assert rows(cur, f"SELECT tablet, hash_buckets FROM sys.partitions "
                         f"WHERE table_name = '{clone}' ORDER BY tablet") == rows(
            cur, f"SELECT tablet, hash_buckets FROM sys.partitions "
                 f"WHERE table_name = '{table_name}' ORDER BY tablet")

        change(cur, clone, "clone")
        clone_rows = contents(cur, clone)
        assert clone_rows != original and len(clone_rows) == 300 + 20 - 27 - 1
        assert contents(cur, table_name) == original

        change(cur, table_name, "source")
        source_rows = contents(cur, table_name)
        assert source_rows != original and source_rows != clone_rows
        assert contents(cur, clone) == clone_rows

        # Cloning flushes: each side's changes go to files of its own.
        cur.execute(f"CREATE TABLE {clone}_2 CLONE {clone}")
        cur.execute(f"CREATE TABLE {table_name}_2 CLONE {table_name}")
        assert contents(cur, clone) == contents(cur, f"{clone}_2") == clone_rows
        assert contents(cur, table_name) == contents(cur, f"{table_name}_2") == source_rows
        cur.execute(f"UPDATE {table_name} SET note = 'after flush' WHERE k <= 50")
        cur.execute(f"DELETE FROM {clone} WHERE k > 200")
        assert contents(cur, clone) == [r for r in clone_rows if r[0] <= 200]
        assert contents(cur, f"{clone}_2") == clone_rows
        assert contents(cur, table_name) == [
            (k, v, "after flush" if k <= 50 else note) for k, v, note in source_rows]
        assert contents(cur, f"{table_name}_2") == source_rows


def test_as_of_clones_the_rows_of_that_time(server, table_name):
    """`CLONE t AS OF to_timestamp_nanos(ns)` holds exactly what `SELECT ... FROM t AS OF` reads
    at that time: rows flushed before it, updates and deletes after it (in memory and flushed),
    rows inserted after it, a key deleted and inserted again; and the clone takes writes of its
    own."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_kv(cur, table_name, 200)
        cur.execute(f"UPDATE {table_name} SET note = 'before' WHERE k <= 20")
        cur.execute(f"CREATE TABLE {table_name}_flush1 CLONE {table_name}")  # flushes the source
        cur.execute(f"INSERT INTO {table_name} VALUES (500, 5000, 'in memory at the time')")
        time.sleep(0.01)
        then = now_ns(cur)
        before = contents(cur, table_name)
        time.sleep(0.01)
        change(cur, table_name, "after")
        cur.execute(f"DELETE FROM {table_name} WHERE k = 500")
        cur.execute(f"INSERT INTO {table_name} VALUES (500, 5001, 'inserted again')")
        cur.execute(f"CREATE TABLE {table_name}_flush2 CLONE {table_name}")  # flushes again
        cur.execute(f"UPDATE {table_name} SET v = 0 WHERE k <= 30")
        after = contents(cur, table_name)
        assert after != before

        # The time-travel query this is checked against reads the rows of that time.
        assert contents(cur, table_name, as_of=then) == before

        clone = f"{table_name}_then"
        cur.execute(f"CREATE TABLE {clone} CLONE {table_name} AS OF to_timestamp_nanos({then})")
        assert contents(cur, clone) == before
        assert contents(cur, table_name) == after
        cur.execute(f"UPDATE {clone} SET note = 'clone' WHERE k = 500")
        cur.execute(f"INSERT INTO {clone} VALUES (10001, 1, 'clone new')")
        assert rows(cur, f"SELECT v, note FROM {clone} WHERE k IN (500, 10001) ORDER BY k") == [
            (5000, "clone"), (1, "clone new")]
        assert contents(cur, table_name) == after

        # A relative time within the history works too.
        cur.execute(f"CREATE TABLE {table_name}_recent CLONE {table_name} "
                    "AS OF now() - INTERVAL '1 millisecond'")
        assert contents(cur, f"{table_name}_recent") == after


def test_a_clone_outlives_its_source_a_kill_9_and_restarts(tmp_path):
    """A clone keeps its rows when its source is dropped, and keeps them, with the writes made
    to it since, over a SIGKILL of the server and restarts on the same data directory; so does
    an AS OF clone."""
    data_dir = str(tmp_path / "data")
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            create_kv(cur, "src", 300)
            then = now_ns(cur)
            time.sleep(0.01)
            cur.execute("UPDATE src SET note = 'later' WHERE k <= 100")
            cur.execute("CREATE TABLE copy CLONE src")
            cur.execute(f"CREATE TABLE old_copy CLONE src AS OF to_timestamp_nanos({then})")
            copy, old_copy = contents(cur, "src"), contents(cur, "src", as_of=then)
            cur.execute("DROP TABLE src")
            assert tables(cur) == ["copy", "old_copy"]
            assert contents(cur, "copy") == copy
            assert contents(cur, "old_copy") == old_copy
            # Written after the clone, not flushed: only in the clone's log when killed.
            change(cur, "copy", "copy")
            cur.execute("INSERT INTO old_copy VALUES (9999, 1, 'old copy new')")
            copy, old_copy = contents(cur, "copy"), contents(cur, "old_copy")
    # Leaving nyala_serve killed the process with SIGKILL (Popen.kill): no clean shutdown.
    for restart in range(2):
        with nyala_serve(data_dir=data_dir) as (url, _):
            with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
                assert tables(cur) == ["copy", *[f"copy_{r}" for r in range(restart)], "old_copy"]
                assert contents(cur, "copy") == copy
                assert contents(cur, "old_copy") == old_copy
                cur.execute(f"UPDATE copy SET v = {restart} WHERE k <= 10")
                cur.execute(f"CREATE TABLE copy_{restart} CLONE copy")  # flushes copy
                copy = contents(cur, "copy")
                assert contents(cur, f"copy_{restart}") == copy
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            assert tables(cur) == ["copy", "copy_0", "copy_1", "old_copy"]
            assert contents(cur, "copy") == contents(cur, "copy_1") == copy
            cur.execute("DROP TABLE copy_0")
    # A dropped clone leaves nothing behind, also after a kill -9 and a restart (its source's
    # log does not make it again).
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            assert tables(cur) == ["copy", "copy_1", "old_copy"]
    staged = [d for _, dirs, _ in os.walk(data_dir) for d in dirs if d.startswith(".clone-")]
    assert staged == []


def test_a_clone_shares_the_source_files(tmp_path):
    """Cloning a 200 000-row table grows the data directory (each file counted once) by at most
    5 % of the table's bytes: the clone's rowset files are hard links to the source's. (The
    first clone also flushes the source, so the second clone's growth is what is measured.)"""
    data_dir = str(tmp_path / "data")
    n, batch = 200_000, 50_000
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE orders (k BIGINT PRIMARY KEY, customer STRING, "
                        "amount DOUBLE, status STRING, note STRING) "
                        "DISTRIBUTE BY HASH (k) INTO 4 BUCKETS")
            for start in range(0, n, batch):
                ids = range(start, start + batch)
                cur.adbc_ingest("orders", pa.table({
                    "k": pa.array(ids, pa.int64()),
                    "customer": [f"customer {i % 5000}" for i in ids],
                    "amount": pa.array([i * 0.25 for i in ids], pa.float64()),
                    "status": [("open", "shipped", "delivered")[i % 3] for i in ids],
                    "note": [f"note {i * 7919 % 1000003} of order {i}" for i in ids],
                }), mode="append")
            cur.execute("CREATE TABLE first_clone CLONE orders")
            source_dirs = tablet_dirs(cur, data_dir, "orders")
            table_bytes = disk_bytes(source_dirs)
            before = disk_bytes([data_dir])
            cur.execute("CREATE TABLE second_clone CLONE orders")
            growth = disk_bytes([data_dir]) - before
            assert growth <= 0.05 * table_bytes, (growth, table_bytes)
            assert table_bytes > 1_000_000, table_bytes

            source = rowset_files(source_dirs)
            for clone in ("first_clone", "second_clone"):
                linked = rowset_files(tablet_dirs(cur, data_dir, clone))
                assert linked and set(linked) <= set(source), clone
                assert all(links >= 3 for links in linked.values()), linked
            expected = rows(cur, "SELECT count(*), sum(amount), count(DISTINCT note) FROM orders")
            assert expected[0][0] == n
            assert rows(cur, "SELECT count(*), sum(amount), count(DISTINCT note) "
                             "FROM second_clone") == expected


def test_mistakes_are_errors_that_create_nothing(server, table_name):
    """Cloning a missing table, onto a taken name, AS OF a time in the future or older than
    the history kept, or AS OF something not a time: each a clear error, and no table more.
    IF NOT EXISTS onto a taken name leaves that table as it was."""
    taken = f"{table_name}_taken"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        create_kv(cur, table_name, 10)
        create_kv(cur, taken, 3)
        before, partitions = tables(cur), rows(cur, "SELECT count(*) FROM sys.partitions")
        new = f"{table_name}_new"
        for sql, needles in [
            (f"CREATE TABLE {new} CLONE {table_name}_missing",
             [f"table '{table_name}_missing' does not exist"]),
            (f"CREATE TABLE {taken} CLONE {table_name}", [f"table '{taken}' already exists"]),
            (f"CREATE TABLE {new} CLONE {table_name} AS OF now() + INTERVAL '1 hour'",
             ["AS OF", "is in the future"]),
            (f"CREATE TABLE {new} CLONE {table_name} AS OF now() - INTERVAL '1 hour'",
             ["older than the history retention allows"]),
            (f"CREATE TABLE {new} CLONE {table_name} AS OF 'yesterday-ish'", ["yesterday-ish"]),
        ]:
            with pytest.raises(flightsql.Error) as failure:
                cur.execute(sql)
            for needle in needles:
                assert needle in str(failure.value), (sql, str(failure.value))
            assert tables(cur) == before, sql
            assert rows(cur, "SELECT count(*) FROM sys.partitions") == partitions, sql
        cur.execute(f"CREATE TABLE IF NOT EXISTS {taken} CLONE {table_name}")
        assert contents(cur, taken) == [(k, k * 10, f"row {k}") for k in (1, 2, 3)]
        assert tables(cur) == before


def test_cloning_needs_select_on_the_source(auth_server, table_name):
    """A user without SELECT on a table cannot clone it (INSERT is not enough) and nothing is
    created; with SELECT it can, and owns the clone: may write to it and drop it."""
    def connect(user, password):
        return flightsql.connect(auth_server, autocommit=True,
                                 db_kwargs={"username": user, "password": password})

    name, password = f"{table_name}_user", "Cloner-Pass-1"
    clone = f"{table_name}_mine"
    with connect(USER, PASSWORD) as admin, admin.cursor() as cur:
        create_kv(cur, table_name, 5)
        cur.execute(f"CREATE USER {name} WITH PASSWORD '{password}'")
        cur.execute(f"GRANT INSERT ON {table_name} TO {name}")
        before = tables(cur)
        with connect(name, password) as conn, conn.cursor() as ucur:
            for sql in (f"CREATE TABLE {clone} CLONE {table_name}",
                        f"CREATE TABLE IF NOT EXISTS {clone} CLONE {table_name} "
                        "AS OF now() - INTERVAL '1 millisecond'"):
                with pytest.raises(flightsql.Error) as failure:
                    ucur.execute(sql)
                text = str(failure.value)
                assert PERMISSION_DENIED in text, text
                assert (f"permission denied: user {name} lacks the SELECT privilege on table "
                        f"{table_name}") in text, text
            assert tables(cur) == before

            cur.execute(f"GRANT SELECT ON {table_name} TO {name}")
            ucur.execute(f"CREATE TABLE {clone} CLONE {table_name}")
            assert contents(ucur, clone) == contents(cur, table_name)
            cur.execute("SHOW GRANTS")
            assert [r for r in cur.fetchall() if r[0] == clone] == [
                (clone, "TABLE", name, "OWNER", "")]
            ucur.execute(f"INSERT INTO {clone} VALUES (6, 60, 'mine')")
            ucur.execute(f"DELETE FROM {clone} WHERE k = 1")
            assert [k for k, _, _ in contents(ucur, clone)] == [2, 3, 4, 5, 6]
            assert [k for k, _, _ in contents(cur, table_name)] == [1, 2, 3, 4, 5]
            ucur.execute(f"DROP TABLE {clone}")
        assert tables(cur) == before


def test_a_clone_of_a_queue_table_goes_on_with_new_positions(server, table_name):
    """A clone of a queue table (a POSITION column in its key) holds the queue's messages;
    messages inserted into the clone take positions after them, never one already taken, and
    tail() returns them after the old ones."""
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (queue STRING, pos BIGINT GENERATED ALWAYS AS "
                    "POSITION, body STRING, PRIMARY KEY (queue, pos)) "
                    "DISTRIBUTE BY HASH (queue) INTO 2 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} (queue, body) VALUES ('a', 'a1'), ('b', 'b1')")
        cur.execute(f"INSERT INTO {table_name} (queue, body) VALUES ('a', 'a2')")
        clone = f"{table_name}_clone"
        cur.execute(f"CREATE TABLE {clone} CLONE {table_name}")
        old = rows(cur, f"SELECT queue, pos, body FROM {clone} ORDER BY queue, pos")
        assert [body for _, _, body in old] == ["a1", "a2", "b1"]
        last = max(pos for _, pos, _ in old)
        cur.execute(f"INSERT INTO {clone} (queue, body) VALUES ('a', 'a3'), ('b', 'b2')")
        new = rows(cur, f"SELECT queue, pos, body FROM {clone} ORDER BY queue, pos")
        assert sorted(body for _, _, body in new) == ["a1", "a2", "a3", "b1", "b2"]
        assert len({(q, p) for q, p, _ in new}) == len(new), f"a key taken twice: {new}"
        assert [body for _, pos, body in new if pos > last] == ["a3", "b2"], new
        assert rows(cur, f"SELECT body FROM tail('{clone}', {last}, 0) ORDER BY pos") == [
            ("a3",), ("b2",)]
