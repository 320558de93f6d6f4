//! float8_e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities, one NaN
//! pattern per sign (`S.1111.111`), largest finite magnitude 448 (`0x7E`).

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Code of +448; `| 0x80` gives -448.
pub const E4M3_MAX_CODE: u8 = 0x7E;

/// Smallest normal e4m3 magnitude, 2^-6.
const MIN_NORMAL: f32 = 0.015625;
/// 2^9: one e4m3 subnormal step (2^-9) becomes one unit.
const SUBNORMAL_STEPS: f32 = 512.0;
/// Difference of the exponent biases of f32 (127) and e4m3 (7).
const BIAS_DIFF: u32 = 127 - 7;

/// Encode `x` as float8_e4m3fn: round to nearest, ties to even, saturating.
///
/// - |x| ≥ 448 (including ±inf, and everything that would round past 448) gives ±448,
///   so the NaN codes `0x7F`/`0xFF` are never produced;
/// - NaN gives `0x00` (+0): NaN never appears in quantized output;
/// - the sign of zero is kept (`-0.0` gives `0x80`); subnormals (m · 2^-9) are rounded exactly.
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x00;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7FFF_FFFF);
    let mag = if a >= E4M3_MAX {
        E4M3_MAX_CODE
    } else if a < MIN_NORMAL {
        // Subnormal range: scaling by 2^9 is exact, so one nearest-even rounding to an integer
        // m in 0..=8 is the whole job; m = 8 is 2^-6, whose code happens to be 8 as well.
        (a * SUBNORMAL_STEPS).round_ties_even() as u8
    } else {
        // Normal range: round the 23-bit f32 mantissa to 3 bits, nearest-even; a carry ripples
        // into the exponent, which is the correct result. a < 448 cannot round past 448.
        let drop = 20;
        let lsb = (bits >> drop) & 1;
        let rounded = ((bits & 0x7FFF_FFFF) + ((1 << (drop - 1)) - 1) + lsb) >> drop;
        (rounded - (BIAS_DIFF << 3)) as u8
    };
    sign | mag
}

/// Decode a float8_e4m3fn code; `0x7F` and `0xFF` (the format's only NaN codes) decode to NaN.
pub fn e4m3_decode(code: u8) -> f32 {
    let sign = u32::from(code & 0x80) << 24;
    let exp = u32::from((code >> 3) & 0x0F);
    let man = u32::from(code & 0x07);
    let mag = match (exp, man) {
        (0x0F, 0x07) => return f32::NAN,
        // Subnormal: m · 2^-9, exact in f32.
        (0, m) => m as f32 / SUBNORMAL_STEPS,
        (e, m) => f32::from_bits(((e + BIAS_DIFF) << 23) | (m << 20)),
    };
    f32::from_bits(mag.to_bits() | sign)
}

/// All 256 codes decoded, for table lookups in hot loops.
pub fn e4m3_decode_table() -> [f32; 256] {
    std::array::from_fn(|c| e4m3_decode(c as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_nan_code_round_trips() {
        for c in 0..=255u8 {
            let v = e4m3_decode(c);
            if c & 0x7F == 0x7F {
                assert!(v.is_nan());
            } else {
                assert_eq!(e4m3_encode(v), c, "{c:#04x} = {v}");
            }
        }
    }

    /// Nearest-even against a brute-force search over all finite codes.
    #[test]
    fn encode_matches_brute_force_nearest_even() {
        let finite: Vec<(u8, f32)> = (0..=0x7Eu8).map(|c| (c, e4m3_decode(c))).collect();
        let nearest = |a: f32| -> u8 {
            let mut best = finite[0];
            for &(c, v) in &finite[1..] {
                let (d, db) = ((a - v).abs(), (a - best.1).abs());
                if d < db || (d == db && c % 2 == 0) {
                    best = (c, v);
                }
            }
            best.0
        };
        let mut x = 1e-5f32;
        while x < 460.0 {
            for a in [
                x,
                f32::from_bits(x.to_bits() + 1),
                f32::from_bits(x.to_bits() - 1),
            ] {
                let want = if a >= E4M3_MAX { 0x7E } else { nearest(a) };
                assert_eq!(e4m3_encode(a), want, "{a}");
                assert_eq!(e4m3_encode(-a), want | 0x80, "{}", -a);
            }
            x *= 1.0 + 1.0 / 64.0;
        }
        // Every midpoint between neighbouring codes goes to the even code.
        for c in 0..0x7Eu8 {
            let mid = (e4m3_decode(c) + e4m3_decode(c + 1)) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(e4m3_encode(mid), even, "midpoint of {c:#04x}");
        }
    }
}
