#!/usr/bin/env bash
# Builds the C sensor-alerts plugin into a WebAssembly component, with the C SDK in
# guest-sdk/c/ (its build-component.sh checks the toolchain and says what is missing).
# Usage: plugins/sensor-alerts-c/build.sh OUT.wasm   (intermediate files go to OUT.wasm.d/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
sdk="${GROUPSTATE_SDK:-$here/../..}/guest-sdk/c"
exec bash "$sdk/build-component.sh" "$out" "$here/src/sensor_alerts.c"
