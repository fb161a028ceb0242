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
