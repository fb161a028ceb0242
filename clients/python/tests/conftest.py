"""A real `nyala serve` process for the client's tests.

The binary is $NYALA_BIN, else `debug/nyala` in $CARGO_TARGET_DIR (default
~/.cache/nyala-target, as tests/run.sh builds it), else the repository's own target/.
"""

import itertools
import os
import select
import subprocess
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
USER, PASSWORD = "alice", "alice-secret"


def nyala_bin():
    if os.environ.get("NYALA_BIN"):
        return os.environ["NYALA_BIN"]
    dirs = [os.environ.get("CARGO_TARGET_DIR"), os.path.expanduser("~/.cache/nyala-target"), os.path.join(REPO, "target")]
    paths = [os.path.join(d, "debug", "nyala") for d in dirs if d]
    return next((p for p in paths if os.path.exists(p)), paths[0])


def start(*args):
    binary = nyala_bin()
    if not os.path.exists(binary):
        raise RuntimeError(f"no nyala binary at {binary}: build it or set NYALA_BIN")
    data_dir = tempfile.TemporaryDirectory()
    proc = subprocess.Popen(
        [binary, "serve", "--data-dir", data_dir.name, "--listen", "127.0.0.1:0",
         "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    urls = [w for w in line.split() if w.startswith("grpc://")]
    if not urls:
        proc.kill()
        proc.wait()
        data_dir.cleanup()
        raise RuntimeError(f"nyala serve did not start (exit code {proc.poll()}): {line!r}")
    return urls[0], proc, data_dir


def stop(proc, data_dir):
    proc.kill()
    proc.wait()
    data_dir.cleanup()


@pytest.fixture(scope="module")
def server():
    url, proc, data_dir = start()
    yield url
    stop(proc, data_dir)


@pytest.fixture(scope="module")
def auth_server():
    url, proc, data_dir = start("--user", USER, "--password", PASSWORD)
    yield url
    stop(proc, data_dir)


@pytest.fixture(scope="module")
def credentials():
    return USER, PASSWORD


_numbers = itertools.count(1)


@pytest.fixture
def table_name(request):
    """A table name unique in the session (a module's tests share one server)."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40].strip("_")
    return f"{base}_{next(_numbers)}"
