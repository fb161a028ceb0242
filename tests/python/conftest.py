"""Shared fixtures: a real `nyala serve` process on a fresh data directory (see nyala_server.py)."""

import itertools

import pytest

from nyala_server import PASSWORD, USER, nyala_server


@pytest.fixture(scope="module")
def server():
    """URL of a server without authentication, one per test module."""
    with nyala_server() as url:
        yield url


@pytest.fixture(scope="module")
def auth_server():
    """URL of a server that requires USER / PASSWORD, one per test module."""
    with nyala_server("--user", USER, "--password", PASSWORD) as url:
        yield url


_numbers = itertools.count(1)


@pytest.fixture
def table_name(request):
    """A table name unique in the session (a module's tests share one server)."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40].strip("_")
    return f"{base}_{next(_numbers)}"


def pytest_collect_file(file_path, parent):
    """fuzz_traffic.py is also a script, hence not named test_*.py: collect it with the rest
    (a path given on the command line pytest collects by itself)."""
    if file_path.name == "fuzz_traffic.py" and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
