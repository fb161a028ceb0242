"""INSERT ... ON CONFLICT over Flight SQL (ADBC) and the PostgreSQL protocol (psycopg, as ORMs
send it), its results compared with DuckDB's on the same statements."""

import random

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import psycopg
import pytest

from nyala_server import nyala_serve


def statements(table, seed, count):
    """Random INSERT ... ON CONFLICT statements on keys 0..29 (no key twice in one statement)."""
    rng = random.Random(seed)
    for _ in range(count):
        keys = rng.sample(range(30), rng.randrange(1, 6))
        rows = ", ".join(f"({k}, {rng.randrange(100)}, 'n{rng.randrange(10)}')" for k in keys)
        action = rng.choice([
            "DO NOTHING",
            "DO UPDATE SET qty = EXCLUDED.qty",
            "DO UPDATE SET qty = qty + EXCLUDED.qty, note = EXCLUDED.note",
            "DO UPDATE SET note = EXCLUDED.note WHERE qty > 50",
            "DO UPDATE SET qty = qty * 2 WHERE EXCLUDED.note < 'n5'",
        ])
        target = rng.choice(["(k)", ""]) if action == "DO NOTHING" else "(k)"
        yield f"INSERT INTO {table} VALUES {rows} ON CONFLICT {target} {action}"


def test_on_conflict_agrees_with_duckdb(table_name):
    t = table_name
    duck = duckdb.connect()
    duck.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, qty BIGINT, note VARCHAR)")
    with nyala_serve(postgres=True) as (grpc, _, pg):
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, qty BIGINT, note STRING) "
                        "DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
            for sql in statements(t, 7, 120):
                cur.execute(sql)
                duck.execute(sql)
            cur.execute(f"SELECT k, qty, note FROM {t} ORDER BY k")
            nyala_rows = cur.fetchall()
        expected = duck.execute(f"SELECT k, qty, note FROM {t} ORDER BY k").fetchall()
        assert nyala_rows == expected
        assert len(expected) > 20

        # An ORM's upsert: server-side parameters over the PostgreSQL protocol.
        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            upsert = (f"INSERT INTO {t} (k, qty, note) VALUES (%s, %s, %s) "
                      "ON CONFLICT (k) DO UPDATE SET qty = EXCLUDED.qty, note = EXCLUDED.note")
            for k in (1, 100):
                cur = conn.execute(upsert, (k, 1000 + k, "orm"), prepare=True)
                assert cur.rowcount == 1
            got = conn.execute(f"SELECT k, qty, note FROM {t} WHERE k IN (1, 100) ORDER BY k")
            assert got.fetchall() == [(1, 1001, "orm"), (100, 1100, "orm")]
            # A parameter only DO UPDATE reads.
            bump = (f"INSERT INTO {t} (k, qty) VALUES (%s, 0) "
                    f"ON CONFLICT (k) DO UPDATE SET qty = {t}.qty + %s")
            conn.execute(bump, (1, 5), prepare=True)
            assert conn.execute(f"SELECT qty FROM {t} WHERE k = 1").fetchone() == (1006,)
            with pytest.raises(psycopg.Error, match="must name the primary key"):
                conn.execute(f"INSERT INTO {t} VALUES (1, 1, 'x') ON CONFLICT (qty) DO NOTHING")


def test_concurrent_upserts_lose_no_increment(table_name):
    """Writers bump one counter with ON CONFLICT DO UPDATE at once; a statement that meets
    another's write fails (to be run again) instead of overwriting it: no increment is lost."""
    import threading
    t = table_name
    with nyala_serve(postgres=True) as (_, _, pg):
        host, port = pg

        def connect():
            return psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                                   autocommit=True)

        with connect() as conn:
            conn.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, n BIGINT)")
        bump = f"INSERT INTO {t} VALUES (1, 1) ON CONFLICT (k) DO UPDATE SET n = n + 1"

        def writer():
            with connect() as conn:
                done = 0
                while done < 25:
                    try:
                        conn.execute(bump)
                        done += 1
                    except (psycopg.errors.SerializationFailure, psycopg.errors.UniqueViolation):
                        pass  # met another writer's bump: run it again

        threads = [threading.Thread(target=writer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with connect() as conn:
            assert conn.execute(f"SELECT n FROM {t} WHERE k = 1").fetchone() == (100,)
