// oasr-quantize CUDA runtime: shared definitions and the bit-exact numerics.
//
// Every function here repeats a function of `src/numerics/` (the CPU reference) operation for
// operation: each float operation is an explicit round-to-nearest-even intrinsic
// (`__fadd_rn`, `__fsub_rn`, `__fmul_rn`, `__fdiv_rn`), which the compiler never contracts
// into a fused multiply-add, and the module is compiled with `--fmad=false` as a second guard.
// No CUDA header is included: NVRTC compiles this with no include path at all.
//
// The runtime (src/runtime/kernels.rs) compiles one translation unit made of this file followed
// by every `kernels-cuda/*.cu` file, so those files do not include this one themselves.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// Enumerations shared with src/runtime/params.rs.
#define OASR_ACT_NONE 0
#define OASR_ACT_RELU 1
#define OASR_ACT_SWISH 2
#define OASR_ACT_GELU 3

#define OASR_OUT_F16 0
#define OASR_OUT_BF16 1

#define OASR_Q_INT8 0
#define OASR_Q_E4M3 1

// The epilogue of a scaled GEMM (docs/numerics.md), shared by every GEMM kernel and by the
// stand-alone epilogue kernel that follows a cuBLASLt int32 GEMM in the benchmark.
//
//   v = act(a_scale[m] * (weight_scale[n] * acc) + bias[n])
//   quant_mult == 0:  out[m, n] = round_to_out(v)                         (u16 bits, f16 or bf16)
//   quant_mult != 0:  out[m, n] = encode(quant_dtype,
//                                        widen(round_to_out(v)) * quant_mult[n])   (u8 codes)
//
// The layout is mirrored by `Epilogue` in src/runtime/params.rs (#[repr(C)], 56 bytes).
struct Epilogue {
    const float* a_scale;       // [M] per-row scales, or 0: a_scale_value for every row
    const float* weight_scale;  // [N]
    const float* bias;          // [N] or 0
    const float* quant_mult;    // [N] consumer multipliers (scaled_mm_quant), or 0
    void* out;                  // [M, N] row-major: u16 bits, or u8 codes with quant_mult
    float a_scale_value;
    i32 activation;             // OASR_ACT_*
    i32 out_dtype;              // OASR_OUT_*
    i32 quant_dtype;            // OASR_Q_*
};

// Arguments of a scaled GEMM: a [M, K] and w [N, K] 8-bit codes, both row-major.
// Mirrored by `GemmParams` in src/runtime/params.rs (88 bytes).
struct GemmParams {
    const u8* a;
    const u8* w;
    Epilogue epi;
    i32 m;
    i32 n;
    i32 k;
    i32 reserved;
};

static_assert(sizeof(Epilogue) == 56, "Epilogue layout is shared with Rust");
static_assert(sizeof(GemmParams) == 88, "GemmParams layout is shared with Rust");

// ---------------------------------------------------------------------------------------------
// Scalar numerics (src/numerics/{rounding,e4m3,quantize,activation}.rs)
// ---------------------------------------------------------------------------------------------

#define OASR_AMAX_FLOOR 1e-8f

__device__ __forceinline__ bool oasr_isnan(float x) { return x != x; }

// round_to_out: nearest-even to f16 / bf16 (overflow to +-inf), NaN written as the canonical NaN.
__device__ __forceinline__ u16 oasr_round_to_out(int out_dtype, float v) {
    if (oasr_isnan(v)) {
        return out_dtype == OASR_OUT_F16 ? (u16)0x7E00 : (u16)0x7FC0;
    }
    u16 h;
    if (out_dtype == OASR_OUT_F16) {
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    } else {
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    }
    return h;
}

// out_bits_to_f32: exact widening.
__device__ __forceinline__ float oasr_widen(int out_dtype, u16 bits) {
    if (out_dtype == OASR_OUT_F16) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
        return f;
    }
    return __uint_as_float(((u32)bits) << 16);
}

// e4m3_encode: nearest-even, saturating at +-448, NaN -> 0x00, sign of zero kept.
__device__ __forceinline__ u8 oasr_e4m3_encode(float x) {
    if (oasr_isnan(x)) {
        return 0;
    }
    const u32 bits = __float_as_uint(x);
    const u32 sign = (bits >> 24) & 0x80u;
    const u32 abits = bits & 0x7FFFFFFFu;
    const float a = __uint_as_float(abits);
    u32 mag;
    if (a >= 448.0f) {
        mag = 0x7Eu;
    } else if (a < 0.015625f) {
        // Subnormal: a * 2^9 is exact; one nearest-even rounding to 0..=8.
        mag = (u32)rintf(__fmul_rn(a, 512.0f));
    } else {
        const u32 lsb = (abits >> 20) & 1u;
        const u32 rounded = (abits + 0x7FFFFu + lsb) >> 20;
        mag = rounded - (120u << 3);
    }
    return (u8)(sign | mag);
}

// encode: int8 = clamp(round_half_even(v), -127, 127) (NaN -> 0); e4m3 as above.
__device__ __forceinline__ u8 oasr_encode(int dtype, float v) {
    if (dtype == OASR_Q_E4M3) {
        return oasr_e4m3_encode(v);
    }
    if (oasr_isnan(v)) {
        return 0;
    }
    float r = rintf(v);
    r = fminf(fmaxf(r, -127.0f), 127.0f);
    return (u8)(i8)(i32)r;
}

__device__ __forceinline__ float oasr_qmax(int dtype) {
    return dtype == OASR_Q_E4M3 ? 448.0f : 127.0f;
}

// ---------------------------------------------------------------------------------------------
// exp / erf / activations (src/numerics/activation.rs), constants pinned by their bits.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float oasr_pow2i(int e) { return __uint_as_float((u32)(e + 127) << 23); }

// exp and erf are branch-free (every path computed, the reference's result selected): a warp
// never diverges on them, and the chains of the outputs a thread has in flight interleave.
__device__ __forceinline__ float oasr_exp(float x) {
    const float xc = fminf(fmaxf(x, -104.0f), 89.0f);
    const float LOG2E = __uint_as_float(0x3FB8AA3Bu);
    const float LN2_HI = __uint_as_float(0x3F318000u);
    const float LN2_LO = __uint_as_float(0xB95E8083u);
    const float MAGIC = __uint_as_float(0x4B400000u);  // 1.5 * 2^23
    const float t = __fmul_rn(xc, LOG2E);
    const float nf = __fsub_rn(__fadd_rn(t, MAGIC), MAGIC);
    const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(nf, LN2_HI)), __fmul_rn(nf, LN2_LO));
    const float z = __fmul_rn(r, r);
    float p = __uint_as_float(0x39506967u);
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3AB743CEu));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3C088908u));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3D2AA9C1u));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3E2AAAAAu));
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3F000000u));
    p = __fadd_rn(__fadd_rn(__fmul_rn(p, z), r), 1.0f);
    const int n = (int)nf;
    const int n1 = n >> 1;  // arithmetic shift: floor
    const int n2 = n - n1;
    const float e = __fmul_rn(__fmul_rn(p, oasr_pow2i(n1)), oasr_pow2i(n2));
    return oasr_isnan(x) ? x : e;
}

// 1 / d correctly rounded for 1 <= d <= 2^64: the hardware reciprocal and one fused Newton
// step, which is __frcp_rn's own sequence on that range, without its branch to the slow path
// for extreme exponents.
__device__ __forceinline__ float oasr_rcp_rn_moderate(float d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    const float e = __fmaf_rn(d, r, -1.0f);
    return __fmaf_rn(r, -e, r);
}

__device__ __forceinline__ float oasr_erf(float x) {
    const u32 bits = __float_as_uint(x);
    const float a = __uint_as_float(bits & 0x7FFFFFFFu);
    // |x| < 0.5: the Taylor series x * S(x^2), Horner from S6 down to S0.
    const float z = __fmul_rn(x, x);
    float s = __uint_as_float(0x38FCD193u);                       // S6
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0xBA6016DAu));  // S5
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0x3BAB2DE7u));  // S4
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0xBCDC1672u));  // S3
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0x3DE71791u));  // S2
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0xBEC093A3u));  // S1
    s = __fadd_rn(__fmul_rn(s, z), __uint_as_float(0x3F906EBBu));  // S0
    const float small = __fmul_rn(x, s);
    // Otherwise Abramowitz-Stegun 7.1.26. t = 1 / (1 + P |x|), correctly rounded (the bits of
    // the IEEE division). Clamping the divisor at 2^64 (|x| > 5.6e19) changes no result: there
    // exp(-x^2) is below 1e-44, q * e rounds to 0 and erf is +-1 whatever t is.
    const float P = __uint_as_float(0x3EA7BA05u);
    const float d = fminf(__fadd_rn(1.0f, __fmul_rn(P, a)), __uint_as_float(0x5F800000u));
    const float t = oasr_rcp_rn_moderate(d);
    float q = __uint_as_float(0x3F87DC22u);                       // a5
    q = __fadd_rn(__fmul_rn(q, t), __uint_as_float(0xBFBA00E3u));  // a4
    q = __fadd_rn(__fmul_rn(q, t), __uint_as_float(0x3FB5F0E3u));  // a3
    q = __fadd_rn(__fmul_rn(q, t), __uint_as_float(0xBE91A98Eu));  // a2
    q = __fadd_rn(__fmul_rn(q, t), __uint_as_float(0x3E827906u));  // a1
    q = __fmul_rn(q, t);
    const float e = oasr_exp(-__fmul_rn(a, a));
    const float y = __fsub_rn(1.0f, __fmul_rn(q, e));
    const float large = __uint_as_float((__float_as_uint(y) & 0x7FFFFFFFu) | (bits & 0x80000000u));
    const float r = a < 0.5f ? small : large;
    return oasr_isnan(x) ? x : r;
}

__device__ __forceinline__ float oasr_activate(int act, float v) {
    switch (act) {
        case OASR_ACT_RELU:
            return v > 0.0f ? v : 0.0f;
        case OASR_ACT_SWISH: {
            const float e = oasr_exp(-v);
            const float d = __fadd_rn(1.0f, e);
            const float s = __frcp_rn(d);  // = 1.0f / d, correctly rounded
            return __fmul_rn(v, s);
        }
        case OASR_ACT_GELU: {
            const float u = __fmul_rn(v, __uint_as_float(0x3F3504F3u));  // FRAC_1_SQRT_2
            const float e = oasr_erf(u);
            const float h = __fmul_rn(0.5f, v);
            return __fmul_rn(h, __fadd_rn(1.0f, e));
        }
        default:
            return v;
    }
}

// epilogue_value: act(a_scale * (weight_scale * acc) + bias), in exactly that order (no bias:
// no addition). The bias is selected, not branched on, so that the outputs a thread has in
// flight interleave; a caller that passes `act` as a compile-time constant gets the code of
// that activation alone.
__device__ __forceinline__ float oasr_epilogue_value(float acc, float weight_scale, float a_scale,
                                                     bool has_bias, float bias, int act) {
    float v = __fmul_rn(weight_scale, acc);
    v = __fmul_rn(a_scale, v);
    const float vb = __fadd_rn(v, bias);
    v = has_bias ? vb : v;
    return oasr_activate(act, v);
}

// Two rounded outputs as one u32 (lo in the low half), exactly as round_to_out.
__device__ __forceinline__ u32 oasr_round_pair_to_out(int out_dtype, float lo, float hi) {
    return (u32)oasr_round_to_out(out_dtype, lo) | ((u32)oasr_round_to_out(out_dtype, hi) << 16);
}

// Two outputs rounded to f16 / bf16 with one packed conversion (lo in the low half): the
// nearest-even rounding of round_to_out for every value but NaN, which the caller fixes.
template <int OUT>
__device__ __forceinline__ u32 oasr_pack_rounded(float lo, float hi) {
    u32 bits;
    if constexpr (OUT == OASR_OUT_F16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(hi), "f"(lo));
    }
    return bits;
}

// The per-column operands of two neighbouring output columns (col, col + 1; col is even).
struct OasrColumns {
    float ws0, ws1, b0, b1, q0, q1;
};

__device__ __forceinline__ OasrColumns oasr_columns(const Epilogue& epi, int col) {
    OasrColumns c;
    c.ws0 = epi.weight_scale[col];
    c.ws1 = epi.weight_scale[col + 1];
    c.b0 = epi.bias != 0 ? epi.bias[col] : 0.0f;
    c.b1 = epi.bias != 0 ? epi.bias[col + 1] : 0.0f;
    c.q0 = epi.quant_mult != 0 ? epi.quant_mult[col] : 0.0f;
    c.q1 = epi.quant_mult != 0 ? epi.quant_mult[col + 1] : 0.0f;
    return c;
}

// Finishes two neighbouring outputs (columns col, col + 1) of row `row` and stores them: one
// 4-byte store of two u16 bits, or one 2-byte store of two 8-bit codes (scaled_mm_quant).
__device__ __forceinline__ void oasr_store_pair(const Epilogue& epi, const OasrColumns& c, int n,
                                                int row, int col, float acc0, float acc1,
                                                float a_scale) {
    const bool has_bias = epi.bias != 0;
    const float v0 = oasr_epilogue_value(acc0, c.ws0, a_scale, has_bias, c.b0, epi.activation);
    const float v1 = oasr_epilogue_value(acc1, c.ws1, a_scale, has_bias, c.b1, epi.activation);
    const i64 idx = (i64)row * n + col;
    if (epi.quant_mult == 0) {
        *reinterpret_cast<u32*>(static_cast<u16*>(epi.out) + idx) =
            oasr_round_pair_to_out(epi.out_dtype, v0, v1);
    } else {
        // quantize_static on the rounded output: widen(round(v)) * mult, then encode.
        const float y0 =
            __fmul_rn(oasr_widen(epi.out_dtype, oasr_round_to_out(epi.out_dtype, v0)), c.q0);
        const float y1 =
            __fmul_rn(oasr_widen(epi.out_dtype, oasr_round_to_out(epi.out_dtype, v1)), c.q1);
        const u32 pair = (u32)oasr_encode(epi.quant_dtype, y0) |
                         ((u32)oasr_encode(epi.quant_dtype, y1) << 8);
        *reinterpret_cast<u16*>(static_cast<u8*>(epi.out) + idx) = (u16)pair;
    }
}
