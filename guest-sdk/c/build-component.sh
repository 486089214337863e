#!/usr/bin/env bash
# Builds a C groupstate plugin into a WebAssembly component, with this folder's helpers
# (groupstate.h, groupstate.c) and its copy of the WIT contract (wit/).
# Usage: guest-sdk/c/build-component.sh [--world keyed-state-function] OUT.wasm SOURCE.c...
#   (intermediate files go to OUT.wasm.d/; the sources may include "groupstate.h" and
#   "state_function.h", the bindings wit-bindgen generates). With `--world
#   keyed-state-function`, the 0.2 state API (wit/v0.2): the sources include
#   "groupstate_v2.h" and "keyed_state_function.h", and groupstate_v2.c is linked too.
#
# Needs: wit-bindgen (cargo install wit-bindgen-cli@0.61.1 --locked --no-default-features
# --features c), Debian's clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32, and
# wasm-component-ld, which ships with rustup's Rust toolchain.
set -euo pipefail
sdk="$(cd "$(dirname "$0")" && pwd)"
world=state-function
if [ "${1:-}" = --world ]; then
  world="${2:?usage: build-component.sh [--world keyed-state-function] OUT.wasm SOURCE.c...}"
  shift 2
fi
case "$world" in
  state-function) wit="$sdk/wit" bindings=state_function helpers=("$sdk/groupstate.c") defines=() ;;
  keyed-state-function)
    wit="$sdk/wit/v0.2" bindings=keyed_state_function
    helpers=("$sdk/groupstate.c" "$sdk/groupstate_v2.c") defines=(-DGS_KEYED)
    ;;
  *) echo "error: unknown world $world: use state-function (0.1) or keyed-state-function (0.2)" >&2; exit 2 ;;
esac
out="${1:?usage: build-component.sh [--world keyed-state-function] OUT.wasm SOURCE.c...}"
shift
[ "$#" -gt 0 ] || { echo "usage: build-component.sh OUT.wasm SOURCE.c..." >&2; exit 2; }
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
command -v rustc >/dev/null || missing "rustc (for wasm-component-ld)" "install Rust with rustup: https://rustup.rs"
component_ld=$(ls "$(rustc --print sysroot)"/lib/rustlib/*/bin/wasm-component-ld 2>/dev/null | head -n 1 || true)
[ -n "$component_ld" ] || missing wasm-component-ld "it ships with rustup's Rust toolchain (rustup update stable)"

rm -rf "$work" && mkdir -p "$work"
# The bindings and the component type (an object file with the WIT world).
if ! wit-bindgen c "$wit" --world "$world" --autodrop-borrows=yes --out-dir "$work" \
  >"$work/wit-bindgen.log" 2>&1; then
  cat "$work/wit-bindgen.log" >&2
  exit 1
fi
cflags=(--target=wasm32-wasi -O2 -I "$work" -I "$sdk" ${defines[@]+"${defines[@]}"})
"$clang" "${cflags[@]}" -w -c "$work/$bindings.c" -o "$work/$bindings.o"
index=0
for source in "${helpers[@]}" "$@"; do
  index=$((index + 1))
  "$clang" "${cflags[@]}" -std=c11 -Wall -Wextra -Wno-unused-parameter -c "$source" \
    -o "$work/$index-$(basename "${source%.c}").o"
done
# clang links with wasm-component-ld, which runs wasm-ld and then turns the module
# into a component (the WIT world comes from <bindings>_component_type.o).
"$clang" --target=wasm32-wasi -mexec-model=reactor -fuse-ld="$component_ld" -Wl,--wasm-ld-path="$wasm_ld" \
  -Wl,--strip-debug \
  "$work"/*.o -o "$out.tmp"
mv "$out.tmp" "$out"
