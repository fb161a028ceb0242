"""BACKUP and RESTORE from outside: over the PostgreSQL protocol and Flight SQL, through
`nyala admin backup|restore`, the files read by pyarrow as they are, a backup killed midway,
and the administrator's privilege."""

import glob
import os
import subprocess
import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import pyarrow.parquet as pq
import pytest

from nyala_server import PASSWORD, USER, nyala_bin, nyala_serve


def connect(pg):
    host, port = pg
    return psycopg.connect(host=host, port=port, user="nyala", dbname="nyala", autocommit=True)


def admin(*args):
    """`nyala admin ARGS`; its output (it must succeed)."""
    done = subprocess.run([nyala_bin(), "admin", *args], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rows(conn, table):
    return conn.execute(f"SELECT k, v, s FROM {table} ORDER BY k").fetchall()


def test_backups_are_parquet_files_and_restore_through_the_command_line(table_name):
    t = table_name
    with tempfile.TemporaryDirectory() as backups, \
            nyala_serve(postgres=True) as (grpc, _, pg), connect(pg) as conn:
        conn.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, v DOUBLE, s STRING) "
                     "DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
        conn.execute(f"INSERT INTO {t} SELECT value, value / 2.0, 'row ' || value "
                     "FROM generate_series(1, 20000) AS g(value)")
        full = os.path.join(backups, "full")
        steps = conn.execute(f"BACKUP TABLE {t} TO '{full}'").fetchall()
        # step, steps, table_name, rows, bytes, file: three files, then the manifest.
        assert [s[0] for s in steps] == [1, 2, 3, 4] and steps[-1][1] == 4
        assert steps[-1][2] is None and steps[-1][5] == os.path.join(full, "manifest.json")
        assert steps[-1][3] == 20000
        at_full = rows(conn, t)

        # The files as they are, read by pyarrow.
        files = sorted(glob.glob(os.path.join(full, t, "*.parquet")))
        assert len(files) == 3
        read = pq.ParquetDataset(files).read().sort_by("k")
        assert [tuple(r.values()) for r in read.to_pylist()] == at_full

        conn.execute(f"UPDATE {t} SET v = -1 WHERE k % 100 = 0")
        conn.execute(f"DELETE FROM {t} WHERE k > 19990")
        conn.execute(f"INSERT INTO {t} VALUES (30000, 1.5, 'new')")
        at_incremental = rows(conn, t)

        # An incremental backup through the command line: the changed rows with `_change`.
        incremental = os.path.join(backups, "incremental")
        out = admin("backup", "--connect", grpc, "--tables", t,
                    "--incremental-from", full, incremental)
        assert "backup complete: 210 rows" in out, out
        changes = pq.ParquetDataset(glob.glob(os.path.join(incremental, t, "*.parquet"))).read()
        kinds = {}
        for change in changes.column("_change").to_pylist():
            kinds[change] = kinds.get(change, 0) + 1
        assert kinds == {"update": 199, "delete": 10, "insert": 1}, kinds

        out = admin("restore", "--connect", grpc, "--table", t, "--as", f"{t}_back",
                    incremental)
        assert "restore complete: 1 table(s) and view(s), 19991 rows" in out, out
        assert rows(conn, f"{t}_back") == at_incremental
        conn.execute(f"RESTORE TABLE {t} FROM '{full}' AS {t}_full")
        assert rows(conn, f"{t}_full") == at_full

        # Over Flight SQL too.
        with flightsql.connect(grpc, autocommit=True) as flight, flight.cursor() as cur:
            cur.execute(f"RESTORE TABLE {t} FROM '{incremental}' AS {t}_flight")
            assert cur.fetchall() == [(1, 1, f"{t}_flight", "table", 19991)]
        assert rows(conn, f"{t}_flight") == at_incremental


def test_a_backup_killed_midway_leaves_no_manifest(table_name):
    t = table_name
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as backups:
        target = os.path.join(backups, "killed")
        with nyala_serve(data_dir=data, postgres=True) as (_, _, pg):
            with connect(pg) as conn:
                conn.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, v DOUBLE, s STRING) "
                             "DISTRIBUTE BY HASH (k) INTO 16 BUCKETS")
                conn.execute(f"INSERT INTO {t} SELECT value, value * 1.5, 'some text ' || value "
                             "FROM generate_series(1, 400000) AS g(value)")

            def back_up():
                try:
                    with connect(pg) as conn:
                        conn.execute(f"BACKUP DATABASE TO '{target}'").fetchall()
                except psycopg.OperationalError:
                    pass  # the server was killed

            backing_up = threading.Thread(target=back_up)
            backing_up.start()
            # Killed (SIGKILL as the context ends) as soon as the backup has begun its files.
            deadline = time.monotonic() + 120
            while not glob.glob(os.path.join(target, t, "*.parquet")):
                assert time.monotonic() < deadline, "the backup wrote no file"
                time.sleep(0.001)
        backing_up.join()
        assert not os.path.exists(os.path.join(target, "manifest.json"))
        with nyala_serve(data_dir=data, postgres=True) as (_, _, pg), connect(pg) as conn:
            with pytest.raises(psycopg.Error, match="holds no complete backup"):
                conn.execute(f"RESTORE TABLE {t} FROM '{target}' AS {t}_copy").fetchall()
            # The same directory takes the backup again, complete this time.
            conn.execute(f"BACKUP DATABASE TO '{target}'").fetchall()
            conn.execute(f"RESTORE TABLE {t} FROM '{target}' AS {t}_copy").fetchall()
            count = f"SELECT count(*), sum(k) FROM {t}_copy"
            assert conn.execute(count).fetchone() == (400000, 400000 * 400001 // 2)


def test_only_the_administrator_backs_up_and_restores(table_name):
    with tempfile.TemporaryDirectory() as backups, \
            nyala_serve("--user", USER, "--password", PASSWORD) as (grpc, _):
        def connect_as(user, password):
            return flightsql.connect(grpc, db_kwargs={"username": user, "password": password},
                                     autocommit=True)

        target = os.path.join(backups, "b")
        with connect_as(USER, PASSWORD) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY)")
            cur.execute("CREATE USER bob WITH PASSWORD 'bob-secret'")
            cur.execute(f"GRANT ALL ON {table_name} TO bob")
            cur.execute(f"BACKUP TABLE {table_name} TO '{target}'")
            cur.fetchall()
        with connect_as("bob", "bob-secret") as conn, conn.cursor() as cur:
            for sql in (f"BACKUP TABLE {table_name} TO '{target}-bob'",
                        f"RESTORE TABLE {table_name} FROM '{target}' AS mine"):
                with pytest.raises(Exception, match="only the administrator"):
                    cur.execute(sql)
                    cur.fetchall()
        assert not os.path.exists(f"{target}-bob")
        # The command line authenticates as the administrator.
        out = admin("backup", "--connect", grpc, "--user", USER, "--password", PASSWORD,
                    os.path.join(backups, "cli"))
        assert "backup complete: 0 rows" in out, out
