#!/usr/bin/env bash
# Builds the C sensor-alerts plugin into a WebAssembly component.
# Usage: plugins/sensor-alerts-c/build.sh OUT.wasm   (intermediate files go to OUT.wasm.d/)
#
# Needs: wit-bindgen (cargo install wit-bindgen-cli@0.61.1 --locked --no-default-features
# --features c), Debian's clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32, and
# wasm-component-ld, which ships with rustup's Rust toolchain.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
work="$out.d"
missing() {
  echo "error: $1 not found; $2" >&2
  exit 1
}

command -v wit-bindgen >/dev/null ||
  missing wit-bindgen "install it with: cargo install wit-bindgen-cli@0.61.1 --locked --no-default-features --features c"
clang=$(command -v clang-14 || command -v clang || true)
[ -n "$clang" ] || missing clang "install it with: apt-get install -y clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32"
wasm_ld=$(command -v wasm-ld-14 || command -v wasm-ld || true)
[ -n "$wasm_ld" ] || missing wasm-ld "install it with: apt-get install -y lld-14"
[ -f /usr/lib/wasm32-wasi/libc.a ] || missing "wasi-libc (/usr/lib/wasm32-wasi/libc.a)" "install it with: apt-get install -y wasi-libc"
builtins=$("$clang" --target=wasm32-wasi -print-libgcc-file-name)
[ -f "$builtins" ] || missing "the wasm32 compiler runtime ($builtins)" "install it with: apt-get install -y libclang-rt-14-dev-wasm32"
component_ld=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/wasm-component-ld 2>/dev/null | head -n 1 || true)
[ -n "$component_ld" ] || missing wasm-component-ld "it ships with rustup's Rust toolchain (rustup update stable)"

rm -rf "$work" && mkdir -p "$work"
# The bindings and the component type (an object file with the WIT world) from wit/.
if ! wit-bindgen c "$here/../../wit" --world state-function --autodrop-borrows=yes --out-dir "$work" \
  >"$work/wit-bindgen.log" 2>&1; then
  cat "$work/wit-bindgen.log" >&2
  exit 1
fi
cflags=(--target=wasm32-wasi -O2 -I "$work")
"$clang" "${cflags[@]}" -w -c "$work/state_function.c" -o "$work/state_function.o"
for source in groupstate sensor_alerts; do
  "$clang" "${cflags[@]}" -std=c11 -Wall -Wextra -Wno-unused-parameter -c "$here/src/$source.c" -o "$work/$source.o"
done
# clang links with wasm-component-ld, which runs wasm-ld and then turns the module
# into a component (the WIT world comes from state_function_component_type.o).
"$clang" --target=wasm32-wasi -mexec-model=reactor -fuse-ld="$component_ld" -Wl,--wasm-ld-path="$wasm_ld" \
  -Wl,--strip-debug \
  "$work"/*.o -o "$out.tmp"
mv "$out.tmp" "$out"
