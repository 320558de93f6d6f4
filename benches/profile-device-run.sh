#!/usr/bin/env bash
# Where the time of the large int8 GEMMs goes, on the GPU machine: the SM clock, power and
# clock-event reasons sampled by nvidia-smi during a sustained `bench-gemm --shapes squares`,
# then Nsight Compute sections (when ncu can read the counters; clocks left as found) of our
# int8 kernel and of cuBLASLt's int8 kernel at 4096³ and 8192³. Run it like
# gemm-device-run.sh, from the repository root with the staged .dev-out/ beside it; logs go to
# $OUT (or ./out). SAMPLES (default 400) sets bench-gemm's samples per measurement, NCU=0 skips
# Nsight Compute.
set -uo pipefail

DEV=${OASR_DEV_DIR:-.dev-out}
OUT=${OUT:-./out}
mkdir -p "$OUT"
# shellcheck source=benches/device-libs.sh
source "$(dirname "$0")/device-libs.sh"

nvidia-smi -q -d PERFORMANCE,CLOCK,POWER > "$OUT/smi-before.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 50 > "$OUT/smi-trace.csv" 2>&1 &
smi=$!
sleep 1
"$DEV/oasr-quantize" bench-gemm --shapes squares --samples "${SAMPLES:-400}" > "$OUT/bench-sustained.md" 2>&1
sleep 1
kill "$smi" 2>/dev/null
cat "$OUT/bench-sustained.md"
# The clock and power while each kernel ran: the trace's busy samples (utilization > 50 %).
awk -F', ' '$5 + 0 > 50 { n++; c += $2; p += $3; if ($2 + 0 < lo || lo == 0) lo = $2 + 0 }
    END { if (n) printf "busy samples %d: SM clock mean %.0f MHz (min %d), power mean %.0f W\n", n, c / n, lo, p / n }' \
    "$OUT/smi-trace.csv"

if [[ "${NCU:-1}" == 1 ]] && command -v ncu > /dev/null; then
    sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats
        --section LaunchStats --section Occupancy"
    profile() { # name, kernel regex, shape: the first launch of a matching kernel
        # shellcheck disable=SC2086
        ncu --clock-control none $sections --metrics sm__cycles_elapsed.avg.per_second \
            -k regex:"$2" -c 1 \
            "$DEV/oasr-quantize" bench-gemm --shapes "$3" --samples 1 > "$OUT/ncu-$1-${3%%,*}.txt" 2>&1
    }
    for shape in 4096,4096,4096 8192,8192,8192; do
        profile ours 'oasr_scaled_mm_wgmma_i8' "$shape"
        # cuBLASLt's int8 kernel: the first kernel that is not ours (its raw int8 GEMM runs first).
        profile lt '^[^o]' "$shape"
    done
    grep -h -E 'oasr_|sm90|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Shared|Issue Slots Busy|Executed Ipc|Registers|Stall|No Eligible|Tensor' \
        "$OUT"/ncu-*.txt | head -200
else
    echo "ncu skipped (NCU=0 or no ncu)"
fi
