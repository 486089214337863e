#!/usr/bin/env bash
# Builds this plugin into {{name}}.wasm beside this script (or into OUT.wasm).
# Usage: ./build.sh [OUT.wasm]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/{{name}}.wasm}"
# Absolute, as the build below runs from the project's folder.
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install Rust with rustup: curl --proto '=https' -sSf https://sh.rustup.rs | sh" >&2
  exit 1
fi
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then
  echo "error: the wasm32-wasip2 target is not installed; install it with: rustup target add wasm32-wasip2" >&2
  exit 1
fi
# The project's own target dir, whatever CARGO_TARGET_DIR says elsewhere.
export CARGO_TARGET_DIR="$here/target"
# From the project's folder, so that cargo reads its .cargo/config.toml.
cd "$here"
cargo build --quiet --release --target wasm32-wasip2 --manifest-path "$here/Cargo.toml"
mkdir -p "$(dirname "$out")"
# Copied, then renamed: a pipeline running with --watch never reads a half-written file.
cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/{{name}}.wasm" "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
