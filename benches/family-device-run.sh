#!/usr/bin/env bash
# The Whisper family's scale benchmarks (BENCHMARKS.md, "Whisper at every size") and the
# transformers fixture of multilingual decoding, on the lent GPU machine (16 CPU cores, torch and
# transformers; no Rust toolchain, no network). No GPU is used.
#
# Here, after `cargo build --release --examples` and calib/fetch-assets.sh:
#   benches/family-device-run.sh --stage            # .dev-out/family, about 10 MB
# There (carry .dev-out), from the repository root:
#   benches/family-device-run.sh fixture            # $OUT/transformers.json
#   benches/family-device-run.sh scale SIZE...      # $OUT/scale.tsv: RTN, calibration, verify
#   RTN_ONLY=1 benches/family-device-run.sh scale SIZE...   # the disk and RTN only
#   THREADS=2 benches/family-device-run.sh calib SIZE...   # calibration on 2 cores only
#   benches/family-device-run.sh cost SIZE...       # per utterance, one greedy decoding, vs FLOPs
#   benches/family-device-run.sh recipes SIZE...    # every built-in recipe: time, RSS, the spec read back
#   RECIPES="fp8_w8a8_rtn_keep" benches/family-device-run.sh recipes SIZE...   # only these
#   (CALIB_UTTS=N at --stage: calibrate on the first N utterances instead of 2)
# Every checkpoint is seeded random weights (examples/whisper_family.rs): cost, not accuracy.
set -euo pipefail

STAGE=.dev-out/family
UTTERANCES=(added jfk-ask-not praatio-bobby)

if [[ "${1:-}" == "--stage" ]]; then
    cache=${OASR_CACHE_DIR:-$HOME/.cache/oasr-quantize}
    rm -rf "$STAGE"
    mkdir -p "$STAGE/tok" "$STAGE/audio"
    strip -o "$STAGE/oasr-quantize" target/release/oasr-quantize
    strip -o "$STAGE/whisper_family" target/release/examples/whisper_family
    for t in english multilingual multilingual-v3; do
        cp -r "$cache/whisper-tokenizers/$t" "$STAGE/tok/"
    done
    python3 - "$cache" "$STAGE" "${UTTERANCES[@]}" <<'PY'
import json, os, shutil, sys
cache, stage, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
def rows(m):
    base = os.path.dirname(m)
    for line in open(m):
        if line.strip():
            u = json.loads(line)
            yield u, os.path.join(base, u["audio"])
found = {}
for m in ["asterisk/gate.jsonl", "crossdomain/gate.jsonl"]:
    for u, path in rows(os.path.join(cache, m)):
        if u["id"] in wanted:
            found[u["id"]] = path
with open(os.path.join(stage, "fixture-audio.txt"), "w") as f:
    for uid in wanted:
        shutil.copy(found[uid], os.path.join(stage, "audio", uid + ".wav"))
        f.write(f"{uid}=audio/{uid}.wav\n")
# Calibration: the first CALIB_UTTS (default 2) utterances of the default calibration manifest.
with open(os.path.join(stage, "calib.jsonl"), "w") as f:
    for i, (u, path) in enumerate(rows(os.path.join(cache, "asterisk/calib.jsonl"))):
        if i == int(os.environ.get("CALIB_UTTS", "2")):
            break
        shutil.copy(path, os.path.join(stage, "audio", os.path.basename(path)))
        u["audio"] = "audio/" + os.path.basename(path)
        f.write(json.dumps(u) + "\n")
PY
    du -sh "$STAGE"
    exit 0
fi

OUT=${OUT:?run on the device machine}
Q=$PWD/$STAGE/oasr-quantize
F=$PWD/$STAGE/whisper_family
export OASR_WHISPER_TOKENIZERS=$PWD/$STAGE/tok
W=${W:-/root/family}
mkdir -p "$W"

# timed LABEL CMD...: wall seconds and peak RSS (MiB) of CMD, one TSV line in $OUT/scale.tsv.
timed() {
    local label=$1
    shift
    /usr/bin/time -f "%e %M" -o "$W/time" "$@" >"$W/last.log" 2>&1 || { cat "$W/last.log"; exit 1; }
    read -r wall rss <"$W/time"
    printf '%s\t%s\t%.1f\n' "$label" "$wall" "$((rss / 1024))" | tee -a "$OUT/scale.tsv"
}

source_of() {
    local size=$1 shards=1
    [[ $size == large* ]] && shards=4
    [[ -d $W/$size ]] || "$F" "$size" "$W/$size" --shards "$shards"
    echo "$W/$size"
}

case "${1:-}" in
fixture)
    [[ -d $W/parity ]] || "$F" parity-multilingual "$W/parity" --dtype f32
    args=()
    while IFS= read -r line; do args+=("${line%%=*}=$PWD/$STAGE/${line#*=}"); done <"$STAGE/fixture-audio.txt"
    python3 tests/whisper_multilingual/make_fixture.py "$W/parity" "$OUT/transformers.json" "${args[@]}"
    ;;
scale)
    shift
    nproc | sed 's/^/cores\t/' | tee -a "$OUT/scale.tsv"
    # The disk: 4 GiB written and flushed, then read back (the page cache dropped when allowed).
    timed disk-write-4GiB dd if=/dev/zero of="$W/dd" bs=16M count=256 conv=fdatasync
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    timed disk-read-4GiB dd if="$W/dd" of=/dev/null bs=16M
    rm -f "$W/dd"
    for size in "$@"; do
        src=$(source_of "$size")
        printf '%s-source-bytes\t%s\n' "$size" "$(du -sb "$src" | cut -f1)" | tee -a "$OUT/scale.tsv"
        sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
        timed "$size-rtn" "$Q" "$src" "$W/$size-int8" --recipe int8_w8a8_rtn --overwrite
        printf '%s-output-bytes\t%s\n' "$size" "$(du -sb "$W/$size-int8" | cut -f1)" | tee -a "$OUT/scale.tsv"
        [[ -n ${RTN_ONLY:-} ]] && continue
        timed "$size-calib-smoothquant-2utt" "$Q" "$src" "$W/$size-sq" --recipe smoothquant_w8a8 \
            --calib-manifest "$STAGE/calib.jsonl" --calib-utterances 2 --overwrite
        timed "$size-verify-1utt" "$Q" verify "$W/$size-int8" --reference "$src" \
            --manifest "$STAGE/calib.jsonl" --limit 1
        rm -rf "$W/$size-sq"
    done
    ;;
calib)
    shift
    threads=${THREADS:-2}
    utts=$(grep -c . "$STAGE/calib.jsonl")
    nproc | sed 's/^/cores\t/' | tee -a "$OUT/scale.tsv"
    for size in "$@"; do
        src=$(source_of "$size")
        timed "$size-calib-smoothquant-${utts}utt-$threads-threads" \
            env RAYON_NUM_THREADS="$threads" taskset -c "0-$((threads - 1))" "$Q" "$src" "$W/$size-sq" --recipe smoothquant_w8a8 \
            --calib-manifest "$STAGE/calib.jsonl" --calib-utterances "$utts" --overwrite
        rm -rf "$W/$size-sq"
    done
    ;;
cost)
    # Per utterance, on this machine's cores: calibration (`smoothquant_w8a8`) and `verify`, each
    # with one greedy decoding (`--no-fallback`: random weights never emit end-of-text, and the
    # fallback would decode 26 times to the token limit), beside the encoder's FLOP count over
    # Whisper's 30 s window. Also runs here (OUT=DIR, after --stage).
    shift
    utts=$(grep -c . "$STAGE/calib.jsonl")
    nproc | sed 's/^/cores\t/' | tee -a "$OUT/scale.tsv"
    for size in "$@"; do
        src=$(source_of "$size")
        python3 - "$src/config.json" "$size" <<'PY' | tee -a "$OUT/scale.tsv"
import json, sys
c = json.load(open(sys.argv[1]))
d, layers, mels, frames = c["d_model"], c["encoder_layers"], c["num_mel_bins"], 2 * c["max_source_positions"]
t = frames // 2
conv = 2 * 3 * mels * d * frames + 2 * 3 * d * d * t
# per layer: q, k, v, out (4 d^2) and the FFN (8 d^2 for ffn = 4d) per frame; scores and values 2 T^2 d
ffn = c["encoder_ffn_dim"]
layer = 2 * t * (4 * d * d + 2 * d * ffn) + 4 * t * t * d
print(f"{sys.argv[2]}-encoder-gflop\t{(conv + layers * layer) / 1e9:.1f}")
PY
        timed "$size-calib-smoothquant-${utts}utt-no-fallback" "$Q" "$src" "$W/$size-sq" \
            --recipe smoothquant_w8a8 --calib-manifest "$STAGE/calib.jsonl" \
            --calib-utterances "$utts" --no-fallback --overwrite
        # the run's own stage breakdown: (hashing …, loading …, calibrating …, writing …)
        grep -o 'in [0-9.]* s (hashing.*)' "$W/last.log" | sed "s/^/$size-stages\t/" | tee -a "$OUT/scale.tsv"
        timed "$size-verify-1utt-no-fallback" "$Q" verify "$W/$size-sq" --reference "$src" \
            --manifest "$STAGE/calib.jsonl" --limit 1 --no-fallback
        rm -rf "$W/$size-sq"
    done
    ;;
recipes)
    # Every built-in recipe on each shape, calibrating ones on the first utterance of calib.jsonl
    # with one greedy decoding (`--no-fallback`, as `cost`); each checkpoint's spec is read back
    # by `inspect --json` (quantized layers, fused norms, chains) and must list the recipe.
    shift
    nproc | sed 's/^/cores\t/' | tee -a "$OUT/scale.tsv"
    for size in "$@"; do
        src=$(source_of "$size")
        tomls=(recipes/*.toml)   # the built-in recipes are these files
        if [[ -n ${RECIPES:-} ]]; then
            tomls=()
            for r in $RECIPES; do tomls+=("recipes/$r.toml"); done
        fi
        for toml in "${tomls[@]}"; do
            recipe=$(basename "$toml" .toml)
            calib=()
            grep -q '^calibration = true' "$toml" &&
                calib=(--calib-manifest "$STAGE/calib.jsonl" --calib-utterances 1 --no-fallback)
            timed "$size-$recipe" "$Q" "$src" "$W/$size-q" --recipe "$recipe" "${calib[@]}" --overwrite
            "$Q" inspect "$W/$size-q" --json >"$W/inspect.json"
            python3 - "$W/inspect.json" "$size-$recipe" "$recipe" <<'PY2' | tee -a "$OUT/scale.tsv"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["quantized_layers"] > 0, s
assert sys.argv[3] in json.dumps(s["producer"]), "the spec does not name its recipe"
print(f"{sys.argv[2]}-spec\tlayers {s['quantized_layers']}\tfused norms {s['fused_norms']}\tchains {s['gemm_chains']}\tkept {len(s['skipped'])}")
PY2
            rm -rf "$W/$size-q"
        done
    done
    ;;
*)
    echo "usage: $0 --stage | fixture | scale SIZE... | calib SIZE... | cost SIZE... | recipes SIZE..." >&2
    exit 2
    ;;
esac
