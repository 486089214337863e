#!/usr/bin/env bash
# Builds the JavaScript sensor-alerts plugin into a WebAssembly component.
# Usage: plugins/sensor-alerts-js/build.sh OUT.wasm
#
# Needs Node.js 20 or later and this folder's npm packages (`npm ci` here installs
# @bytecodealliance/componentize-js at the version in package-lock.json).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
if ! command -v node >/dev/null; then
  echo "error: node not found; install Node.js 20 or later (apt-get install -y nodejs npm)" >&2
  exit 1
fi
cli="$here/node_modules/@bytecodealliance/componentize-js/src/cli.js"
wanted=$(node -p "require('$here/package.json').devDependencies['@bytecodealliance/componentize-js']")
installed=$(node -p "try { require('$here/node_modules/@bytecodealliance/componentize-js/package.json').version } catch { '' }")
if [ ! -f "$cli" ] || [ "$installed" != "$wanted" ]; then
  echo "error: componentize-js $wanted is not installed in $here/node_modules; run: npm ci --prefix $here" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
# -d: leave out the engine features whose WASI imports the host does not grant (http,
# fetch-event); stdio, clocks and random stay, all virtual in the host's sandbox.
node "$cli" "$here/sensor-alerts.js" --wit "$here/../../wit" --world-name state-function \
  -d http -d fetch-event --out "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
