"""Views seen through ADBC: created, read, listed by Flight SQL GetTables as VIEW, dropped."""

import adbc_driver_flightsql.dbapi as flightsql


def objects(conn, kind):
    """The names of the tables GetTables lists with table type `kind`."""
    reader = conn.adbc_get_objects(depth="tables", table_types_filter=[kind])
    names = []
    for catalog in reader.read_all().to_pylist():
        for schema in catalog["catalog_db_schemas"] or []:
            names.extend(t["table_name"] for t in schema["db_schema_tables"] or [])
    return names


def test_a_view_is_read_like_a_table_and_listed_as_a_view(server, table_name):
    view = f"{table_name}_big"
    with flightsql.connect(server, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, v BIGINT) "
                    "DISTRIBUTE BY HASH (k) INTO 2 BUCKETS")
        cur.execute(f"INSERT INTO {table_name} VALUES (1, 10), (2, 20), (3, 30)")
        cur.execute(f"CREATE VIEW {view} AS SELECT k, v FROM {table_name} WHERE v > 15")
        cur.fetchall()
        cur.execute(f"SELECT k FROM {view} ORDER BY k")
        assert cur.fetchall() == [(2,), (3,)]
        assert "VIEW" in conn.adbc_get_table_types()
        assert view in objects(conn, "VIEW") and view not in objects(conn, "TABLE")
        assert table_name in objects(conn, "TABLE")
        cur.execute(f"DROP VIEW {view}")
        cur.fetchall()
        assert view not in objects(conn, "VIEW")
        cur.execute(f"DROP TABLE {table_name}")
