#!/usr/bin/env bash
# Builds this plugin into {{name}}.wasm beside this script (or into OUT.wasm).
# Usage: ./build.sh [OUT.wasm]
#
# Installs the groupstate SDK (groupstate_sdk) with pip into .build/sdk, then runs
# componentize-py, which bundles CPython, plugin.py and the SDK into one component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/{{name}}.wasm}"
sdk="{{sdk}}/guest-sdk/python"
pinned=0.25.1
if ! command -v python3 >/dev/null; then
  echo "error: python3 not found; install Python 3.10 or later (apt-get install -y python3 python3-pip)" >&2
  exit 1
fi
if ! command -v componentize-py >/dev/null; then
  echo "error: componentize-py not found; install it with: pip install componentize-py==$pinned" >&2
  exit 1
fi
version=$(componentize-py --version | awk '{print $2}')
if [ "$version" != "$pinned" ]; then
  echo "warning: componentize-py $version is installed; groupstate is tested with $pinned" >&2
fi
rm -rf "$here/.build/sdk"
# The SDK's package is built with flit_core: installed here (pip install flit_core), it
# is used as it is and the build needs no network; otherwise pip fetches it from PyPI.
isolation=()
python3 -c 'import flit_core' 2>/dev/null && isolation=(--no-build-isolation)
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --root-user-action=ignore ${isolation[@]+"${isolation[@]}"} --target "$here/.build/sdk" "$sdk"
wit=$(PYTHONPATH="$here/.build/sdk" python3 -m groupstate_sdk wit-path)
mkdir -p "$(dirname "$out")"
# --stub-wasi: every WASI import becomes a trapping stub, so the component imports only
# the groupstate interfaces (the plugin uses no files, clocks, random or stdio).
# -p: this folder and the SDK only, so no other installed package is bundled.
componentize-py --quiet --wit-path "$wit" --world state-function \
  componentize plugin --python-path "$here" --python-path "$here/.build/sdk" --stub-wasi --output "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
