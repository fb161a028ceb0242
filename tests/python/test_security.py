"""Security through Flight SQL, against real `nyala serve` processes.

One module-wide server runs with TLS (a test CA and a leaf certificate for localhost and
127.0.0.1, made here with the `cryptography` package) and an administrator (`--user/--password`).
The tests check: TLS with ADBC and with pyarrow, plaintext clients refused; wrong passwords
refused; each privilege (SELECT, INSERT, UPDATE, DELETE, ALL) granted and revoked, with refused
statements changing nothing; ownership for DDL and GRANT/REVOKE; user management for the
administrator only; metadata (SHOW TABLES, information_schema, GetTables) listing only what a user
may see; views read with their owner's privileges; bulk ingest needing INSERT; password changes
and dropped users ending sessions; users surviving a restart with authentication staying on; and
passwords kept out of SHOW output, error messages and the web UI.

Each test makes its own users and tables, so they share the one server.
"""

import datetime
import html
import ipaddress
import itertools
import re
import types
import urllib.parse
import urllib.request

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flight_sql_messages import (
    any_message,
    decode_fields,
    length_delimited,
    statement_query,
    statement_update,
)
from nyala_server import host_port, nyala_serve

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
TLS_ROOTS = "adbc.flight.sql.client_option.tls_root_certs"
PERMISSION_DENIED = "PermissionDenied"  # how ADBC's Go driver names the gRPC code
UNAUTHENTICATED = "Unauthenticated"
SESSION_ENDED = "the session's user was dropped or its password changed: authenticate again"
INVALID_LOGIN = "invalid username or password"


# --- Certificates: a CA and a server certificate it signed ---

def _certificates():
    """(ca_pem, cert_pem, key_pem): a CA, and a leaf for DNS:localhost and IP:127.0.0.1 it
    signed (rustls refuses a self-signed CA certificate used directly as the server's)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    validity = dict(not_valid_before=now - datetime.timedelta(hours=1),
                    not_valid_after=now + datetime.timedelta(days=2))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Nyala test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity["not_valid_before"]).not_valid_after(validity["not_valid_after"])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity["not_valid_before"]).not_valid_after(validity["not_valid_after"])
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                     content_commitment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (
        ca.public_bytes(pem),
        cert.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca, cert, key = _certificates()
    paths = {}
    for name, data in (("ca.pem", ca), ("cert.pem", cert), ("key.pem", key)):
        (directory / name).write_bytes(data)
        paths[name] = str(directory / name)
    return types.SimpleNamespace(ca=ca, ca_path=paths["ca.pem"], cert=paths["cert.pem"],
                                 key=paths["key.pem"])


@pytest.fixture(scope="module")
def tls_server(pki):
    """The module's server: TLS, and the administrator ADMIN. `url` is the grpc+tls:// URL the
    server printed (127.0.0.1, which the certificate names too), `localhost_url` the same port by
    DNS name, `http` the web UI."""
    with nyala_serve("--user", ADMIN, "--password", ADMIN_PASSWORD,
                     "--tls-cert", pki.cert, "--tls-key", pki.key,
                     postgres=True) as (url, http, pg):
        assert url.startswith("grpc+tls://127.0.0.1:"), url
        assert http.startswith("http://"), http
        _, port = host_port(url)
        yield types.SimpleNamespace(url=url, localhost_url=f"grpc+tls://localhost:{port}",
                                    port=port, http=http, ca=pki.ca, pg=pg,
                                    ca_path=pki.ca_path)


# --- Clients ---

_numbers = itertools.count(1)


def unique(prefix):
    return f"{prefix}{next(_numbers)}"


def connect(server, user=ADMIN, password=ADMIN_PASSWORD, url=None):
    """An ADBC connection over TLS, trusting only the test CA."""
    return flightsql.connect(url or server.url, autocommit=True,
                             db_kwargs={TLS_ROOTS: server.ca.decode(), "username": user,
                                        "password": password})


def close(conn):
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a connection whose session the server ended
        pass


def run(conn, sql):
    """Runs `sql` on a cursor of its own; its rows (DDL: none, DML: [(count,)])."""
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def columns_and_rows(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return [d[0] for d in cur.description], cur.fetchall()


def refused(action, *needles, code=PERMISSION_DENIED):
    """Runs `action` (a callable, or SQL for `run` on a connection: `refused((conn, sql))`),
    which must fail with gRPC `code` and messages containing every needle; the error's text."""
    if isinstance(action, tuple):
        conn, sql = action
        action = lambda: run(conn, sql)  # noqa: E731
    with pytest.raises(flightsql.Error) as failure:
        action()
    text = str(failure.value)
    assert code in text, text
    for needle in needles:
        assert needle in text, text
    return text


def lacks(user, privilege, table, kind="table"):
    return f"permission denied: user {user} lacks the {privilege} privilege on {kind} {table}"


def not_owner(table, owner=ADMIN):
    return (f"permission denied: {table} belongs to {owner}; only its owner or the administrator "
            "may change it or grant privileges on it")


def not_admin(user):
    return f"permission denied: only the administrator manages users, and {user} is not it"


def grants(conn, user=None, table=None):
    """SHOW GRANTS as tuples, optionally only those of `user` and/or on `table`."""
    names, rows = columns_and_rows(conn, "SHOW GRANTS")
    assert names == ["object", "object_type", "user", "privilege", "owner"]
    return sorted(r for r in rows
                  if (user is None or r[2] == user) and (table is None or r[0] == table))


def bearer(server, user, password, url=None):
    """A pyarrow Flight client over TLS and the call options carrying `user`'s bearer token."""
    client = flight.FlightClient(url or server.url, tls_root_certs=server.ca)
    header = client.authenticate_basic_token(user, password)
    assert header[0].lower() == b"authorization" and header[1].startswith(b"Bearer "), header
    return client, flight.FlightCallOptions(headers=[header], timeout=30)


def flight_query(client, options, sql):
    info = client.get_flight_info(statement_query(sql), options)
    tables = [client.do_get(e.ticket, options).read_all() for e in info.endpoints]
    return pa.concat_tables(tables) if tables else info.schema.empty_table()


def flight_update(client, options, sql):
    writer, reader = client.do_put(statement_update(sql), pa.schema([]), options)
    writer.done_writing()
    result = reader.read()
    writer.close()
    return decode_fields(result.to_pybytes()).get(1, [0])[0]


def get_tables(client, options):
    """Flight SQL GetTables (all catalogs, schemas, tables and types): the table names."""
    command = flight.FlightDescriptor.for_command(any_message("CommandGetTables", b""))
    info = client.get_flight_info(command, options)
    table = pa.concat_tables(client.do_get(e.ticket, options).read_all() for e in info.endpoints)
    return set(table.column("table_name").to_pylist())


def adbc_objects(conn):
    """The table and view names ADBC's GetObjects (GetTables underneath) lists."""
    names = set()
    for catalog in conn.adbc_get_objects(depth="tables").read_all().to_pylist():
        for schema in catalog["catalog_db_schemas"] or []:
            names.update(t["table_name"] for t in schema["db_schema_tables"] or [])
    return names


# --- Fixtures: the administrator's connection, users, tables ---

@pytest.fixture(scope="module")
def admin(tls_server):
    conn = connect(tls_server)
    yield conn
    close(conn)


@pytest.fixture
def user(tls_server, admin):
    """Makes users: `user("bob")` creates a fresh user named bob<n> and returns
    (name, password, connection logged in as it)."""
    opened = []

    def make(prefix="user"):
        name = unique(prefix)
        password = f"{name}-Pass-{len(name)}"
        run(admin, f"CREATE USER {name} WITH PASSWORD '{password}'")
        conn = connect(tls_server, name, password)
        opened.append(conn)
        return name, password, conn

    yield make
    for conn in opened:
        close(conn)


ROWS = [(1, "one"), (2, "two"), (3, "three")]


def create_table(conn, name, rows=ROWS):
    run(conn, f"CREATE TABLE {name} (k BIGINT PRIMARY KEY, v STRING) "
              "DISTRIBUTE BY HASH (k) INTO 2 BUCKETS")
    if rows:
        values = ", ".join(f"({k}, '{v}')" for k, v in rows)
        assert run(conn, f"INSERT INTO {name} VALUES {values}") == [(len(rows),)]


@pytest.fixture
def table(admin, table_name):
    """A fresh table of the administrator holding ROWS."""
    create_table(admin, table_name)
    return table_name


def contents(admin, table):
    return run(admin, f"SELECT k, v FROM {table} ORDER BY k")


# --- TLS ---

def test_tls_with_adbc(tls_server, table_name):
    for url in (tls_server.url, tls_server.localhost_url):
        conn = connect(tls_server, url=url)
        try:
            assert run(conn, "SELECT 40 + 2 AS answer") == [(42,)]
        finally:
            close(conn)
    conn = connect(tls_server, url=tls_server.localhost_url)
    try:
        create_table(conn, table_name)
        assert run(conn, f"UPDATE {table_name} SET v = 'uno' WHERE k = 1") == [(1,)]
        assert contents(conn, table_name) == [(1, "uno"), (2, "two"), (3, "three")]
    finally:
        close(conn)


def test_tls_with_pyarrow(tls_server, table_name):
    client, options = bearer(tls_server, ADMIN, ADMIN_PASSWORD, url=tls_server.localhost_url)
    try:
        assert flight_update(client, options, f"CREATE TABLE {table_name} (k BIGINT PRIMARY KEY, "
                                              "v STRING) DISTRIBUTE BY HASH (k) INTO 4 BUCKETS") == 0
        values = ", ".join(f"({i}, 'v{i}')" for i in range(100))
        assert flight_update(client, options, f"INSERT INTO {table_name} VALUES {values}") == 100

        # A plain scan has one endpoint per tablet, each located at the server's TLS address;
        # each is read on a connection of its own to that location, with the bearer token.
        info = client.get_flight_info(statement_query(f"SELECT k, v FROM {table_name}"), options)
        assert len(info.endpoints) == 4
        seen = []
        for endpoint in info.endpoints:
            locations = [loc.uri.decode() for loc in endpoint.locations]
            assert locations == [f"grpc+tls://127.0.0.1:{tls_server.port}"], locations
            reader = flight.FlightClient(locations[0], tls_root_certs=tls_server.ca)
            try:
                seen += reader.do_get(endpoint.ticket, options).read_all().column("k").to_pylist()
            finally:
                reader.close()
        assert sorted(seen) == list(range(100))
        count = flight_query(client, options, f"SELECT count(*) AS n FROM {table_name}")
        assert count.column("n").to_pylist() == [100]

        forged = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer 0123456789abcdef")],
                                          timeout=30)
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.get_flight_info(statement_query("SELECT 1"), forged)
    finally:
        client.close()


def test_plaintext_clients_are_refused(tls_server):
    host, port = host_port(tls_server.url)
    # ADBC over plaintext gRPC: the handshake fails.
    with pytest.raises(flightsql.Error):
        conn = flightsql.connect(f"grpc://{host}:{port}", autocommit=True,
                                 db_kwargs={"username": ADMIN, "password": ADMIN_PASSWORD})
        try:
            run(conn, "SELECT 1")
        finally:
            close(conn)
    # pyarrow over plaintext: neither a handshake nor an anonymous call gets through.
    plain = flight.FlightClient(f"grpc+tcp://{host}:{port}")
    try:
        options = flight.FlightCallOptions(timeout=10)
        with pytest.raises((flight.FlightError, pa.ArrowException)):
            plain.authenticate_basic_token(ADMIN, ADMIN_PASSWORD, options)
        with pytest.raises((flight.FlightError, pa.ArrowException)):
            plain.get_flight_info(statement_query("SELECT 1"), options)
    finally:
        plain.close()
    # TLS without trusting the test CA: the server's certificate is not accepted.
    untrusting = flight.FlightClient(tls_server.url)
    try:
        with pytest.raises((flight.FlightError, pa.ArrowException)):
            untrusting.authenticate_basic_token(ADMIN, ADMIN_PASSWORD,
                                                flight.FlightCallOptions(timeout=10))
    finally:
        untrusting.close()


# --- Authentication ---

def test_postgres_clients_need_tls_and_a_password(tls_server):
    """The PostgreSQL protocol of a TLS server: a client that verifies the certificate and
    logs in with SCRAM-SHA-256 gets in; plaintext and a wrong password are refused."""
    import psycopg
    host, port = tls_server.pg
    secure = dict(host="localhost", port=port, dbname="nyala", user=ADMIN,
                  sslmode="verify-full", sslrootcert=tls_server.ca_path)
    with psycopg.connect(password=ADMIN_PASSWORD, autocommit=True, **secure) as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT 6 * 7").fetchone() == (42,)
    with pytest.raises(psycopg.OperationalError, match="(?i)password authentication"):
        psycopg.connect(password="wrong password", **secure)
    with pytest.raises(psycopg.OperationalError, match="only TLS connections"):
        psycopg.connect(host=host, port=port, dbname="nyala", user=ADMIN,
                        password=ADMIN_PASSWORD, sslmode="disable")


def test_wrong_password_and_unknown_user_are_refused(tls_server, user):
    name, password, _ = user("pw")
    for who, wrong in ((ADMIN, "not-the-password"),
                       (name, password + "-wrong"),
                       (name, password.upper()),
                       ("nosuchuser", ADMIN_PASSWORD)):
        refused(lambda: run(connect(tls_server, who, wrong), "SELECT 1"),  # noqa: B023
                INVALID_LOGIN, code=UNAUTHENTICATED)
        client = flight.FlightClient(tls_server.url, tls_root_certs=tls_server.ca)
        try:
            with pytest.raises(flight.FlightUnauthenticatedError, match=INVALID_LOGIN):
                client.authenticate_basic_token(who, wrong)
        finally:
            client.close()
    # Without credentials nothing runs.
    anonymous = flightsql.connect(tls_server.url, autocommit=True,
                                  db_kwargs={TLS_ROOTS: tls_server.ca.decode()})
    try:
        refused((anonymous, "SELECT 1"), "authentication required", code=UNAUTHENTICATED)
    finally:
        close(anonymous)
    client = flight.FlightClient(tls_server.url, tls_root_certs=tls_server.ca)
    try:
        with pytest.raises(flight.FlightUnauthenticatedError, match="authentication required"):
            client.get_flight_info(statement_query("SELECT 1"),
                                   flight.FlightCallOptions(timeout=30))
    finally:
        client.close()
    # The right password still works.
    conn = connect(tls_server, name, password)
    try:
        assert run(conn, "SELECT 1 AS one") == [(1,)]
    finally:
        close(conn)


def test_login_whose_basic_header_needs_base64_padding(tls_server, admin):
    """ADBC (arrow-go) encodes `user:password` as base64 without `=` padding; the server must
    accept that as well as the padded form pyarrow and JDBC send."""
    name = unique("pad")
    password = f"{name}-Padding-Secret"
    while (len(name) + 1 + len(password)) % 3 != 1:  # base64 of `name:password` ends in "=="
        password += "y"
    assert (len(name) + 1 + len(password)) % 3 == 1
    run(admin, f"CREATE USER {name} WITH PASSWORD '{password}'")
    client, _ = bearer(tls_server, name, password)  # pyarrow pads: accepted
    client.close()
    conn = connect(tls_server, name, password)
    try:
        assert run(conn, "SELECT 1 AS one") == [(1,)]
    finally:
        close(conn)
    # A wrong password of such a length is a wrong password, not a malformed header.
    refused(lambda: run(connect(tls_server, name, password + "z"), "SELECT 1"),
            INVALID_LOGIN, code=UNAUTHENTICATED)


# --- Privileges ---

def test_tail_needs_the_select_privilege(admin, user):
    """tail('q', ...) reads the queue table it names, so it needs SELECT on it."""
    name, _, conn = user("tailer")
    queue = unique("queue")
    run(admin, f"CREATE TABLE {queue} (k STRING, pos BIGINT GENERATED ALWAYS AS POSITION, "
               "body STRING, PRIMARY KEY (k, pos))")
    run(admin, f"INSERT INTO {queue} (k, body) VALUES ('a', 'secret')")
    read = f"SELECT body FROM tail('{queue}', 0, 0) WHERE k = 'a'"
    refused((conn, read), lacks(name, "SELECT", queue))
    run(admin, f"GRANT SELECT ON {queue} TO {name}")
    assert run(conn, read) == [("secret",)]


def test_select_privilege(admin, user, table):
    name, _, conn = user("reader")
    own = unique("own")
    create_table(conn, own, rows=[(1, "mine")])  # a table of its own to join with
    reads = [
        f"SELECT k, v FROM {table} ORDER BY k",
        f"SELECT k, v FROM {table} AS OF now() ORDER BY k",
        f"SELECT k, v FROM nyala_as_of('{table}', now()) ORDER BY k",
        f"SELECT t.k, t.v FROM {own} o JOIN {table} t ON o.k = t.k ORDER BY t.k",
        f"SELECT k, v FROM {own} WHERE k IN (SELECT k FROM {table}) ORDER BY k",
        f"SELECT k, v FROM (SELECT k, v FROM {table}) s ORDER BY k",
        f"SELECT 1 AS one WHERE EXISTS (SELECT 1 FROM {table})",
        f"SELECT count(*) AS n FROM {table}",
    ]
    for sql in reads:
        refused((conn, sql), lacks(name, "SELECT", table))

    run(admin, f"GRANT SELECT ON {table} TO {name}")
    assert grants(admin, name, table) == [(table, "TABLE", name, "SELECT", ADMIN)]
    assert grants(conn, name, table) == [(table, "TABLE", name, "SELECT", ADMIN)]
    results = [run(conn, sql) for sql in reads]
    assert results[:3] == [ROWS] * 3
    assert results[3:6] == [[(1, "one")], [(1, "mine")], ROWS]
    assert results[6:] == [[(1,)], [(3,)]]
    # SELECT grants reading only.
    refused((conn, f"INSERT INTO {table} VALUES (9, 'nine')"), lacks(name, "INSERT", table))
    refused((conn, f"DELETE FROM {table}"), lacks(name, "DELETE", table))

    run(admin, f"REVOKE SELECT ON TABLE {table} FROM {name}")
    assert grants(admin, name, table) == []
    for sql in reads:
        refused((conn, sql), lacks(name, "SELECT", table))
    assert contents(admin, table) == ROWS


def test_insert_privilege(admin, user, table):
    name, _, conn = user("inserter")
    refused((conn, f"INSERT INTO {table} VALUES (4, 'four')"), lacks(name, "INSERT", table))
    refused((conn, f"INSERT INTO {table} SELECT k + 10, v FROM {table}"),
            f"permission denied: user {name} lacks the")
    assert contents(admin, table) == ROWS

    run(admin, f"GRANT INSERT ON TABLE {table} TO {name}")
    assert grants(admin, name, table) == [(table, "TABLE", name, "INSERT", ADMIN)]
    assert run(conn, f"INSERT INTO {table} VALUES (4, 'four'), (5, 'five')") == [(2,)]
    assert contents(admin, table) == ROWS + [(4, "four"), (5, "five")]
    # INSERT grants neither reading nor changing rows.
    refused((conn, f"SELECT * FROM {table}"), lacks(name, "SELECT", table))
    refused((conn, f"UPDATE {table} SET v = 'x'"), lacks(name, "UPDATE", table))
    refused((conn, f"DELETE FROM {table} WHERE k = 4"), lacks(name, "DELETE", table))
    assert contents(admin, table) == ROWS + [(4, "four"), (5, "five")]

    run(admin, f"REVOKE INSERT ON {table} FROM {name}")
    refused((conn, f"INSERT INTO {table} VALUES (6, 'six')"), lacks(name, "INSERT", table))
    assert contents(admin, table) == ROWS + [(4, "four"), (5, "five")]


def test_update_privilege(admin, user, table):
    name, _, conn = user("updater")
    refused((conn, f"UPDATE {table} SET v = 'changed' WHERE k = 1"), lacks(name, "UPDATE", table))
    refused((conn, f"UPDATE {table} SET v = 'changed'"), lacks(name, "UPDATE", table))
    assert contents(admin, table) == ROWS

    run(admin, f"GRANT UPDATE ON {table} TO {name}")
    assert run(conn, f"UPDATE {table} SET v = 'changed' WHERE k = 1") == [(1,)]
    assert contents(admin, table) == [(1, "changed"), (2, "two"), (3, "three")]
    refused((conn, f"INSERT INTO {table} VALUES (4, 'four')"), lacks(name, "INSERT", table))
    refused((conn, f"DELETE FROM {table}"), lacks(name, "DELETE", table))

    run(admin, f"REVOKE UPDATE ON {table} FROM {name}")
    refused((conn, f"UPDATE {table} SET v = 'again'"), lacks(name, "UPDATE", table))
    assert contents(admin, table) == [(1, "changed"), (2, "two"), (3, "three")]


def test_delete_privilege(admin, user, table):
    name, _, conn = user("deleter")
    refused((conn, f"DELETE FROM {table} WHERE k = 1"), lacks(name, "DELETE", table))
    refused((conn, f"DELETE FROM {table}"), lacks(name, "DELETE", table))
    assert contents(admin, table) == ROWS

    run(admin, f"GRANT DELETE ON {table} TO {name}")
    assert run(conn, f"DELETE FROM {table} WHERE k = 1") == [(1,)]
    assert contents(admin, table) == ROWS[1:]
    refused((conn, f"UPDATE {table} SET v = 'x'"), lacks(name, "UPDATE", table))

    run(admin, f"REVOKE DELETE ON {table} FROM {name}")
    refused((conn, f"DELETE FROM {table}"), lacks(name, "DELETE", table))
    assert contents(admin, table) == ROWS[1:]


def test_reading_the_dml_target_needs_select(admin, user, table):
    """A statement that reads its own target table (INSERT ... SELECT, a subquery) needs SELECT
    on it, as any other read does: INSERT, UPDATE and DELETE alone do not let a user copy the
    rows around or probe them."""
    name, _, conn = user("selfreader")
    run(admin, f"GRANT INSERT, UPDATE, DELETE ON {table} TO {name}")
    for sql in (f"INSERT INTO {table} SELECT k + 10, v FROM {table}",
                f"UPSERT INTO {table} SELECT k, v || '!' FROM {table}",
                f"UPDATE {table} SET v = (SELECT max(v) FROM {table})",
                f"DELETE FROM {table} WHERE k IN (SELECT k FROM {table} WHERE v = 'two')",
                f"DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM {table} WHERE v LIKE 't%')"):
        refused((conn, sql), lacks(name, "SELECT", table))
        assert contents(admin, table) == ROWS, sql


def test_upsert_needs_insert_and_update(admin, user, table):
    name, _, conn = user("upserter")
    upsert = f"UPSERT INTO {table} VALUES (1, 'uno'), (7, 'seven')"
    refused((conn, upsert), lacks(name, "INSERT", table))
    run(admin, f"GRANT INSERT ON {table} TO {name}")
    refused((conn, upsert), lacks(name, "UPDATE", table))
    run(admin, f"REVOKE INSERT ON {table} FROM {name}")
    run(admin, f"GRANT UPDATE ON {table} TO {name}")
    refused((conn, upsert), lacks(name, "INSERT", table))
    assert contents(admin, table) == ROWS

    run(admin, f"GRANT INSERT ON {table} TO {name}")
    assert run(conn, upsert) == [(2,)]
    assert contents(admin, table) == [(1, "uno"), (2, "two"), (3, "three"), (7, "seven")]


def test_all_privileges(admin, user, table):
    name, _, conn = user("all")
    statements = [
        (f"SELECT k, v FROM {table} WHERE k = 1", "SELECT"),
        (f"INSERT INTO {table} VALUES (4, 'four')", "INSERT"),
        (f"UPDATE {table} SET v = 'UNO' WHERE k = 1", "UPDATE"),
        (f"DELETE FROM {table} WHERE k = 2", "DELETE"),
    ]
    for sql, privilege in statements:
        refused((conn, sql), lacks(name, privilege, table))
    assert contents(admin, table) == ROWS

    run(admin, f"GRANT ALL PRIVILEGES ON TABLE {table} TO {name}")
    assert grants(admin, name, table) == sorted(
        (table, "TABLE", name, p, ADMIN) for p in ("SELECT", "INSERT", "UPDATE", "DELETE"))
    # The owner shows as OWNER, granted by nobody.
    assert grants(admin, ADMIN, table) == [(table, "TABLE", ADMIN, "OWNER", "")]
    assert [run(conn, sql) for sql, _ in statements] == [[(1, "one")], [(1,)], [(1,)], [(1,)]]
    assert contents(admin, table) == [(1, "UNO"), (3, "three"), (4, "four")]

    run(admin, f"REVOKE ALL ON {table} FROM {name}")
    assert grants(admin, name, table) == []
    for sql, privilege in statements:
        refused((conn, sql), lacks(name, privilege, table))
    assert contents(admin, table) == [(1, "UNO"), (3, "three"), (4, "four")]

    # ALL without PRIVILEGES, and lists of privileges.
    run(admin, f"GRANT ALL ON {table} TO {name}")
    assert len(grants(admin, name, table)) == 4
    run(admin, f"REVOKE INSERT, UPDATE ON TABLE {table} FROM {name}")
    assert [g[3] for g in grants(admin, name, table)] == ["DELETE", "SELECT"]
    run(admin, f"REVOKE ALL PRIVILEGES ON {table} FROM {name}")
    run(admin, f"GRANT SELECT, DELETE ON {table} TO {name}")
    assert [g[3] for g in grants(admin, name, table)] == ["DELETE", "SELECT"]
    refused((conn, f"INSERT INTO {table} VALUES (5, 'five')"), lacks(name, "INSERT", table))


# --- Ownership ---

def test_ddl_and_grants_need_ownership(admin, user, table):
    name, _, conn = user("nonowner")
    other, other_password, other_conn = user("other")
    run(admin, f"GRANT ALL ON {table} TO {name}")
    # All privileges on a table are no ownership of it.
    for sql in (f"DROP TABLE {table}",
                f"ALTER TABLE {table} ADD COLUMN w BIGINT",
                f"GRANT SELECT ON {table} TO {other}",
                f"REVOKE SELECT ON {table} FROM {name}"):
        refused((conn, sql), not_owner(table))
    assert contents(admin, table) == ROWS
    assert columns_and_rows(admin, f"SELECT * FROM {table}")[0] == ["k", "v"]
    assert grants(admin, other) == []
    assert len(grants(admin, name, table)) == 4

    # The creator of a table owns it: may change it, grant and revoke on it.
    own = unique("owned")
    create_table(conn, own)
    assert grants(conn, table=own) == [(own, "TABLE", name, "OWNER", "")]
    refused((other_conn, f"SELECT * FROM {own}"), lacks(other, "SELECT", own))
    run(conn, f"GRANT SELECT ON {own} TO {other}")
    assert grants(admin, other, own) == [(own, "TABLE", other, "SELECT", name)]
    assert contents(other_conn, own) == ROWS
    # A grantee may read but not administer it.
    for sql in (f"DROP TABLE {own}", f"GRANT SELECT ON {own} TO {other}",
                f"ALTER TABLE {own} ADD COLUMN w BIGINT"):
        refused((other_conn, sql), not_owner(own, name))
    run(conn, f"REVOKE SELECT ON {own} FROM {other}")
    refused((other_conn, f"SELECT * FROM {own}"), lacks(other, "SELECT", own))
    run(conn, f"ALTER TABLE {own} ADD COLUMN w BIGINT")
    assert columns_and_rows(conn, f"SELECT * FROM {own}")[0] == ["k", "v", "w"]

    # The administrator may do everything on anybody's table.
    run(admin, f"GRANT INSERT ON {own} TO {other}")
    assert run(other_conn, f"INSERT INTO {own} VALUES (10, 'ten', 100)") == [(1,)]
    run(admin, f"REVOKE INSERT ON {own} FROM {other}")
    assert run(admin, f"SELECT k, v, w FROM {own} WHERE k = 10") == [(10, "ten", 100)]
    run(admin, f"DROP TABLE {own}")
    assert grants(admin, table=own) == []

    # A table the user owns may be dropped by it.
    mine = unique("mine")
    create_table(conn, mine)
    run(conn, f"DROP TABLE {mine}")
    refused((admin, f"SELECT * FROM {mine}"), mine, code="InvalidArgument")


# --- User management ---

def test_only_the_administrator_manages_users(tls_server, admin, user):
    name, password, conn = user("plain")
    other, other_password, other_conn = user("victim")
    new_user = unique("made")
    refused((conn, f"CREATE USER {new_user} WITH PASSWORD 'Made-Pass-1'"),
            not_admin(name))
    refused((conn, f"CREATE USER IF NOT EXISTS {new_user} WITH PASSWORD 'Made-Pass-1'"),
            not_admin(name))
    refused((conn, f"DROP USER {other}"), not_admin(name))
    refused((conn, f"DROP USER IF EXISTS {other}"), not_admin(name))
    refused((conn, f"DROP USER {ADMIN}"), not_admin(name))
    refused((conn, f"ALTER USER {other} WITH PASSWORD 'Hijacked-99'"),
            f"permission denied: only the administrator changes the password of {other}")
    refused((conn, f"ALTER USER {ADMIN} WITH PASSWORD 'Hijacked-99'"),
            f"permission denied: only the administrator changes the password of {ADMIN}")
    # Nothing changed: the victim's session and password still work, no user was made.
    assert run(other_conn, "SELECT 1 AS one") == [(1,)]
    close(connect(tls_server, other, other_password))
    refused(lambda: run(connect(tls_server, new_user, "Made-Pass-1"), "SELECT 1"),
            INVALID_LOGIN, code=UNAUTHENTICATED)

    # The administrator's own rules.
    run(admin, f"CREATE USER IF NOT EXISTS {other} WITH PASSWORD 'Ignored-Pass-1'")
    close(connect(tls_server, other, other_password))  # the password did not change
    refused((admin, f"CREATE USER {other} WITH PASSWORD 'Another-Pass-1'"),
            f"user {other} exists already", code="InvalidArgument")
    run(admin, "DROP USER IF EXISTS nosuchuser")
    refused((admin, "DROP USER nosuchuser"), "no user nosuchuser", code="InvalidArgument")
    refused((admin, "ALTER USER nosuchuser WITH PASSWORD 'Whatever-1'"), "no user nosuchuser",
            code="InvalidArgument")
    refused((admin, f"DROP USER {ADMIN}"), "the administrator cannot be dropped",
            code="InvalidArgument")
    text = refused((admin, f"CREATE USER {unique('short')} WITH PASSWORD 'Pw7-abc'"),
                   "a password needs at least 8 characters", code="InvalidArgument")
    assert "Pw7-abc" not in text
    text = refused((admin, f"ALTER USER {other} WITH PASSWORD 'Pw7-xyz'"),
                   "a password needs at least 8 characters", code="InvalidArgument")
    assert "Pw7-xyz" not in text
    close(connect(tls_server, other, other_password))

    # A user who owns tables cannot be dropped until they are gone; its grants go with it.
    owned = unique("owned")
    create_table(conn, owned)
    table = unique("granted")
    create_table(admin, table)
    run(admin, f"GRANT SELECT ON {table} TO {name}")
    refused((admin, f"DROP USER {name}"), f"user {name} owns {owned}: drop them first",
            code="InvalidArgument")
    assert run(conn, "SELECT 1 AS one") == [(1,)]
    run(admin, f"DROP TABLE {owned}")
    run(admin, f"DROP USER {name}")
    assert grants(admin, name) == []
    refused(lambda: run(connect(tls_server, name, password), "SELECT 1"), INVALID_LOGIN,
            code=UNAUTHENTICATED)
    # A new user of the same name inherits nothing.
    run(admin, f"CREATE USER {name} WITH PASSWORD '{password}'")
    again = connect(tls_server, name, password)
    try:
        refused((again, f"SELECT * FROM {table}"), lacks(name, "SELECT", table))
    finally:
        close(again)


# --- Metadata ---

@pytest.fixture(scope="module")
def visibility(tls_server, admin):
    """A user who sees some tables: `seen` (SELECT granted), `insert_only` (INSERT granted),
    `view` (a view with SELECT granted), `own` (its own table); `hidden` and `hidden_view` it has
    no privilege on."""
    name = unique("viewer")
    password = f"{name}-Pass-xyz"
    run(admin, f"CREATE USER {name} WITH PASSWORD '{password}'")
    names = {k: unique(f"vis_{k}_") for k in ("seen", "insert_only", "hidden", "view",
                                              "hidden_view", "own")}
    for k in ("seen", "insert_only", "hidden"):
        create_table(admin, names[k])
    run(admin, f"CREATE VIEW {names['view']} AS SELECT k FROM {names['hidden']}")
    run(admin, f"CREATE VIEW {names['hidden_view']} AS SELECT k FROM {names['seen']}")
    run(admin, f"GRANT SELECT ON {names['seen']} TO {name}")
    run(admin, f"GRANT INSERT ON {names['insert_only']} TO {name}")
    run(admin, f"GRANT SELECT ON {names['view']} TO {name}")
    conn = connect(tls_server, name, password)
    create_table(conn, names["own"])
    yield types.SimpleNamespace(
        name=name, password=password, conn=conn, tables=names,
        visible={names[k] for k in ("seen", "insert_only", "view", "own")},
        invisible={names[k] for k in ("hidden", "hidden_view")})
    close(conn)


def test_show_tables_and_information_schema_list_only_visible_tables(admin, visibility):
    conn = visibility.conn
    assert {r[0] for r in run(conn, "SHOW TABLES")} == visibility.visible
    listed = run(conn, "SELECT table_name FROM information_schema.tables "
                       "WHERE table_schema = 'public'")
    assert {r[0] for r in listed} == visibility.visible
    hidden = visibility.tables["hidden"]
    assert run(conn, "SELECT column_name FROM information_schema.columns "
                     f"WHERE table_name = '{hidden}'") == []
    assert run(conn, "SELECT table_name FROM information_schema.views "
                     f"WHERE table_name = '{visibility.tables['hidden_view']}'") == []
    # The administrator sees everything.
    everything = visibility.visible | visibility.invisible
    assert everything <= {r[0] for r in run(admin, "SHOW TABLES")}
    assert everything <= {r[0] for r in run(admin, "SELECT table_name FROM "
                                                   "information_schema.tables")}


def test_get_tables_lists_only_visible_tables(tls_server, admin, visibility):
    conn = visibility.conn
    assert adbc_objects(conn) == visibility.visible
    client, options = bearer(tls_server, visibility.name, visibility.password)
    try:
        assert get_tables(client, options) == visibility.visible
    finally:
        client.close()
    # ADBC asks GetTables (with schemas) for a table's schema.
    seen = visibility.tables["seen"]
    assert conn.adbc_get_table_schema(seen).names == ["k", "v"]
    with pytest.raises(flightsql.Error):
        conn.adbc_get_table_schema(visibility.tables["hidden"])
    # The administrator sees everything.
    everything = visibility.visible | visibility.invisible
    assert everything <= adbc_objects(admin)
    client, options = bearer(tls_server, ADMIN, ADMIN_PASSWORD)
    try:
        assert everything <= get_tables(client, options)
    finally:
        client.close()


def test_primary_keys_of_an_invisible_table_are_not_listed(tls_server, visibility):
    """GetPrimaryKeys must not describe a table the user may not see (its key columns)."""
    client, options = bearer(tls_server, visibility.name, visibility.password)
    try:
        def keys(table):
            command = flight.FlightDescriptor.for_command(
                any_message("CommandGetPrimaryKeys", length_delimited(3, table)))
            info = client.get_flight_info(command, options)
            return [r["column_name"] for e in info.endpoints
                    for r in client.do_get(e.ticket, options).read_all().to_pylist()]

        assert keys(visibility.tables["seen"]) == ["k"]
        try:
            hidden = keys(visibility.tables["hidden"])
        except flight.FlightUnauthorizedError:
            hidden = []
        assert hidden == []
    finally:
        client.close()


def test_statements_describing_an_invisible_table_are_refused(visibility):
    conn, name = visibility.conn, visibility.name
    hidden = visibility.tables["hidden"]
    for sql in (f"DESCRIBE {hidden}", f"SHOW COLUMNS FROM {hidden}",
                f"EXPLAIN SELECT * FROM {hidden}"):
        refused((conn, sql), f"permission denied: user {name}", hidden)


# --- Views ---

def test_a_view_is_read_with_its_owners_privileges(admin, user, table):
    owner, _, owner_conn = user("viewowner")
    reader, _, reader_conn = user("viewreader")
    view = unique("v")
    # Creating a view over a table needs SELECT on it.
    refused((owner_conn, f"CREATE VIEW {view} AS SELECT k, v FROM {table} WHERE k > 1"),
            lacks(owner, "SELECT", table))
    run(admin, f"GRANT SELECT ON {table} TO {owner}")
    run(owner_conn, f"CREATE VIEW {view} AS SELECT k, v FROM {table} WHERE k > 1")
    assert grants(admin, table=view) == [(view, "VIEW", owner, "OWNER", "")]

    refused((reader_conn, f"SELECT * FROM {view}"), lacks(reader, "SELECT", view, kind="view"))
    run(owner_conn, f"GRANT SELECT ON {view} TO {reader}")
    # SELECT on the view suffices; the table stays closed to the reader.
    assert run(reader_conn, f"SELECT k, v FROM {view} ORDER BY k") == ROWS[1:]
    assert run(reader_conn, f"SELECT count(*) FROM {view} WHERE v = 'two'") == [(1,)]
    refused((reader_conn, f"SELECT * FROM {table}"), lacks(reader, "SELECT", table))
    refused((reader_conn, f"INSERT INTO {table} VALUES (9, 'nine')"),
            lacks(reader, "INSERT", table))
    # The reader cannot widen its access with a view of its own.
    sneaky = unique("sneaky")
    refused((reader_conn, f"CREATE VIEW {sneaky} AS SELECT * FROM {table}"),
            lacks(reader, "SELECT", table))
    refused((reader_conn, f"SELECT * FROM {sneaky}"), sneaky, code="InvalidArgument")

    # Once the owner loses SELECT on the table, its view cannot be read by anyone it granted.
    run(admin, f"REVOKE SELECT ON {table} FROM {owner}")
    lost = f"permission denied: view {view} cannot be read: user {owner} lacks the SELECT privilege on table {table}"
    refused((reader_conn, f"SELECT * FROM {view}"), lost)
    refused((owner_conn, f"SELECT * FROM {view}"), lost)
    run(admin, f"GRANT SELECT ON {table} TO {owner}")
    assert run(reader_conn, f"SELECT k FROM {view} ORDER BY k") == [(2,), (3,)]

    # A view of the administrator's over the table: SELECT on the view is enough as well.
    admin_view = unique("av")
    run(admin, f"CREATE VIEW {admin_view} AS SELECT k FROM {table} WHERE k = 1")
    run(admin, f"GRANT SELECT ON {admin_view} TO {reader}")
    assert run(reader_conn, f"SELECT k FROM {admin_view}") == [(1,)]
    run(admin, f"REVOKE SELECT ON {view} FROM {reader}")
    refused((reader_conn, f"SELECT * FROM {view}"), lacks(reader, "SELECT", view, kind="view"))
    # Views are owned like tables: only the owner (or the administrator) drops them.
    refused((reader_conn, f"DROP VIEW {admin_view}"), not_owner(admin_view))
    run(owner_conn, f"DROP VIEW {view}")
    run(admin, f"DROP VIEW {admin_view}")


# --- Bulk ingest ---

def test_bulk_ingest_needs_insert(admin, user, table):
    name, _, conn = user("ingester")
    data = pa.table({"k": pa.array([10, 11], pa.int64()), "v": pa.array(["ten", "eleven"])})

    def ingest(target, mode="append"):
        with conn.cursor() as cur:
            return cur.adbc_ingest(target, data, mode=mode)

    refused(lambda: ingest(table), lacks(name, "INSERT", table))
    assert contents(admin, table) == ROWS
    run(admin, f"GRANT INSERT ON {table} TO {name}")
    assert ingest(table) in (2, -1)
    assert contents(admin, table) == ROWS + [(10, "ten"), (11, "eleven")]
    run(admin, f"REVOKE INSERT ON {table} FROM {name}")
    data = pa.table({"k": pa.array([12], pa.int64()), "v": pa.array(["twelve"])})
    refused(lambda: ingest(table), lacks(name, "INSERT", table))
    assert contents(admin, table) == ROWS + [(10, "ten"), (11, "eleven")]

    # A table an ingest creates belongs to the ingesting user.
    created = unique("ingested")
    ingest(created, mode="create")
    assert grants(admin, table=created) == [(created, "TABLE", name, "OWNER", "")]
    assert run(conn, f"SELECT k, v FROM {created}") == [(12, "twelve")]


# --- Sessions end with a password change or a dropped user ---

def test_a_password_change_ends_the_users_sessions(tls_server, admin, user):
    name, password, conn = user("changer")
    bystander, _, bystander_conn = user("bystander")
    assert run(conn, "SELECT 1 AS one") == [(1,)]
    client, options = bearer(tls_server, name, password)
    try:
        assert flight_query(client, options, "SELECT 2 AS two").column("two").to_pylist() == [2]
        new_password = f"{name}-Changed-1"
        run(admin, f"ALTER USER {name} WITH PASSWORD '{new_password}'")
        refused((conn, "SELECT 1"), SESSION_ENDED, code=UNAUTHENTICATED)
        with pytest.raises(flight.FlightUnauthenticatedError, match="authenticate again"):
            flight_query(client, options, "SELECT 2 AS two")
    finally:
        client.close()
    # Other users' sessions go on.
    assert run(bystander_conn, "SELECT 3 AS three") == [(3,)]
    refused(lambda: run(connect(tls_server, name, password), "SELECT 1"), INVALID_LOGIN,
            code=UNAUTHENTICATED)
    fresh = connect(tls_server, name, new_password)
    try:
        assert run(fresh, "SELECT 4 AS four") == [(4,)]
        # A user may change its own password: the session that changed it goes on, the
        # user's other sessions end.
        other = connect(tls_server, name, new_password)
        try:
            assert run(other, "SELECT 5 AS five") == [(5,)]
            newest = f"{name}-Changed-2"
            run(fresh, f"ALTER USER {name} WITH PASSWORD '{newest}'")
            assert run(fresh, "SELECT 1 AS one") == [(1,)]
            refused((other, "SELECT 1"), "authenticate again", code=UNAUTHENTICATED)
        finally:
            close(other)
    finally:
        close(fresh)
    refused(lambda: run(connect(tls_server, name, new_password), "SELECT 1"), INVALID_LOGIN,
            code=UNAUTHENTICATED)
    latest = connect(tls_server, name, newest)
    try:
        assert run(latest, "SELECT 5 AS five") == [(5,)]
    finally:
        close(latest)


def test_dropping_a_user_ends_its_sessions(tls_server, admin, user):
    name, password, conn = user("doomed")
    client, options = bearer(tls_server, name, password)
    try:
        assert run(conn, "SELECT 1 AS one") == [(1,)]
        run(admin, f"DROP USER {name}")
        refused((conn, "SELECT 1"), SESSION_ENDED, code=UNAUTHENTICATED)
        with pytest.raises(flight.FlightUnauthenticatedError, match="authenticate again"):
            flight_query(client, options, "SELECT 1 AS one")
    finally:
        client.close()
    refused(lambda: run(connect(tls_server, name, password), "SELECT 1"), INVALID_LOGIN,
            code=UNAUTHENTICATED)


# --- Users survive a restart ---

def test_users_survive_a_restart_and_authentication_stays_on(tmp_path):
    data_dir = str(tmp_path / "data")
    name, password = "survivor", "Survivor-Pass"
    table = "kept"

    def login(url, who, secret):
        return flightsql.connect(url, autocommit=True,
                                 db_kwargs={"username": who, "password": secret})

    with nyala_serve("--user", ADMIN, "--password", ADMIN_PASSWORD, data_dir=data_dir) as (url, _):
        admin = login(url, ADMIN, ADMIN_PASSWORD)
        try:
            run(admin, f"CREATE USER {name} WITH PASSWORD '{password}'")
            create_table(admin, table)
            run(admin, f"GRANT SELECT ON {table} TO {name}")
            before = grants(admin)
        finally:
            close(admin)

    # Restarted without --user: authentication stays on, the users and grants are kept.
    with nyala_serve(data_dir=data_dir) as (url, _):
        anonymous = flightsql.connect(url, autocommit=True)
        try:
            refused((anonymous, "SELECT 1"), "authentication required", code=UNAUTHENTICATED)
            refused((anonymous, f"SELECT * FROM {table}"), "authentication required",
                    code=UNAUTHENTICATED)
        finally:
            close(anonymous)
        plain = flight.FlightClient(url.replace("grpc://", "grpc+tcp://"))
        try:
            with pytest.raises(flight.FlightUnauthenticatedError):
                plain.get_flight_info(statement_query("SELECT 1"),
                                      flight.FlightCallOptions(timeout=30))
        finally:
            plain.close()
        refused(lambda: run(login(url, name, "wrong-password"), "SELECT 1"),
                INVALID_LOGIN, code=UNAUTHENTICATED)
        conn = login(url, name, password)
        try:
            assert contents(conn, table) == ROWS
            refused((conn, f"INSERT INTO {table} VALUES (9, 'nine')"),
                    lacks(name, "INSERT", table))
            refused((conn, "CREATE USER intruder WITH PASSWORD 'Intruder-1'"), not_admin(name))
        finally:
            close(conn)
        admin = login(url, ADMIN, ADMIN_PASSWORD)
        try:
            assert grants(admin) == before
            assert contents(admin, table) == ROWS
        finally:
            close(admin)

    # --user/--password only make the administrator at the first start: a later start with
    # another password changes nothing.
    other_password = "another-admin-password"
    with nyala_serve("--user", ADMIN, "--password", other_password, data_dir=data_dir) as (url, _):
        refused(lambda: run(login(url, ADMIN, other_password), "SELECT 1"), INVALID_LOGIN,
                code=UNAUTHENTICATED)
        admin = login(url, ADMIN, ADMIN_PASSWORD)
        try:
            assert contents(admin, table) == ROWS
        finally:
            close(admin)


# --- Passwords stay secret ---

def _get(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def test_passwords_are_not_shown(tls_server, admin):
    name = unique("secretive")
    secrets = ["Web-Ui-Secret-4711", "Web-Ui-Secret-4712", "Web-Ui-Secret-4713"]
    run(admin, f"CREATE USER {name} WITH PASSWORD '{secrets[0]}'")
    run(admin, f"ALTER USER {name} WITH PASSWORD '{secrets[1]}'")
    run(admin, f"CREATE USER IF NOT EXISTS {name} WITH PASSWORD '{secrets[2]}'")
    text = refused((admin, f"CREATE USER {name} WITH PASSWORD '{secrets[2]}'"),
                   "exists already", code="InvalidArgument")
    short = "Sh0rt-7"
    text += refused((admin, f"ALTER USER {name} WITH PASSWORD '{short}'"),
                    "at least 8 characters", code="InvalidArgument")
    # A wrong login does not echo what it was given.
    text += refused(lambda: run(connect(tls_server, name, secrets[0]), "SELECT 1"),
                    INVALID_LOGIN, code=UNAUTHENTICATED)
    for secret in secrets + [short]:
        assert secret not in text

    shown = str(run(admin, "SHOW GRANTS"))
    shown += str(run(admin, "SELECT * FROM information_schema.tables"))

    # The web UI: every page linked from the front page and from the statements page.
    pages = {"/", "/statements"}
    for start in ("/", "/statements"):
        pages |= {href for href in re.findall(r'href="([^"]+)"', _get(tls_server.http + start))
                  if href.startswith("/")}
    seen = {}
    for page in sorted(pages):
        seen[page] = html.unescape(_get(tls_server.http + urllib.parse.quote(page, safe="/?=&")))
    # The statements page does list the statements (with the password masked).
    assert f"CREATE USER {name} WITH PASSWORD" in seen["/statements"]
    assert f"ALTER USER {name} WITH PASSWORD" in seen["/statements"]
    for secret in secrets + [short]:
        assert secret not in shown
        for page, body in seen.items():
            assert secret not in body, f"the password {secret!r} shows on {page}"
