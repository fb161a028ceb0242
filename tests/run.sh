#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests, then the Python client tests against a
# real `nyala serve` process. Installs what it needs (Python packages) itself.
set -euo pipefail
cd "$(dirname "$0")/.."

# One target directory outside the clone, so CI and repeated runs reuse the build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/nyala-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# One build of every crate, with the features the tests use too (a build of the binary alone
# resolves other features and compiles DataFusion a second time).
cargo build --workspace --all-targets
export NYALA_BIN="$CARGO_TARGET_DIR/debug/nyala"
cargo test --workspace

# Debian packages, as root or with sudo: headless Chromium for the web UI tests, psql for the
# PostgreSQL protocol's, psqlODBC and unixODBC for the ODBC tests.
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v psql >/dev/null || missing+=(postgresql-client)
[ -e /usr/lib/x86_64-linux-gnu/odbc/psqlodbcw.so ] || odbcinst -q -d 2>/dev/null | grep -q "PostgreSQL Unicode" \
    || missing+=(odbc-postgresql unixodbc unixodbc-dev)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    else
        sudo -n apt-get update -qq && sudo -n apt-get install -y -qq "${missing[@]}"
    fi
fi
for tool in chromium psql odbcinst; do
    command -v "$tool" >/dev/null || { echo "$tool is missing and could not be installed" >&2; exit 1; }
done

python3 -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
python3 -m pip install --quiet --disable-pip-version-check -e clients/python
python3 -m pytest -q tests/python clients/python/tests

# The Flight SQL JDBC driver and pgjdbc against a real server; Maven fetches them and JUnit.
mvn -q -B -f clients/java/pom.xml test
