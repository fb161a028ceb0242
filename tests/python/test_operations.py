"""Operations: every server's /metrics (parsed by the Prometheus client's OpenMetrics parser),
the web UI (loaded in headless Chromium), cancelling a statement from the web UI, and
`nyala admin` (ksck, tables, tablets, leader-step-down, rebalance) on a cluster of a master
and tablet server processes."""

import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from nyala_server import cluster, get, metrics, nyala_bin, nyala_serve, start_process, url_in, value

DEADLINE = 60


def sql(url, statement):
    """Runs `statement` with `nyala sql`; its CSV output."""
    done = subprocess.run([nyala_bin(), "sql", "--connect", url, "--mode", "csv", "-c", statement],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def chromium():
    """Chromium's command; tests/run.sh installs Debian's package."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed (tests/run.sh installs Debian's chromium package)"
    return binary


def dom(url):
    """The page at `url` as headless Chromium renders it."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
             "--dump-dom", url],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def server():
    with nyala_serve() as urls:
        yield urls


def test_metrics_follow_the_conventions_and_counters_move(server):
    url, http = server
    sql(url, "CREATE TABLE m (id BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (id) INTO 2 BUCKETS")
    # A first multi-tablet statement creates the transaction status table (a catalog row).
    sql(url, "INSERT INTO m VALUES (-1, 'a'), (-2, 'b')")
    sql(url, "DELETE FROM m WHERE id < 0")
    before = metrics(http)
    assert len(before) >= 20, sorted(before)
    for family in before.values():
        assert family.name.startswith("nyala_"), family.name
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
    sql(url, "INSERT INTO m SELECT v, 'x' FROM generate_series(1, 100) AS t(v)")
    assert sql(url, "SELECT count(*) AS n FROM m").splitlines()[1] == "100"
    after = metrics(http)
    written = "nyala_tablet_written_rows_total"
    # The 100 rows, and the row of the transaction status table that committed them (the
    # INSERT writes both tablets, so it is a transaction).
    assert value(after, written) - value(before, written) == 101
    scanned = "nyala_tablet_scanned_rows_total"
    assert value(after, scanned) - value(before, scanned) >= 100
    statements = "nyala_statement_duration_seconds_count"
    assert value(after, statements, kind="dml") == value(before, statements, kind="dml") + 1
    assert value(after, "nyala_statement_rows_total", kind="dml") >= 100
    assert value(after, "nyala_rpc_duration_seconds_count", method="DoGet") >= 1
    # State read at the scrape: each tablet's memory, its Raft state, the memory limit.
    tablets = {s.labels["tablet"] for s in after["nyala_tablet_memory_bytes"].samples}
    assert len(tablets) >= 2
    assert value(after, "nyala_tablet_memory_bytes") > 0
    assert value(after, "nyala_server_memory_limit_bytes") > 0
    assert all(s.value >= 1 for s in after["nyala_raft_term"].samples)
    assert value(after, "nyala_sessions") >= 0


def test_web_ui_shows_tables_tablets_and_statements(server):
    url, http = server
    sql(url, "CREATE TABLE web_a (id BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (id) INTO 3 BUCKETS")
    sql(url, "CREATE TABLE web_b (id BIGINT PRIMARY KEY, s STRING)")
    sql(url, "INSERT INTO web_b VALUES (1, '<b>bold</b>')")
    tablets = sql(url, "SELECT tablet_id FROM sys.partitions WHERE table_name = 'web_a'").split()[1:]
    assert len(tablets) == 3
    home = dom(f"{http}/")
    for name in ("web_a", "web_b", *tablets):
        assert name in home, name
    page = dom(f"{http}/tables/web_a")
    for tablet in tablets:
        assert tablet in page
    assert "delta files" in page and "rowsets" in page
    statements = dom(f"{http}/statements")
    # The statement's text is shown as text: its markup is escaped, not rendered.
    assert "INSERT INTO web_b VALUES (1, '&lt;b&gt;bold&lt;/b&gt;')" in statements
    assert "<b>bold</b>" not in statements
    assert "Candidates" in dom(f"{http}/maintenance")
    with pytest.raises(urllib.error.HTTPError) as missing:
        get(f"{http}/tables/no_such_table")
    assert missing.value.code == 404


def test_a_running_statement_is_cancelled_from_the_web_ui(server):
    url, http = server
    slow = subprocess.Popen(
        [nyala_bin(), "sql", "--connect", url, "-c",
         "SELECT count(*) FROM generate_series(1, 100000000000) a"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + DEADLINE
        while True:
            ids = re.findall(r'action="/statements/(\d+)/cancel"', get(f"{http}/statements"))
            if ids:
                break
            assert time.time() < deadline, "the statement never showed as running"
            time.sleep(0.2)
        request = urllib.request.Request(f"{http}/statements/{ids[0]}/cancel", method="POST")
        assert "Running" in urllib.request.urlopen(request, timeout=30).read().decode()
        _, stderr = slow.communicate(timeout=DEADLINE)
        assert slow.returncode != 0
        assert "cancelled" in stderr
    finally:
        slow.kill()
        slow.wait()
    assert 'action="/statements/' not in get(f"{http}/statements")
    assert value(metrics(http), "nyala_statements_cancelled_total") >= 1


def replicas_of(tablets_output):
    """`nyala admin tablets` output: tablet id -> the server ids of its replicas."""
    rows = (re.match(r"^(\S+)\s+(\S+)\s+(.*?)\s+(\d+)\s+(\d+)$", line)
            for line in tablets_output.splitlines()[1:])
    return {row[1]: [int(s) for s in re.findall(r"\d+", row[3])] for row in rows if row}


def test_admin_commands_and_ksck_on_a_cluster():
    with cluster(3) as c:
        create = ("CREATE TABLE events (id BIGINT PRIMARY KEY, v BIGINT, doc JSON, "
                  "pair ARRAY<BIGINT>) "
                  "DISTRIBUTE BY HASH (id) INTO 3 BUCKETS WITH (replicas = 3)")
        c.until(lambda: subprocess.run([nyala_bin(), "sql", "--connect", c.url, "-c", create],
                                       capture_output=True).returncode == 0,
                "the tablet servers never registered")
        sql(c.url, "INSERT INTO events SELECT v, v * 10, '{\"v\": ' || CAST(v AS VARCHAR) || '}', "
                   "[v, v + 1] FROM generate_series(1, 300) AS t(v)")
        healthy = c.until(lambda: (r := c.admin("ksck")).returncode == 0 and r, "ksck never passed")
        assert "OK" in healthy.stdout and "3 of 3 tablet servers live" in healthy.stdout
        tables = c.admin("tables")
        assert tables.returncode == 0 and re.search(r"^events\s+3\s+3\s", tables.stdout, re.M), tables.stdout
        tablets = c.admin("tablets", "events")
        assert tablets.returncode == 0, tablets.stderr
        placement = replicas_of(tablets.stdout)
        assert len(placement) == 3 and all(len(r) == 3 for r in placement.values()), tablets.stdout
        assert c.admin("tablets", "no_such_table").returncode != 0

        # A leader steps down: another replica leads, and the cluster stays healthy.
        tablet = next(iter(placement))
        stepped = c.admin("leader-step-down", tablet)
        assert stepped.returncode == 0, stepped.stderr
        old, new = map(int, re.findall(r"server (\d+)", stepped.stdout))
        assert old != new and new in placement[tablet]

        # A fourth server gets replicas by rebalancing, one move at a time.
        c.start_tserver()
        # "listening" is printed before the server's first heartbeat reaches the master.
        c.until(lambda: "4 of 4 tablet servers live" in c.admin("ksck").stdout,
                "the fourth server never registered")
        moved = c.admin("rebalance")
        assert moved.returncode == 0, moved.stderr
        assert re.search(r"^[1-9]\d* replica\(s\) moved", moved.stdout, re.M), moved.stdout
        c.until(lambda: c.admin("ksck").returncode == 0, "ksck failed after rebalancing")
        assert sql(c.url, "SELECT count(*) AS n FROM events").splitlines()[1] == "300"
        # JSON documents survive the leader change and the replicas' moves (read by the shell).
        total = sql(c.url, "SELECT sum(json_get_int(doc, 'v')) AS s FROM events")
        assert total.splitlines()[1] == "45150", total
        # So do arrays.
        total = sql(c.url, "SELECT sum(pair[2]) AS s, sum(cardinality(pair)) AS n FROM events")
        assert total.splitlines()[1] == "45450,600", total
        cluster_page = dom(f"{c.http}/cluster")
        for server_id in c.tservers:
            assert f">{server_id}<" in cluster_page
        master_metrics = metrics(c.http)
        assert value(master_metrics, "nyala_master_tablet_server_live") == 4
        assert value(master_metrics, "nyala_master_replica_moves_total") >= 1
        _, tserver_http = next(iter(c.tservers.values()))
        assert "nyala_raft_commit_index" in metrics(tserver_http)

        # Two of a tablet's three replicas gone: no majority, and ksck says so.
        placement = replicas_of(c.admin("tablets", "events").stdout)
        for server_id in next(iter(placement.values()))[:2]:
            c.kill(server_id)
        # Once the master takes them for dead (their last reports may still name a leader).
        # (A replica's report of the majority can lead the master's count of live servers.)
        broken = c.until(lambda: (r := c.admin("ksck")).returncode != 0 and "no majority" in r.stdout
                         and "2 of 4 tablet servers live" in r.stdout and r,
                         "ksck never noticed the dead servers")
        assert "UNHEALTHY" in broken.stdout and "2 of 4 tablet servers live" in broken.stdout, broken.stdout


def test_a_data_directory_serves_one_server_at_a_time(tmp_path):
    """A second `nyala serve` on a data directory in use exits with an error that says so and
    changes nothing; the first goes on serving; once it is gone the directory opens again."""
    data_dir = str(tmp_path / "data")
    with nyala_serve(data_dir=data_dir) as (url, _):
        sql(url, "CREATE TABLE t (k BIGINT PRIMARY KEY)")
        sql(url, "INSERT INTO t VALUES (1)")
        second = subprocess.run(
            [nyala_bin(), "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
             "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=DEADLINE)
        assert second.returncode != 0
        assert "in use by another Nyala server" in second.stderr, second.stderr
        sql(url, "INSERT INTO t VALUES (2)")
    # Leaving nyala_serve killed the first with SIGKILL: its lock went with it.
    with nyala_serve(data_dir=data_dir) as (url, _):
        assert sql(url, "SELECT k FROM t ORDER BY k").split() == ["k", "1", "2"]
