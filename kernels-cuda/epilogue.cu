// The scaled-GEMM epilogue (docs/numerics.md) as a kernel of its own, applied to an int32 [M, N]
// accumulator written by another GEMM (cuBLASLt's i8·i8 -> i32 in `bench-gemm`). It computes
// exactly what the fused epilogue of scaled_mm computes, so "cuBLASLt + this kernel" is
// bit-identical to our scaled_mm and to the CPU reference: the benchmark compares equal work.
//
// Each thread finishes 8 neighbouring outputs of one row (N % 8 == 0): two 16-byte loads of
// accumulators, 16-byte loads of the column operands, one 16-byte store; the activation and
// the output dtype are template parameters, NaN takes a per-thread slow path. As lean as the
// fused epilogue, so that the benchmark's "separate epilogue" baseline is a fair one.
template <int ACT, int OUT>
__device__ __forceinline__ void oasr_epilogue_i32_body(const i32* __restrict__ acc,
                                                       const Epilogue& epi, i32 m, i32 n) {
    const i64 groups = (i64)m * (n / 8);
    const bool has_bias = epi.bias != 0;
    for (i64 gi = (i64)blockIdx.x * blockDim.x + threadIdx.x; gi < groups;
         gi += (i64)gridDim.x * blockDim.x) {
        const i64 first = gi * 8;
        // 32-bit division whenever the group index fits (it does below 2^31 groups).
        const int gpr = n / 8;
        int row, col;
        if (gi < 0x7FFFFFFF) {
            row = (int)((u32)gi / (u32)gpr);
            col = (int)((u32)gi - (u32)row * (u32)gpr) * 8;
        } else {
            row = (int)(first / n);
            col = (int)(first % n);
        }
        const float a_scale = epi.a_scale != 0 ? epi.a_scale[row] : epi.a_scale_value;
        const int4 v0 = *reinterpret_cast<const int4*>(acc + first);
        const int4 v1 = *reinterpret_cast<const int4*>(acc + first + 4);
        const float4 w0 = *reinterpret_cast<const float4*>(epi.weight_scale + col);
        const float4 w1 = *reinterpret_cast<const float4*>(epi.weight_scale + col + 4);
        float4 b0 = {0.0f, 0.0f, 0.0f, 0.0f}, b1 = b0;
        if (has_bias) {
            b0 = *reinterpret_cast<const float4*>(epi.bias + col);
            b1 = *reinterpret_cast<const float4*>(epi.bias + col + 4);
        }
        const float f[8] = {__int2float_rn(v0.x), __int2float_rn(v0.y), __int2float_rn(v0.z),
                            __int2float_rn(v0.w), __int2float_rn(v1.x), __int2float_rn(v1.y),
                            __int2float_rn(v1.z), __int2float_rn(v1.w)};
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
        float y[8];
        bool nan = false;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            y[i] = oasr_epilogue_value(f[i], w[i], a_scale, has_bias, b[i], ACT);
            nan |= oasr_isnan(y[i]);
        }
        uint4 bits;
        if (!nan) {
            bits.x = oasr_pack_rounded<OUT>(y[0], y[1]);
            bits.y = oasr_pack_rounded<OUT>(y[2], y[3]);
            bits.z = oasr_pack_rounded<OUT>(y[4], y[5]);
            bits.w = oasr_pack_rounded<OUT>(y[6], y[7]);
        } else {
            // Rare: round_to_out of every value, as the reference.
            bits.x = oasr_round_pair_to_out(OUT, y[0], y[1]);
            bits.y = oasr_round_pair_to_out(OUT, y[2], y[3]);
            bits.z = oasr_round_pair_to_out(OUT, y[4], y[5]);
            bits.w = oasr_round_pair_to_out(OUT, y[6], y[7]);
        }
        *reinterpret_cast<uint4*>(static_cast<u16*>(epi.out) + first) = bits;
    }
}

template <int OUT>
__device__ __forceinline__ void oasr_epilogue_i32_out(const i32* __restrict__ acc,
                                                      const Epilogue& epi, i32 m, i32 n) {
    switch (epi.activation) {
        case OASR_ACT_RELU:
            oasr_epilogue_i32_body<OASR_ACT_RELU, OUT>(acc, epi, m, n);
            break;
        case OASR_ACT_SWISH:
            oasr_epilogue_i32_body<OASR_ACT_SWISH, OUT>(acc, epi, m, n);
            break;
        case OASR_ACT_GELU:
            oasr_epilogue_i32_body<OASR_ACT_GELU, OUT>(acc, epi, m, n);
            break;
        default:
            oasr_epilogue_i32_body<OASR_ACT_NONE, OUT>(acc, epi, m, n);
            break;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    oasr_epilogue_i32(const i32* __restrict__ acc, Epilogue epi, i32 m, i32 n) {
    if (epi.out_dtype == OASR_OUT_F16) {
        oasr_epilogue_i32_out<OASR_OUT_F16>(acc, epi, m, n);
    } else {
        oasr_epilogue_i32_out<OASR_OUT_BF16>(acc, epi, m, n);
    }
}
