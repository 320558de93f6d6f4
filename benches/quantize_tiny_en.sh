#!/usr/bin/env bash
# Benchmark: quantize the real Whisper tiny.en with int8_w8a8_rtn (release build).
# Prints wall time (median of RUNS) and peak resident memory, and the issue's targets as ratios.
# Usage: bash benches/quantize_tiny_en.sh [RECIPE]   (RUNS=5 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=${1:-int8_w8a8_rtn}
runs=${RUNS:-5}
command -v /usr/bin/time >/dev/null || { echo "needs GNU time: apt-get install -y time" >&2; exit 1; }
eval "$(bash calib/fetch-assets.sh 2>/dev/null | sed 's/^/export /')"
cargo build --release --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# fp32 size of the weights: 4 bytes per parameter.
params=$(./target/release/oasr-quantize inspect "$OASR_WHISPER_TINY_EN" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["parameters"])')
walls=(); rss_max=0
for i in $(seq "$runs"); do
  /usr/bin/time -f '%e %M' -o "$out/time" ./target/release/oasr-quantize "$OASR_WHISPER_TINY_EN" "$out/q" --recipe "$recipe" --overwrite --json >/dev/null
  read -r wall rss <"$out/time"
  walls+=("$wall"); (( rss > rss_max )) && rss_max=$rss
done
median=$(printf '%s\n' "${walls[@]}" | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
python3 - "$median" "$rss_max" "$params" "$recipe" "$runs" <<'PY'
import sys
wall, rss_kib, params, recipe, runs = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
fp32_mb = params * 4 / 1e6
rss_mb = rss_kib * 1024 / 1e6
print(f"recipe {recipe}: median wall {wall:.2f} s over {runs} runs (target < 5 s: {wall / 5:.2f}x of the budget)")
print(f"peak RSS {rss_mb:.1f} MB; fp32 weights {fp32_mb:.1f} MB; ratio {rss_mb / fp32_mb:.2f}x (target <= 1.5x)")
PY
