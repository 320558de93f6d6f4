//! GEMM epilogue activations, with `exp` and `erf` built from IEEE `+ - * /` and bit operations
//! only, in a fixed order, so a CUDA kernel can repeat them with `__fadd_rn` / `__fsub_rn` /
//! `__fmul_rn` / `__fdiv_rn` and get the same bits (libm and `__expf` differ between platforms).

use serde::{Deserialize, Serialize};

/// The activation applied in a GEMM epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    None,
    Relu,
    /// SiLU: `v * sigmoid(v)`.
    Swish,
    /// The exact-erf GELU (not the tanh approximation).
    Gelu,
}

impl Activation {
    /// The serialized name.
    pub fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Swish => "swish",
            Activation::Gelu => "gelu",
        }
    }
}

/// Apply `act` to `v`.
#[inline]
pub fn activate(act: Activation, v: f32) -> f32 {
    match act {
        Activation::None => v,
        Activation::Relu => relu(v),
        Activation::Swish => swish(v),
        Activation::Gelu => gelu(v),
    }
}

/// `v > 0 ? v : +0.0`: -0.0 and NaN both give +0.0 (write it as this comparison on the GPU, not
/// `fmaxf`, whose signed-zero result is unspecified).
#[inline]
pub fn relu(v: f32) -> f32 {
    if v > 0.0 {
        v
    } else {
        0.0
    }
}

/// `v * (1 / (1 + exp_f32(-v)))`, within 3 ulp for v ≥ -88 (tested). For v < -88.72,
/// `exp_f32(-v)` overflows to +inf and the result is -0.0 (the true value is below 1e-36);
/// NaN stays NaN.
#[inline]
pub fn swish(v: f32) -> f32 {
    let e = exp_f32(-v);
    let d = 1.0 + e;
    let s = 1.0 / d;
    v * s
}

/// `(0.5 * v) * (1 + erf_f32(v * FRAC_1_SQRT_2))`, error below 2e-7 · |v| (tested). For
/// v ≤ -5.55 the erf rounds to -1 and the result is -0.0 (as in an f32 PyTorch GELU); NaN stays
/// NaN.
#[inline(always)]
pub fn gelu(v: f32) -> f32 {
    let u = v * std::f32::consts::FRAC_1_SQRT_2;
    let e = erf_f32(u);
    let h = 0.5 * v;
    h * (1.0 + e)
}

/// [`gelu`] of every element, in place, on the widest vector unit this CPU has (the same bits).
pub fn gelu_in_place(xs: &mut [f32]) {
    super::kernels::gelu_kernel()(xs)
}

/// The softmax of one row, in place: max, `exp_f32(x - max)`, a sum in 16 fixed lanes (so the
/// result never depends on the vector width), then each value divided by the sum. An empty row
/// is left alone.
pub fn softmax_in_place(row: &mut [f32]) {
    super::kernels::softmax_kernel()(row)
}

#[inline(always)]
pub(super) fn gelu_body(xs: &mut [f32]) {
    for v in xs.iter_mut() {
        *v = gelu(*v);
    }
}

/// Lanes of the softmax reductions.
const SOFTMAX_LANES: usize = 16;

#[inline(always)]
pub(super) fn softmax_body(row: &mut [f32]) {
    const L: usize = SOFTMAX_LANES;
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = row.chunks_exact(L);
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for l in 0..L {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    max = lanes.iter().copied().fold(max, f32::max);
    let mut sums = [0f32; L];
    let mut chunks = row.chunks_exact_mut(L);
    for c in &mut chunks {
        for l in 0..L {
            let e = exp_f32(c[l] - max);
            c[l] = e;
            sums[l] += e;
        }
    }
    let mut tail = 0f32;
    for v in chunks.into_remainder() {
        *v = exp_f32(*v - max);
        tail += *v;
    }
    let sum = sums.iter().sum::<f32>() + tail;
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Inputs below this give +0.0 (exp(-104) is under half the smallest subnormal).
pub const EXP_INPUT_MIN: f32 = -104.0;
/// Inputs above this give +inf (exp overflows f32 from 88.7228394 on).
pub const EXP_INPUT_MAX: f32 = 89.0;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split for Cody–Waite: `LN2_HI` has 9 significant bits, so `n * LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4; // 0x3F318000 = 355/512 exactly
const LN2_LO: f32 = -0.000_212_194_44; // 0xB95E8083
/// 1.5 · 2^23: adding and subtracting it rounds |t| < 2^22 to an integer, nearest-even.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// exp(r) ≈ 1 + r + r² · P(r) on |r| ≤ ln2/2 (the Cephes `expf` minimax coefficients).
const EXP_P: [f32; 6] = [
    0.000_198_756_91, // 0x39506967
    0.001_398_199_9,  // 0x3AB743CE
    0.008_333_452,    // 0x3C088908
    0.041_665_796,    // 0x3D2AA9C1
    0.166_666_66,     // 0x3E2AAAAA
    0.5,              // 0x3F000000
];

/// 2^e as f32 for e in -126..=127, from exponent bits.
#[inline(always)]
fn pow2i(e: i32) -> f32 {
    f32::from_bits((e.wrapping_add(127) as u32) << 23)
}

/// e^x in f32 from `+ - * /` and bit operations only: under 1 ulp from the true value over the
/// normal range, within one subnormal step below it (tested). Operation order (each step one IEEE round-to-nearest-even op):
///
/// ```text
/// NaN -> NaN;  x = min(max(x, -104), 89)
/// t  = x * LOG2E
/// nf = (t + 1.5·2^23) - 1.5·2^23                  // round to integer, ties to even
/// r  = (x - nf * LN2_HI) - nf * LN2_LO
/// z  = r * r
/// p  = P0;  p = p * r + P_i  for P1..P5          // Horner, no FMA
/// p  = ((p * z) + r) + 1
/// n  = (int) nf;  n1 = n >> 1 (floor);  n2 = n - n1
/// result = (p * 2^n1) * 2^n2                     // the first product is exact
/// ```
///
/// The two-step scaling covers n in -150..=128 with a single rounding, so subnormal results are
/// rounded once and x ≥ 88.7228394 overflows to +inf.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let c = x.clamp(EXP_INPUT_MIN, EXP_INPUT_MAX);
    let t = c * LOG2E;
    let big = t + ROUND_MAGIC;
    let nf = big - ROUND_MAGIC;
    let r = (c - nf * LN2_HI) - nf * LN2_LO;
    let z = r * r;
    let mut p = EXP_P[0];
    for &k in &EXP_P[1..] {
        p = p * r + k;
    }
    let p = ((p * z) + r) + 1.0;
    // n = nf, read from the low mantissa bits of `big` (ulp 1 there): the same integer as
    // `nf as i32`, without the saturating conversion that keeps this loop from vectorising.
    let n = (big.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let y = (p * pow2i(n1)) * pow2i(n2);
    // A select, not an early return, so loops over slices vectorise.
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// Below this |x|, erf uses its Taylor series; from it on, Abramowitz–Stegun 7.1.26.
pub const ERF_SERIES_MAX: f32 = 0.5;

/// erf(x) = x · S(x²) on |x| < 0.5: the Taylor coefficients 2/√π · (-1)^n / (n! (2n + 1)),
/// n = 0..=6 (truncation error < 1e-9 relative).
const ERF_S: [f32; 7] = [
    std::f32::consts::FRAC_2_SQRT_PI, // 0x3F906EBB
    -0.376_126_38,                    // 0xBEC093A3
    0.112_837_92,                     // 0x3DE71791
    -0.026_866_172,                   // 0xBCDC1672
    0.005_223_978,                    // 0x3BAB2DE7
    -0.000_854_832_7,                 // 0xBA6016DA
    0.000_120_553_326,                // 0x38FCD193
];

/// Abramowitz–Stegun 7.1.26: erf(a) ≈ 1 - t·(a1 + t·(a2 + ...)) · e^(-a²), t = 1/(1 + P·a).
const ERF_P: f32 = 0.327_591_1; // 0x3EA7BA05
const ERF_A: [f32; 5] = [
    0.254_829_6,   // a1 = 0.254829592, 0x3E827906
    -0.284_496_72, // a2 = -0.284496736, 0xBE91A98E
    1.421_413_8,   // a3 = 1.421413741, 0x3FB5F0E3
    -1.453_152_1,  // a4 = -1.453152027, 0xBFBA00E3
    1.061_405_4,   // a5 = 1.061405429, 0x3F87DC22
];

/// erf(x) in f32 from `+ - * /`, bit operations and [`exp_f32`]: absolute error < 3.5e-7,
/// and under 3 ulp for |x| < 0.5 (tested). Operation order:
///
/// ```text
/// NaN -> NaN;  a = |x|                           // clear the sign bit
/// a < 0.5:  z = x * x
///           s = S6;  s = s * z + S_i  for S5..S0 // Horner, no FMA
///           result = x * s                      // odd; erf(±0) = ±0
/// else:     t = 1 / (1 + P * a)
///           q = a5;  q = q * t + a_i  for a4..a1;  q = q * t
///           e = exp_f32(-(a * a))
///           y = 1 - q * e
///           result = y with the sign bit of x    // odd symmetry
/// ```
///
/// |x| ≥ 3.92 gives exactly ±1.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    let z = x * x;
    let mut s = ERF_S[6];
    for &c in ERF_S[..6].iter().rev() {
        s = s * z + c;
    }
    let series = x * s;
    let t = 1.0 / (1.0 + ERF_P * a);
    let mut q = ERF_A[4];
    for &c in ERF_A[..4].iter().rev() {
        q = q * t + c;
    }
    let q = q * t;
    let e = exp_f32(-(a * a));
    let y = 1.0 - q * e;
    let tail = f32::from_bits((y.to_bits() & 0x7FFF_FFFF) | (bits & 0x8000_0000));
    // Both branches are computed and one selected, so loops over slices vectorise.
    let r = if a < ERF_SERIES_MAX { series } else { tail };
    if x.is_nan() {
        x
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants are part of the GPU contract: pin their bits.
    #[test]
    fn constant_bits() {
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&[LOG2E, LN2_HI, LN2_LO, ROUND_MAGIC, ERF_P]),
            [
                0x3FB8_AA3B,
                0x3F31_8000,
                0xB95E_8083,
                0x4B40_0000,
                0x3EA7_BA05
            ]
        );
        assert_eq!(
            bits(&EXP_P),
            [
                0x3950_6967,
                0x3AB7_43CE,
                0x3C08_8908,
                0x3D2A_A9C1,
                0x3E2A_AAAA,
                0x3F00_0000
            ]
        );
        assert_eq!(
            bits(&ERF_S),
            [
                0x3F90_6EBB,
                0xBEC0_93A3,
                0x3DE7_1791,
                0xBCDC_1672,
                0x3BAB_2DE7,
                0xBA60_16DA,
                0x38FC_D193
            ]
        );
        assert_eq!(
            bits(&ERF_A),
            [
                0x3E82_7906,
                0xBE91_A98E,
                0x3FB5_F0E3,
                0xBFBA_00E3,
                0x3F87_DC22
            ]
        );
        assert_eq!(std::f32::consts::FRAC_1_SQRT_2.to_bits(), 0x3F35_04F3);
    }

    #[test]
    fn magic_rounding_is_nearest_even() {
        for t in [-150.5f32, -0.5, 0.5, 1.5, 2.5, 127.5, -3.7, 128.2] {
            let nf = (t + ROUND_MAGIC) - ROUND_MAGIC;
            assert_eq!(nf, t.round_ties_even(), "{t}");
        }
    }

    #[test]
    fn relu_pins_zero_and_nan() {
        assert_eq!(relu(-0.0).to_bits(), 0);
        assert_eq!(relu(f32::NAN).to_bits(), 0);
        assert_eq!(relu(-1.0).to_bits(), 0);
        assert_eq!(relu(2.5), 2.5);
    }
}
