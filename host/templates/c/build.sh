#!/usr/bin/env bash
# Builds this plugin into {{name}}.wasm beside this script (or into OUT.wasm).
# Usage: ./build.sh [OUT.wasm]   (intermediate files go to .build/)
#
# The C SDK (groupstate.h, groupstate.c and the WIT) is in the groupstate checkout;
# its build-component.sh generates the bindings with wit-bindgen, compiles with clang
# for wasm32-wasi and links a component, and says what to install when a tool is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/{{name}}.wasm}"
sdk="{{sdk}}/guest-sdk/c"
if [ ! -f "$sdk/build-component.sh" ]; then
  echo "error: no C SDK at $sdk; make the project again with groupstate new --sdk <groupstate checkout>" >&2
  exit 1
fi
mkdir -p "$here/.build" "$(dirname "$out")"
bash "$sdk/build-component.sh" "$here/.build/{{name}}.wasm" "$here/plugin.c"
# Copied, then renamed: a pipeline running with --watch never reads a half-written file.
cp "$here/.build/{{name}}.wasm" "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
