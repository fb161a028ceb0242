"""Python client for Nyala, over Arrow Flight SQL.

>>> import nyala
>>> conn = nyala.connect("grpc://127.0.0.1:50051")
>>> nyala.query_arrow(conn, "SELECT id, name FROM t WHERE id = ?", (5,))
>>> nyala.load(conn, "t", dataframe, mode="append")

`connect` returns a DB-API 2.0 connection (the ADBC Flight SQL driver's, in autocommit
mode: every Nyala statement commits on its own); the helpers take such a connection.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import adbc_driver_flightsql.dbapi as _flightsql
import adbc_driver_manager
import pyarrow as pa

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "LOAD_MODES",
    "Connection",
    "Cursor",
    "connect",
    "load",
    "query_arrow",
    "query_pandas",
    # DB-API 2.0 module globals and exceptions
    "apilevel",
    "threadsafety",
    "paramstyle",
    "Warning",
    "Error",
    "InterfaceError",
    "DatabaseError",
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
]

DEFAULT_URL = "grpc://127.0.0.1:50051"

#: How `load` treats the target table:
#: append (it must exist), create (it must not exist), replace (drop it if it exists, then
#: create), create_append (create it if it does not exist, then append).
LOAD_MODES = ("append", "create", "replace", "create_append")

Connection = _flightsql.Connection
Cursor = _flightsql.Cursor

apilevel = _flightsql.apilevel
threadsafety = _flightsql.threadsafety
paramstyle = "qmark"  # `?`; Nyala also understands `$1`, `$2`, ...

Warning = _flightsql.Warning
Error = _flightsql.Error
InterfaceError = _flightsql.InterfaceError
DatabaseError = _flightsql.DatabaseError
DataError = _flightsql.DataError
OperationalError = _flightsql.OperationalError
IntegrityError = _flightsql.IntegrityError
InternalError = _flightsql.InternalError
ProgrammingError = _flightsql.ProgrammingError
NotSupportedError = _flightsql.NotSupportedError

_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls")


def _normalize_url(url: str) -> str:
    if "://" not in url:
        url = "grpc://" + url
    scheme = url.split("://", 1)[0].lower()
    if scheme not in _SCHEMES:
        raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}: use one of {', '.join(_SCHEMES)}")
    return url


def connect(
    url: str = DEFAULT_URL,
    username: Optional[str] = None,
    password: Optional[str] = None,
    **db_kwargs: str,
) -> Connection:
    """Connects to a Nyala server; returns a DB-API 2.0 connection in autocommit mode.

    `url` is ``grpc://host:port`` (``grpc+tls://`` for TLS; a bare ``host:port`` means
    ``grpc://``). With `username` and `password` the client authenticates with them (HTTP
    basic auth in the Flight handshake, then the bearer token the server hands out).
    Further keyword arguments are ADBC Flight SQL database options, e.g.
    ``**{"adbc.flight.sql.rpc.timeout_seconds.query": "30"}``.

    Use it as a context manager, or call ``close()``.
    """
    if (username is None) != (password is None):
        raise ValueError("give both username and password, or neither")
    options = dict(db_kwargs)
    if username is not None:
        options[adbc_driver_manager.DatabaseOptions.USERNAME.value] = username
        options[adbc_driver_manager.DatabaseOptions.PASSWORD.value] = password
    return _flightsql.connect(_normalize_url(url), db_kwargs=options, autocommit=True)


Params = Optional[Union[Sequence[Any], pa.RecordBatch, pa.Table]]


def query_arrow(conn: Connection, sql: str, params: Params = None) -> pa.Table:
    """Runs `sql` and returns its whole result as a pyarrow Table.

    `params` binds the statement's placeholders (``?`` or ``$1``, ``$2``, ...): a sequence of
    values, one per placeholder, or an Arrow RecordBatch/Table with one row per execution.
    A result spread over several endpoints (a plain scan of a table with several tablets)
    is read in full.
    """
    cursor = conn.cursor()
    try:
        if params is None:
            cursor.execute(sql)
        else:
            cursor.execute(sql, params)
        return cursor.fetch_arrow_table()
    finally:
        cursor.close()


def query_pandas(conn: Connection, sql: str, params: Params = None):
    """Runs `sql` and returns its result as a pandas DataFrame (needs pandas installed)."""
    try:
        import pandas  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("query_pandas needs pandas: pip install 'nyala[pandas]'") from e
    return query_arrow(conn, sql, params).to_pandas()


def _is_pandas(data: Any) -> bool:
    return type(data).__module__.split(".", 1)[0] == "pandas" and type(data).__name__ == "DataFrame"


def _as_arrow(data: Any):
    if isinstance(data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
        return data
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, dict):
        return pa.table(data)
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return pa.Table.from_pylist(data)
    if hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__"):
        return data  # Polars and other Arrow PyCapsule producers
    raise TypeError(
        f"cannot load {type(data).__name__}: give a pyarrow Table, RecordBatch or RecordBatchReader, "
        "a pandas DataFrame, a dict of columns or a list of row dicts"
    )


def load(conn: Connection, table_name: str, data: Any, mode: str = "append") -> int:
    """Bulk-loads `data` into `table_name` (Flight SQL bulk ingest); returns the rows loaded.

    `data`: a pyarrow Table, RecordBatch or RecordBatchReader, a pandas DataFrame (its index
    is not loaded), a dict of columns or a list of row dicts. `mode` is one of LOAD_MODES.
    A table the load creates takes its first column as the primary key. Loading a key that
    the table already has is an error.
    """
    if mode not in LOAD_MODES:
        raise ValueError(f"mode must be one of {', '.join(LOAD_MODES)}, not {mode!r}")
    arrow = _as_arrow(data)
    cursor = conn.cursor()
    try:
        loaded = cursor.adbc_ingest(table_name, arrow, mode=mode)
    finally:
        cursor.close()
    if loaded is None or loaded < 0:
        loaded = getattr(arrow, "num_rows", -1)
    return loaded
