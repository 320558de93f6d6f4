#!/usr/bin/env bash
# How calibration scales with cores (BENCHMARKS.md, "Calibration on 2 to 16 cores"): the real
# tiny.en calibrated on the default 128 utterances with 2, 4, 8 and 16 threads (each run pinned to
# that many cores), the same binary and work. Runs on the lent machine after the two installs of
# benches/accuracy-device-run.sh:
#
#   benches/calib-scaling-device-run.sh [RECIPE...]     # default: smoothquant_w8a8
#
# One TSV line per run in $OUT/scaling.tsv: recipe, threads, wall seconds, peak RSS MiB, and the
# sha256 (16 digits) of the written tensors, which must not depend on the thread count.
set -euo pipefail

ACC=/root/acc
B=${OASR_BIN:-$ACC/oasr-quantize}
OUT=${OUT:-./out}
mkdir -p "$OUT"
set -a
# shellcheck disable=SC1091
source "$ACC/assets.env"
set +a
W=/tmp/calib-scaling
mkdir -p "$W"
cores=$(nproc)
echo "$cores cores; $(grep -m1 'model name' /proc/cpuinfo)" | tee "$OUT/scaling.tsv"
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(smoothquant_w8a8)
for recipe in "${recipes[@]}"; do
    for threads in ${THREADS_LIST:-16 8 4 2}; do
        ((threads <= cores)) || continue
        /usr/bin/time -f "%e %M" -o "$W/time" env RAYON_NUM_THREADS="$threads" \
            taskset -c "0-$((threads - 1))" "$B" "$OASR_WHISPER_TINY_EN" "$W/out" \
            --recipe "$recipe" --calib-manifest "$OASR_CALIB_MANIFEST" --overwrite \
            >"$W/log" 2>&1 || { cat "$W/log"; exit 1; }
        read -r wall rss <"$W/time"
        # the tensors must not depend on the thread count
        sum=$(cat "$W"/out/*.safetensors | sha256sum | cut -c1-16)
        printf '%s\t%s\t%s\t%s\t%s\n' "$recipe" "$threads" "$wall" "$((rss / 1024))" "$sum" | tee -a "$OUT/scaling.tsv"
    done
done
