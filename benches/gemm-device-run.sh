#!/usr/bin/env bash
# One GPU session of the CUDA scaled-GEMM runtime: the GPU tests (bit-exactness, batch
# invariance, real Whisper weights), the NVRTC compile check, a SASS summary of the GEMM kernels,
# `bench-gemm`, and a PyTorch cross-check of the library baselines. Logs go to $OUT (or ./out).
#
# The machine needs the NVIDIA driver, NVRTC and cuBLASLt 13 (found through ldconfig or under
# /usr/local, /opt, /usr/lib), but no Rust toolchain: build first, on any x86-64 Linux machine,
#   cargo build --release --features cuda --tests && cargo build --release --features cuda
#   benches/gemm-device-run.sh --stage        # copies the executables into .dev-out/
# and, for the real-weights test, write the tiny.en subset (calib/fetch-assets.sh first):
#   OASR_WRITE_WHISPER_SUBSET=.dev-out/whisper-tiny-subset.safetensors \
#     cargo test --release --features cuda --test cuda_whisper -- --ignored write_whisper_subset
# then run this script on the GPU machine from the repository root with .dev-out/ beside it.
#
# Options: --stage (copy executables, then exit), --skip-tests, --skip-bench,
#          --bench-args "..." (extra arguments of bench-gemm, default: --all-configs);
#          BENCH2_ARGS="..." in the environment runs a second bench-gemm (to bench2.md);
#          MMA_TESTS=1 also runs cuda_kernels with OASR_CUDA_GEMM=mma (the portable mma.sync
#          kernels only, as on sm_80 / sm_89) on a 9.0 device.
# Environment: OASR_DEV_DIR (default .dev-out) where the executables are staged and read;
# CARGO_TARGET_DIR (default target) where --stage finds them; TEST_TIMEOUT (seconds per test
# executable, default 420): a kernel that hangs fails its test instead of the whole session;
# TESTS (default "cuda_nvrtc cuda_kernels cuda_whisper"); TORCH_REF=0 skips the PyTorch check.
set -uo pipefail

DEV=${OASR_DEV_DIR:-.dev-out}
if [[ "${1:-}" == "--stage" ]]; then
    tdir=${CARGO_TARGET_DIR:-target}
    mkdir -p "$DEV"
    for t in cuda_kernels cuda_nvrtc cuda_whisper; do
        exe=$(ls -t "$tdir"/release/deps/"$t"-* 2>/dev/null | grep -v '\.d$' | head -1)
        [[ -n "$exe" ]] || { echo "no $t test executable: cargo build --release --features cuda --tests" >&2; exit 1; }
        cp "$exe" "$DEV/$t"
    done
    cp "$tdir"/release/oasr-quantize "$DEV/oasr-quantize"
    # target/ is shared: make sure the binary copied is the one built with the cuda feature.
    "$DEV/oasr-quantize" bench-gemm --help > /dev/null 2>&1 ||
        { echo "$DEV/oasr-quantize has no bench-gemm: cargo build --release --features cuda" >&2; exit 1; }
    strip "$DEV"/cuda_* "$DEV/oasr-quantize" 2>/dev/null || true
    du -sh "$DEV"
    exit 0
fi

SKIP_TESTS=0
SKIP_BENCH=0
BENCH_ARGS="--all-configs"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --skip-tests) SKIP_TESTS=1 ;;
        --skip-bench) SKIP_BENCH=1 ;;
        --bench-args) BENCH_ARGS="$2"; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

OUT=${OUT:-./out}
mkdir -p "$OUT"
# shellcheck source=benches/device-libs.sh
source "$(dirname "$0")/device-libs.sh"
export OASR_REQUIRE_GPU=1 OASR_REQUIRE_NVRTC=1
[[ -f "$DEV/whisper-tiny-subset.safetensors" ]] && export OASR_WHISPER_SUBSET="$DEV/whisper-tiny-subset.safetensors"

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
run_test() { # name, extra environment...
    local t=$1
    shift
    echo "=== $t $*" | tee -a "$OUT/tests.log"
    local start
    start=$(date +%s)
    env "$@" timeout "${TEST_TIMEOUT:-420}" "$DEV/$t" 2>&1 | tee -a "$OUT/tests.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $t $* rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/tests.log"
    [[ $rc == 0 ]] || status=1
}
if [[ $SKIP_TESTS == 0 ]]; then
    for t in ${TESTS:-cuda_nvrtc cuda_kernels cuda_whisper}; do
        run_test "$t"
    done
    if [[ "${MMA_TESTS:-0}" == 1 ]]; then
        run_test cuda_kernels OASR_CUDA_GEMM=mma
    fi
fi

# Which tensor-core instructions each GEMM kernel uses (HMMA / IMMA / QMMA; HGMMA / IGMMA /
# QGMMA for wgmma, UTMALDG for the TMA loads), from the cached CUBIN.
cubin=$(ls -t "$OASR_CUDA_CACHE_DIR"/kernels-sm_*.cubin 2>/dev/null | head -1)
if [[ -n "$cubin" ]] && command -v cuobjdump > /dev/null; then
    cuobjdump --dump-sass "$cubin" > "$OUT/sass.txt" 2>&1
    awk '/Function :/ { f = $3 } /[HIQ]MMA|[HIQ]GMMA|UTMALDG|F2FP|I2F|LDSM|LDGSTS/ { for (i = 1; i <= NF; i++) if ($i ~ /^(HMMA|IMMA|QMMA|HGMMA|IGMMA|QGMMA|UTMALDG|F2FP|LDSM|LDGSTS)/) { split($i, a, "."); c[f " " a[1] "." a[2]]++ } }
         END { for (x in c) print x, c[x] }' "$OUT/sass.txt" | sort > "$OUT/sass-summary.txt"
    rm -f "$OUT/sass.txt"
    cat "$OUT/sass-summary.txt"
fi

if [[ $SKIP_BENCH == 0 ]]; then
    # shellcheck disable=SC2086
    "$DEV/oasr-quantize" bench-gemm --json "$OUT/bench.json" $BENCH_ARGS > "$OUT/bench.md" 2> "$OUT/bench.err"
    rc=$?
    cat "$OUT/bench.err" "$OUT/bench.md"
    [[ $rc == 0 ]] || status=1
    if [[ -n "${BENCH2_ARGS:-}" ]]; then
        # shellcheck disable=SC2086
        "$DEV/oasr-quantize" bench-gemm $BENCH2_ARGS > "$OUT/bench2.md" 2>> "$OUT/bench.err" || status=1
        cat "$OUT/bench2.md"
    fi
    if [[ "${TORCH_REF:-1}" == 1 ]] && python3 -c "import torch" 2> /dev/null; then
        python3 benches/torch_gemm_reference.py > "$OUT/torch.txt" 2>&1
        cat "$OUT/torch.txt"
    fi
fi
exit $status
