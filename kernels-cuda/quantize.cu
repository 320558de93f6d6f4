// Activation quantization (src/numerics/quantize.rs): the per-token (dynamic) rule, with the
// optional runtime smoother, and the static rule at a calibrated input_scale.

#define OASR_QUANT_THREADS 256

// Per-token quantization of x [rows, cols]: one CTA per row.
//   x'_j = x_j * smooth_inv_j (with a smoother);  amax = max(max_j |x'_j|, 1e-8)
//   mult = Q / amax;  q_j = encode(x'_j * mult);  scale = amax / Q
// max is exact and order independent (fmaxf ignores NaN like f32::max), so the reduction tree
// does not matter; everything else is one rounding per operation, as on the CPU.
extern "C" __global__ void __launch_bounds__(OASR_QUANT_THREADS)
    oasr_quantize_per_token(const float* __restrict__ x, const float* __restrict__ smooth_inv,
                            u8* __restrict__ codes, float* __restrict__ scales, i32 rows,
                            i32 cols, i32 dtype) {
    __shared__ float warp_max[OASR_QUANT_THREADS / 32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* xr = x + (i64)row * cols;
    u8* cr = codes + (i64)row * cols;
    float amax = OASR_AMAX_FLOOR;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = xr[j];
        if (smooth_inv != 0) {
            v = __fmul_rn(v, smooth_inv[j]);
        }
        amax = fmaxf(amax, fabsf(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    }
    if ((threadIdx.x & 31) == 0) {
        warp_max[threadIdx.x >> 5] = amax;
    }
    __syncthreads();
    amax = warp_max[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
        amax = fmaxf(amax, warp_max[w]);
    }
    const float q = oasr_qmax(dtype);
    const float mult = __fdiv_rn(q, amax);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = xr[j];
        if (smooth_inv != 0) {
            v = __fmul_rn(v, smooth_inv[j]);
        }
        cr[j] = oasr_encode(dtype, __fmul_rn(v, mult));
    }
    if (threadIdx.x == 0) {
        scales[row] = __fdiv_rn(amax, q);
    }
}

// Static quantization: q = encode(x * mult_j), where mult_j = smooth_inv_j * (1 / input_scale)
// comes from numerics::static_multipliers on the host (bitwise the reference's multipliers).
extern "C" __global__ void __launch_bounds__(OASR_QUANT_THREADS)
    oasr_quantize_static(const float* __restrict__ x, const float* __restrict__ mult,
                         u8* __restrict__ codes, i32 rows, i32 cols, i32 dtype) {
    const i64 total = (i64)rows * cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        codes[i] = oasr_encode(dtype, __fmul_rn(x[i], mult[i % cols]));
    }
}
