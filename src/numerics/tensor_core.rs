//! A model of how Hopper's fp8 tensor cores sum a dot product, for `verify --fp8-accumulation
//! tensor-core`: the CPU figures then predict what the GPU's wgmma kernels serve, where the
//! reference ([`super::scaled_mm`]) sums every product exactly in f32 order.
//!
//! The model, fitted on an H100 against cuBLASLt's fp8 GEMM with f32 output (bit-identical on
//! every one of 904 240 outputs of random e4m3 matrices, K from 32 to 384, with and without
//! promotion; `benches/tensor_core_fit.py`, docs/numerics.md): each wgmma step adds 32 products
//! to the accumulator as one block. The block aligns every term (the 32 exact products and the
//! accumulator) to the largest of their exponents, where a product's exponent is the sum of its
//! operands' (`⌊log2 |a|⌋ + ⌊log2 |w|⌋`, before the product's own carry), keeps 13 bits below
//! it, truncating toward zero, sums exactly, and keeps 14 significant bits of the sum, again
//! toward zero (the accumulator's e8m13 format). Our wgmma kernel restarts that accumulator
//! every [`PROMOTE`] K elements and adds it into an f32 master accumulator (round to nearest),
//! units in ascending K order.

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

/// `⌊log2 |x|⌋` of a zero: below every sum of two real exponents, so a zero never sets a block's
/// alignment.
const ZERO_LOG2: i32 = -1 << 20;

/// Every e4m3 code decoded (exact in f64) with `⌊log2 |value|⌋`.
fn e4m3_terms() -> [(f64, i32); 256] {
    let mut table = [(0f64, ZERO_LOG2); 256];
    for (code, t) in table.iter_mut().enumerate() {
        // NaN codes never reach a GEMM (the quantizer never emits them).
        let v = f64::from(super::e4m3_decode(code as u8));
        *t = (v, log2_floor(v));
    }
    table
}

/// `⌊log2 |x|⌋` of a finite f64 (from its exponent bits; subnormal f64 never occur here).
fn log2_floor(x: f64) -> i32 {
    if x == 0.0 || !x.is_finite() {
        return ZERO_LOG2;
    }
    ((x.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// Decoded codes, split so that the block loops vectorise: values (exact in f64) and
/// `⌊log2 |value|⌋`.
struct Decoded {
    values: Vec<f64>,
    log2: Vec<i32>,
}

impl Decoded {
    fn new(terms: &[(f64, i32); 256], codes: &[u8]) -> Self {
        let (values, log2) = codes.iter().map(|&c| terms[usize::from(c)]).unzip();
        Decoded { values, log2 }
    }
}

/// One dot product of decoded codes as the model sums it.
fn dot(a: (&[f64], &[i32]), w: (&[f64], &[i32])) -> f32 {
    let mut master = 0f32;
    for start in (0..a.0.len()).step_by(PROMOTE) {
        let end = (start + PROMOTE).min(a.0.len());
        let mut acc = 0f32;
        for s in (start..end).step_by(STEP) {
            let e = (s + STEP).min(end);
            let (av, al, wv, wl) = (&a.0[s..e], &a.1[s..e], &w.0[s..e], &w.1[s..e]);
            let acc64 = f64::from(acc);
            let top = al
                .iter()
                .zip(wl)
                .map(|(x, y)| x + y)
                .fold(log2_floor(acc64), i32::max);
            if top < ZERO_LOG2 / 2 {
                continue; // every term is zero
            }
            // Terms in units of 2^(top - KEPT_BITS): scaling by a power of two is exact, and
            // `as i64` truncates toward zero. Each is below 2^16, so the sum is exact.
            let unit = 2f64.powi(KEPT_BITS - top);
            let mut sum = (acc64 * unit) as i64;
            for (x, y) in av.iter().zip(wv) {
                sum += (x * y * unit) as i64;
            }
            // The block's result keeps ACC_BITS significant bits, truncated toward zero (a
            // sum that carried above the top loses its lowest bits); exact in f32.
            acc = (truncate_to_acc_bits(sum) as f64 / unit) as f32;
        }
        master += acc;
    }
    master
}

/// [`dot`] compiled for AVX2 (the exponent maxima vectorise).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: (&[f64], &[i32]), w: (&[f64], &[i32])) -> f32 {
    dot(a, w)
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
    let terms = e4m3_terms();
    let wd = Decoded::new(&terms, w);
    #[cfg(target_arch = "x86_64")]
    let avx2 = is_x86_feature_detected!("avx2");
    let rows = out.len() / n.max(1);
    out.par_chunks_mut(n.max(1))
        .with_min_len(crate::parallel::min_task_len(rows))
        .enumerate()
        .for_each(|(i, row)| {
            let ad = Decoded::new(&terms, &a[i * k..(i + 1) * k]);
            let ai = (&ad.values[..], &ad.log2[..]);
            for (j, o) in row.iter_mut().enumerate() {
                let wj = (&wd.values[j * k..(j + 1) * k], &wd.log2[j * k..(j + 1) * k]);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: dot_avx2 runs only where the CPU has AVX2 (checked above).
                let acc = if avx2 {
                    unsafe { dot_avx2(ai, wj) }
                } else {
                    dot(ai, wj)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let acc = dot(ai, wj);
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
    fn the_term_table_holds_each_codes_exponent() {
        let t = e4m3_terms();
        for code in 0..=255u8 {
            let v = f64::from(e4m3_decode(code));
            if v.is_nan() || v == 0.0 {
                continue;
            }
            // Subnormal e4m3 codes too: 2^-9 is -9, 3 · 2^-9 is -8.
            assert_eq!(
                t[usize::from(code)].1,
                v.abs().log2().floor() as i32,
                "code {code:#x}"
            );
        }
        assert_eq!(t[usize::from(e4m3_encode(0.001953125))].1, -9);
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

    /// GPU results written by `benches/tensor_core_fit.py --write-fixtures` from an H100's
    /// cuBLASLt fp8 GEMM (f32 output, promotion every 128 K elements, as our wgmma kernel).
    const GPU_FIXTURES: [(&str, &[u8]); 8] = [
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
