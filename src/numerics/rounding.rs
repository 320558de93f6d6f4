//! Scalar rounding: half-to-even for int8 codes and the single rounding of a GEMM output to the
//! served 16-bit float dtype.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// Round to the nearest integer, ties to even (`rintf` / `__float2int_rn` on the GPU).
///
/// NaN stays NaN and ±inf stay ±inf; the sign of zero is kept (`-0.4` gives `-0.0`).
///
/// Computed as `(|x| + 2^23) - 2^23` with the sign put back: below 2^23 the sum's ulp is 1, so the
/// addition itself rounds to the nearest integer, ties to even (IEEE default rounding), and every
/// f32 from 2^23 up is already an integer. The same result as `f32::round_ties_even`, but a
/// select that vectorizes, where `round_ties_even` is a call to libm's `rintf` on baseline x86-64
/// (no SSE4.1 `roundps`): quantizing a large checkpoint spent 11 % of its time in that call.
#[inline]
pub fn round_half_even(x: f32) -> f32 {
    const TWO_23: f32 = 8_388_608.0;
    let a = x.abs();
    if a < TWO_23 {
        ((a + TWO_23) - TWO_23).copysign(x)
    } else {
        x // an integer already, ±inf or NaN
    }
}

/// The 16-bit float dtype a GEMM writes (the served activation dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutDtype {
    F16,
    Bf16,
}

impl OutDtype {
    /// The name used in configs and reports (`"f16"` / `"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            OutDtype::F16 => "f16",
            OutDtype::Bf16 => "bf16",
        }
    }
}

/// The canonical f16 NaN every NaN output is written as (GPU conversions differ in payload).
pub const F16_CANONICAL_NAN: u16 = 0x7E00;
/// The canonical bf16 NaN every NaN output is written as.
pub const BF16_CANONICAL_NAN: u16 = 0x7FC0;

/// Round `v` once to `out`, nearest-even, and return its bits.
///
/// Finite values beyond the dtype's range become ±inf (IEEE overflow, what
/// `__float2half_rn` / `__float2bfloat16_rn` do). Any NaN becomes the canonical quiet NaN of
/// the dtype so that CPU and GPU bits agree even on garbage input.
#[inline]
pub fn round_to_out(out: OutDtype, v: f32) -> u16 {
    match out {
        OutDtype::F16 if v.is_nan() => F16_CANONICAL_NAN,
        OutDtype::Bf16 if v.is_nan() => BF16_CANONICAL_NAN,
        OutDtype::F16 => f16::from_f32(v).to_bits(),
        OutDtype::Bf16 => bf16::from_f32(v).to_bits(),
    }
}

/// Widen f16 bits to f32 (exact).
#[inline]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// Widen bf16 bits to f32 (exact: bf16 is the top half of an f32).
#[inline]
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Widen bits of `out` to f32 (exact).
#[inline]
pub fn out_bits_to_f32(out: OutDtype, b: u16) -> f32 {
    match out {
        OutDtype::F16 => f16_bits_to_f32(b),
        OutDtype::Bf16 => bf16_bits_to_f32(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_even() {
        for (x, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-2.5, -2.0),
            (-3.5, -4.0),
        ] {
            assert_eq!(round_half_even(x), want, "{x}");
        }
        assert_eq!(round_half_even(-0.4).to_bits(), (-0.0f32).to_bits());
    }

    /// The select equals `f32::round_ties_even` bit for bit: every 61st f32 bit pattern (all
    /// signs, exponents and NaN payloads), every half-integer around 2^22 and 2^23, and the
    /// specials.
    #[test]
    fn equals_round_ties_even_bit_for_bit() {
        let same = |x: f32| {
            let (got, want) = (round_half_even(x), x.round_ties_even());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e} ({:#010x}): {got:e} against {want:e}",
                x.to_bits()
            );
        };
        (0..=u32::MAX)
            .step_by(61)
            .for_each(|b| same(f32::from_bits(b)));
        for edge in [4_194_304.0f32, 8_388_608.0] {
            for i in -64..=64 {
                let x = edge + i as f32 * 0.5;
                same(x);
                same(-x);
                same(f32::from_bits(x.to_bits() + 1));
                same(f32::from_bits(x.to_bits() - 1));
            }
        }
        for x in [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
            0.49999997,
        ] {
            same(x);
            same(-x);
        }
    }

    #[test]
    fn out_rounding_is_nearest_even_and_overflows_to_inf() {
        // 2049 is a tie between 2048 and 2050 in f16; 2051 ties to 2052.
        assert_eq!(round_to_out(OutDtype::F16, 2049.0), 0x6800);
        assert_eq!(round_to_out(OutDtype::F16, 2051.0), 0x6802);
        assert_eq!(round_to_out(OutDtype::F16, 65520.0), 0x7C00);
        assert_eq!(round_to_out(OutDtype::F16, 65519.0), 0x7BFF);
        // bf16: 257 ties to 256, 259 ties to 260.
        assert_eq!(round_to_out(OutDtype::Bf16, 257.0), 0x4380);
        assert_eq!(round_to_out(OutDtype::Bf16, 259.0), 0x4382);
        assert_eq!(round_to_out(OutDtype::Bf16, f32::MAX), 0x7F80);
        assert_eq!(round_to_out(OutDtype::F16, f32::NAN), F16_CANONICAL_NAN);
        assert_eq!(round_to_out(OutDtype::Bf16, -f32::NAN), BF16_CANONICAL_NAN);
    }

    #[test]
    fn widening_round_trips() {
        for b in 0..=u16::MAX {
            for out in [OutDtype::F16, OutDtype::Bf16] {
                let v = out_bits_to_f32(out, b);
                if !v.is_nan() {
                    assert_eq!(round_to_out(out, v), b, "{out:?} {b:#06x}");
                }
            }
        }
    }
}
