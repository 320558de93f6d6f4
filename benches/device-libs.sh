# Sourced by the benches/*-device-run.sh scripts on the GPU machine: puts the directories of
# NVRTC 13 and cuBLASLt 13 (found through ldconfig, else under /usr/local, /opt, /usr/lib) on
# LD_LIBRARY_PATH, since the runtime loads them by name, and sets the default module cache.
for lib in libnvrtc.so.13 libcublasLt.so.13; do
    p=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l { print $NF; exit }')
    [[ -n "$p" ]] || p=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | grep -v '\.alt\.' | head -1)
    if [[ -n "$p" ]]; then
        export LD_LIBRARY_PATH="$(dirname "$p")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    else
        echo "warning: $lib not found" >&2
    fi
done
export OASR_CUDA_CACHE_DIR=${OASR_CUDA_CACHE_DIR:-/tmp/oasr-cuda-cache}
