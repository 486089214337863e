#!/usr/bin/env bash
# The whole test suite: formatting, lints, host unit tests, SDK unit tests and the
# end-to-end tests (which build every plugin to a wasm32-wasip2 component first).
# It starts by installing what is missing (tests/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== setup (installs only what is missing)"
./tests/setup.sh
echo "== fmt"
cargo fmt --all -- --check
cargo fmt --manifest-path guest-sdk/Cargo.toml -- --check
cargo fmt --manifest-path plugins/Cargo.toml --all -- --check
cargo fmt --manifest-path tests/plugins/Cargo.toml --all -- --check
echo "== clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== build (the end-to-end tests call the release binary)"
cargo build --release --workspace
echo "== guest-sdk and plugin unit tests (native)"
CARGO_TARGET_DIR=target/guest-native cargo test --manifest-path guest-sdk/Cargo.toml 2>&1 | tee -a "$log"
CARGO_TARGET_DIR=target/guest-native cargo test --manifest-path plugins/Cargo.toml --workspace 2>&1 | tee -a "$log"
echo "== Python SDK and plugin unit tests (plain Python, the 0.2 layer and its KeyedDriver)"
(cd guest-sdk/python && python3 -m unittest discover -s tests)
(cd plugins/sessions-py && PYTHONPATH=../../guest-sdk/python python3 -m unittest)
echo "== host unit tests and end-to-end tests"
cargo test --release --workspace -- --skip crash:: --skip kafka:: 2>&1 | tee -a "$log"
echo "== Kafka tests, one at a time (each starts its own tansu broker; several group"
echo "   members of parallel tests on two cores made tansu's group coordination stall)"
cargo test --release -p groupstate-tests --test it -- kafka:: --test-threads 1 2>&1 | tee -a "$log"
echo "== crash test (kill -9 at random moments; prints its seed and kill count)"
cargo test --release -p groupstate-tests --test it -- crash:: --nocapture 2>&1 | tee -a "$log"
# One closing line over every cargo test run above.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
