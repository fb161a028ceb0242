"""Tables created without a primary key, as other databases' SQL, BI tools and dataframe
libraries create them: over Flight SQL (ADBC, bulk ingest) and the PostgreSQL protocol."""

import tempfile

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from nyala_server import nyala_serve, update


def test_tables_without_a_key_load_and_change_like_any_other(table_name):
    t = table_name
    rows = pa.table({"city": ["Oslo", "Oslo", None, "Lima"] * 2500,
                     "temp": pa.array([1.5, 1.5, 2.0, None] * 2500)})
    with tempfile.TemporaryDirectory() as files, nyala_serve(postgres=True) as (grpc, _, pg):
        pq.write_table(rows, f"{files}/more.parquet")
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {t} (city STRING, temp DOUBLE)")
            # Bulk ingest and COPY load duplicates and NULLs as they are.
            assert cur.adbc_ingest(t, rows, mode="append") == 10000
            assert update(conn, f"COPY {t} FROM '{files}/more.parquet'") == 10000
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {t}")
            got = cur.fetch_arrow_table()
            assert got.column_names == ["city", "temp"]
            assert got.num_rows == 20000
            cur.execute(f"SELECT count(DISTINCT auto_incrementing_id) FROM {t}")
            assert cur.fetchall() == [(20000,)]
            assert update(conn, f"UPDATE {t} SET temp = 0 WHERE temp IS NULL") == 5000
            assert update(conn, f"DELETE FROM {t} WHERE city IS NULL") == 5000

        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            cur = conn.execute(f"SELECT city, count(*), sum(temp) FROM {t} "
                               "GROUP BY city ORDER BY city")
            assert cur.fetchall() == [("Lima", 5000, 0.0), ("Oslo", 10000, 15000.0)]
            assert [d.name for d in conn.execute(f"SELECT * FROM {t} LIMIT 1").description] \
                == ["city", "temp"]
            conn.execute(f"INSERT INTO {t} VALUES (%s, %s), (%s, %s)", ("Oslo", 9.0, "Oslo", 9.0))
            cur = conn.execute(f"SELECT count(*) FROM {t} WHERE temp = 9")
            assert cur.fetchone() == (2,)
            partitions = conn.execute(f"SHOW PARTITIONS {t}").fetchall()
            assert len(partitions) == 4
            create = conn.execute(f"SHOW CREATE TABLE {t}").fetchone()[1]
            assert "PRIMARY KEY" not in create and "HASH INTO 4 BUCKETS" in create
