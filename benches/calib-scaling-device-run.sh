#!/usr/bin/env bash
# How calibration scales with cores (BENCHMARKS.md, "Calibration on 2 to 16 cores"): the real
# tiny.en calibrated on the default 128 utterances with 2, 4, 8 and 16 threads (each run pinned to
# that many cores), the same binary and work. Runs on the lent machine after the two installs of
# benches/accuracy-device-run.sh:
#
#   benches/calib-scaling-device-run.sh [RECIPE...]     # default: smoothquant_w8a8
#
# One TSV line per run in $OUT/scaling.tsv: recipe, threads, wall seconds, peak RSS MiB, user CPU
# seconds, and the sha256 (16 digits) of the written tensors, which must not depend on the thread
# count.
#
# PROCESSES="16 2" (instead of threads) runs the hardware's own ceiling: that many independent
# single-threaded processes at once, each pinned to one CPU and calibrating its own 8 utterances
# of the manifest; one line per run (wall of the slowest process, user CPU seconds summed over
# the processes, per utterance), with no sharing in the program at all.
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
echo "$cores cores; $(grep -m1 'model name' /proc/cpuinfo)" | tee -a "$OUT/scaling.tsv"
if [[ -n ${PROCESSES:-} ]]; then
    per=8
    # Slices beside the manifest, whose audio paths are relative to its directory.
    dir=$(dirname "$OASR_CALIB_MANIFEST")
    for n in $PROCESSES; do
        ((n <= cores)) || continue
        start=$(date +%s%N)
        for ((i = 0; i < n; i++)); do
            slice="$dir/.slice-$i.jsonl"
            sed -n "$((i * per + 1)),$((i * per + per))p" "$OASR_CALIB_MANIFEST" >"$slice"
            /usr/bin/time -f "%e %U" -o "$W/time-$i" env RAYON_NUM_THREADS=1 taskset -c "$i" \
                "$B" "$OASR_WHISPER_TINY_EN" "$W/out-$i" --recipe "${1:-smoothquant_w8a8}" \
                --calib-manifest "$slice" --overwrite >"$W/log-$i" 2>&1 &
        done
        wait
        end=$(date +%s%N)
        if grep -l 'non-zero' "$W"/time-*; then cat "$W"/log-*; exit 1; fi
        cat "$W"/time-* | awk -v n="$n" -v per="$per" -v ns=$((end - start)) '{u += $2} END {
            printf "processes\t%d\twall %.2f s\tuser %.2f s\tuser per utterance %.3f s\n",
                n, ns / 1e9, u, u / (per * n) }' | tee -a "$OUT/scaling.tsv"
        rm -f "$W"/time-* "$dir"/.slice-*.jsonl
    done
    exit 0
fi
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(smoothquant_w8a8)
for recipe in "${recipes[@]}"; do
    for threads in ${THREADS_LIST:-16 8 4 2}; do
        ((threads <= cores)) || continue
        /usr/bin/time -f "%e %M %U" -o "$W/time" env RAYON_NUM_THREADS="$threads" \
            taskset -c "0-$((threads - 1))" "$B" "$OASR_WHISPER_TINY_EN" "$W/out" \
            --recipe "$recipe" --calib-manifest "$OASR_CALIB_MANIFEST" --overwrite \
            >"$W/log" 2>&1 || { cat "$W/log"; exit 1; }
        read -r wall rss user <"$W/time"
        # the tensors must not depend on the thread count
        sum=$(cat "$W"/out/*.safetensors | sha256sum | cut -c1-16)
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$recipe" "$threads" "$wall" "$((rss / 1024))" "$user" "$sum" | tee -a "$OUT/scaling.tsv"
    done
done
