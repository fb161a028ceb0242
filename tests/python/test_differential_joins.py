"""Random joins against DuckDB: the same pseudo-random tables in a real `nyala serve` process
and in an in-memory DuckDB, the same queries in both, the rows compared as multisets.

Nyala runs every query with runtime filters as they are by default (twice: a filter that
depends on timing shows as two different answers), then with `SET nyala.runtime_filters =
minmax` and `= bloom` on the same session. A difference is reported with the rows only one
side has and, to tell the runtime filters from the rest, whether Nyala answers as DuckDB with
them off. sql/tests/runtime_filters compares Nyala with itself (filters on against off); this
test found the first of its queries (ISSUE_QUERY).

The three tables have the same columns, so joins name columns alike (`b.id`, `c.id`); their
keys have NULLs and values the other tables lack; each has 4 tablets, two thirds of its rows in
DiskRowSets (a clean restart flushes them) and the rest in MemRowSets, with some of the flushed
rows since updated (join keys too) or deleted. The queries join two or three tables (inner and
outer, on one or two keys, sometimes NULL-equal), filter them with comparisons, BETWEEN,
IS [NOT] NULL, IS [NOT] DISTINCT FROM, OR, and IN / NOT IN / EXISTS subqueries, and answer
aggregates, groups, or their first rows in an order of every column they return (so the rows
a LIMIT keeps are the same in both). A query DuckDB refuses is left out; one only Nyala refuses
is listed in a warning, not failed: DataFusion plans some subquery shapes DuckDB does not.
"""

import datetime
import decimal
import math
import random
import warnings

import adbc_driver_flightsql.dbapi as flightsql
import duckdb
import pytest

from nyala_server import nyala_serve

SEED = 7
RANDOM_QUERIES = 40

TABLES = [("t3", 300), ("t1", 2_000), ("t2", 3_000)]
# k3 and b1 point into t3's ids (0..299), t1_id into t1's (0..1999), with misses and NULLs.
COLUMNS = ("id BIGINT PRIMARY KEY, k3 BIGINT, t1_id BIGINT, b1 BIGINT, i1 INT, d1 DOUBLE, "
           "s1 STRING, dt DATE")
INSERT_BATCH = 500

# Changes to the flushed rows after the restart: deltas over DiskRowSets, whose files' min/max
# still show the old values of the keys they change.
CHANGES = [
    "UPDATE t2 SET k3 = k3 + 1000 WHERE id % 29 = 0",
    "UPDATE t2 SET k3 = 5, i1 = i1 - 7 WHERE id % 31 = 1",
    "UPDATE t1 SET k3 = NULL, d1 = d1 + 1.0 WHERE id % 37 = 2",
    "UPDATE t3 SET i1 = NULL WHERE id % 11 = 3",
    "DELETE FROM t1 WHERE id % 23 = 5",
    "DELETE FROM t3 WHERE id % 41 = 6",
]

# The query this test found (verbatim): with runtime filters on, Nyala returned 25 rows in one
# run and 43 in the next, instead of DuckDB's 49.
ISSUE_QUERY = (
    "SELECT (SELECT min(ib.i1 * 6) FROM t2 ib WHERE ib.k3 = c.id AND NOT (ib.k3 <= 130)) AS c0, "
    "b.d1 + c.i1, c.d1 FROM t2 b LEFT JOIN t3 c ON b.k3 = c.id "
    "WHERE (b.t1_id >= c.d1 OR b.dt BETWEEN DATE '2021-12-04' AND DATE '2023-05-17' "
    "OR c.i1 IS NOT DISTINCT FROM c.d1) "
    "AND c.id IN (SELECT ia.k3 FROM t1 ia WHERE ia.d1 <= 716806747415 "
    "OR ia.s1 IS DISTINCT FROM ia.s1) "
    "ORDER BY b.d1 DESC NULLS LAST, b.id, c.id DESC NULLS FIRST LIMIT 49"
)

# (what a run is called, the SET before it or None); each run takes every query on one session.
RUNS = [
    ("default", None),
    ("default, again", None),
    ("minmax", "SET nyala.runtime_filters = minmax"),
    ("bloom", "SET nyala.runtime_filters = bloom"),
]


# --- The data ---

def or_null(rng, one_in, value):
    """`value()` as SQL, or one time in `one_in` NULL."""
    return "NULL" if rng.randrange(one_in) == 0 else value()


def row(rng, id):
    """Row `id` as SQL values, NULLs in every column but the key."""
    k3 = or_null(rng, 10, lambda: str(rng.randrange(360)))
    t1_id = or_null(rng, 10, lambda: str(rng.randrange(2_200)))
    b1 = or_null(rng, 8, lambda: str(rng.randrange(400)))
    i1 = or_null(rng, 7, lambda: str(rng.randint(-1_000, 1_000)))
    # Mostly far apart (±1e12, whole numbers: sums are exact); some as small as the integers.
    d1 = or_null(rng, 10, lambda: f"{rng.randint(-1_000, 1_000)}.0" if rng.randrange(5) == 0
                 else f"{rng.randint(-1_000_000, 1_000_000) * 1_000_000}.0")
    s1 = or_null(rng, 9, lambda: "'{}'".format(rng.choice(["a", "b", "ab", "ba", "abc", "z"])))
    # 2020-01-01 and the six years after it.
    dt = or_null(rng, 10, lambda: "DATE '{}'".format(
        datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randrange(2_192))))
    return f"({id}, {k3}, {t1_id}, {b1}, {i1}, {d1}, {s1}, {dt})"


def inserts(table, rows):
    return [f"INSERT INTO {table} VALUES " + ", ".join(rows[i:i + INSERT_BATCH])
            for i in range(0, len(rows), INSERT_BATCH)]


def statements():
    """The statements that make the tables: (before the restart, after it)."""
    rng = random.Random(SEED)
    before, after = [], []
    for table, count in TABLES:
        table_rows = [row(rng, id) for id in range(count)]
        before.append(f"CREATE TABLE {table} ({COLUMNS}) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS")
        before += inserts(table, table_rows[:count * 2 // 3])
        after += inserts(table, table_rows[count * 2 // 3:])
    return before, after + CHANGES


def for_duckdb(sql):
    return sql.split(" DISTRIBUTE BY ")[0]


@pytest.fixture(scope="module")
def databases(tmp_path_factory):
    """(a Nyala URL, a connection to it, a DuckDB connection) with the same tables."""
    data_dir = str(tmp_path_factory.mktemp("nyala"))
    duck = duckdb.connect()
    before, after = statements()
    with nyala_serve(data_dir=data_dir, graceful=True) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            for sql in before:
                cur.execute(sql)
                duck.execute(for_duckdb(sql))
    with nyala_serve(data_dir=data_dir) as (url, _):
        with flightsql.connect(url, autocommit=True) as conn:
            with conn.cursor() as cur:
                for sql in after:
                    cur.execute(sql)
                    duck.execute(sql)
            yield url, conn, duck
    duck.close()


# --- The queries ---

TABLE_NAMES = ["t1", "t2", "t3"]
# Keys that find one row (an id) and keys that find several.
KEY_PAIRS = [("k3", "id"), ("b1", "id"), ("t1_id", "id"), ("id", "id"), ("id", "k3"),
             ("id", "t1_id"), ("k3", "k3"), ("b1", "k3")]
JOINS = ["JOIN", "JOIN", "LEFT JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]
KEYS = ["id", "k3", "t1_id", "b1"]
OUTPUTS = ["id", "k3", "t1_id", "i1", "d1", "s1", "dt"]


def distinct(a, is_, b):
    """`a IS [NOT] DISTINCT FROM b`, in parentheses: sqlparser 0.62 parses the right operand
    greedily, `a IS DISTINCT FROM b AND c` as `a IS DISTINCT FROM (b AND c)`
    (apache/datafusion#23692), which DataFusion refuses here (`Int64 AND Boolean`)."""
    return f"({a} {is_} DISTINCT FROM {b})"


def random_query(rng):
    """Two or three tables joined, filtered, and answered as aggregates, per group, or as their
    first rows in an order of every column returned."""
    count = rng.choice([2, 3])
    source = f"{rng.choice(TABLE_NAMES)} x0"
    for i in range(1, count):
        other = rng.randrange(i)
        left, right = rng.choice(KEY_PAIRS)
        on = (distinct(f"x{other}.{left}", "IS NOT", f"x{i}.{right}") if rng.randrange(6) == 0
              else f"x{other}.{left} = x{i}.{right}")
        extra = rng.randrange(5)
        if extra == 0:
            on += f" AND x{i}.i1 > {rng.randint(-1_000, 1_000)}"
        elif extra == 1:
            on += f" AND x{other}.b1 = x{i}.b1"
        elif extra == 2:
            on += f" AND x{other}.k3 = x{i}.k3"
        source += f" {rng.choice(JOINS)} {rng.choice(TABLE_NAMES)} x{i} ON {on}"

    def alias():
        return f"x{rng.randrange(count)}"

    predicates = []
    for _ in range(rng.randrange(4)):
        predicate = random_predicate(rng, alias(), alias())
        if rng.randrange(4) == 0:
            predicate = f"({predicate} OR {random_predicate(rng, alias(), alias())})"
        predicates.append(predicate)
    where = " WHERE " + " AND ".join(predicates) if predicates else ""

    a, b, c = alias(), alias(), alias()
    shape = rng.randrange(3)
    if shape == 0:
        return (f"SELECT count(*), count({a}.k3), sum({b}.i1), min({c}.d1), max({a}.dt), "
                f"max({b}.s1) FROM {source}{where}")
    if shape == 1:
        key = rng.choice(["k3", "b1", "s1", "dt"])
        return (f"SELECT {a}.{key}, count(*), sum({b}.id), max({c}.d1) "
                f"FROM {source}{where} GROUP BY {a}.{key}")
    columns = [f"{alias()}.{rng.choice(OUTPUTS)} AS c{n}" for n in range(1 + rng.randrange(3))]
    # Every table's id too: the rows are mostly distinct.
    columns += [f"x{i}.id AS id{i}" for i in range(count)]
    if rng.randrange(4) == 0:
        columns.append(f"(SELECT min(y.i1) FROM t2 y WHERE y.k3 = {alias()}.id) AS s")
    # DuckDB puts NULLs last either way, DataFusion first when descending: always say which.
    order = [f"{n} {rng.choice(['ASC', 'DESC'])} NULLS {rng.choice(['FIRST', 'LAST'])}"
             for n in range(1, len(columns) + 1)]
    return (f"SELECT {', '.join(columns)} FROM {source}{where} "
            f"ORDER BY {', '.join(order)} LIMIT {1 + rng.randrange(60)}")


def random_predicate(rng, alias, other_alias):
    """A condition on the row of `alias` (and sometimes of `other_alias`)."""
    table = rng.choice(TABLE_NAMES)
    key, other = rng.choice(KEYS), rng.choice(KEYS)
    n = rng.randint(-1_000, 1_000)
    kind = rng.randrange(15)
    if kind == 0:
        return f"{alias}.i1 {rng.choice(['<', '<=', '>', '>=', '=', '<>'])} {n}"
    if kind == 1:
        return f"{alias}.d1 {rng.choice(['<', '>'])} {n * 1_000_000_000}"
    if kind == 2:
        return f"{alias}.dt BETWEEN DATE '2021-06-01' AND DATE '2023-06-01'"
    if kind == 3:
        return f"{alias}.{key} BETWEEN {abs(n) % 300} AND {abs(n) % 300 + 80}"
    if kind == 4:
        return f"{alias}.{rng.choice(KEYS + ['i1', 's1', 'dt'])} IS {rng.choice(['', 'NOT '])}NULL"
    if kind == 5:
        return f"{alias}.s1 IN ('a', 'ab')"
    if kind == 6:
        return distinct(f"{alias}.{key}", rng.choice(["IS", "IS NOT"]),
                        f"{other_alias}.{rng.choice(KEYS)}")
    if kind == 7:
        return distinct(f"{alias}.i1", rng.choice(["IS", "IS NOT"]), str(abs(n) % 20))
    if kind == 8:
        return f"{alias}.t1_id >= {other_alias}.d1"
    if kind in (9, 10):
        return f"{alias}.{key} IN (SELECT y.{other} FROM {table} y WHERE y.i1 < {n})"
    if kind == 11:
        return f"{alias}.{key} NOT IN (SELECT y.{other} FROM {table} y WHERE y.i1 > {n})"
    if kind == 12:
        return (f"EXISTS (SELECT 1 FROM {table} y WHERE y.{other} = {alias}.{key} "
                f"AND y.i1 > {n})")
    if kind == 13:
        return (f"NOT EXISTS (SELECT 1 FROM {table} y WHERE y.{other} = {alias}.{key} "
                f"AND y.i1 < {n})")
    return f"{alias}.{key} IS NOT NULL"


def queries():
    return [ISSUE_QUERY] + [random_query(random.Random(SEED * 1_000 + i))
                            for i in range(RANDOM_QUERIES)]


# --- Comparing ---

def value(v):
    """One value as text both systems write alike: their integer and float types differ
    (DuckDB sums INTs into HUGEINT, DataFusion into BIGINT)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float, decimal.Decimal)):
        if math.isfinite(v) and v == int(v) and abs(v) < 2 ** 53:
            return str(int(v))
        return f"{float(v):.6g}"
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    return repr(v)


def rows(fetched):
    """Rows as a sorted multiset of tuples of text."""
    return sorted(tuple(value(v) for v in r) for r in fetched)


def nyala_rows(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return rows(cur.fetchall())


def only_in(a, b, limit=5):
    """The first rows of `a` that `b` lacks, counting repeats."""
    left = {}
    for r in b:
        left[r] = left.get(r, 0) + 1
    missing = []
    for r in a:
        if left.get(r, 0) > 0:
            left[r] -= 1
        else:
            missing.append(r)
    return missing[:limit]


def difference(url, sql, run, expected, got):
    """What a wrong answer looks like, and whether Nyala gives it without runtime filters (on
    a session of its own, the test's keeps its setting)."""
    with flightsql.connect(url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute("SET nyala.runtime_filters = off")
        try:
            off = nyala_rows(conn, sql)
            off = "as DuckDB" if off == expected else f"{len(off)} rows, not as DuckDB either"
        except Exception as e:  # noqa: BLE001 - the report says what happened
            off = f"fails: {e}"
    if isinstance(got, Exception):
        return f"{sql}\n  runtime filters {run}: fails: {got}\n  with them off: {off}"
    return (f"{sql}\n  runtime filters {run}: {len(got)} rows, DuckDB {len(expected)}; "
            f"runtime filters off: {off}\n"
            f"  only in Nyala: {only_in(got, expected)}\n"
            f"  only in DuckDB: {only_in(expected, got)}")


def test_random_joins_answer_as_duckdb(databases):
    url, conn, duck = databases
    expected = {}
    for sql in queries():
        try:
            expected[sql] = rows(duck.execute(sql).fetchall())
        except duckdb.Error:
            pass
    assert ISSUE_QUERY in expected

    refused, differences = {}, []
    for run, setting in RUNS:
        if setting:
            with conn.cursor() as cur:
                cur.execute(setting)
        for sql, want in expected.items():
            if sql in refused:
                continue
            try:
                got = nyala_rows(conn, sql)
            except Exception as e:  # noqa: BLE001 - a refusal is listed, not failed
                if run == RUNS[0][0]:
                    refused[sql] = str(e).splitlines()[0]
                    continue
                got = e
            if got != want:
                differences.append(difference(url, sql, run, want, got))

    if refused:
        listing = "\n".join(f"{sql}\n  {error}" for sql, error in refused.items())
        print(f"Nyala refuses {len(refused)} queries DuckDB runs:\n{listing}")
        warnings.warn(f"Nyala refuses {len(refused)} of {len(expected)} queries DuckDB runs "
                      f"(run with -s to see them):\n{listing}")
    assert not differences, "\n\n".join(differences)
    assert ISSUE_QUERY not in refused
    # A generator whose queries Nyala mostly refuses tests nothing.
    assert len(refused) <= len(expected) // 2, list(refused)
