"""Starting a real `nyala serve` process on a fresh data directory and a free port.

The binary is $NYALA_BIN, else `debug/nyala` in $CARGO_TARGET_DIR (default
~/.cache/nyala-target, as tests/run.sh builds it), else the repository's own target/.
"""

import contextlib
import os
import select
import subprocess
import tempfile
import time
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STARTUP_TIMEOUT = 60


def nyala_bin():
    if os.environ.get("NYALA_BIN"):
        return os.environ["NYALA_BIN"]
    candidates = []
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(os.environ["CARGO_TARGET_DIR"])
    candidates += [os.path.expanduser("~/.cache/nyala-target"), os.path.join(REPO, "target")]
    paths = [os.path.join(c, "debug", "nyala") for c in candidates]
    return next((p for p in paths if os.path.exists(p)), paths[0])


def start_process(args, expect, lines=1):
    """Starts `nyala ARGS`; returns the process and the words of the first `lines` lines it
    prints, the first of which must contain `expect`."""
    binary = nyala_bin()
    if not os.path.exists(binary):
        raise RuntimeError(f"no nyala binary at {binary}: build it or set NYALA_BIN")
    proc = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    if expect not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"nyala {args[0]} did not start (exit code {proc.poll()}): {line!r}")
    words = line.split()
    # The lines after the first follow at once (and may be buffered already: no select).
    for _ in range(lines - 1):
        words += proc.stdout.readline().split()
    return proc, words


def url_in(words, scheme):
    """The first word of a startup line that is a `scheme` URL."""
    return next(w.rstrip(",)") for w in words if w.startswith(scheme))


@contextlib.contextmanager
def nyala_serve(*args, data_dir=None, graceful=False, postgres=False):
    """Runs `nyala serve` with extra `args`; yields its (grpc:// or, with --tls-cert,
    grpc+tls://, http://) URLs, and with `postgres` the (host, port) of its PostgreSQL
    protocol; kills it afterwards. The data directory is a fresh temporary one unless
    `data_dir` names one (to restart a server on the same data). `graceful` stops it with
    SIGTERM instead, so it shuts down cleanly: its tablets flush their MemRowSets into
    DiskRowSets."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory())
        proc, words = start_process(
            ["serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
             "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0", *args],
            " on grpc",
            lines=2 if postgres else 1,
        )
        try:
            urls = (url_in(words, "grpc"), url_in(words, "http://"))
            if postgres:
                # "Nyala PostgreSQL protocol listening on HOST:PORT"
                host, port = words[words.index("PostgreSQL") + 4].rsplit(":", 1)
                urls += ((host, int(port)),)
            yield urls
            if graceful:
                proc.terminate()
                proc.wait(timeout=STARTUP_TIMEOUT)
        finally:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def nyala_server(*args):
    """Runs `nyala serve` with extra `args`; yields its grpc:// URL; kills it afterwards."""
    with nyala_serve(*args) as (url, _):
        yield url


def execute_update(cur, sql):
    """Runs `sql` as an update (DB-API's execute() runs everything as a query, whose row
    count ADBC reports as -1) and returns the rows it changed."""
    cur.adbc_statement.set_sql_query(sql)
    return cur.adbc_statement.execute_update()


def update(conn, sql):
    """execute_update on a cursor of its own (one that bulk ingest has not used)."""
    with conn.cursor() as cur:
        return execute_update(cur, sql)


def host_port(url):
    """'grpc://127.0.0.1:1234' -> ('127.0.0.1', 1234)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


USER, PASSWORD = "alice", "alice-secret"


def get(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def metrics(http):
    """The server's metric families by name."""
    return {f.name: f for f in text_string_to_metric_families(get(f"{http}/metrics"))}


def value(families, name, **labels):
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(s.value for f in families.values() for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


# How long a cluster's condition may take to hold (a leader elected, servers taken for dead).
CLUSTER_DEADLINE = 60


class Cluster:
    """A master and tablet servers, each a process with its web UI."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        master, words = self.start("master", "--rpc-addr", "127.0.0.1:0", "--flight-addr",
                                   "127.0.0.1:0", expect="grpc://")
        self.url = url_in(words, "grpc://")
        self.http = url_in(words, "http://")
        # "... (internal RPC 127.0.0.1:NNNN, data: ...)"
        self.masters = words[words.index("RPC") + 1].rstrip(",")
        self.tservers = {}

    def start(self, role, *args, expect):
        data_dir = tempfile.mkdtemp(dir=self.root)
        proc, words = start_process([role, "--data-dir", data_dir, "--http-addr", "127.0.0.1:0", *args],
                                    expect)
        self.procs.append(proc)
        return proc, words

    def start_tserver(self):
        proc, words = self.start("tserver", "--rpc-addr", "127.0.0.1:0", "--masters", self.masters,
                                 expect="listening")
        # "Nyala tablet server <id> listening on <addr> and http://... (data: ...)"
        self.tservers[int(words[3])] = (proc, url_in(words, "http://"))

    def signal(self, server_id, signum):
        self.tservers[server_id][0].send_signal(signum)

    def kill(self, server_id):
        proc, _ = self.tservers.pop(server_id)
        proc.kill()
        proc.wait()

    def admin(self, *args):
        return subprocess.run([nyala_bin(), "admin", "--masters", self.masters, *args],
                              capture_output=True, text=True, timeout=600)

    def until(self, condition, what):
        deadline = time.time() + CLUSTER_DEADLINE
        while True:
            result = condition()
            if result:
                return result
            assert time.time() < deadline, what
            time.sleep(0.5)

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def cluster(tservers):
    with tempfile.TemporaryDirectory() as root:
        c = Cluster(root)
        try:
            for _ in range(tservers):
                c.start_tserver()
            yield c
        finally:
            c.stop()
