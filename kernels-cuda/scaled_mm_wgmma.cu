// Hopper-native scaled GEMM (sm_90a): warp-specialised, persistent, TMA + mbarrier ring,
// wgmma.mma_async from 128B-swizzled shared memory, and the same fused epilogue as
// scaled_mm.cu (common.cuh: oasr_epilogue_value and oasr_round_to_out, the operation order of
// docs/numerics.md).
//
// A is [M, K] and W is [N, K] 8-bit codes, both row-major: both K-major, which is what wgmma
// requires for 8-bit operands. The kernel bodies exist only when compiled for sm_90a
// (`__CUDA_ARCH_FEAT_SM90_ALL`, NVRTC `--gpu-architecture=sm_90a`); on every other target the
// entry points are empty stubs, which the runtime never selects.
//
// CTA: BM / 64 consumer warpgroups (each owns 64 output rows x BN columns, accumulators in
// registers), then the producer: a whole warpgroup beside two consumer warpgroups (it hands its
// registers to them with setmaxnreg), one warp beside one. Every consumer warpgroup starts at a
// warp index divisible by 4, as wgmma requires. One producer lane feeds a STAGES-deep ring of
// [BM x 128] + [BN x 128] byte tiles with two `cp.async.bulk.tensor` (TMA) loads per stage,
// completing on a "full" mbarrier; consumers release a slot through an "empty" mbarrier (one
// arrival per consumer warp) once the wgmmas reading it have completed. The TMA tensor maps
// (built on the host by cuTensorMapEncodeTiled, passed as __grid_constant__ parameters) use the
// 128-byte swizzle: 16-byte chunk c of row r of a tile lands at r * 128 + ((c ^ (r % 8)) * 16),
// which is the SWIZZLE_128B K-major layout the wgmma shared-memory descriptor names (8-row
// groups 1024 bytes apart; a k32 step is +32 bytes of the descriptor's start address). Rows past
// M / N and bytes past K are zero-filled by the TMA unit, so every M >= 1, N % 8 == 0,
// K % 16 == 0 runs without a fallback.
//
// The grid is persistent: CTA b computes output tiles b, b + gridDim.x, ... (grouped
// rasterisation, OASR_WGMMA_GROUP_M row tiles per group, for L2 reuse), and the producer runs
// ahead into the next tile while the consumers finish the epilogue of the current one.
//
// - int8: wgmma m64nNk32 .s32.s8.s8, exact int32 accumulation over the whole K; the first
//   wgmma of a tile starts from zero (scale-d = 0). Bit-exact with the CPU reference.
// - e4m3: wgmma m64nNk32 .f32.e4m3.e4m3 into a temporary accumulator per 128-byte K slice
//   (or per 64 / 32 K elements: OASR_WGMMA_FP8_PROMOTE), added into an f32 master accumulator
//   with __fadd_rn once the slice is complete, slices in ascending K order (Hopper's fp8 wgmma keeps fewer accumulator bits than f32; promoting
//   bounds what it can lose); two temporaries alternate where registers allow, so one slice's
//   wgmmas run while the previous one is promoted. Every output element is the same chain for
//   every M and every tile configuration, so the result is batch-invariant.
//
// Epilogue, the operations of common.cuh's oasr_epilogue_value / oasr_round_to_out with
// selects instead of branches and packed conversions (same bits), the tile's column operands
// from shared memory:
// - f16 / bf16 with activation none or ReLU: each lane finishes its accumulators in registers,
//   stmatrix writes 64 columns of the warp's 16 rows into a swizzled staging box, and a TMA
//   store writes the box out while the warp goes on (oasr_wgmma_epilogue_tma);
// - otherwise (swish, GELU, the 8-bit codes of scaled_mm_quant): per consumer warp, EC columns
//   at a time, the accumulators (int8: converted to f32 once, nearest-even) go to a per-warp
//   shared scratch, then the warp writes its 16 rows, four columns a lane, with coalesced stores.
// Both live outside the ring, which the producer is already refilling. See docs/cuda.md for
// why code size and instruction count matter.
//
// Experiment knobs (NVRTC options through OASR_NVRTC_OPTIONS, part of the module cache key):
// -DOASR_WGMMA_GROUP_M=n; timings whose results are wrong by design:
// -DOASR_WGMMA_EXPERIMENT_NO_EPILOGUE (the main loop alone), -DOASR_WGMMA_EXPERIMENT_NO_TMA_WAIT
// (the TMA epilogue without waiting for its box to be free), -DOASR_WGMMA_EXPERIMENT_NO_TMA_STORE
// (without issuing its stores).

struct __align__(64) OasrTmap {
    u64 opaque[16];
};

// Registers a consumer thread may hold: 232 after setmaxnreg with two consumer warpgroups; with
// one, the __maxnreg__ cap under which MINB CTAs of 5 warps fit on the busiest sub-partition.
__host__ __device__ constexpr int oasr_wgmma_consumer_regs(int bm, int minb) {
    return bm == 128 ? 232 : (512 / ((5 * minb + 3) / 4)) / 8 * 8;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void oasr_mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void oasr_mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void oasr_mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Spins until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void oasr_mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// TMA: the box at (c0 = byte offset along K, c1 = row) of the tensor map into shared memory.
__device__ __forceinline__ void oasr_tma_load_2d(u32 dst, const OasrTmap* map, int c0, int c1,
                                                 u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

__device__ __forceinline__ void oasr_tma_prefetch_map(const OasrTmap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// TMA store: the box at (c0 = column, c1 = row) of the output tensor map from shared memory,
// in this thread's bulk async-group; the unit clips what lies outside the tensor.
__device__ __forceinline__ void oasr_tma_store_2d(const OasrTmap* map, u32 src, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
            reinterpret_cast<u64>(map)),
        "r"(src), "r"(c0), "r"(c1)
        : "memory");
}
__device__ __forceinline__ void oasr_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's bulk stores have read their shared memory (the buffer is free).
__device__ __forceinline__ void oasr_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Waits until this thread's bulk stores are complete.
__device__ __forceinline__ void oasr_bulk_wait() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's generic-proxy shared-memory writes visible to the TMA unit.
__device__ __forceinline__ void oasr_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Four 8 x 8 matrices of 16-bit values from the mma / wgmma D fragment layout (lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each) into shared memory; lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void oasr_stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

__device__ __forceinline__ void oasr_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void oasr_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void oasr_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins accumulator registers at this point of the program: the wgmma asm statements write
// them asynchronously, so their readers must not be moved above the wait that completes them.
template <int R>
__device__ __forceinline__ void oasr_fence_regs(i32 (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int R>
__device__ __forceinline__ void oasr_fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: start address,
// leading byte offset 16 (unused for swizzled K-major), stride byte offset 1024 (one 8-row
// group of 128-byte rows), layout type 1 (128B swizzle). The tile base is 1024-byte aligned.
__device__ __forceinline__ u64 oasr_wgmma_desc(u32 smem_addr) {
    return (u64)((smem_addr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

// wgmma m64nNk32 with both operands from shared memory; scale_d == 0: D = A * B, else
// D += A * B. One wrapper per N and dtype, from OASR_WGMMA_WRAPPER: inline asm takes each of
// the R = N / 2 accumulator registers as its own operand (%0 .. %R-1, constraint "r" for s32,
// "f" for f32), then the two descriptors (%R, %R+1) and scale_d (%R+2).
#define OASR_ACC8(C, i)                                                                      \
    "+" C(d[i]), "+" C(d[i + 1]), "+" C(d[i + 2]), "+" C(d[i + 3]), "+" C(d[i + 4]),        \
        "+" C(d[i + 5]), "+" C(d[i + 6]), "+" C(d[i + 7])
#define OASR_ACC32(C, i) \
    OASR_ACC8(C, i), OASR_ACC8(C, i + 8), OASR_ACC8(C, i + 16), OASR_ACC8(C, i + 24)
#define OASR_ACC_32(C) OASR_ACC32(C, 0)
#define OASR_ACC_64(C) OASR_ACC_32(C), OASR_ACC32(C, 32)
#define OASR_ACC_96(C) OASR_ACC_64(C), OASR_ACC32(C, 64)
#define OASR_ACC_128(C) OASR_ACC_96(C), OASR_ACC32(C, 96)
#define OASR_PH_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define OASR_TAIL_32 "%32, %33"
#define OASR_SCALE_32 "%34"
#define OASR_PH_64 OASR_PH_32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define OASR_TAIL_64 "%64, %65"
#define OASR_SCALE_64 "%66"
#define OASR_PH_96 OASR_PH_64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define OASR_TAIL_96 "%96, %97"
#define OASR_SCALE_96 "%98"
#define OASR_PH_128 OASR_PH_96 ", " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define OASR_TAIL_128 "%128, %129"
#define OASR_SCALE_128 "%130"
#define OASR_WGMMA_WRAPPER(NAME, T, C, N, R, TYPES, IMM)                                       \
    __device__ __forceinline__ void NAME(T(&d)[R], u64 da, u64 db, int scale_d) {              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " OASR_SCALE_##R ", 0;\n"                \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32." TYPES " {" OASR_PH_##R         \
                     "}, " OASR_TAIL_##R ", p" IMM ";\n}\n"                                      \
                     : OASR_ACC_##R(C)                                                        \
                     : "l"(da), "l"(db), "r"(scale_d));                                       \
    }
OASR_WGMMA_WRAPPER(oasr_wgmma_s8_n64, i32, "r", 64, 32, "s32.s8.s8", "")
OASR_WGMMA_WRAPPER(oasr_wgmma_s8_n128, i32, "r", 128, 64, "s32.s8.s8", "")
OASR_WGMMA_WRAPPER(oasr_wgmma_s8_n192, i32, "r", 192, 96, "s32.s8.s8", "")
OASR_WGMMA_WRAPPER(oasr_wgmma_s8_n256, i32, "r", 256, 128, "s32.s8.s8", "")
// e4m3: the immediate scales of A and B (1: not negated).
OASR_WGMMA_WRAPPER(oasr_wgmma_e4m3_n64, float, "f", 64, 32, "f32.e4m3.e4m3", ", 1, 1")
OASR_WGMMA_WRAPPER(oasr_wgmma_e4m3_n128, float, "f", 128, 64, "f32.e4m3.e4m3", ", 1, 1")
OASR_WGMMA_WRAPPER(oasr_wgmma_e4m3_n192, float, "f", 192, 96, "f32.e4m3.e4m3", ", 1, 1")

template <int BN>
__device__ __forceinline__ void oasr_wgmma_mma(i32 (&d)[BN / 2], u64 da, u64 db, int scale_d) {
    if constexpr (BN == 64) {
        oasr_wgmma_s8_n64(d, da, db, scale_d);
    } else if constexpr (BN == 128) {
        oasr_wgmma_s8_n128(d, da, db, scale_d);
    } else if constexpr (BN == 192) {
        oasr_wgmma_s8_n192(d, da, db, scale_d);
    } else {
        static_assert(BN == 256, "BN must be 64, 128, 192 or 256");
        oasr_wgmma_s8_n256(d, da, db, scale_d);
    }
}
template <int BN>
__device__ __forceinline__ void oasr_wgmma_mma(float (&d)[BN / 2], u64 da, u64 db, int scale_d) {
    if constexpr (BN == 64) {
        oasr_wgmma_e4m3_n64(d, da, db, scale_d);
    } else if constexpr (BN == 128) {
        oasr_wgmma_e4m3_n128(d, da, db, scale_d);
    } else {
        static_assert(BN == 192, "fp8 BN must be 64, 128 or 192");
        oasr_wgmma_e4m3_n192(d, da, db, scale_d);
    }
}

// STEPS wgmma k32 steps of a 128-byte K slice, from step `first`, on stage tiles `a` (this
// warpgroup's 64 rows) and `b`; the whole slice is STEPS = 4, first = 0.
template <int BN, int STEPS, typename Acc>
__device__ __forceinline__ void oasr_wgmma_steps(Acc (&d)[BN / 2], u32 a, u32 b, int first,
                                                 bool accumulate) {
    // +32 bytes per k32 step: +2 in the descriptor's (address >> 4) field.
    const u64 da = oasr_wgmma_desc(a) + 2 * first;
    const u64 db = oasr_wgmma_desc(b) + 2 * first;
    oasr_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < STEPS; ++ks) {
        oasr_wgmma_mma<BN>(d, da + 2 * ks, db + 2 * ks, (accumulate || ks > 0) ? 1 : 0);
    }
    oasr_wgmma_commit();
}

template <int BN, typename Acc>
__device__ __forceinline__ void oasr_wgmma_slice(Acc (&d)[BN / 2], u32 a, u32 b, bool accumulate) {
    oasr_wgmma_steps<BN, 4>(d, a, b, 0, accumulate);
}

// fp8: K elements per promotion into the f32 master accumulator (128, 64 or 32). 128 is one
// stage's slice; 64 and 32 promote 2 or 4 times a slice, so the tensor core's short
// accumulation covers fewer products (docs/cuda.md measures what each costs).
#ifndef OASR_WGMMA_FP8_PROMOTE
#define OASR_WGMMA_FP8_PROMOTE 128
#endif
static_assert(OASR_WGMMA_FP8_PROMOTE == 128 || OASR_WGMMA_FP8_PROMOTE == 64 ||
                  OASR_WGMMA_FP8_PROMOTE == 32,
              "OASR_WGMMA_FP8_PROMOTE must be 128, 64 or 32");

// Output tile `t` of a tiles_m x tiles_n grid, grouped by OASR_WGMMA_GROUP_M row tiles (as
// scaled_mm.cu) so that the tiles in flight at once share rows of A and columns of W in L2.
#ifndef OASR_WGMMA_GROUP_M
#define OASR_WGMMA_GROUP_M 8
#endif
__device__ __forceinline__ void oasr_tile_coords(int t, int tiles_m, int tiles_n, int& tm,
                                                 int& tn) {
    constexpr int GROUP_M = OASR_WGMMA_GROUP_M;
    const int in_group = GROUP_M * tiles_n;
    const int group = t / in_group;
    const int first_m = group * GROUP_M;
    const int group_m = min(tiles_m - first_m, GROUP_M);
    tm = first_m + (t % in_group) % group_m;
    tn = (t % in_group) / group_m;
}

// The per-column operands of a tile (weight_scale, bias, and the consumer multipliers of
// scaled_mm_quant; zeros where absent or past N) are staged in shared memory once per tile, as
// [3][BN] floats: each consumer thread loads at most one column before the main loop, so the
// latency hides behind it, and stores it after; the epilogue then reads each pass's columns
// from shared memory instead of waiting on global loads pass after pass.
struct OasrTileColumn {
    float ws, b, q;
};

__device__ __forceinline__ OasrTileColumn oasr_tile_column(const GemmParams& p, int col) {
    OasrTileColumn c = {0.0f, 0.0f, 0.0f};
    if (col < p.n) {
        c.ws = p.epi.weight_scale[col];
        c.b = p.epi.bias != 0 ? p.epi.bias[col] : 0.0f;
        c.q = p.epi.quant_mult != 0 ? p.epi.quant_mult[col] : 0.0f;
    }
    return c;
}

// The epilogue output kinds: OASR_OUT_F16 and OASR_OUT_BF16 (scaled_mm), or the 8-bit codes
// of scaled_mm_quant.
#define OASR_EPI_QUANT 2

// The epilogue of one consumer warp for activation ACT and output kind OUT: rows row_base ..
// row_base + 15 of the output, columns col0 .. col0 + BN - 1, in BN / EC passes of EC columns.
// `acc` is in the wgmma D layout (register 4j + e: row lane / 4 + 8 * (e / 2), column
// 8j + 2 * (lane % 4) + e % 2); a pass copies its columns to the warp's scratch (int8:
// converted to f32 once, nearest-even), then each lane finishes four neighbouring columns of
// a row at a time (one 16-byte scratch read, one 8-byte or 4-byte store). slab_scale is the
// a_scale of row (lane % 16); `tcols` is the tile's column operands in shared memory
// ([3][BN]: weight_scale, bias, consumer multipliers).
//
// Code size and instruction count matter here more than anywhere. The pass loop is not
// unrolled (only the copy of the pass's accumulators to the scratch is selected per pass, with
// constant register indices), and ACT and OUT are template parameters dispatched once per
// tile, so that a tile runs through one compact copy of the epilogue (straight-line code for
// every pass, at hundreds of kilobytes per kernel, missed the instruction cache on every tile).
// The f16 / bf16 path rounds two outputs per packed conversion and leaves NaN (whose canonical
// bits the hardware conversion does not promise) to a warp-uniform slow path.
template <int ACT, int OUT, int BN, int EC, typename Acc>
__device__ __forceinline__ void oasr_wgmma_epilogue_act(const GemmParams& p,
                                                        const Acc (&acc)[BN / 2],
                                                        const float* tcols, float* scratch,
                                                        int row_base, int col0, int lane,
                                                        float slab_scale) {
    constexpr int SROW = EC + 8;    // floats per scratch row (conflict-free 8-byte writes)
    constexpr int LPR = EC / 4;     // lanes per output row
    constexpr int RPI = 32 / LPR;   // rows per iteration
    constexpr int ROWS = 16 / RPI;  // rows per lane
    constexpr int NC = BN / EC;     // passes
    // Rows in flight: all of the lane's rows for the short activations, half of them for
    // swish and GELU (long chains, many registers each).
    constexpr bool LIGHT = ACT == OASR_ACT_NONE || ACT == OASR_ACT_RELU;
    constexpr int FU = LIGHT || ROWS == 1 ? ROWS : ROWS / 2;
    static_assert(ROWS % FU == 0, "rows per lane must be a multiple of FU");
    const int g = lane >> 2;
    const int tq = lane & 3;
    const int lrow = lane / LPR;
    const int lane_col = (lane % LPR) * 4;
#ifdef OASR_WGMMA_EXPERIMENT_NO_EPILOGUE
    // Timing experiment only (never in a real build): the main loop without the epilogue.
    if (p.m > 0) {
        return;
    }
#endif
    // The a_scale of each of the lane's rows (the same rows in every pass).
    float row_scale[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        row_scale[i] = __shfl_sync(0xFFFFFFFFu, slab_scale, lrow + i * RPI);
    }
    const bool has_bias = p.epi.bias != 0;
    // Output elements per lane step: RPI rows down.
    const i64 step = (i64)RPI * p.n;
#pragma unroll 1
    for (int c = 0; c < NC; ++c) {
        if (col0 + c * EC >= p.n) {
            break;  // warp-uniform: the rest of the tile is past N
        }
        // The lane's four columns of the pass: weight_scale, bias, consumer multipliers.
        const float4 cws = *reinterpret_cast<const float4*>(tcols + c * EC + lane_col);
        const float4 cb = *reinterpret_cast<const float4*>(tcols + BN + c * EC + lane_col);
#pragma unroll
        for (int cc = 0; cc < NC; ++cc) {
            if (cc == c) {
#pragma unroll
                for (int jj = 0; jj < EC / 8; ++jj) {
                    const int j = cc * (EC / 8) + jj;
                    float2 lo, hi;
                    lo.x = oasr_acc_to_f32(acc[4 * j]);
                    lo.y = oasr_acc_to_f32(acc[4 * j + 1]);
                    hi.x = oasr_acc_to_f32(acc[4 * j + 2]);
                    hi.y = oasr_acc_to_f32(acc[4 * j + 3]);
                    *reinterpret_cast<float2*>(scratch + g * SROW + jj * 8 + tq * 2) = lo;
                    *reinterpret_cast<float2*>(scratch + (g + 8) * SROW + jj * 8 + tq * 2) = hi;
                }
            }
        }
        __syncwarp();
        const int col = col0 + c * EC + lane_col;
        const bool col_ok = col < p.n;
        // The lane's first output of the pass; each of its rows is `step` elements further.
        const i64 first = (i64)(row_base + lrow) * p.n + col;
        u8* const out8 = static_cast<u8*>(p.epi.out) + first;
        u16* const out16 = static_cast<u16*>(p.epi.out) + first;
        const int row = row_base + lrow;
#pragma unroll(FU == ROWS ? 1 : ROWS / FU)
        for (int it = 0; it < ROWS; it += FU) {
            float4 v[FU];
#pragma unroll
            for (int u = 0; u < FU; ++u) {
                v[u] = *reinterpret_cast<const float4*>(scratch + (lrow + (it + u) * RPI) * SROW +
                                                        lane_col);
            }
            float y[FU][4];
#pragma unroll
            for (int u = 0; u < FU; ++u) {
                const float as = row_scale[it + u];
                y[u][0] = oasr_epilogue_value(v[u].x, cws.x, as, has_bias, cb.x, ACT);
                y[u][1] = oasr_epilogue_value(v[u].y, cws.y, as, has_bias, cb.y, ACT);
                y[u][2] = oasr_epilogue_value(v[u].z, cws.z, as, has_bias, cb.z, ACT);
                y[u][3] = oasr_epilogue_value(v[u].w, cws.w, as, has_bias, cb.w, ACT);
            }
            if constexpr (OUT == OASR_EPI_QUANT) {
                // scaled_mm_quant: quantize_static on the rounded output,
                // widen(round(v)) * mult, then encode; four codes in one 4-byte store.
                const float4 cq4 = *reinterpret_cast<const float4*>(tcols + 2 * BN + c * EC +
                                                                    lane_col);
                const float cq[4] = {cq4.x, cq4.y, cq4.z, cq4.w};
#pragma unroll
                for (int u = 0; u < FU; ++u) {
                    u32 codes = 0;
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const u16 h = oasr_round_to_out(p.epi.out_dtype, y[u][i]);
                        const float yq = __fmul_rn(oasr_widen(p.epi.out_dtype, h), cq[i]);
                        codes |= (u32)oasr_encode(p.epi.quant_dtype, yq) << (8 * i);
                    }
                    if (row + (it + u) * RPI < p.m && col_ok) {
                        *reinterpret_cast<u32*>(out8 + (it + u) * step) = codes;
                    }
                }
            } else {
                uint2 bits[FU];
                bool nan = false;
#pragma unroll
                for (int u = 0; u < FU; ++u) {
                    bits[u].x = oasr_pack_rounded<OUT>(y[u][0], y[u][1]);
                    bits[u].y = oasr_pack_rounded<OUT>(y[u][2], y[u][3]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) nan |= oasr_isnan(y[u][i]);
                }
                if (__any_sync(0xFFFFFFFFu, nan)) {
                    // Rare: some lane has a NaN. round_to_out of every value, as the reference.
#pragma unroll
                    for (int u = 0; u < FU; ++u) {
                        bits[u].x = oasr_round_pair_to_out(OUT, y[u][0], y[u][1]);
                        bits[u].y = oasr_round_pair_to_out(OUT, y[u][2], y[u][3]);
                    }
                }
#pragma unroll
                for (int u = 0; u < FU; ++u) {
                    if (row + (it + u) * RPI < p.m && col_ok) {
                        *reinterpret_cast<uint2*>(out16 + (it + u) * step) = bits[u];
                    }
                }
            }
        }
        __syncwarp();
    }
}

// The f16 / bf16 epilogue of one consumer warp through TMA stores (activation none or ReLU):
// every lane finishes its own accumulators in registers (the wgmma D layout: rows
// row_base + lane / 4 and + 8, columns 8j + 2 (lane % 4) and + 1), 64 columns at a time;
// stmatrix writes them as 16 rows of 128 bytes (the 128-byte swizzle) into the warp's staging
// box, and one lane hands the box to the TMA unit, which writes it to global memory (clipped to
// M x N) while the warp goes on: with the next box, then the next tile's main loop. Before
// refilling the box, the lane waits until the unit has read the previous one (long done, as a
// rule). The operations are those of oasr_wgmma_epilogue_act, so the bits are the same.
template <int ACT, int OUT, int BN, typename Acc>
__device__ __forceinline__ void oasr_wgmma_epilogue_tma(const GemmParams& p, const OasrTmap& to,
                                                        const Acc (&acc)[BN / 2],
                                                        const float* tcols, u32 stage,
                                                        int row_base, int col0, int lane,
                                                        float slab_scale) {
    static_assert(BN % 64 == 0, "TMA boxes are 64 columns wide");
    const int g = lane >> 2;
    const int tq = lane & 3;
    const float as_lo = __shfl_sync(0xFFFFFFFFu, slab_scale, g);
    const float as_hi = __shfl_sync(0xFFFFFFFFu, slab_scale, g + 8);
#ifdef OASR_WGMMA_EXPERIMENT_NO_EPILOGUE
    if (p.m > 0) {
        return;
    }
#endif
    const bool has_bias = p.epi.bias != 0;
    // This lane's stmatrix row: row srow of the box, 16-byte chunk (j % 8) + (lane >> 4) for
    // the column blocks j, j + 1 of each stmatrix.
    const int srow = ((lane >> 3) & 1) * 8 + (lane & 7);
    const u32 row_addr = stage + srow * 128;
    // The lane's four values of column block j (columns 8j + 2 (lane % 4) and + 1).
    auto box_values = [&](int j, float (&y)[4]) {
        const int col = 8 * j + 2 * tq;
        const float2 ws = *reinterpret_cast<const float2*>(tcols + col);
        const float2 b = *reinterpret_cast<const float2*>(tcols + BN + col);
        y[0] = oasr_epilogue_value(oasr_acc_to_f32(acc[4 * j]), ws.x, as_lo, has_bias, b.x, ACT);
        y[1] = oasr_epilogue_value(oasr_acc_to_f32(acc[4 * j + 1]), ws.y, as_lo, has_bias, b.y,
                                   ACT);
        y[2] = oasr_epilogue_value(oasr_acc_to_f32(acc[4 * j + 2]), ws.x, as_hi, has_bias, b.x,
                                   ACT);
        y[3] = oasr_epilogue_value(oasr_acc_to_f32(acc[4 * j + 3]), ws.y, as_hi, has_bias, b.y,
                                   ACT);
    };
#pragma unroll
    for (int bx = 0; bx < BN / 64; ++bx) {
        if (col0 + bx * 64 >= p.n) {
            break;  // warp-uniform: the rest of the tile is past N
        }
        // The box's 32 outputs of this lane, as 16 packed pairs in stmatrix order: r[2 jj] and
        // r[2 jj + 1] hold rows lane / 4 and + 8 of column block 8 bx + jj. One NaN vote per
        // box, so that the 32 independent chains form one block the compiler can interleave.
        u32 r[16];
        bool nan = false;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            float y[4];
            box_values(8 * bx + jj, y);
            r[2 * jj] = oasr_pack_rounded<OUT>(y[0], y[1]);
            r[2 * jj + 1] = oasr_pack_rounded<OUT>(y[2], y[3]);
            nan |= oasr_isnan(y[0]) | oasr_isnan(y[1]) | oasr_isnan(y[2]) | oasr_isnan(y[3]);
        }
        if (__any_sync(0xFFFFFFFFu, nan)) {
            // Rare: some lane has a NaN. round_to_out of every value, as the reference.
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                float y[4];
                box_values(8 * bx + jj, y);
                r[2 * jj] = oasr_round_pair_to_out(OUT, y[0], y[1]);
                r[2 * jj + 1] = oasr_round_pair_to_out(OUT, y[2], y[3]);
            }
        }
#ifndef OASR_WGMMA_EXPERIMENT_NO_TMA_WAIT
        if (lane == 0) {
            oasr_bulk_wait_read();  // the box is free again
        }
#endif
        __syncwarp();
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int chunk = 2 * q + (lane >> 4);
            oasr_stmatrix_x4(row_addr + ((chunk ^ (srow & 7)) << 4), r[4 * q], r[4 * q + 1],
                             r[4 * q + 2], r[4 * q + 3]);
        }
        oasr_fence_proxy_async();
        __syncwarp();
#ifndef OASR_WGMMA_EXPERIMENT_NO_TMA_STORE
        if (lane == 0 && row_base < p.m) {
            oasr_tma_store_2d(&to, stage, col0 + bx * 64, row_base);
            oasr_bulk_commit();
        }
#endif
    }
}

// The epilogue of one consumer warp for activation none or ReLU (ACT): through TMA stores for
// f16 / bf16, through the scratch for the 8-bit codes of scaled_mm_quant.
template <int ACT, int OUT, int BN, int EC, typename Acc>
__device__ __forceinline__ void oasr_wgmma_epilogue_light(const GemmParams& p, const OasrTmap& to,
                                                          const Acc (&acc)[BN / 2],
                                                          const float* cols, float* scratch,
                                                          u32 stage, int row_base, int col0,
                                                          int lane, float slab_scale) {
    if constexpr (OUT != OASR_EPI_QUANT) {
        oasr_wgmma_epilogue_tma<ACT, OUT, BN>(p, to, acc, cols, stage, row_base, col0, lane,
                                              slab_scale);
    } else {
        oasr_wgmma_epilogue_act<ACT, OUT, BN, EC>(p, acc, cols, scratch, row_base, col0, lane,
                                                  slab_scale);
    }
}

// The epilogue of one consumer warp with the activation and output kind of the call,
// dispatched once per tile. Swish and GELU (whose compact pass loop fits the instruction
// cache) always go through the scratch.
template <int OUT, int BN, int EC, typename Acc>
__device__ __forceinline__ void oasr_wgmma_epilogue_out(const GemmParams& p, const OasrTmap& to,
                                                        const Acc (&acc)[BN / 2],
                                                        const float* cols, float* scratch,
                                                        u32 stage, int row_base, int col0,
                                                        int lane, float slab_scale) {
    switch (p.epi.activation) {
        case OASR_ACT_RELU:
            oasr_wgmma_epilogue_light<OASR_ACT_RELU, OUT, BN, EC>(
                p, to, acc, cols, scratch, stage, row_base, col0, lane, slab_scale);
            break;
        case OASR_ACT_SWISH:
            oasr_wgmma_epilogue_act<OASR_ACT_SWISH, OUT, BN, EC>(p, acc, cols, scratch, row_base,
                                                                 col0, lane, slab_scale);
            break;
        case OASR_ACT_GELU:
            oasr_wgmma_epilogue_act<OASR_ACT_GELU, OUT, BN, EC>(p, acc, cols, scratch, row_base,
                                                                col0, lane, slab_scale);
            break;
        default:
            oasr_wgmma_epilogue_light<OASR_ACT_NONE, OUT, BN, EC>(
                p, to, acc, cols, scratch, stage, row_base, col0, lane, slab_scale);
            break;
    }
}

template <int BN, int EC, typename Acc>
__device__ __forceinline__ void oasr_wgmma_epilogue(const GemmParams& p, const OasrTmap& to,
                                                    const Acc (&acc)[BN / 2], const float* cols,
                                                    float* scratch, u32 stage, int row_base,
                                                    int col0, int lane, float slab_scale) {
    if (p.epi.quant_mult != 0) {
        oasr_wgmma_epilogue_out<OASR_EPI_QUANT, BN, EC>(p, to, acc, cols, scratch, stage,
                                                        row_base, col0, lane, slab_scale);
    } else if (p.epi.out_dtype == OASR_OUT_F16) {
        oasr_wgmma_epilogue_out<OASR_OUT_F16, BN, EC>(p, to, acc, cols, scratch, stage, row_base,
                                                      col0, lane, slab_scale);
    } else {
        oasr_wgmma_epilogue_out<OASR_OUT_BF16, BN, EC>(p, to, acc, cols, scratch, stage,
                                                       row_base, col0, lane, slab_scale);
    }
}

template <int N>
__device__ __forceinline__ void oasr_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void oasr_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <bool FP8, int BM, int BN, int STAGES, int EC, int MINB>
__device__ __forceinline__ void oasr_wgmma_gemm(const GemmParams& p, const OasrTmap& ta,
                                                const OasrTmap& tb, const OasrTmap& to) {
    constexpr int CW = BM / 64;  // consumer warpgroups
    constexpr int BK = 128;      // bytes of K per stage: one 128-byte swizzle row
    constexpr u32 A_STAGE = BM * BK;
    constexpr u32 B_STAGE = BN * BK;
    constexpr int SROW = EC + 8;
    constexpr u32 SCRATCH = CW * 4 * 16 * SROW * 4;
    // The TMA-store epilogue's staging box per consumer warp (16 rows x 128 bytes), in the
    // same region as the scratch (a launch uses one of the two epilogues).
    constexpr u32 STAGING = CW * 4 * 2048;
    constexpr u32 EPI = STAGING > SCRATCH ? STAGING : SCRATCH;
    constexpr u32 COLS = 2 * 3 * BN * 4;
    constexpr int CT = CW * 128;  // consumer threads
    static_assert(BN <= CT, "one column operand per consumer thread");
    constexpr int R = BN / 2;  // accumulator registers per thread
    // fp8 pipelines its promotions with two temporaries where they fit beside the master
    // accumulator (the 128 x 128 tile; not under the caps of several CTAs per SM).
    constexpr bool FP8_TWO_TEMPS = 3 * R + 40 <= oasr_wgmma_consumer_regs(BM, MINB);
    static_assert(BM == 64 || BM == 128, "BM must be 64 or 128");
    static_assert(BM == 64 || MINB == 1, "two consumer warpgroups need the whole SM");
    static_assert(BN % EC == 0 && (EC == 16 || EC == 32), "EC must be 16 or 32 and divide BN");

    extern __shared__ __align__(1024) u8 oasr_wsmem[];
    const u32 raw = (u32)__cvta_generic_to_shared(oasr_wsmem);
    const u32 base = (raw + 1023u) & ~1023u;  // the 128B swizzle repeats every 1024 bytes
    const u32 sa = base;
    const u32 sb = sa + STAGES * A_STAGE;
    const u32 sscratch = sb + STAGES * B_STAGE;
    const u32 scols = sscratch + EPI;  // the tiles' column operands: [2][3][BN] floats
    const u32 bars = scols + COLS;         // full[STAGES], then empty[STAGES]
    float* scratch_all = reinterpret_cast<float*>(oasr_wsmem + (sscratch - raw));
    float* cols_all = reinterpret_cast<float*>(oasr_wsmem + (scols - raw));

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int m = p.m, n = p.n, k = p.k;
    const int tiles_m = (m + BM - 1) / BM;
    const int tiles_n = (n + BN - 1) / BN;
    const int tiles = tiles_m * tiles_n;
    const int ktiles = (k + BK - 1) / BK;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            oasr_mbar_init(bars + 8 * s, 1);
            oasr_mbar_init(bars + 8 * (STAGES + s), CW * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= CW * 4) {
        // Producer (a whole warpgroup where there are two consumer warpgroups, so that it can
        // hand its registers to them; one warp otherwise): one lane issues every TMA load.
        if constexpr (CW == 2) {
            oasr_setmaxnreg_dec<40>();
        }
        if (warp == CW * 4 && lane == 0) {
            oasr_tma_prefetch_map(&ta);
            oasr_tma_prefetch_map(&tb);
            int s = 0;
            u32 phase = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                int tm, tn;
                oasr_tile_coords(t, tiles_m, tiles_n, tm, tn);
                for (int kt = 0; kt < ktiles; ++kt) {
                    const int kk = kt * BK;
                    oasr_mbar_wait(bars + 8 * (STAGES + s), phase ^ 1u);
                    oasr_mbar_expect_tx(bars + 8 * s, A_STAGE + B_STAGE);
                    oasr_tma_load_2d(sa + s * A_STAGE, &ta, kk, tm * BM, bars + 8 * s);
                    oasr_tma_load_2d(sb + s * B_STAGE, &tb, kk, tn * BN, bars + 8 * s);
                    if (++s == STAGES) {
                        s = 0;
                        phase ^= 1u;
                    }
                }
            }
        }
    } else {
        // Consumers.
        if constexpr (CW == 2) {
            oasr_setmaxnreg_inc<232>();
        }
        const int cw = warp >> 2;
        const int wq = warp & 3;
        float* scratch = scratch_all + warp * 16 * SROW;
        const u32 stage = sscratch + warp * 2048;  // 1024-byte aligned
        if (tid == 0) {
            oasr_tma_prefetch_map(&to);
        }
        const u32 a_off = cw * 64 * BK;
        int s = 0;
        u32 phase = 0;
        int tile_parity = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int tm, tn;
            oasr_tile_coords(t, tiles_m, tiles_n, tm, tn);
            const int row_base = tm * BM + cw * 64 + wq * 16;
            const int col0 = tn * BN;
            // Epilogue operands, loaded now so that their latency hides behind the main loop:
            // the a_scale of row (lane % 16) of this warp's 16 rows, and column col0 + tid.
            const int srow = row_base + (lane & 15);
            const float slab_scale = p.epi.a_scale == 0 ? p.epi.a_scale_value
                                     : srow < m         ? p.epi.a_scale[srow]
                                                        : 0.0f;
            const OasrTileColumn column =
                tid < BN ? oasr_tile_column(p, col0 + tid) : OasrTileColumn{};
            // After the main loop: publish the tile's column operands to every consumer warp.
            // Tiles alternate between two buffers; the barrier of tile t (all consumer threads)
            // comes after everyone's epilogue of tile t - 1, so the buffer written for tile
            // t + 1 is no longer read.
            auto publish_columns = [&]() {
                float* tcols = cols_all + (tile_parity & 1) * 3 * BN;
                if (tid < BN) {
                    tcols[tid] = column.ws;
                    tcols[BN + tid] = column.b;
                    tcols[2 * BN + tid] = column.q;
                }
                asm volatile("bar.sync 1, %0;\n" ::"n"(CT) : "memory");
                ++tile_parity;
                return tcols;
            };
            if constexpr (!FP8) {
                i32 acc[R];
#pragma unroll
                for (int i = 0; i < R; ++i) acc[i] = 0;
                int prev = 0;
                for (int kt = 0; kt < ktiles; ++kt) {
                    oasr_mbar_wait(bars + 8 * s, phase);
                    oasr_fence_regs(acc);
                    oasr_wgmma_slice<BN>(acc, sa + s * A_STAGE + a_off, sb + s * B_STAGE,
                                         kt > 0);
                    oasr_wgmma_wait<1>();  // the previous slice is done: release its slot
                    oasr_fence_regs(acc);
                    if (kt > 0 && lane == 0) {
                        oasr_mbar_arrive(bars + 8 * (STAGES + prev));
                    }
                    prev = s;
                    if (++s == STAGES) {
                        s = 0;
                        phase ^= 1u;
                    }
                }
                oasr_wgmma_wait<0>();
                oasr_fence_regs(acc);
                if (lane == 0) {
                    oasr_mbar_arrive(bars + 8 * (STAGES + prev));
                }
                oasr_wgmma_epilogue<BN, EC>(p, to, acc, publish_columns(), scratch, stage,
                                                 row_base, col0, lane, slab_scale);
            } else {
                // Each promotion unit (OASR_WGMMA_FP8_PROMOTE K elements: a 128-byte slice or
                // a part of one) goes into a temporary accumulator (its first wgmma with
                // scale-d = 0), which is added into the master accumulator once the unit's
                // wgmmas are complete: units in ascending K order, one __fadd_rn per unit and
                // element. With two temporaries (where the registers allow) unit i + 1's wgmmas
                // run while unit i is promoted, so the tensor cores never wait for the
                // additions. ptxas serializes every wgmma if a non-wgmma instruction writes
                // the accumulator of one in flight, so only a completed temporary is ever
                // fenced or read. A stage's slot is released after its last unit.
                constexpr int STEPS = OASR_WGMMA_FP8_PROMOTE / 32;  // k32 steps per unit
                constexpr int UNITS = 4 / STEPS;                    // units per stage
                float master[R];
#pragma unroll
                for (int i = 0; i < R; ++i) master[i] = 0.0f;
                float ta[R] = {};
                auto issue = [&](float (&t)[R], int part) {
                    oasr_fence_regs(t);
                    oasr_wgmma_steps<BN, STEPS>(t, sa + s * A_STAGE + a_off, sb + s * B_STAGE,
                                                part * STEPS, false);
                };
                auto next_stage = [&]() {
                    const int slot = s;
                    if (++s == STAGES) {
                        s = 0;
                        phase ^= 1u;
                    }
                    return slot;
                };
                // After the wait that completed `t`'s unit: release `slot` (-1: none) if the
                // unit ended its stage (every earlier wgmma is complete too), promote it.
                auto promote = [&](float (&t)[R], int slot) {
                    oasr_fence_regs(t);
                    if (slot >= 0 && lane == 0) {
                        oasr_mbar_arrive(bars + 8 * (STAGES + slot));
                    }
#pragma unroll
                    for (int e = 0; e < R; ++e) master[e] = __fadd_rn(master[e], t[e]);
                };
                if constexpr (UNITS > 1) {
                    // Several units a stage: one temporary, each unit waits for the one before
                    // (the other consumer warpgroup, or another CTA on the SM, keeps the tensor
                    // cores busy meanwhile). Two alternating temporaries made ptxas serialize
                    // every wgmma of the 128 x 128 tile at these intervals.
                    for (int kt = 0; kt < ktiles; ++kt) {
                        oasr_mbar_wait(bars + 8 * s, phase);
#pragma unroll
                        for (int part = 0; part < UNITS; ++part) {
                            issue(ta, part);
                            oasr_wgmma_wait<0>();
                            promote(ta, part == UNITS - 1 ? s : -1);
                        }
                        next_stage();
                    }
                } else {
                    // One unit a stage: the stage's slot is released after its promotion.
                    auto issue_stage = [&](float (&t)[R]) {
                        oasr_mbar_wait(bars + 8 * s, phase);
                        issue(t, 0);
                        return next_stage();
                    };
                    int slot_a = issue_stage(ta);
                    if constexpr (FP8_TWO_TEMPS) {
                        float tb[R] = {};
                        int kt = 1;
                        for (; kt + 1 < ktiles; kt += 2) {
                            const int slot_b = issue_stage(tb);
                            oasr_wgmma_wait<1>();
                            promote(ta, slot_a);
                            slot_a = issue_stage(ta);
                            oasr_wgmma_wait<1>();
                            promote(tb, slot_b);
                        }
                        if (kt < ktiles) {
                            const int slot_b = issue_stage(tb);
                            oasr_wgmma_wait<1>();
                            promote(ta, slot_a);
                            oasr_wgmma_wait<0>();
                            promote(tb, slot_b);
                        } else {
                            oasr_wgmma_wait<0>();
                            promote(ta, slot_a);
                        }
                    } else {
                        // One temporary: the other consumer warpgroup, or another CTA on the
                        // SM, keeps the tensor cores busy during the addition.
                        for (int kt = 1; kt < ktiles; ++kt) {
                            oasr_wgmma_wait<0>();
                            promote(ta, slot_a);
                            slot_a = issue_stage(ta);
                        }
                        oasr_wgmma_wait<0>();
                        promote(ta, slot_a);
                    }
                }
                oasr_wgmma_epilogue<BN, EC>(p, to, master, publish_columns(), scratch,
                                                 stage, row_base, col0, lane, slab_scale);
            }
        }
        if (lane == 0) {
            oasr_bulk_wait();  // the TMA stores read shared memory, which lives with the CTA
        }
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OASR_WGMMA_BODY(...) __VA_ARGS__
#else
#define OASR_WGMMA_BODY(...)
#endif

// One extern "C" entry point per (dtype, configuration): BM x BN output tile, STAGES-deep
// ring, EC epilogue columns per pass (scratch epilogue), MINB CTAs per SM. The name encodes
// the configuration, which src/runtime/kernels.rs lists with the same numbers. `to` is the
// output's tensor map (read by the TMA-store epilogue only).
//
// Registers: an SM's register file is split among its 4 sub-partitions, warp w of a CTA on
// sub-partition w % 4 (16384 registers each). BM = 128: 2 consumer warpgroups and a producer
// warpgroup (384 threads), __launch_bounds__(384, 1) caps them at 168 at entry, then
// setmaxnreg moves the producer's registers to the consumers (40 / 232).
// BM = 64: one consumer warpgroup and one producer warp (160 threads), capped with __maxnreg__
// so that MINB CTAs fit on the busiest sub-partition.
#define OASR_WGMMA_ATTR_128(MINB) __launch_bounds__(384, MINB)
#define OASR_WGMMA_ATTR_64(MINB) __maxnreg__(oasr_wgmma_consumer_regs(64, MINB))
#define OASR_WGMMA_KERNEL(D, FP8, BM, BN, ST, EC, MINB)                                        \
    extern "C" __global__ void OASR_WGMMA_ATTR_##BM(MINB)                                     \
        oasr_scaled_mm_wgmma_##D##_##BM##x##BN##_s##ST##_e##EC(                              \
            const __grid_constant__ GemmParams p, const __grid_constant__ OasrTmap ta,        \
            const __grid_constant__ OasrTmap tb, const __grid_constant__ OasrTmap to) {       \
        OASR_WGMMA_BODY(oasr_wgmma_gemm<FP8, BM, BN, ST, EC, MINB>(p, ta, tb, to);)          \
    }
#define OASR_WGMMA_I8(BM, BN, ST, EC, MINB) OASR_WGMMA_KERNEL(i8, false, BM, BN, ST, EC, MINB)
#define OASR_WGMMA_E4M3(BM, BN, ST, EC, MINB) OASR_WGMMA_KERNEL(e4m3, true, BM, BN, ST, EC, MINB)

OASR_WGMMA_I8(128, 256, 4, 32, 1)
OASR_WGMMA_I8(128, 192, 4, 32, 1)
OASR_WGMMA_I8(128, 128, 6, 32, 1)
OASR_WGMMA_I8(64, 128, 4, 32, 2)
OASR_WGMMA_I8(64, 64, 3, 32, 3)
OASR_WGMMA_E4M3(128, 192, 4, 32, 1)
OASR_WGMMA_E4M3(128, 128, 6, 32, 1)
OASR_WGMMA_E4M3(64, 128, 4, 32, 2)
OASR_WGMMA_E4M3(64, 64, 4, 16, 3)
