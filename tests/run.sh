#!/usr/bin/env bash
# The whole test suite: formatting, lints, host unit tests, SDK unit tests and the
# end-to-end tests (which build every plugin to a wasm32-wasip2 component first).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target list --installed | grep -q wasm32-wasip2 || rustup target add wasm32-wasip2
echo "== fmt"
cargo fmt --all -- --check
cargo fmt --manifest-path guest-sdk/Cargo.toml -- --check
cargo fmt --manifest-path plugins/Cargo.toml --all -- --check
echo "== clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== build (the end-to-end tests call the release binary)"
cargo build --release --workspace
echo "== guest-sdk and plugin unit tests (native)"
CARGO_TARGET_DIR=target/guest-native cargo test --manifest-path guest-sdk/Cargo.toml
CARGO_TARGET_DIR=target/guest-native cargo test --manifest-path plugins/Cargo.toml --workspace
echo "== host unit tests and end-to-end tests"
cargo test --release --workspace -- --skip crash::
echo "== crash test (kill -9 at random moments; prints its seed and kill count)"
cargo test --release -p groupstate-tests -- crash:: --nocapture
