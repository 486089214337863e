#!/usr/bin/env bash
# Builds the Python sensor-alerts plugin into a WebAssembly component.
# Usage: plugins/sensor-alerts-py/build.sh OUT.wasm
#
# Needs componentize-py (pip install componentize-py==0.25.1), which bundles CPython
# and generates the `wit_world` bindings from wit/ while it builds.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
pinned=0.25.1
if ! command -v componentize-py >/dev/null; then
  echo "error: componentize-py not found; install it with: pip install componentize-py==$pinned" >&2
  exit 1
fi
version=$(componentize-py --version | awk '{print $2}')
if [ "$version" != "$pinned" ]; then
  echo "warning: componentize-py $version is installed; this plugin is tested with $pinned" >&2
fi
mkdir -p "$(dirname "$out")"
# --stub-wasi: every WASI import becomes a trapping stub, so the component imports only
# the groupstate interfaces (the plugin uses no files, clocks, random or stdio).
# -p: the plugin folder only, so no installed package is bundled by accident.
componentize-py --quiet --wit-path "$here/../../wit" --world state-function \
  componentize sensor_alerts --python-path "$here" --stub-wasi --output "$out.tmp"
mv "$out.tmp" "$out"
