"""ARRAY columns over Flight SQL (ADBC bulk ingest, pyarrow lists), COPY from Parquet files that
pyarrow wrote, the shell, and the PostgreSQL protocol (psycopg reads PostgreSQL arrays)."""

import subprocess
import tempfile

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nyala_server import nyala_bin, nyala_serve, update

TAGS = [["rust", "db"], [], None, ["x", None, "y"]] * 250
SCORES = [[1, 2, 3], None, [None], [7]] * 250


def rows(first):
    n = len(TAGS)
    return pa.table({
        "id": pa.array(range(first, first + n), pa.int64()),
        "tags": pa.array(TAGS, pa.list_(pa.string())),
        "scores": pa.array(SCORES, pa.list_(pa.int32())),
    })


def test_arrays_round_trip_through_pyarrow_copy_the_shell_and_psycopg(table_name):
    t = table_name
    with tempfile.TemporaryDirectory() as files, nyala_serve(postgres=True) as (grpc, _, pg):
        # pyarrow writes Parquet lists with an element field named `element`.
        pq.write_table(rows(1000), f"{files}/more.parquet")
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} (id BIGINT PRIMARY KEY, tags ARRAY<STRING>, "
                        "scores INT[])")
            assert cur.adbc_ingest(t, rows(0), mode="append") == 1000
            assert update(conn, f"COPY {t} FROM '{files}/more.parquet'") == 1000
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, tags, scores FROM {t} ORDER BY id")
            got = cur.fetch_arrow_table()
            assert pa.types.is_list(got.schema.field("tags").type)
            assert got.column("tags").to_pylist() == TAGS * 2
            assert got.column("scores").to_pylist() == SCORES * 2
            cur.execute(f"SELECT tag, count(*) AS n FROM (SELECT unnest(tags) AS tag FROM {t}) "
                        "WHERE tag IS NOT NULL GROUP BY tag ORDER BY tag")
            assert cur.fetchall() == [("db", 500), ("rust", 500), ("x", 500), ("y", 500)]
            cur.execute(f"SELECT count(*) FROM {t} WHERE array_has(tags, 'rust')")
            assert cur.fetchall() == [(500,)]
            assert update(conn, f"UPDATE {t} SET scores = array_append(scores, 0) "
                                "WHERE scores IS NULL") == 500
            cur.execute(f"SELECT scores FROM {t} WHERE id = 1")
            assert cur.fetchall() == [([0],)]

        shell = subprocess.run([nyala_bin(), "sql", "--connect", grpc, "--mode", "csv", "-c",
                                f"SELECT tags, scores FROM {t} WHERE id = 3"],
                               capture_output=True, text=True, timeout=60)
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.splitlines()[1] == '"[x, , y]",[7]', shell.stdout

        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            cur = conn.execute(f"SELECT tags, scores FROM {t} WHERE id < 4 ORDER BY id")
            assert cur.fetchall() == [(["rust", "db"], [1, 2, 3]), ([], [0]),
                                      (None, [None]), (["x", None, "y"], [7])]
            conn.execute(f"INSERT INTO {t} VALUES (5000, ARRAY['pg'], [1, 2])")
            cur = conn.execute(f"SELECT cardinality(scores) FROM {t} WHERE id = 5000")
            assert cur.fetchone() == (2,)
            # Python lists as parameters (psycopg sends PostgreSQL arrays).
            conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (5001, ["p", None], [4, 5]))
            cur = conn.execute(f"SELECT tags, scores FROM {t} WHERE id = %s", (5001,))
            assert cur.fetchone() == (["p", None], [4, 5])
            with pytest.raises(psycopg.Error, match="primary key"):
                conn.execute("CREATE TABLE bad_arrays (tags STRING[] PRIMARY KEY)")
