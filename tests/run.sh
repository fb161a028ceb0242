#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests, the user guide and its links, then the
# Python and Java client tests against real `nyala serve` processes. Installs what it needs
# (mdBook, Debian and Python packages) itself.
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

# The user guide (docs/, an mdBook), built outside the clone with its links checked; and the
# benchmarks page, which must be what bench/render.py makes of bench/results/*.json.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
command -v mdbook >/dev/null \
    || cargo install mdbook --locked --version 0.5.4 --no-default-features --features search
book="$(realpath -m "$CARGO_TARGET_DIR")/book"
mdbook build docs -d "$book"
python3 docs/check_links.py "$book"
python3 bench/render.py --check

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
python3 -m unittest discover -s bench -p 'test_*.py'  # the benchmarks' results files, no server
python3 -m pytest -q tests/python clients/python/tests

# The Flight SQL JDBC driver and pgjdbc against a real server; Maven fetches them and JUnit.
mvn -q -B -f clients/java/pom.xml test
