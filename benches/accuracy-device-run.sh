#!/usr/bin/env bash
# Gate runs (the accuracy tables and the recipe ablations) on the 16 CPU cores of the lent GPU
# machine, which has no Rust toolchain and cannot fetch the assets. No GPU is used.
#
# Here, after `cargo build --release` and calib/fetch-assets.sh:
#   benches/accuracy-device-run.sh --stage
# stages two parts under .dev-out/acc, each under the 64 MiB a device call may carry:
#   a/  the stripped, gzipped binary and the first part of tiny.en's model.bin
#   b/  the rest of the model and every manifest of assets.env with its audio as FLAC (lossless:
#       the decoded samples are those of the WAV files), except the long set's audio
#   c/, d/  the long set's audio (crossdomain/gate-long.jsonl, 66 MB of FLAC), in two halves
# On the device machine, in calls back to back (the machine keeps /root/acc while warm):
#   benches/accuracy-device-run.sh --install a        # carry .dev-out/acc/a
#   benches/accuracy-device-run.sh --install b        # carry .dev-out/acc/b
#   benches/accuracy-device-run.sh --install c        # and d: only for the `long` profiles
# then, in the same or a later call while the machine is warm:
#   benches/accuracy-device-run.sh GATE.toml PROFILE [gate options...]
# which runs `oasr-quantize gate GATE.toml --profile PROFILE --json $OUT/<gate>-<profile>.json`.
set -euo pipefail

ACC=/root/acc
STAGE=.dev-out/acc

if [[ "${1:-}" == "--stage" ]]; then
    # audio_paths MANIFEST: each line's `audio` path, as written in the manifest
    audio_paths() {
        python3 -c 'import json,sys; [print(json.loads(l)["audio"]) for l in open(sys.argv[1]) if l.strip()]' "$1"
    }
    src=${OASR_CACHE_DIR:-$HOME/.cache/oasr-quantize}
    rm -rf "$STAGE"
    mkdir -p "$STAGE/a" "$STAGE/b/whisper-tiny.en"
    strip -o "$STAGE/a/oasr-quantize" target/release/oasr-quantize
    gzip -9 "$STAGE/a/oasr-quantize"
    m="$src/whisper-tiny.en"
    split -b 46000000 -d "$m/model.bin" "$STAGE/model.bin.part"
    mv "$STAGE/model.bin.part00" "$STAGE/a/"
    mv "$STAGE/model.bin.part01" "$STAGE/b/whisper-tiny.en/"
    cp "$m"/{config.json,vocabulary.txt} "$STAGE/b/whisper-tiny.en/"
    gzip -9c "$m/tokenizer.json" > "$STAGE/b/whisper-tiny.en/tokenizer.json.gz"
    sha256sum "$m/model.bin" | cut -d' ' -f1 > "$STAGE/b/whisper-tiny.en/model.bin.sha256"
    : > "$STAGE/b/assets.env"
    while IFS='=' read -r key path; do
        [[ "$key" == *MANIFEST ]] || continue
        rel=${path#"$src"/}
        dir=$(dirname "$rel")
        mkdir -p "$STAGE/b/$dir/flac"
        python3 - "$path" "$STAGE/b/$rel" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src) as f, open(dst, "w") as out:
    for line in f:
        if line.strip():
            u = json.loads(line)
            name = u["audio"].rsplit("/", 1)[-1].rsplit(".", 1)[0]
            u["audio"] = "flac/" + name + ".flac"
            out.write(json.dumps(u) + "\n")
PY
        audio_paths "$path" |
            while read -r a; do
                name=$(basename "$a" .wav)
                [[ -f "$STAGE/b/$dir/flac/$name.flac" ]] ||
                    sox -D -R -V1 "$(dirname "$path")/$a" "$STAGE/b/$dir/flac/$name.flac"
            done
        echo "$key=$ACC/$rel" >> "$STAGE/b/assets.env"
    done < "$src/assets.env"
    echo "OASR_WHISPER_TINY_EN=$ACC/whisper-tiny.en" >> "$STAGE/b/assets.env"
    # The long set alone is over one call's 64 MiB: its audio travels in two parts of its own.
    long=$(grep '^OASR_XDOMAIN_LONG_MANIFEST=' "$src/assets.env" | cut -d= -f2-)
    if [[ -n $long ]]; then
        rel=${long#"$src"/}
        mkdir -p "$STAGE/c/$(dirname "$rel")/flac" "$STAGE/d/$(dirname "$rel")/flac"
        audio_paths "$STAGE/b/$rel" | awk '{ print (NR % 2 ? "c" : "d") " " $0 }' |
            while read -r part a; do
                mv "$STAGE/b/$(dirname "$rel")/$a" "$STAGE/$part/$(dirname "$rel")/$a"
            done
    fi
    du -sh "$STAGE"/*/
    exit 0
fi

if [[ "${1:-}" == "--install" ]]; then
    part=$2
    mkdir -p "$ACC"
    cp -r "$STAGE/$part/." "$ACC/"
    if [[ -f $ACC/model.bin.part00 && -f $ACC/whisper-tiny.en/model.bin.part01 ]]; then
        m=$ACC/whisper-tiny.en
        cat "$ACC/model.bin.part00" "$m/model.bin.part01" > "$m/model.bin"
        rm -f "$ACC/model.bin.part00" "$m/model.bin.part01"
        echo "$(cat "$m/model.bin.sha256")  $m/model.bin" | sha256sum -c -
        gunzip -f "$m/tokenizer.json.gz"
    fi
    if [[ -f $ACC/oasr-quantize.gz ]]; then gunzip -f "$ACC/oasr-quantize.gz"; chmod +x "$ACC/oasr-quantize"; fi
    ls -la "$ACC"
    exit 0
fi

gate=$1 profile=$2
shift 2
set -a
# shellcheck disable=SC1091
source "$ACC/assets.env"
set +a
OUT=${OUT:-./out}
mkdir -p "$OUT"
name=$(basename "$gate" .toml)-$profile
echo "$(nproc) cores; $gate profile $profile"
"$ACC/oasr-quantize" gate "$gate" --profile "$profile" --json "$OUT/$name.json" "$@" 2>&1 |
    tee "$OUT/$name.log" || true
