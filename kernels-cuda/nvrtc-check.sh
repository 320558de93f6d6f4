#!/usr/bin/env bash
# CI check of the CUDA kernels without a GPU: compile every kernel of kernels-cuda/ with NVRTC
# for sm_80, sm_89, sm_90 and sm_90a, the target of 9.0 devices with the Hopper wgmma / TMA
# kernels (tests/cuda_nvrtc.rs: entry points, no spills, no serialized wgmma). NVRTC comes from
# the `nvidia-cuda-nvrtc` wheel of PyPI, installed once into a cache directory;
# OASR_REQUIRE_NVRTC=1 turns "NVRTC not found" into a failure instead of a skip.
#
#   kernels-cuda/nvrtc-check.sh                # from the repository root
#
# Environment: NVRTC_WHEEL_VERSION (default 13.0.88, the CUDA 13.0 of the GPU machines),
# OASR_NVRTC_CACHE (default ~/.cache/oasr-quantize/nvrtc), PYTHON (default python3).
set -euo pipefail

version=${NVRTC_WHEEL_VERSION:-13.0.88}
cache=${OASR_NVRTC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oasr-quantize/nvrtc}
python=${PYTHON:-python3}
dir="$cache/$version"
lib="$dir/nvidia/cu13/lib"

if ! ls "$lib"/libnvrtc.so.* > /dev/null 2>&1; then
    echo "installing nvidia-cuda-nvrtc==$version into $dir" >&2
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$dir" "nvidia-cuda-nvrtc==$version"
fi

export OASR_NVRTC_LIB_DIR="$lib"
export OASR_REQUIRE_NVRTC=1
exec cargo test --release --features cuda --test cuda_nvrtc -- --nocapture
