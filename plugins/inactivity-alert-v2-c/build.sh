#!/usr/bin/env bash
# Builds the C inactivity-alert plugin on the 0.2 state API into a WebAssembly component,
# with the C SDK in guest-sdk/c/ (its build-component.sh checks the toolchain).
# Usage: plugins/inactivity-alert-v2-c/build.sh OUT.wasm   (intermediate files go to OUT.wasm.d/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
sdk="${GROUPSTATE_SDK:-$here/../..}/guest-sdk/c"
exec bash "$sdk/build-component.sh" --world keyed-state-function "$out" "$here/src/inactivity_alert.c"
