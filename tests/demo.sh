#!/usr/bin/env bash
# The main job on the embedded default (JSON Lines in and out, state in sled): build
# the host and the sensor-alerts plugin, generate sensor events, run the pipeline,
# and show what it did. Usage: tests/demo.sh [EVENTS] [SENSORS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
events=${1:-1000000}
sensors=${2:-10000}
seed=${3:-1}
work=${GROUPSTATE_DEMO_DIR:-target/demo}
rustup target list --installed | grep -q wasm32-wasip2 || rustup target add wasm32-wasip2
echo "== building the sensor-alerts plugin (wasm32-wasip2 component)"
CARGO_TARGET_DIR=target/guest cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml
echo "== building the host"
cargo build --release -p groupstate-host
bin=target/release/groupstate
plugin=target/guest/wasm32-wasip2/release/sensor_alerts.wasm
rm -rf "$work" && mkdir -p "$work"
echo "== generating $events events from $sensors sensors (seed $seed)"
$bin gen sensor --events "$events" --sensors "$sensors" --seed "$seed" --output "$work/input.jsonl"
echo "== running the pipeline"
$bin run --plugin "$plugin" --input "$work/input.jsonl" --output "$work/alerts.jsonl" \
  --state-dir "$work/state" --key-field sensor_id --time-field ts --timeout event-time
echo "== results"
echo "alerts: $(wc -l < "$work/alerts.jsonl") lines in $work/alerts.jsonl; the first three:"
head -n 3 "$work/alerts.jsonl"
echo "keys still holding state (sensors heard from in the last 10 minutes of event time): $($bin state --state-dir "$work/state" --show keys | wc -l)"
echo "== running again over the same state dir: nothing new"
$bin run --plugin "$plugin" --input "$work/input.jsonl" --output "$work/alerts.jsonl" \
  --state-dir "$work/state" --key-field sensor_id --time-field ts --timeout event-time
