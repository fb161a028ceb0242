"""JSON columns over Flight SQL (ADBC, pyarrow) and the PostgreSQL protocol (psycopg reads
them as PostgreSQL's json type), loaded by COPY, refused when not JSON."""

import json
import tempfile

import adbc_driver_flightsql.dbapi as flightsql
import psycopg
import pytest

from nyala_server import nyala_serve

DOCS = [{"user": "ada", "tags": ["a", "b"], "n": 1},
        {"user": "bob", "nested": {"deep": [1, 2, {"x": None}]}, "n": 2},
        [1, "two", 3.5], "just a string", 42]


def test_json_round_trips_and_is_queried(table_name):
    t = table_name
    with tempfile.TemporaryDirectory() as files, nyala_serve(postgres=True) as (grpc, _, pg):
        with open(f"{files}/docs.json", "w") as f:
            for i, doc in enumerate(DOCS):
                f.write(json.dumps({"id": i, "doc": json.dumps(doc)}) + "\n")
        host, port = pg
        with psycopg.connect(host=host, port=port, user="nyala", dbname="nyala",
                             autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {t} (id BIGINT PRIMARY KEY, doc JSON)")
            assert conn.execute(f"COPY {t} FROM '{files}/docs.json'").rowcount == len(DOCS)
            cur = conn.execute(f"SELECT doc FROM {t} ORDER BY id")
            assert cur.description[0].type_code == 114  # json
            assert [row[0] for row in cur.fetchall()] == DOCS
            cur = conn.execute(f"SELECT id FROM {t} WHERE doc->>'user' = %s", ("bob",))
            assert cur.fetchall() == [(1,)]
            cur = conn.execute(f"SELECT json_get_int(doc, 'n') FROM {t} WHERE id < 2 ORDER BY id")
            assert cur.fetchall() == [(1,), (2,)]
            with pytest.raises(psycopg.Error, match=r"column 'doc' of the row \(id=9\) is not "
                                                     r"valid JSON"):
                conn.execute(f"INSERT INTO {t} VALUES (8, '{{}}'), (9, '{{oops')")
            assert conn.execute(f"SELECT count(*) FROM {t}").fetchone() == (len(DOCS),)
        with flightsql.connect(grpc, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT id, doc FROM {t} ORDER BY id")
            table = cur.fetch_arrow_table()
            assert [json.loads(d) for d in table.column("doc").to_pylist()] == DOCS
            field = table.schema.field("doc")
            assert (field.metadata or {}).get(b"ARROW:extension:name") == b"arrow.json" \
                or str(field.type).startswith("extension<arrow.json")
