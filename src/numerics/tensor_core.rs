//! A model of how Hopper's fp8 tensor cores sum a dot product, for `verify --fp8-accumulation
//! tensor-core`: the CPU figures then predict what the GPU's wgmma kernels serve, where the
//! reference ([`super::scaled_mm`]) sums every product exactly in f32 order.
//!
//! The model, fitted on an H100 against cuBLASLt's fp8 GEMM with f32 output (bit-identical on
//! every one of 1 310 720 outputs of e4m3 matrices in five magnitude mixes, K from 32 to 384,
//! with and without promotion; `benches/tensor_core_fit.py`, docs/numerics.md): each wgmma step
//! adds 32 products to the accumulator as one block. The block aligns every term (the 32 exact
//! products and the accumulator) to the largest of their exponents, where a product's exponent
//! is the sum of its operands' exponent fields (`⌊log2 |a|⌋ + ⌊log2 |w|⌋` for normal codes,
//! before the product's own carry; a subnormal operand counts with e4m3's emin, -6, however
//! small it is; a zero product never sets it), keeps 13 bits below it, truncating toward zero,
//! sums exactly, and keeps 14 significant bits of the sum, again toward zero (the
//! accumulator's e8m13 format). Our wgmma kernel restarts that accumulator every [`PROMOTE`] K
//! elements and adds it into an f32 master accumulator (round to nearest), units in ascending K
//! order.

/// K elements per wgmma step (one block of the model).
const STEP: usize = 32;
/// K elements per promotion unit of the default wgmma kernel (`OASR_WGMMA_FP8_PROMOTE`).
const PROMOTE: usize = 128;
/// Bits the block keeps below its largest exponent.
const KEPT_BITS: i32 = 13;

/// Significant bits of the accumulator a block writes (the tensor core's e8m13 format).
const ACC_BITS: u32 = KEPT_BITS as u32 + 1;

/// `sum` with its bits below the ACC_BITS most significant cleared (toward zero).
fn truncate_to_acc_bits(sum: i64) -> i64 {
    let magnitude = sum.unsigned_abs();
    let drop = (u64::BITS - magnitude.leading_zeros()).saturating_sub(ACC_BITS);
    let kept = ((magnitude >> drop) << drop) as i64;
    if sum < 0 {
        -kept
    } else {
        kept
    }
}

/// The exponent that marks a zero product or accumulator: below every real one, so a zero
/// never sets a block's alignment.
const NONE: i32 = i32::MIN / 4;

/// One e4m3 code as the model reads it: |value| = `mag` · 2^`exp` with `mag` an integer below
/// 16, `align` = the exponent the block aligns on (its exponent field: ⌊log2 |value|⌋, or
/// e4m3's emin -6 for a subnormal), and `neg` = -1 for a negative code (0 otherwise).
#[derive(Clone, Copy)]
struct Code {
    mag: u8,
    exp: i8,
    align: i8,
    neg: i8,
}

/// e4m3's smallest normal exponent, with which its subnormals align.
const E4M3_EMIN: i32 = -6;

/// Every e4m3 code read as a [`Code`], from [`super::e4m3_decode`] (the one definition of the
/// format). Zeros (and the NaN codes, which the quantizer never emits) get `mag` 0, so their
/// products are zero whatever their exponents.
fn e4m3_codes() -> [Code; 256] {
    std::array::from_fn(|c| {
        let v = super::e4m3_decode(c as u8);
        let neg = if v.is_sign_negative() { -1 } else { 0 };
        if v == 0.0 || v.is_nan() {
            return Code {
                mag: 0,
                exp: -64,
                align: -64,
                neg,
            };
        }
        // e4m3 keeps 3 fraction bits; its subnormals are whole multiples of 2^-9.
        let log2 = log2_floor(v);
        let exp = (log2 - 3).max(-9);
        Code {
            mag: (f64::from(v.abs()) * pow2(-exp)) as u8,
            exp: exp as i8,
            // Measured: a subnormal operand aligns as if it were 2^-6 (an exponent field of 0
            // reads as emin), which the per-layer outputs of a static fp8 layer on the GPU show.
            align: log2.max(E4M3_EMIN) as i8,
            neg,
        }
    })
}

/// Rows of codes in four planes, each row padded with zero codes to whole steps (a zero
/// product changes no block), so that every block is a fixed-size array and its loops
/// vectorise.
struct Planes {
    mag: Vec<i32>,
    exp: Vec<i32>,
    align: Vec<i32>,
    neg: Vec<i32>,
    /// Elements per padded row.
    stride: usize,
}

impl Planes {
    fn new(table: &[Code; 256], codes: &[u8], k: usize) -> Self {
        let stride = k.next_multiple_of(STEP);
        let plane = |f: fn(&Code) -> i32| {
            codes
                .chunks(k.max(1))
                .flat_map(|row| {
                    let pad = std::iter::repeat_n(0, stride - row.len());
                    row.iter().copied().chain(pad)
                })
                .map(|c| f(&table[usize::from(c)]))
                .collect()
        };
        Planes {
            mag: plane(|c| i32::from(c.mag)),
            exp: plane(|c| i32::from(c.exp)),
            align: plane(|c| i32::from(c.align)),
            neg: plane(|c| i32::from(c.neg)),
            stride,
        }
    }

    /// Step `s` (elements `s · STEP ..`) of row `row`.
    fn step(&self, row: usize, s: usize) -> Step<'_> {
        let start = row * self.stride + s * STEP;
        fn at(p: &[i32], start: usize) -> &[i32; STEP] {
            p[start..start + STEP].try_into().expect("a whole step")
        }
        Step {
            mag: at(&self.mag, start),
            exp: at(&self.exp, start),
            align: at(&self.align, start),
            neg: at(&self.neg, start),
        }
    }
}

/// One step's elements of a row's planes.
struct Step<'a> {
    mag: &'a [i32; STEP],
    exp: &'a [i32; STEP],
    align: &'a [i32; STEP],
    neg: &'a [i32; STEP],
}

/// `⌊log2 |x|⌋` of a non-zero finite f32 (subnormals included), NONE for zero.
fn log2_floor(x: f32) -> i32 {
    if x == 0.0 {
        return NONE;
    }
    let bits = x.to_bits();
    match ((bits >> 23) & 0xFF) as i32 {
        0 => -127 - ((bits & 0x7F_FFFF).leading_zeros() as i32 - 9),
        e => e - 127,
    }
}

/// 2^e as an f64 (|e| stays far inside f64's normal range here).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// One wgmma step: the block of products `a` · `w` added to `acc` as the model sums them.
#[inline(always)]
fn step(a: Step, w: Step, acc: f32) -> f32 {
    let mut top = log2_floor(acc);
    for k in 0..STEP {
        let zero = a.mag[k] * w.mag[k] == 0;
        top = top.max(if zero { NONE } else { a.align[k] + w.align[k] });
    }
    if top == NONE {
        return acc; // every term is zero
    }
    // Each product mag_a · mag_w · 2^(exp_a + exp_w) in units of 2^(top - KEPT_BITS): a shift
    // of the integer product (below 2^8), left (exact) or right (truncating toward zero); the
    // terms are below 2^21 and 32 of them sum exactly in i32.
    let mut sum = 0i32;
    for k in 0..STEP {
        let shift = a.exp[k] + w.exp[k] + KEPT_BITS - top;
        let magnitude = (a.mag[k] * w.mag[k]) << shift.clamp(0, 15) >> (-shift).clamp(0, 31);
        let neg = a.neg[k] ^ w.neg[k];
        sum += (magnitude ^ neg) - neg;
    }
    // The accumulator in the same units (scaling by a power of two is exact; `as` truncates).
    let unit = pow2(KEPT_BITS - top);
    let total = (f64::from(acc) * unit) as i64 + i64::from(sum);
    // The block's result keeps ACC_BITS significant bits, truncated toward zero (a sum that
    // carried above the top loses its lowest bits); exact in f32.
    (truncate_to_acc_bits(total) as f64 / unit) as f32
}

/// The one row of `a` times row `j` of `w` as the model sums it.
#[inline(always)]
fn dot(a: &Planes, w: &Planes, j: usize) -> f32 {
    let steps = a.stride / STEP;
    let mut master = 0f32;
    for unit in (0..steps).step_by(PROMOTE / STEP) {
        let mut acc = 0f32;
        for s in unit..(unit + PROMOTE / STEP).min(steps) {
            acc = step(a.step(0, s), w.step(j, s), acc);
        }
        master += acc;
    }
    master
}

/// [`dot`] compiled for AVX2 (the block loops vectorise).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &Planes, w: &Planes, j: usize) -> f32 {
    dot(a, w, j)
}

/// Fills `out` `[m, n]` with `value(i, j, acc)`, where `acc` is row i of `a` `[m, k]` times row j
/// of `w` `[n, k]` as the model sums it: the tensor-core counterpart of the reference's exact f32
/// sums, handed to the same epilogue.
pub(crate) fn fill<T: Send>(
    a: &[u8],
    w: &[u8],
    n: usize,
    k: usize,
    out: &mut [T],
    value: impl Fn(usize, usize, f32) -> T + Sync,
) {
    use rayon::prelude::*;
    let table = e4m3_codes();
    let wp = Planes::new(&table, w, k);
    #[cfg(target_arch = "x86_64")]
    let avx2 = is_x86_feature_detected!("avx2");
    let rows = out.len() / n.max(1);
    out.par_chunks_mut(n.max(1))
        .with_min_len(crate::parallel::min_task_len(rows))
        .enumerate()
        .for_each(|(i, row)| {
            let ap = Planes::new(&table, &a[i * k..(i + 1) * k], k);
            for (j, o) in row.iter_mut().enumerate() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: dot_avx2 runs only where the CPU has AVX2 (checked above).
                let acc = if avx2 {
                    unsafe { dot_avx2(&ap, &wp, j) }
                } else {
                    dot(&ap, &wp, j)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let acc = dot(&ap, &wp, j);
                *o = value(i, j, acc);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{e4m3_decode, e4m3_encode};

    /// The model's accumulators, `[m, n]`.
    fn accumulators(a: &[u8], w: &[u8], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        fill(a, w, n, k, &mut out, |_, _, acc| acc);
        out
    }

    fn codes(values: &[f32]) -> Vec<u8> {
        values.iter().map(|&v| e4m3_encode(v)).collect()
    }

    #[test]
    fn the_code_table_holds_each_codes_value_and_exponent() {
        let t = e4m3_codes();
        for code in 0..=255u8 {
            let v = f64::from(e4m3_decode(code));
            let c = t[usize::from(code)];
            if v.is_nan() || v == 0.0 {
                assert_eq!(c.mag, 0, "code {code:#x}");
                continue;
            }
            assert_eq!(
                f64::from(c.mag) * 2f64.powi(c.exp.into()),
                v.abs(),
                "code {code:#x}"
            );
            // Subnormal codes align with e4m3's emin: 2^-9 and 3 · 2^-9 as -6.
            assert_eq!(
                i32::from(c.align),
                (v.abs().log2().floor() as i32).max(-6),
                "code {code:#x}"
            );
            assert_eq!(c.neg, if v < 0.0 { -1 } else { 0 }, "code {code:#x}");
        }
        assert_eq!(t[usize::from(e4m3_encode(0.001953125))].align, -6);
        assert_eq!(t[usize::from(e4m3_encode(0.015625))].align, -6);
        assert_eq!(t[usize::from(e4m3_encode(0.03125))].align, -5);
    }

    #[test]
    fn log2_floor_reads_the_f32_exponent() {
        for x in [
            1.0f32,
            1.5,
            3.99,
            4.0,
            0.3,
            1e-40,
            -7.0,
            f32::MIN_POSITIVE,
            65504.0,
        ] {
            assert_eq!(
                log2_floor(x),
                f64::from(x.abs()).log2().floor() as i32,
                "{x}"
            );
        }
        assert_eq!(log2_floor(0.0), NONE);
    }

    #[test]
    fn small_sums_are_exact() {
        // Terms within 13 bits of one another lose nothing.
        let a = codes(&[1.0, 2.0, -0.5, 0.25]);
        let w = codes(&[3.0, 1.5, 1.0, -4.0]);
        assert_eq!(accumulators(&a, &w, 1, 1, 4), vec![3.0 + 3.0 - 0.5 - 1.0]);
    }

    #[test]
    fn a_term_below_the_kept_bits_is_truncated_toward_zero() {
        // 256 · 256 = 2^16 sets the block's top exponent; 2^-9 · 1 is 25 bits below, under the
        // 13 kept bits, so it vanishes, where the exact f32 sum keeps it.
        let a = codes(&[256.0, 0.001953125]);
        let w = codes(&[256.0, 1.0]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![65536.0]);
        // 2^16 and -(1 + 2^-3) · 2^3 (16 bits below the top): -9 truncates to -8, toward zero.
        let a = codes(&[256.0, -9.0]);
        let w = codes(&[256.0, 1.0]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![65536.0 - 8.0]);
    }

    #[test]
    fn a_subnormal_operand_aligns_as_emin() {
        // 2^-9 (subnormal) · 2^8 = 2^-1 aligns as -6 + 8 = 2, so the last kept unit is 2^-11 and
        // 2^-6 · 2^-7 = 2^-13 vanishes; aligned on the product's own exponent (-1) it would stay.
        let a = codes(&[0.001953125, 0.015625]);
        let w = codes(&[256.0, 0.0078125]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![0.5]);
        // A normal operand of the same product aligns on its own exponent: 2^-13 stays.
        let a = codes(&[0.5, 0.015625]);
        let w = codes(&[1.0, 0.0078125]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![0.5 + 2f32.powi(-13)]);
    }

    /// GPU results written by `benches/tensor_core_fit.py --write-fixtures` from an H100's
    /// cuBLASLt fp8 GEMM (f32 output, promotion every 128 K elements, as our wgmma kernel).
    const GPU_FIXTURES: [(&str, &[u8]); 10] = [
        (
            "normal_k32",
            include_bytes!("../../tests/fixtures/tensor_core/normal_k32.bin"),
        ),
        (
            "normal_k384",
            include_bytes!("../../tests/fixtures/tensor_core/normal_k384.bin"),
        ),
        (
            "wide_k32",
            include_bytes!("../../tests/fixtures/tensor_core/wide_k32.bin"),
        ),
        (
            "wide_k384",
            include_bytes!("../../tests/fixtures/tensor_core/wide_k384.bin"),
        ),
        (
            "positive_k32",
            include_bytes!("../../tests/fixtures/tensor_core/positive_k32.bin"),
        ),
        (
            "positive_k384",
            include_bytes!("../../tests/fixtures/tensor_core/positive_k384.bin"),
        ),
        (
            "per_token_k32",
            include_bytes!("../../tests/fixtures/tensor_core/per_token_k32.bin"),
        ),
        (
            "per_token_k384",
            include_bytes!("../../tests/fixtures/tensor_core/per_token_k384.bin"),
        ),
        // Half zeros, most of the rest subnormal: where a subnormal operand's alignment (emin)
        // shows (aligned on its own exponent, 10 and 6 of these outputs differ).
        (
            "sparse_k32",
            include_bytes!("../../tests/fixtures/tensor_core/sparse_k32.bin"),
        ),
        (
            "sparse_k384",
            include_bytes!("../../tests/fixtures/tensor_core/sparse_k384.bin"),
        ),
    ];

    #[test]
    fn the_model_gives_the_gpus_bits() {
        for (name, bytes) in GPU_FIXTURES {
            let u32_at = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
            let (m, n, k) = (u32_at(0) as usize, u32_at(1) as usize, u32_at(2) as usize);
            let (a, rest) = bytes[12..].split_at(m * k);
            let (w, y) = rest.split_at(n * k);
            let gpu: Vec<f32> = y
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(gpu.len(), m * n, "{name}");
            let model = accumulators(a, w, m, n, k);
            let differ = gpu
                .iter()
                .zip(&model)
                .filter(|(g, t)| g.to_bits() != t.to_bits());
            assert_eq!(
                differ.count(),
                0,
                "{name}: the model differs from the GPU's sums"
            );
            // The reference's sequential f32 sums differ: these cases tell the two apart.
            let f32_sum = |i: usize, j: usize| {
                let (ai, wj) = (&a[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                ai.iter()
                    .zip(wj)
                    .fold(0f32, |s, (&x, &y)| s + e4m3_decode(x) * e4m3_decode(y))
            };
            let off_reference = (0..m * n)
                .filter(|&o| f32_sum(o / n, o % n) != gpu[o])
                .count();
            assert!(off_reference > 0, "{name}: no output tells the sums apart");
        }
    }

    #[test]
    fn a_block_sum_above_the_top_keeps_fourteen_bits_toward_zero() {
        // (1 + 7/8)^2 = 225 · 2^-6 sets the top exponent (0, before the product's carry);
        // 2^-7 · 2^-6 = 2^-13 is the last kept unit. Their sum, 28 801 units of 2^-13, needs
        // 15 bits: the block keeps 14 and drops the 2^-13, where an f32 sum would keep it.
        let a = codes(&[1.875, 0.0078125]);
        let w = codes(&[1.875, 0.015625]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![3.515625]);
        let a = codes(&[-1.875, -0.0078125]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![-3.515625]);
        // Within 14 bits nothing is dropped: 1.875 · 1 + 2^-13 is 15 361 units.
        let a = codes(&[1.875, 0.0078125]);
        let w = codes(&[1.0, 0.015625]);
        assert_eq!(accumulators(&a, &w, 1, 1, 2), vec![1.875 + 2f32.powi(-13)]);
    }

    #[test]
    fn the_accumulator_restarts_at_each_promotion() {
        // Step 1 of unit 1 holds 2^16; a small product in the next unit is summed against a
        // fresh accumulator, so it survives; in the same unit it would be truncated.
        let mut a = vec![0u8; 2 * PROMOTE];
        let mut w = vec![0u8; 2 * PROMOTE];
        a[0] = e4m3_encode(256.0);
        w[0] = e4m3_encode(256.0);
        a[PROMOTE] = e4m3_encode(0.5);
        w[PROMOTE] = e4m3_encode(0.5);
        assert_eq!(accumulators(&a, &w, 1, 1, 2 * PROMOTE), vec![65536.25]);
        a.swap(PROMOTE, STEP);
        w.swap(PROMOTE, STEP);
        assert_eq!(accumulators(&a, &w, 1, 1, 2 * PROMOTE), vec![65536.0]);
    }
}
