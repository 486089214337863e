#!/usr/bin/env bash
# Builds the Python sessions plugin (the 0.2 state API) into a WebAssembly component.
# Usage: plugins/sessions-py/build.sh OUT.wasm   (the SDK is installed into OUT.wasm.d/)
#
# Needs componentize-py (pip install componentize-py==0.25.1). The SDK (guest-sdk/python)
# is installed with pip, as a plugin outside the repository does; its copy of the 0.2
# WIT (`python3 -m groupstate_sdk wit-path 0.2`) gives the world `keyed-state-function`.
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
isolation=()
python3 -c 'import flit_core' 2>/dev/null && isolation=(--no-build-isolation)
python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --root-user-action=ignore ${isolation[@]+"${isolation[@]}"} --target "$work/sdk" "$sdk"
wit=$(PYTHONPATH="$work/sdk" python3 -m groupstate_sdk wit-path 0.2)
# Only sessions.py is bundled from this folder (not its tests): a folder of its own.
mkdir -p "$work/src" && cp "$here/sessions.py" "$work/src/"
componentize-py --quiet --wit-path "$wit" --world keyed-state-function \
  componentize sessions --python-path "$work/src" --python-path "$work/sdk" --stub-wasi --output "$out.tmp"
mv "$out.tmp" "$out"
