#!/usr/bin/env bash
# Does the CPU's model of the tensor cores (`verify --fp8-accumulation tensor-core`) predict what
# the GPU serves? Quantizes each fp8 recipe named in RECIPES and verifies the checkpoint on SET
# twice: with the GEMMs on the GPU (`--device cuda`, the default wgmma kernels) and on the CPU
# with the tensor-core model. Runs on the lent GPU machine after the installs of
# benches/accuracy-device-run.sh (a build with --features cuda):
#
#   cargo build --release --features cuda && benches/accuracy-device-run.sh --stage   # here
#   benches/accuracy-device-run.sh --install a ; ... --install b                      # there
#   RECIPES="fp8_w8a8_rtn" benches/tensor-core-device-run.sh cross_domain             # there
#
# SET is cross_domain (the default), in_domain or long (installs c and d). The reports land in
# $OUT as <recipe>-<set>-{gpu,tc}.json; benches/paired_cosine.py compares two of them.
# LIMIT=N verifies only the set's first N utterances (on both lanes).
# PER_LAYER=N adds `verify --per-layer --device cuda --fp8-accumulation tensor-core` on the first
# N utterances and lists every layer whose GPU output differs from the CPU model on the same
# input (to find the step that parts the lanes where the reports differ).
set -uo pipefail

ACC=/root/acc
B=${OASR_BIN:-$ACC/oasr-quantize}
OUT=${OUT:-./out}
mkdir -p "$OUT"
# shellcheck source=benches/device-libs.sh
source "$(dirname "$0")/device-libs.sh"
set -a
# shellcheck disable=SC1091
source "$ACC/assets.env"
set +a
export OASR_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "$(nproc) cores"

set_name=${1:-cross_domain}
case $set_name in
cross_domain) manifest=$OASR_XDOMAIN_GATE_MANIFEST ;;
in_domain) manifest=$OASR_GATE_MANIFEST ;;
long) manifest=$OASR_XDOMAIN_LONG_MANIFEST ;;
*) echo "unknown set $set_name (cross_domain, in_domain, long)" >&2; exit 2 ;;
esac
read -r -a RECIPES <<< "${RECIPES:-fp8_w8a8_rtn}"
status=0
for r in "${RECIPES[@]}"; do
    q=/tmp/tc-$r
    if [[ ! -d $q ]]; then
        start=$SECONDS
        calib=()
        grep -q '^calibration = true' "recipes/$r.toml" && calib=(--calib-manifest "$OASR_CALIB_MANIFEST")
        "$B" "$OASR_WHISPER_TINY_EN" "$q" --recipe "$r" "${calib[@]}" --overwrite > /dev/null ||
            { status=1; continue; }
        echo "$r: quantized in $((SECONDS - start)) s"
    fi
    for lane in gpu tc; do
        case $lane in
        gpu) opts=(--device cuda) ;;
        tc) opts=(--fp8-accumulation tensor-core) ;;
        esac
        start=$SECONDS
        "$B" verify "$q" --reference "$OASR_WHISPER_TINY_EN" --manifest "$manifest" "${opts[@]}" \
            ${LIMIT:+--limit "$LIMIT"} \
            --json "$OUT/$r-$set_name-$lane.json" > "$OUT/$r-$set_name-$lane.log" 2>&1 || status=1
        echo "$r $set_name $lane: $((SECONDS - start)) s"
    done
    python3 - "$OUT/$r-$set_name-gpu.json" "$OUT/$r-$set_name-tc.json" <<'PY' || status=1
import json, sys
g, t = (json.load(open(p)) for p in sys.argv[1:])
same = sum(a == b for a, b in zip(g["transcripts"], t["transcripts"]) if a["id"] == b["id"])
print(f"  utterances whose transcripts and teacher-forced figures are the same: "
      f"{same} of {len(g['transcripts'])}")
for name, r in (("gpu", g), ("tc ", t)):
    f = r["teacher_forced"]
    print(f"  {name}: cosine {f['cosine_mean']:.6f} (min {f['cosine_min']:.3f}), centred "
          f"{f['centered_cosine_mean']:.6f}, KL {f['kl_mean']:.3e}, WER {r['wer_quantized']}")
PY
    if [[ -n ${PER_LAYER:-} ]]; then
        "$B" verify "$q" --reference "$OASR_WHISPER_TINY_EN" --manifest "$manifest" \
            --limit "$PER_LAYER" --per-layer --device cuda --fp8-accumulation tensor-core \
            --json "$OUT/$r-$set_name-layers.json" > /dev/null 2>&1 || status=1
        python3 - "$OUT/$r-$set_name-layers.json" <<'PY' || status=1
import json, sys
layers = json.load(open(sys.argv[1]))["per_layer"]["layers"]
differ = [(l["name"], l["output_error"]["gpu"]["relative_l2_to_cpu"]) for l in layers
          if l["output_error"].get("gpu", {}).get("relative_l2_to_cpu")]
print(f"  layers whose GPU output differs from the CPU model: {len(differ)} of {len(layers)}")
for name, d in differ:
    print(f"    {name}: {d:.3e}")
PY
    fi
done
exit $status
