"""Starting a real `nyala serve` process on a fresh data directory and a free port.

The binary is $NYALA_BIN, else `debug/nyala` in $CARGO_TARGET_DIR (default
~/.cache/nyala-target, as tests/run.sh builds it), else the repository's own target/.
"""

import contextlib
import os
import select
import subprocess
import tempfile

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


@contextlib.contextmanager
def nyala_server(*args):
    """Runs `nyala serve` with extra `args`; yields its grpc:// URL; kills it afterwards."""
    binary = nyala_bin()
    if not os.path.exists(binary):
        raise RuntimeError(f"no nyala binary at {binary}: build it or set NYALA_BIN")
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [binary, "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT)
            line = proc.stdout.readline() if ready else ""
            urls = [w for w in line.split() if w.startswith("grpc://")]
            if not urls:
                raise RuntimeError(f"nyala serve did not start (exit code {proc.poll()}): {line!r}")
            yield urls[0]
        finally:
            proc.kill()
            proc.wait()


def host_port(url):
    """'grpc://127.0.0.1:1234' -> ('127.0.0.1', 1234)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


USER, PASSWORD = "alice", "secret"
