// Scaled GEMM of a W8A8 layer with its fused epilogue: out = epilogue(A · Wᵀ).
//
// A is [M, K] and W is [N, K], 8-bit codes, both row-major (the weight keeps its [N, K] layout,
// which is exactly the "col" operand of mma.sync). Contract: M >= 1, K % 16 == 0, N % 8 == 0,
// both base pointers 16-byte aligned (checked by the runtime).
//
// - int8: mma.sync.m16n8k32 s8·s8 -> s32, exact int32 accumulation (K <= INT8_MAX_K);
//   the accumulator becomes f32 once, nearest-even, in the epilogue. Bit-exact with the CPU
//   reference whatever the tile.
// - e4m3 (sm_89+): the e4m3 fragments are widened to f16 (exactly: every e4m3 value is an f16
//   value, and the products of two are exact in f32) and multiplied with mma.sync.m16n8k16
//   f16·f16 -> f32, two per k32 step (k 0..15, then 16..31). sm_90 has no native form of
//   mma.m16n8k32.e4m3 (ptxas expands it into the same conversions and HMMA.16816, but once per
//   mma instead of once per fragment). Every output is the chain
//   D = mma(A[:, k0:k0+16], W[:, k0:k0+16], D) for k0 = 0, 16, 32, ... from D = +0, in that
//   order, in every tile configuration and for every M: no split-K, no reordering, so a row's
//   result does not depend on the batch it is in or on the tile that computes it.
//
// Tiling: a CTA computes a BM x BN output tile with WARPS_M x WARPS_N warps; K advances in
// BK-byte slices through a STAGES-deep ring of shared-memory buffers filled by cp.async
// (16-byte, L2-only .cg copies; rows past M / N and chunks past K are zero-filled). Shared rows
// are BK bytes of 16-byte chunks, XOR-swizzled so that every ldmatrix phase (8 rows x 16 bytes)
// hits 32 distinct banks. Fragments come from ldmatrix.x4; the epilogue reads the accumulators
// straight from registers.

template <bool FP8>
struct AccType {
    typedef i32 type;
};
template <>
struct AccType<true> {
    typedef float type;
};

__device__ __forceinline__ float oasr_acc_to_f32(i32 v) { return __int2float_rn(v); }
__device__ __forceinline__ float oasr_acc_to_f32(float v) { return v; }

__device__ __forceinline__ void oasr_cp_async16(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void oasr_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void oasr_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void oasr_ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void oasr_mma(i32 (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two e4m3 codes (a 16-bit half of a fragment register) to two f16 (exact: every e4m3 value,
// subnormals included, is an f16 value).
__device__ __forceinline__ u32 oasr_e4m3x2_to_f16x2(u32 v) {
    u32 r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const u16 h = (u16)v;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
#endif
    return r;
}

__device__ __forceinline__ void oasr_mma_f16(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                             u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The e4m3 fragments of one k32 step, widened to f16 once (not once per mma, which is what
// ptxas does for mma.m16n8k32.e4m3 on sm_90, where that instruction has no native form).
//
// Register x of an 8-bit fragment holds k = 4t .. 4t+3 (lane t = lane % 4; +16 for a2, a3, b1).
// Its low half (k = 4t, 4t+1) becomes f16 "virtual" k = 2t, 2t+1 and its high half
// (k = 4t+2, 4t+3) virtual k = 2t+8, 2t+9 of an m16n8k16 fragment. A and B use the same
// bijection, so each m16n8k16 sums exactly the products of real k = 0..15, then 16..31: a fixed
// order, the same for every tile and every M.
struct OasrF16Frag {
    u32 a[2][4];  // [k16 half][m16n8k16 A registers]
};

__device__ __forceinline__ void oasr_widen_a(OasrF16Frag& f, const u32 (&a)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 top = a[2 * h], bottom = a[2 * h + 1];  // rows g and g + 8
        f.a[h][0] = oasr_e4m3x2_to_f16x2(top & 0xFFFFu);
        f.a[h][1] = oasr_e4m3x2_to_f16x2(bottom & 0xFFFFu);
        f.a[h][2] = oasr_e4m3x2_to_f16x2(top >> 16);
        f.a[h][3] = oasr_e4m3x2_to_f16x2(bottom >> 16);
    }
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared tile of CPR chunks per row.
template <int CPR>
__device__ __forceinline__ u32 oasr_swizzle(int row, int chunk) {
    static_assert(CPR == 4 || CPR == 8, "BK must be 64 or 128 bytes");
    const int s = CPR == 8 ? (chunk ^ (row & 7)) : (chunk ^ ((row >> 1) & 3));
    return (u32)(row * CPR + s) * 16u;
}

// Copies rows [row0, row0 + ROWS) x bytes [k0, k0 + BK) of a [rows, k] matrix into a shared
// tile; out-of-range rows and chunks are zero-filled (their source address stays in bounds).
template <int ROWS, int BK, int THREADS>
__device__ __forceinline__ void oasr_load_tile(u32 smem, const u8* g, int rows, int k, int row0,
                                               int k0, int tid) {
    constexpr int CPR = BK / 16;
    constexpr int CHUNKS = ROWS * CPR;
#pragma unroll
    for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; ++i) {
        const int idx = tid + i * THREADS;
        if (CHUNKS % THREADS == 0 || idx < CHUNKS) {
            const int r = idx / CPR;
            const int c = idx % CPR;
            const int gr = row0 + r;
            const int gk = k0 + c * 16;
            const bool ok = gr < rows && gk < k;
            const u8* src = g + (ok ? ((i64)gr * k + gk) : 0);
            oasr_cp_async16(smem + oasr_swizzle<CPR>(r, c), src, ok ? 16u : 0u);
        }
    }
}

template <bool FP8, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void oasr_scaled_mm(const GemmParams& p) {
    typedef typename AccType<FP8>::type Acc;
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M;  // warp tile rows
    constexpr int WTN = BN / WARPS_N;  // warp tile columns
    constexpr int MT = WTM / 16;       // m16 tiles per warp
    constexpr int NT = WTN / 8;        // n8 tiles per warp
    constexpr int CPR = BK / 16;
    constexpr u32 A_STAGE = BM * BK;
    constexpr u32 B_STAGE = BN * BK;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be a multiple of 16 x 16");
    static_assert(BK % 32 == 0, "BK must hold whole k32 steps");
    // Fully unrolled k32 steps let ptxas hoist the next step's ldmatrix over the current mma.
    constexpr int KS_UNROLL = BK / 32;

    extern __shared__ __align__(128) u8 oasr_smem[];
    const u32 smem_a = (u32)__cvta_generic_to_shared(oasr_smem);
    const u32 smem_b = smem_a + STAGES * A_STAGE;

    const int m = p.m, n = p.n, k = p.k;
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;

    // Grouped rasterization: GROUP_M row tiles share each column sweep, for L2 reuse of W.
    const int tiles_m = (m + BM - 1) / BM;
    const int tiles_n = (n + BN - 1) / BN;
    constexpr int GROUP_M = 8;
    const int pid = blockIdx.x;
    const int in_group = GROUP_M * tiles_n;
    const int group = pid / in_group;
    const int first_m = group * GROUP_M;
    const int group_m = min(tiles_m - first_m, GROUP_M);
    const int tile_m = first_m + (pid % in_group) % group_m;
    const int tile_n = (pid % in_group) / group_m;
    const int row0 = tile_m * BM;
    const int col0 = tile_n * BN;

    Acc acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

    const int ktiles = (k + BK - 1) / BK;

    // Epilogue operands, loaded now so that their latency hides behind the main loop: the
    // lane's two output columns, and the a_scale of row (lane % 16) of each m16 slab (handed
    // to the other lanes with a shuffle in the epilogue).
    constexpr int LPR = WTN / 2;  // lanes per output row in the epilogue
    static_assert(LPR <= 32 && 32 % LPR == 0, "warp tile width must be 16, 32 or 64");
    const int lane_col = (lane % LPR) * 2;
    const int col = col0 + warp_n * WTN + lane_col;
    const bool col_ok = col < n;
    OasrColumns cols = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (col_ok) {
        cols = oasr_columns(p.epi, col);
    }
    float slab_scale[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int row = row0 + warp_m * WTM + i * 16 + (lane & 15);
        slab_scale[i] = p.epi.a_scale == 0 ? p.epi.a_scale_value
                        : row < m          ? p.epi.a_scale[row]
                                           : 0.0f;
    }

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) {
            oasr_load_tile<BM, BK, THREADS>(smem_a + s * A_STAGE, p.a, m, k, row0, s * BK, tid);
            oasr_load_tile<BN, BK, THREADS>(smem_b + s * B_STAGE, p.w, n, k, col0, s * BK, tid);
        }
        oasr_cp_async_commit();
    }

    // Per-lane ldmatrix coordinates (see the fragment layouts of mma.m16n8k32 for 8-bit types).
    const int a_row = warp_m * WTM + (lane & 15);
    const int a_chunk = lane >> 4;
    const int b_row = warp_n * WTN + (lane & 7) + ((lane >> 4) << 3);
    const int b_chunk = (lane >> 3) & 1;

    for (int kt = 0; kt < ktiles; ++kt) {
        oasr_cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < ktiles) {
            const int s = next % STAGES;
            oasr_load_tile<BM, BK, THREADS>(smem_a + s * A_STAGE, p.a, m, k, row0, next * BK, tid);
            oasr_load_tile<BN, BK, THREADS>(smem_b + s * B_STAGE, p.w, n, k, col0, next * BK, tid);
        }
        oasr_cp_async_commit();

        const int s = kt % STAGES;
        const u32 sa = smem_a + s * A_STAGE;
        const u32 sb = smem_b + s * B_STAGE;
#pragma unroll KS_UNROLL
        for (int ks = 0; ks < BK / 32; ++ks) {
            u32 af[MT][4];
            u32 bf[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                oasr_ldmatrix_x4(af[i], sa + oasr_swizzle<CPR>(a_row + i * 16, ks * 2 + a_chunk));
            }
#pragma unroll
            for (int j = 0; j < NT / 2; ++j) {
                u32 r[4];
                oasr_ldmatrix_x4(r, sb + oasr_swizzle<CPR>(b_row + j * 16, ks * 2 + b_chunk));
                bf[2 * j][0] = r[0];
                bf[2 * j][1] = r[1];
                bf[2 * j + 1][0] = r[2];
                bf[2 * j + 1][1] = r[3];
            }
            if constexpr (FP8) {
                OasrF16Frag fa[MT];
                u32 fb[NT][4];
#pragma unroll
                for (int i = 0; i < MT; ++i) oasr_widen_a(fa[i], af[i]);
#pragma unroll
                for (int j = 0; j < NT; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        fb[j][2 * h] = oasr_e4m3x2_to_f16x2(bf[j][h] & 0xFFFFu);
                        fb[j][2 * h + 1] = oasr_e4m3x2_to_f16x2(bf[j][h] >> 16);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int i = 0; i < MT; ++i)
#pragma unroll
                        for (int j = 0; j < NT; ++j)
                            oasr_mma_f16(acc[i][j], fa[i].a[h][0], fa[i].a[h][1], fa[i].a[h][2],
                                         fa[i].a[h][3], fb[j][2 * h], fb[j][2 * h + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < MT; ++i)
#pragma unroll
                    for (int j = 0; j < NT; ++j) oasr_mma(acc[i][j], af[i], bf[j][0], bf[j][1]);
            }
        }
    }
    oasr_cp_async_wait<0>();
    __syncthreads();  // every warp is done with the pipeline buffers: reuse them as scratch

    // Epilogue, one m16 slab of the warp tile at a time: the lane's accumulators (rows g and
    // g + 8, columns 2 * tig and 2 * tig + 1 of each n8 tile) go to the warp's scratch as f32
    // (int8: the one nearest-even conversion of the exact sum), then the warp walks the slab
    // row by row, each lane finishing two neighbouring columns, so that output stores are
    // contiguous across the warp. The scratch row stride is WTN + 8 floats (bank-conflict-free
    // 8-byte accesses).
    constexpr int SROW = WTN + 8;
    constexpr int RPI = 32 / LPR;  // slab rows per iteration
    float* scratch = reinterpret_cast<float*>(oasr_smem) + warp * 16 * SROW;
    const int g = lane >> 2;
    const int tig = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float2 lo, hi;
            lo.x = oasr_acc_to_f32(acc[i][j][0]);
            lo.y = oasr_acc_to_f32(acc[i][j][1]);
            hi.x = oasr_acc_to_f32(acc[i][j][2]);
            hi.y = oasr_acc_to_f32(acc[i][j][3]);
            *reinterpret_cast<float2*>(scratch + g * SROW + j * 8 + tig * 2) = lo;
            *reinterpret_cast<float2*>(scratch + (g + 8) * SROW + j * 8 + tig * 2) = hi;
        }
        __syncwarp();
        // ROWS rows of the slab per lane, U at a time: U independent epilogue chains in flight
        // (the activations are long dependent sequences of correctly rounded operations).
        constexpr int ROWS = 16 / RPI;
        constexpr int U = 4;
        static_assert(ROWS % U == 0, "slab rows per lane must be a multiple of U");
#pragma unroll 1
        for (int it = 0; it < ROWS; it += U) {
            float2 v[U];
            float a_scale[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int r = lane / LPR + (it + u) * RPI;
                v[u] = *reinterpret_cast<const float2*>(scratch + r * SROW + lane_col);
                a_scale[u] = __shfl_sync(0xFFFFFFFFu, slab_scale[i], r);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int row = row0 + warp_m * WTM + i * 16 + lane / LPR + (it + u) * RPI;
                if (row < m && col_ok) {
                    oasr_store_pair(p.epi, cols, n, row, col, v[u].x, v[u].y, a_scale[u]);
                }
            }
        }
        __syncwarp();
    }
}

// One extern "C" entry point per (dtype, tile configuration). The name encodes the
// configuration, which src/runtime/kernels.rs lists with the same numbers. e4m3 kernels are
// empty below sm_89 (the runtime refuses fp8 there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define OASR_FP8_BODY(...) __VA_ARGS__
#else
#define OASR_FP8_BODY(...)
#endif

#define OASR_GEMM_I8(BM, BN, BK, WM, WN, ST, MINB)                                         \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB)                         \
        oasr_scaled_mm_i8_##BM##x##BN##x##BK##_w##WM##x##WN##_s##ST(GemmParams p) {          \
        oasr_scaled_mm<false, BM, BN, BK, WM, WN, ST>(p);                                    \
    }

#define OASR_GEMM_E4M3(BM, BN, BK, WM, WN, ST, MINB)                                       \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB)                         \
        oasr_scaled_mm_e4m3_##BM##x##BN##x##BK##_w##WM##x##WN##_s##ST(GemmParams p) {        \
        OASR_FP8_BODY(oasr_scaled_mm<true, BM, BN, BK, WM, WN, ST>(p);)                      \
    }

// The same tile configurations for both dtypes, largest CTA tiles first: 64 x 64 warp tiles for
// the large shapes, smaller CTAs (more of them in flight per SM) for the small ones. The
// BK = 128 variants are int8 only: with the widened fp8 fragments they would spill.
#define OASR_GEMM_CONFIG(BM, BN, BK, WM, WN, ST, MINB) \
    OASR_GEMM_I8(BM, BN, BK, WM, WN, ST, MINB)         \
    OASR_GEMM_E4M3(BM, BN, BK, WM, WN, ST, MINB)

OASR_GEMM_CONFIG(128, 256, 64, 2, 4, 4, 1)
OASR_GEMM_I8(128, 256, 128, 2, 4, 3, 1)
OASR_GEMM_CONFIG(128, 128, 64, 2, 2, 4, 2)
OASR_GEMM_I8(128, 128, 128, 2, 2, 3, 1)
OASR_GEMM_I8(128, 128, 64, 2, 2, 6, 2)
OASR_GEMM_CONFIG(128, 128, 64, 2, 4, 4, 1)
OASR_GEMM_CONFIG(128, 64, 64, 2, 2, 4, 2)
OASR_GEMM_CONFIG(64, 128, 64, 2, 2, 4, 2)
OASR_GEMM_CONFIG(64, 64, 64, 2, 2, 4, 2)
