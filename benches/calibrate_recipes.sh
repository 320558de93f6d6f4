#!/usr/bin/env bash
# Benchmark: the calibrating recipes on the real Whisper tiny.en and the default 128 calibration
# utterances (release build), whole process. Runs the recipes alternately, RUNS times each, and
# prints each one's median wall time and peak RSS, and the fused recipes' ratio to
# smoothquant_w8a8 in the same run (target <= 1.25x; peak RSS target <= 700 MiB).
# Usage: bash benches/calibrate_recipes.sh [RECIPE...]   (RUNS=2 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-2}
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(smoothquant_w8a8 smoothquant_w8a8_fused)
command -v /usr/bin/time >/dev/null || { echo "needs GNU time: apt-get install -y time" >&2; exit 1; }
eval "$(bash calib/fetch-assets.sh 2>/dev/null | sed 's/^/export /')"
cargo build --release --quiet
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$runs"); do
  for r in "${recipes[@]}"; do
    /usr/bin/time -f '%e %M' -o "$out/time" ./target/release/oasr-quantize "$OASR_WHISPER_TINY_EN" \
      "$out/q" --recipe "$r" --calib-manifest "$OASR_CALIB_MANIFEST" --overwrite --json >/dev/null
    echo "$r $(cat "$out/time")" | tee -a "$out/all" >&2
  done
done
python3 - "$out/all" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r, wall, rss = line.split()
    rows.setdefault(r, []).append((float(wall), int(rss)))
med = {r: statistics.median(w for w, _ in v) for r, v in rows.items()}
for r, v in rows.items():
    walls = ", ".join(f"{w:.1f}" for w, _ in v)
    print(f"{r}: median {med[r]:.1f} s ({walls}), peak RSS {max(m for _, m in v) / 1024:.0f} MiB")
base = med.get("smoothquant_w8a8")
for r in med:
    if base and r != "smoothquant_w8a8":
        print(f"{r} / smoothquant_w8a8: {med[r] / base:.2f}x")
PY
