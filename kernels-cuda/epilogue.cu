// The epilogue of DESIGN.md section 3 as a kernel of its own, applied to an int32 [M, N]
// accumulator written by another GEMM (cuBLASLt's i8·i8 -> i32 in `bench-gemm`). It computes
// exactly what the fused epilogue of scaled_mm computes, so "cuBLASLt + this kernel" is
// bit-identical to our scaled_mm and to the CPU reference: the benchmark compares equal work.
//
// Each thread finishes 8 neighbouring outputs of one row (N % 8 == 0): two 16-byte loads of
// accumulators, four pair stores.
extern "C" __global__ void __launch_bounds__(256)
    oasr_epilogue_i32(const i32* __restrict__ acc, Epilogue epi, i32 m, i32 n) {
    const i64 groups = (i64)m * (n / 8);
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
        const float f[8] = {__int2float_rn(v0.x), __int2float_rn(v0.y), __int2float_rn(v0.z),
                            __int2float_rn(v0.w), __int2float_rn(v1.x), __int2float_rn(v1.y),
                            __int2float_rn(v1.z), __int2float_rn(v1.w)};
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const OasrColumns c = oasr_columns(epi, col + 2 * p);
            oasr_store_pair(epi, c, n, row, col + 2 * p, f[2 * p], f[2 * p + 1], a_scale);
        }
    }
}
