#!/usr/bin/env bash
# fp8 as the GPU serves it (docs/accuracy.md "fp8 on the GPU", BENCHMARKS.md "fp8 accumulation"):
# the gate's fp8 entries verified on the GPU lane and on the CPU reference, with each fp8
# accumulation scheme of the GPU, and the GEMM speed of each scheme. Runs on the lent GPU machine
# after the two installs of benches/accuracy-device-run.sh (built with --features cuda):
#
#   cargo build --release --features cuda && benches/accuracy-device-run.sh --stage   # here
#   benches/accuracy-device-run.sh --install a ; ... --install b                      # there
#   benches/fp8-gpu-device-run.sh gate [PROFILE]       # there: the gate on the GPU (default ci)
#   benches/fp8-gpu-device-run.sh variants [PROFILE]   # there, while warm: the other schemes
#   benches/fp8-gpu-device-run.sh speed                # there: bench-gemm per scheme
#   GATE=benches/fp8-gpu.toml benches/fp8-gpu-device-run.sh gate cross_domain   # every utterance
#   ENTRIES="fp8_rtn" benches/fp8-gpu-device-run.sh gate long    # the long set (installs c and d)
#   SCHEMES=mma benches/fp8-gpu-device-run.sh variants long      # only the mma.sync kernels
#
# The schemes: wgmma promoting every 128 K elements into the f32 master accumulator (the
# default), every 64 or 32 (OASR_NVRTC_OPTIONS=-DOASR_WGMMA_FP8_PROMOTE=N), and the mma.sync
# kernels (OASR_CUDA_GEMM=mma). Results land in $OUT as one tarball and a summary.
set -uo pipefail

ACC=/root/acc
B=${OASR_BIN:-$ACC/oasr-quantize}
OUT=${OUT:-./out}
mkdir -p "$OUT"
# shellcheck source=benches/device-libs.sh
source "$(dirname "$0")/device-libs.sh"
if [[ -f $ACC/assets.env ]]; then # the speed runs need no assets
    set -a
    # shellcheck disable=SC1091
    source "$ACC/assets.env"
    set +a
fi
export OASR_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv
echo "$(nproc) cores"

# GATE and ENTRIES choose the gate file and its entries (the full sets: benches/fp8-gpu.toml)
GATE=${GATE:-calib/gate.toml}
read -r -a ENTRIES <<< "${ENTRIES:-fp8_rtn smoothquant_fp8 fused_fp8 portable_fp8}"
# name and environment of each GPU scheme besides the default
VARIANTS=()
for v in "p64 OASR_NVRTC_OPTIONS=-DOASR_WGMMA_FP8_PROMOTE=64" \
         "p32 OASR_NVRTC_OPTIONS=-DOASR_WGMMA_FP8_PROMOTE=32" \
         "mma OASR_CUDA_GEMM=mma"; do
    [[ " ${SCHEMES:-p64 p32 mma} " == *" ${v%% *} "* ]] && VARIANTS+=("$v")
done

work=/tmp/fp8-gate
profile=${2:-ci}
limit=$([[ $profile == ci ]] && echo 24 || echo 100000)
# the sets `variants` verifies on: the long profile's one set, else both gates
if [[ $profile == long ]]; then
    SETS=("cross_domain_long:${OASR_XDOMAIN_LONG_MANIFEST:-}")
else
    SETS=("in_domain:${OASR_GATE_MANIFEST:-}" "cross_domain:${OASR_XDOMAIN_GATE_MANIFEST:-}")
fi
case "${1:-}" in
gate)
    # The default scheme, judged by the gate against the CPU reference of the same checkpoints
    # (kept in $work for `variants`, while the machine is warm; a later call's entries add to
    # the earlier calls' report).
    mkdir -p "$OUT/r" "$work"
    only=()
    for e in "${ENTRIES[@]}"; do only+=(--only "$e"); rm -rf "${work:?}/$e"; done
    "$B" gate "$GATE" --profile "$profile" "${only[@]}" --device cuda --keep "$work" \
        --json "$OUT/r/gate-p128.json" 2>&1 | grep -v '^ *\[' | tee "$OUT/r/gate-p128.log"
    python3 - "$OUT/r/gate-p128.json" /tmp/gate-p128.json <<'EOF3'
import json, os, sys
new, acc = sys.argv[1], sys.argv[2]
report = json.load(open(new))
if os.path.exists(acc):
    old = json.load(open(acc))
    names = {(r["name"], r["set"]) for r in report["results"]}
    report["results"] = [r for r in old["results"] if (r["name"], r["set"]) not in names] + report["results"]
json.dump(report, open(acc, "w"))
EOF3
    tar -C "$OUT" -czf "$OUT/fp8-gate.tgz" r && rm -rf "$OUT/r"
    ;;
variants)
    mkdir -p "$OUT/r"
    cp /tmp/gate-p128.json "$OUT/r/"
    for v in "${VARIANTS[@]}"; do
        read -r name envs <<< "$v"
        for e in "${ENTRIES[@]}"; do
            for set in "${SETS[@]}"; do
                env $envs "$B" verify "$work/$e" --reference "$OASR_WHISPER_TINY_EN" \
                    --manifest "${set#*:}" --limit "$limit" --device cuda \
                    --json "$OUT/r/$name-$e-${set%%:*}.json" > "$OUT/r/$name-$e-${set%%:*}.log" 2>&1 ||
                    echo "FAILED: $name $e ${set%%:*}"
            done
        done
        echo "== $name done"
    done
    python3 - "$OUT/r" <<'EOF2' | tee "$OUT/summary-accuracy.md"
import json, sys, pathlib
r = pathlib.Path(sys.argv[1])
gate = json.loads((r / "gate-p128.json").read_text())
print("| entry | set | cpu mean (min) | wgmma p128 | p64 | p32 | mma.sync |")
print("|---|---|---|---|---|---|---|")
for g in gate["results"]:
    if not g.get("cpu_reference"):
        continue
    cpu = g["cpu_reference"]
    cells = [f"{cpu['cosine_mean']:.6f} ({cpu['cosine_min']:.3f})"]
    tf = g["verify"]["teacher_forced"]
    cells.append(f"{tf['cosine_mean']:.6f} ({tf['cosine_min']:.3f}) {tf['cosine_mean'] - cpu['cosine_mean']:+.6f}")
    for v in ["p64", "p32", "mma"]:
        f = r / f"{v}-{g['name']}-{g['set']}.json"
        if f.exists():
            t = json.loads(f.read_text())["teacher_forced"]
            cells.append(f"{t['cosine_mean']:.6f} ({t['cosine_min']:.3f}) {t['cosine_mean'] - cpu['cosine_mean']:+.6f}")
        else:
            cells.append("—")
    print(f"| {g['name']} | {g['set']} | " + " | ".join(cells) + " |")
EOF2
    tar -C "$OUT" -czf "$OUT/fp8-variants.tgz" r && rm -rf "$OUT/r"
    ;;
speed)
    shapes=${SHAPES:-default}
    "$B" bench-gemm --shapes "$shapes" --json "$OUT/bench-p128.json" > "$OUT/bench-p128.md" 2>&1
    for v in "${VARIANTS[@]:0:2}"; do
        read -r name envs <<< "$v"
        env $envs "$B" bench-gemm --shapes "$shapes" --json "$OUT/bench-$name.json" \
            > "$OUT/bench-$name.md" 2>&1
    done
    python3 - "$OUT" <<'EOF' | tee "$OUT/summary-speed.md"
import json, sys, pathlib
o = pathlib.Path(sys.argv[1])
runs = {v: json.loads((o / f"bench-{v}.json").read_text()) for v in ["p128", "p64", "p32"]
        if (o / f"bench-{v}.json").exists()}
print("| M | N | K | cuBLASLt fp8 µs | " + " | ".join(f"ours {v} µs (x of cuBLASLt)" for v in runs) + " | " +
      " | ".join(f"{v} / p128" for v in runs if v != "p128") + " |")
print("|---|---|---|---|" + "---|" * (2 * len(runs) - 1))
base = runs["p128"]["results"]
for i, s in enumerate(base):
    lt = s["cublaslt_fp8"].get("median_us")
    cells, times = [], {}
    for v, r in runs.items():
        f = r["results"][i]["ours_fp8"]
        t = f.get("timing", {}).get("median_us")
        times[v] = t
        cells.append(f"{t:.1f} ({lt / t:.2f}x)" if t and lt else "n/a")
    ratios = [f"{times[v] / times['p128']:.3f}" if times.get(v) and times.get("p128") else "n/a"
              for v in runs if v != "p128"]
    print(f"| {s['m']} | {s['n']} | {s['k']} | {lt if lt is None else f'{lt:.1f}'} | " +
          " | ".join(cells) + " | " + " | ".join(ratios) + " |")
EOF
    ;;
*)
    echo "usage: $0 gate|variants [PROFILE] | speed" >&2
    exit 2
    ;;
esac
