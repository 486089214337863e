#!/usr/bin/env bash
# What the CPU limit per plugin call costs: `groupstate run` of the sensor pipeline over
# 1M events with epoch interruption (the default) and without it
# (GROUPSTATE_BENCH_NO_CPU_LIMIT=1, for benchmarks only), runs interleaved, a fresh
# state dir each time; prints wall and CPU seconds per run and the medians' ratios.
# Usage: tests/bench-cpu-limit.sh [RUNS]   (after `cargo build --release --workspace`)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
bin=target/release/groupstate
plugin=target/guest/wasm32-wasip2/release/sensor_alerts.wasm
input=target/bench-cpu-limit/sensor-1000000-10000-1.jsonl
work=target/bench-cpu-limit/run
mkdir -p "$work"
[ -f "$input" ] || $bin gen sensor --events 1000000 --sensors 10000 --seed 1 --output "$input"

one() { # $1: on (CPU limit) or off
  rm -rf "$work/state" "$work/out.jsonl"
  local env=()
  [ "$1" = off ] && env=(GROUPSTATE_BENCH_NO_CPU_LIMIT=1)
  env "${env[@]}" /usr/bin/time -f "%e %U %S" -o "$work/time" "$bin" run --plugin "$plugin" \
    --input "$input" --output "$work/out.jsonl" --state-dir "$work/state" --key-field sensor_id \
    --time-field ts --timeout event-time --cache-dir "$work/cache" --no-fsync --quiet 2>/dev/null
  local wall user sys
  read -r wall user sys < "$work/time"
  echo "$1 $wall $(echo "$user + $sys" | bc) $(wc -l < "$work/out.jsonl")"
}

one on >/dev/null && one off >/dev/null # compile and cache both engine configurations
results=$(for _ in $(seq "$runs"); do one on; one off; done)
echo "$results" | awk '{ printf "%-3s wall %6.2f s  cpu %6.2f s  alerts %s\n", $1, $2, $3, $4 }'
median() { echo "$results" | awk -v k="$1" -v c="$2" '$1 == k { print $c }' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for col in 2:wall 3:cpu; do
  on=$(median on "${col%%:*}"); off=$(median off "${col%%:*}")
  echo "median ${col#*:}: with limit $on s, without $off s, ratio $(echo "scale=3; $on / $off" | bc)"
done
