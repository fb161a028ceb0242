"""Distributed execution on a cluster of a master and three tablet servers: the 22 TPC-H
queries (tpchgen, a small scale factor) give the same results with `nyala.distributed` on and
off, EXPLAIN shows their stages with tasks on more than one server, and a tablet server killed
while a distributed query runs makes it fail with a clean, retryable error, after which queries
work again."""

import os
import re
import signal
import sys
import threading
import time
import urllib.request

import adbc_driver_flightsql.dbapi as flightsql
import pytest

from nyala_server import cluster, metrics, value

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import tpch  # noqa: E402  (the TPC-H benchmark's data, loading and result comparison)

SCALE = 0.01
BUCKETS = 6


def run(cur, statements):
    """The rows of the last query among `statements` (a query file's), normalised."""
    rows = None
    for statement in statements:
        table = tpch.execute(cur, statement)
        if tpch.is_query(statement):
            rows = tpch.normalise(table)
    return rows


def set_mode(cur, mode):
    tpch.execute(cur, f"SET nyala.distributed = '{mode}'")


def explain(cur, query):
    table = tpch.execute(cur, "EXPLAIN " + query)
    return "\n".join(r["plan"] for r in table.to_pylist() if r["plan_type"] == "physical_plan")


def scans_opened(c):
    """Tablet scans the tablet servers opened for other servers (ScanOpen calls)."""
    return sum(value(metrics(http), "nyala_rpc_duration_seconds_count", method="ScanOpen")
               for _, http in c.tservers.values())


def scanned_rows(line):
    """The output_rows of an EXPLAIN ANALYZE line ("57", "18.00 K", "1.2 M")."""
    number, unit = re.search(r"output_rows=([0-9.]+)(?: ([KM]))?", line).groups()
    return float(number) * {None: 1, "K": 1e3, "M": 1e6}[unit]


def connect(c):
    # Statements outside a transaction (the DB-API's default would open one, and statements
    # in a transaction run on one coordinator).
    conn = c.until(lambda: _try_connect(c.url), "the tablet servers never registered")
    return conn


def _try_connect(url):
    conn = flightsql.connect(url, autocommit=True)
    try:
        with conn.cursor() as cur:
            tpch.execute(cur, "CREATE TABLE IF NOT EXISTS probe (k BIGINT PRIMARY KEY) "
                              "DISTRIBUTE BY HASH (k) INTO 3 BUCKETS")
        return conn
    except Exception:
        conn.close()
        return None


def test_tpch_agrees_distributed_and_on_one_coordinator_and_survives_a_lost_server():
    files = tpch.generate_data(SCALE)
    with cluster(3) as c:
        conn = connect(c)
        # Every server leads some tablets before the tables are loaded.
        c.until(lambda: "3 of 3 tablet servers live" in c.admin("ksck").stdout,
                "the tablet servers never all reported")
        tpch.load(conn, files, BUCKETS, 50_000)
        cur = conn.cursor()
        queries = sorted(f for f in os.listdir(tpch.QUERY_DIR) if f.endswith(".sql"))
        assert len(queries) == 22
        for name in queries:
            with open(os.path.join(tpch.QUERY_DIR, name)) as f:
                statements = tpch.split_statements(f.read())
            results = {}
            for mode in ["off", "on"]:
                set_mode(cur, mode)
                results[mode] = run(cur, statements)
            diff, _ = tpch.compare(results["on"], results["off"], "distributed", "one coordinator")
            assert diff is None, f"{name}: {diff}"
            assert results["on"], f"{name} returned no rows"

        # A distributed query's scans read the tablets where they lead, in process: no tablet
        # server opens a scan for another (on one coordinator, every tablet is read that way).
        with open(os.path.join(tpch.QUERY_DIR, "q01.sql")) as f:
            q1 = f.read().strip().rstrip(";")
        for mode, remote_scans in [("on", 0), ("off", BUCKETS)]:
            set_mode(cur, mode)
            before = scans_opened(c)
            run(cur, [q1])
            assert scans_opened(c) - before == remote_scans, mode

        # EXPLAIN shows the stages, the scans' tasks on the servers leading tablets (where
        # placement put the 6 tablets: on two or three servers).
        set_mode(cur, "on")
        plan = explain(cur, q1)
        assert "DistributedExec" in plan and "Stage 1" in plan, plan
        scan = next(line for line in plan.splitlines() if "NyalaScanExec" in line)
        servers = set(re.findall(r"\d+@([0-9.:]+):", scan))
        assert len(servers) >= 2, scan
        set_mode(cur, "off")
        assert "DistributedExec" not in explain(cur, q1)
        # `auto` keeps queries that scan fewer than a million rows on one coordinator.
        set_mode(cur, "auto")
        assert "DistributedExec" not in explain(cur, q1)
        # Bad values are refused with what is accepted.
        with pytest.raises(Exception, match="auto, on or off"):
            set_mode(cur, "sometimes")
        # In a transaction, statements keep one coordinator.
        set_mode(cur, "on")
        tpch.execute(cur, "BEGIN")
        assert "DistributedExec" not in explain(cur, q1)
        tpch.execute(cur, "COMMIT")

        # A tablet server stops answering (SIGSTOP), then one dies (SIGKILL), while a
        # distributed query runs on it (the coordinator's web UI showing the stages it runs
        # in): the query fails with a retryable error naming the server, or finishes with the
        # right count; it never hangs; queries work again once the server answers or its
        # tablets lead elsewhere.
        tpch.execute(cur, "CREATE TABLE facts (id BIGINT PRIMARY KEY, g BIGINT) "
                          "DISTRIBUTE BY HASH (id) INTO 6 BUCKETS WITH (replicas = 3)")
        tpch.execute(cur, "INSERT INTO facts SELECT v, v % 10 FROM generate_series(1, 60000) AS t(v)")
        slow = "SELECT count(*) FROM facts a JOIN facts b ON a.g = b.g"
        expected = [(float(60000 * 6000),)]
        # A join's filter reaches the scans of its probe side on every server: of the 60 000
        # rows, the tablets hand out about those of the 20 keys of the broadcast build side.
        tpch.execute(cur, "CREATE TABLE dim (k BIGINT PRIMARY KEY)")
        tpch.execute(cur, "INSERT INTO dim SELECT v * 1000 FROM generate_series(1, 20) AS t(v)")
        joined = "SELECT count(*) FROM facts f JOIN dim d ON f.id = d.k"
        assert run(cur, [joined]) == [(20.0,)]
        analyzed = "\n".join(r["plan"] for r in tpch.execute(cur, "EXPLAIN ANALYZE " + joined).to_pylist())
        assert "DistributedExec" in analyzed, analyzed
        scan = next(line for line in analyzed.splitlines() if "NyalaScanExec: table=facts" in line)
        assert scanned_rows(scan) < 1000, scan

        # The statement timeout stops a distributed query too.
        set_mode(cur, "on")
        tpch.execute(cur, "SET statement_timeout = '300ms'")
        with pytest.raises(Exception, match="statement timeout"):
            run(cur, [slow])
        tpch.execute(cur, "SET statement_timeout = 0")

        def works():
            try:
                return run(cur, [slow]) == expected
            except Exception:  # noqa: BLE001 (not yet: leaders are being elected)
                return False

        for fault in [signal.SIGSTOP, signal.SIGKILL]:
            victim = next(iter(c.tservers))
            outcome = interrupted(conn, slow, c.http, lambda: c.signal(victim, fault))
            assert "hung" not in outcome, f"the query hung after {fault.name}"
            if "error" in outcome:
                # (The server that stopped, or a tablet it led, as the statement met it first.)
                assert "(Unavailable;" in outcome["error"] and "tablet" in outcome["error"], \
                    outcome["error"]
            else:
                assert outcome["rows"] == expected, outcome
            if fault == signal.SIGSTOP:
                c.signal(victim, signal.SIGCONT)
            else:
                c.tservers.pop(victim)
            c.until(works, f"queries never worked again after {fault.name}")
        conn.close()


def interrupted(conn, query, http, fault):
    """Runs `query` distributed and, once the coordinator's web UI shows its stages, `fault`;
    its rows or error, or "hung" if it had neither after 60 s. A query that ends before the
    page was seen showing it (a slow page on a busy machine) runs again, up to three times."""
    for _ in range(3):
        outcome = {}

        def run_query():
            with conn.cursor() as other:
                try:
                    set_mode(other, "on")
                    outcome["rows"] = run(other, [query])
                except Exception as e:  # noqa: BLE001 (the error is what is checked)
                    outcome["error"] = str(e)

        running = threading.Thread(target=run_query)
        started = time.time()
        running.start()
        shown = False
        while running.is_alive() and not shown and time.time() - started < 30:
            with urllib.request.urlopen(f"{http}/statements", timeout=10) as page:
                shown = "distributed: stages" in page.read().decode()
        if shown:
            break
        running.join(timeout=60)
    assert shown, "the statements page never showed the query's stages"
    fault()
    running.join(timeout=60)
    if running.is_alive():
        outcome["hung"] = True
    return outcome
