#!/usr/bin/env bash
# Builds the Python sensor-alerts plugin into a WebAssembly component.
# Usage: plugins/sensor-alerts-py/build.sh OUT.wasm   (the SDK is installed into OUT.wasm.d/)
#
# Needs componentize-py (pip install componentize-py==0.25.1), which bundles CPython
# and generates the `wit_world` bindings from the WIT while it builds. The SDK
# (guest-sdk/python) is installed with pip, as a plugin outside the repository does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
sdk="${GROUPSTATE_SDK:-$here/../..}/guest-sdk/python"
pinned=0.25.1
if ! command -v componentize-py >/dev/null; then
  echo "error: componentize-py not found; install it with: pip install componentize-py==$pinned" >&2
  exit 1
fi
version=$(componentize-py --version | awk '{print $2}')
if [ "$version" != "$pinned" ]; then
  echo "warning: componentize-py $version is installed; this plugin is tested with $pinned" >&2
fi
work="$out.d"
rm -rf "$work" && mkdir -p "$work"
# The SDK's package is built with flit_core: installed here (tests/setup.sh does), it is
# used as it is and the build needs no network; otherwise pip fetches it from PyPI.
isolation=()
python3 -c 'import flit_core' 2>/dev/null && isolation=(--no-build-isolation)
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --root-user-action=ignore ${isolation[@]+"${isolation[@]}"} --target "$work/sdk" "$sdk"
wit=$(PYTHONPATH="$work/sdk" python3 -m groupstate_sdk wit-path)
# --stub-wasi: every WASI import becomes a trapping stub, so the component imports only
# the groupstate interfaces (the plugin uses no files, clocks, random or stdio).
# -p: the plugin folder and the SDK only, so no other installed package is bundled.
componentize-py --quiet --wit-path "$wit" --world state-function \
  componentize sensor_alerts --python-path "$here" --python-path "$work/sdk" --stub-wasi --output "$out.tmp"
mv "$out.tmp" "$out"
