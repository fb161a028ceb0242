#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests, then the Python client tests against a
# real `nyala serve` process. Installs what it needs (Python packages) itself.
set -euo pipefail
cd "$(dirname "$0")/.."

# One target directory outside the clone, so CI and repeated runs reuse the build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/nyala-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

cargo build -p nyala-flight --bin nyala
export NYALA_BIN="$CARGO_TARGET_DIR/debug/nyala"
cargo test --workspace

# The web UI tests load pages in headless Chromium (Debian's package); as root or with sudo.
if ! command -v chromium >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq chromium
    else
        sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium
    fi
fi
command -v chromium >/dev/null || { echo "chromium is missing and could not be installed" >&2; exit 1; }

python3 -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
python3 -m pip install --quiet --disable-pip-version-check -e clients/python
python3 -m pytest -q tests/python clients/python/tests

# The Flight SQL JDBC driver against a real server; Maven fetches the driver and JUnit itself.
mvn -q -B -f clients/java/pom.xml test
