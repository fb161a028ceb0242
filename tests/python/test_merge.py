"""MERGE over Flight SQL (ADBC) and the PostgreSQL protocol (psycopg), its results compared with
DuckDB's on the same statements."""

import random

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import psycopg
import pytest

from nyala_server import nyala_serve

MATCHED = [
    "WHEN MATCHED AND t.qty + s.qty > 150 THEN DELETE",
    "WHEN MATCHED AND s.note < 'n3' THEN UPDATE SET qty = t.qty + s.qty",
    "WHEN MATCHED THEN UPDATE SET qty = s.qty, note = s.note",
    "WHEN MATCHED AND t.note = s.note THEN DELETE",
]
NOT_MATCHED = [
    "WHEN NOT MATCHED THEN INSERT VALUES (s.k, s.qty, s.note)",
    "WHEN NOT MATCHED AND s.qty > 30 THEN INSERT (k, note) VALUES (s.k, 'big')",
    "WHEN NOT MATCHED BY SOURCE AND t.qty > 80 THEN UPDATE SET qty = t.qty - 50",
    "WHEN NOT MATCHED BY SOURCE AND t.k % 7 = 0 THEN DELETE",
]


def statements(table, seed, count):
    """Random MERGE statements on keys 0..29 (no key twice in one source)."""
    rng = random.Random(seed)
    for _ in range(count):
        keys = rng.sample(range(30), rng.randrange(1, 8))
        rows = ", ".join(f"({k}, {rng.randrange(100)}, 'n{rng.randrange(6)}')" for k in keys)
        clauses = rng.sample(MATCHED, rng.randrange(0, 3)) + rng.sample(NOT_MATCHED,
                                                                      rng.randrange(1, 3))
        rng.shuffle(clauses)
        yield (f"MERGE INTO {table} AS t USING (VALUES {rows}) AS s (k, qty, note) "
               f"ON t.k = s.k {' '.join(clauses)}")


def test_merge_agrees_with_duckdb(table_name):
    t = table_name
    duck = duckdb.connect()
    duck.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, qty BIGINT, note VARCHAR)")
    with nyala_serve(postgres=True) as (grpc, _, pg):
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} (k BIGINT PRIMARY KEY, qty BIGINT, note STRING) "
                        "DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
            changed = 0
            refused = 0
            for sql in statements(t, 11, 150):
                cur.adbc_statement.set_sql_query(sql)
                try:
                    duck_count = duck.execute(sql).fetchone()[0]
                except duckdb.ParserException as e:
                    # A clause after one of its kind without a condition: refused by both.
                    assert "unreachable" in str(e)
                    with pytest.raises(flightsql.ProgrammingError, match="unreachable clause"):
                        cur.adbc_statement.execute_update()
                    refused += 1
                    continue
                count = cur.adbc_statement.execute_update()
                assert count == duck_count, sql
                changed += count
            cur.execute(f"SELECT k, qty, note FROM {t} ORDER BY k")
            nyala_rows = cur.fetchall()
        expected = duck.execute(f"SELECT k, qty, note FROM {t} ORDER BY k").fetchall()
        assert nyala_rows == expected
        assert len(expected) > 10 and changed > 200 and 0 < refused < 50

        # Prepared with parameters over the PostgreSQL protocol; an error changes nothing.
        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            upsert = (f"MERGE INTO {t} USING (SELECT %s::bigint AS k) AS s ON {t}.k = s.k "
                      f"WHEN MATCHED THEN UPDATE SET qty = %s "
                      f"WHEN NOT MATCHED THEN INSERT VALUES (s.k, %s, 'pg')")
            for k in (1, 100):
                cur = conn.execute(upsert, (k, 1000 + k, 1000 + k), prepare=True)
                assert cur.rowcount == 1
                assert cur.statusmessage == "MERGE 1"
            got = conn.execute(f"SELECT k, qty FROM {t} WHERE k IN (1, 100) ORDER BY k")
            assert got.fetchall() == [(1, 1001), (100, 1100)]
            before = conn.execute(f"SELECT * FROM {t} ORDER BY k").fetchall()
            with pytest.raises(psycopg.Error, match="more than one source row matches"):
                conn.execute(f"MERGE INTO {t} USING (VALUES (1, 1), (1, 2)) AS s (k, v) "
                             f"ON {t}.k = s.k WHEN MATCHED THEN UPDATE SET qty = s.v "
                             f"WHEN NOT MATCHED THEN INSERT VALUES (s.k, s.v, 'x')")
            assert conn.execute(f"SELECT * FROM {t} ORDER BY k").fetchall() == before
