#!/usr/bin/env bash
# Builds the JavaScript sensor-alerts plugin into a WebAssembly component.
# Usage: plugins/sensor-alerts-js/build.sh OUT.wasm
#
# Needs Node.js 20 or later and npm. The first build runs `npm ci` here, which installs
# @bytecodealliance/componentize-js at the version in package-lock.json and the SDK
# (guest-sdk/js, a `file:` dependency in package.json), as a plugin outside the
# repository does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "error: node or npm not found; install Node.js 20 or later (apt-get install -y nodejs npm)" >&2
  exit 1
fi
cd "$here"
cli="node_modules/@bytecodealliance/componentize-js/src/cli.js"
wanted=$(node -p "require('./package.json').devDependencies['@bytecodealliance/componentize-js']")
installed=$(node -p "try { require('./node_modules/@bytecodealliance/componentize-js/package.json').version } catch { '' }")
if [ ! -f "$cli" ] || [ "$installed" != "$wanted" ]; then
  npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2
fi
# npm keeps a copied `file:` package as it is until it is installed again: refresh the
# SDK's copy when its folder changed.
sdk=$(node -p "require('path').resolve(require('./package.json').dependencies['groupstate-sdk'].replace(/^file:/, ''))")
stale=0
for file in "$sdk"/*.js; do
  diff -q "$file" "node_modules/groupstate-sdk/$(basename "$file")" >/dev/null 2>&1 || stale=1
done
diff -rq "$sdk/wit" node_modules/groupstate-sdk/wit >/dev/null 2>&1 || stale=1
if [ "$stale" = 1 ]; then
  rm -rf node_modules/groupstate-sdk
  npm install --prefer-offline --no-audit --no-fund --loglevel=error >&2
fi
# -d: leave out the engine features whose WASI imports the host does not grant (http,
# fetch-event); stdio, clocks and random stay, all virtual in the host's sandbox.
node "$cli" sensor-alerts.js --wit node_modules/groupstate-sdk/wit --world-name state-function \
  -d http -d fetch-event --out "$out.tmp" >/dev/null
mv "$out.tmp" "$out"
