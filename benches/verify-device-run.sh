#!/usr/bin/env bash
# `verify --device cuda` on a GPU machine without a Rust toolchain: the cuda_verify test binary
# (int8 bit-identity of the CPU and CUDA lanes on the real tiny.en, fp8 closeness), then verify
# throughput of both lanes on the same utterances through the CLI. Logs under $OUT (or ./out).
#
# Build and stage here (any x86-64 Linux machine, calib/fetch-assets.sh run first):
#   cargo build --release --features cuda --test cuda_verify --bin oasr-quantize
#   benches/verify-device-run.sh --stage          # executables + assets into $OASR_DEV_DIR
# then, on the GPU machine, from the repository root with $OASR_DEV_DIR beside it:
#   benches/verify-device-run.sh
# The staged assets are tiny.en (75 MB: model.bin is split in two parts, part00 and part01, so
# that each fits a 64 MiB transfer; MODEL_PART0 names where part00 is if it travelled apart),
# the first CALIB calibration and BENCH gate utterances (trimmed manifests and their audio).
# Environment: BENCH (gate utterances of the throughput runs, default 32), CALIB (default 8),
# TEST_TIMEOUT (seconds, default 420), SKIP_TESTS=1, SKIP_BENCH=1.
set -uo pipefail

DEV=${OASR_DEV_DIR:-.dev-out/cuda-verify}
BENCH=${BENCH:-32}
CALIB=${CALIB:-8}

if [[ "${1:-}" == "--stage" ]]; then
    tdir=${CARGO_TARGET_DIR:-target}
    src=${OASR_CACHE_DIR:-$HOME/.cache/oasr-quantize}
    rm -rf "$DEV"
    mkdir -p "$DEV/bin" "$DEV/cache/whisper-tiny.en" "$DEV/cache/asterisk/wav16k"
    exe=$(ls -t "$tdir"/release/deps/cuda_verify-* 2>/dev/null | grep -v '\.d$' | head -1)
    [[ -n "$exe" ]] || { echo "no cuda_verify executable: cargo build --release --features cuda --test cuda_verify" >&2; exit 1; }
    cp "$exe" "$DEV/bin/cuda_verify"
    cp "$tdir/release/oasr-quantize" "$DEV/bin/oasr-quantize"
    "$DEV/bin/oasr-quantize" bench-gemm --help > /dev/null 2>&1 ||
        { echo "$DEV/bin/oasr-quantize has no CUDA: cargo build --release --features cuda" >&2; exit 1; }
    strip "$DEV"/bin/* && gzip -9 "$DEV"/bin/*
    m="$src/whisper-tiny.en"
    cp "$m"/{config.json,tokenizer.json,vocabulary.txt} "$DEV/cache/whisper-tiny.en/"
    split -b 46000000 -d "$m/model.bin" "$DEV/cache/whisper-tiny.en/model.bin.part"
    sha256sum "$m/model.bin" | cut -d' ' -f1 > "$DEV/cache/whisper-tiny.en/model.bin.sha256"
    head -"$CALIB" "$src/asterisk/calib.jsonl" > "$DEV/cache/asterisk/calib.jsonl"
    head -"$BENCH" "$src/asterisk/gate.jsonl" > "$DEV/cache/asterisk/gate.jsonl"
    cat "$DEV"/cache/asterisk/*.jsonl |
        python3 -c 'import sys, json; [print(json.loads(l)["audio"]) for l in sys.stdin]' |
        while read -r f; do cp "$src/asterisk/$f" "$DEV/cache/asterisk/$f"; done
    du -sh "$DEV" "$DEV"/bin/* "$DEV"/cache/whisper-tiny.en/model.bin.part*
    exit 0
fi

OUT=${OUT:-./out}
mkdir -p "$OUT"
cache=$DEV/cache
model=$cache/whisper-tiny.en
if [[ ! -f $model/model.bin ]]; then
    cat "${MODEL_PART0:-$model/model.bin.part00}" "$model/model.bin.part01" > "$model/model.bin"
fi
echo "$(cat "$model/model.bin.sha256")  $model/model.bin" | sha256sum -c - || exit 1
bin=/tmp/oasr-verify-bin
mkdir -p "$bin"
for b in cuda_verify oasr-quantize; do gunzip -c "$DEV/bin/$b.gz" > "$bin/$b" && chmod +x "$bin/$b"; done
# shellcheck source=benches/device-libs.sh
source "$(dirname "$0")/device-libs.sh"
export OASR_CACHE_DIR=$cache OASR_REQUIRE_GPU=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv
    nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
    timeout "${TEST_TIMEOUT:-420}" "$bin/cuda_verify" --nocapture 2>&1 | tee "$OUT/tests.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi

if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    q=/tmp/oasr-verify-q
    rm -rf "$q"
    "$bin/oasr-quantize" "$model" "$q/int8_rtn" --recipe int8_w8a8_rtn > /dev/null || status=1
    # A loose error guard, so that the int8 chains arm (the recipe's declines tiny.en's).
    "$bin/oasr-quantize" "$model" "$q/int8_fused" --recipe smoothquant_w8a8_fused \
        --option static_inputs.max_error_ratio=1000 \
        --calib-manifest "$cache/asterisk/calib.jsonl" --calib-utterances 4 > /dev/null || status=1
    for ck in int8_rtn int8_fused; do
        for dev in cpu cuda; do
            echo "== $ck on $dev ($BENCH utterances)"
            "$bin/oasr-quantize" verify "$q/$ck" --reference "$model" \
                --manifest "$cache/asterisk/gate.jsonl" --device "$dev" \
                --json "$OUT/verify-$ck-$dev.json" 2>&1 || status=1
        done
    done 2>&1 | tee "$OUT/bench.log"
    python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| checkpoint | device | utterances | utterances/s | seconds | WER q | TF cosine mean | identical to cpu |")
print("|---|---|---:|---:|---:|---:|---:|:---:|")
for ck in ["int8_rtn", "int8_fused"]:
    reps = {d: json.loads((out / f"verify-{ck}-{d}.json").read_text()) for d in ["cpu", "cuda"]
            if (out / f"verify-{ck}-{d}.json").exists()}
    keys = ["wer_quantized", "free_running", "teacher_forced", "nonfinite", "transcripts"]
    for d, r in reps.items():
        same = all(r[k] == reps["cpu"][k] for k in keys) if "cpu" in reps else None
        print(f"| {ck} | {r['device']} | {r['utterances']} | {r['utterances_per_second']:.2f} | "
              f"{r['seconds']:.1f} | {r['wer_quantized']} | {r['teacher_forced']['cosine_mean']:.6f} | {same} |")
EOF
fi
exit $status
