//! The f32 products of a few rows (a decoding step): with a weight read where it lies, and
//! attention's two products over strided heads.
//!
//! gemm packs its right-hand side on every call. For a decoding step's one row that packing
//! (of the whole weight, the 51865-row output head included) cost several times the
//! arithmetic, on one thread. Here each output is a dot product with the weight's own row,
//! summed in one fixed order: 32 lanes, lane l accumulating the products of k ≡ l (mod 32) with
//! fused multiply-adds in ascending k (past K, zeros), then lanes l, l + 8, l + 16, l + 24 added
//! as (l + (l + 8)) + ((l + 16) + (l + 24)), then those eight as
//! ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). The AVX2/FMA path and the portable path perform
//! the same roundings, so the bits are the same on every machine. Outputs are computed in
//! parallel; each output's sum does not depend on how they are split.

use rayon::prelude::*;

/// The most rows a product runs here; more go to gemm (whose packing then pays off). A row's
/// result therefore depends on whether its product had at most this many rows.
pub(crate) const MAX_ROWS: usize = 4;

/// Lanes of the fixed summation order.
const LANES: usize = 32;

/// Products (rows · K · outputs) below which one thread is faster than splitting the outputs.
const PARALLEL_WORK: usize = 1 << 19;

/// `x` `[rows, k]` times `w` `[n, k]` transposed: `[rows, n]`, row-major.
pub(crate) fn product(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(w.len(), n * k);
    // Column-major while computing, so that each task writes one contiguous run.
    let mut by_output = vec![0f32; n * rows];
    let fill = |(j, out): (usize, &mut [f32])| {
        let wj = &w[j * k..(j + 1) * k];
        for (r, o) in out.iter_mut().enumerate() {
            *o = dot(&x[r * k..(r + 1) * k], wj);
        }
    };
    if rows * k * n >= PARALLEL_WORK && crate::parallel::inner_parallelism() {
        by_output
            .par_chunks_mut(rows)
            .with_min_len(64)
            .enumerate()
            .for_each(fill);
    } else {
        by_output.chunks_mut(rows).enumerate().for_each(fill);
    }
    let mut y = vec![0f32; rows * n];
    for (j, col) in by_output.chunks(rows).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * n + j] = *v;
        }
    }
    y
}

/// The dot product in the module's fixed order.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

fn reduce(lanes: [f32; 8]) -> f32 {
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (ca, cb) in a.chunks(LANES).zip(b.chunks(LANES)) {
        for (l, (x, y)) in ca.iter().zip(cb).enumerate() {
            acc[l] = x.mul_add(*y, acc[l]);
        }
    }
    let mut eight = [0f32; 8];
    for (l, e) in eight.iter_mut().enumerate() {
        *e = (acc[l] + acc[l + 8]) + (acc[l + 16] + acc[l + 24]);
    }
    reduce(eight)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let k = a.len().min(b.len());
    let whole = k / LANES * LANES;
    let mut acc = [_mm256_setzero_ps(); 4];
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    while i < whole {
        for (q, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8q + 8 <= whole <= k, within both slices.
            let (va, vb) = unsafe {
                (
                    _mm256_loadu_ps(pa.add(i + 8 * q)),
                    _mm256_loadu_ps(pb.add(i + 8 * q)),
                )
            };
            *acc = _mm256_fmadd_ps(va, vb, *acc);
        }
        i += LANES;
    }
    if whole < k {
        // The ragged end, zero-padded (a zero product leaves a lane's sum as it is).
        let (mut ta, mut tb) = ([0f32; LANES], [0f32; LANES]);
        ta[..k - whole].copy_from_slice(&a[whole..k]);
        tb[..k - whole].copy_from_slice(&b[whole..k]);
        for (q, acc) in acc.iter_mut().enumerate() {
            // SAFETY: 8q + 8 <= LANES, within the padded arrays.
            let (va, vb) = unsafe {
                (
                    _mm256_loadu_ps(ta.as_ptr().add(8 * q)),
                    _mm256_loadu_ps(tb.as_ptr().add(8 * q)),
                )
            };
            *acc = _mm256_fmadd_ps(va, vb, *acc);
        }
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut eight = [0f32; 8];
    // SAFETY: `eight` holds 8 floats.
    unsafe { _mm256_storeu_ps(eight.as_mut_ptr(), s) };
    reduce(eight)
}

/// `out[c] = Σ_j p[j] · v[j · stride + c]` for `c < out.len()`: a few rows' weighted sum of
/// strided rows (attention's probabilities times its values), each output one chain of fused
/// multiply-adds in ascending j. Both paths perform the same roundings.
pub(crate) fn weighted_rows(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    let width = out.len();
    debug_assert!(p.is_empty() || v.len() >= (p.len() - 1) * stride + width);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { weighted_rows_avx2(p, v, stride, out) };
    }
    weighted_rows_portable(p, v, stride, 0, width, out);
}

/// Columns `from..to` of [`weighted_rows`], one scalar chain each.
fn weighted_rows_portable(
    p: &[f32],
    v: &[f32],
    stride: usize,
    from: usize,
    to: usize,
    out: &mut [f32],
) {
    for (c, o) in out.iter_mut().enumerate().take(to).skip(from) {
        let mut acc = 0f32;
        for (j, pj) in p.iter().enumerate() {
            acc = pj.mul_add(v[j * stride + c], acc);
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_rows_avx2(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const BLOCKS: usize = 8;
    let width = out.len();
    let vector = width / 8 * 8;
    let mut c0 = 0;
    while c0 < vector {
        let blocks = ((vector - c0) / 8).min(BLOCKS);
        let mut acc = [_mm256_setzero_ps(); BLOCKS];
        for (j, pj) in p.iter().enumerate() {
            let pj = _mm256_set1_ps(*pj);
            let row = &v[j * stride + c0..j * stride + c0 + 8 * blocks];
            for (b, acc) in acc.iter_mut().enumerate().take(blocks) {
                // SAFETY: 8b + 8 <= row.len().
                let x = unsafe { _mm256_loadu_ps(row.as_ptr().add(8 * b)) };
                *acc = _mm256_fmadd_ps(pj, x, *acc);
            }
        }
        for (b, acc) in acc.iter().enumerate().take(blocks) {
            // SAFETY: c0 + 8b + 8 <= vector <= out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c0 + 8 * b), *acc) };
        }
        c0 += 8 * blocks;
    }
    weighted_rows_portable(p, v, stride, vector, width, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::exec::tests::values;

    /// Both paths give the same bits, at every depth around the lane count and with ragged ends.
    #[test]
    fn the_vector_and_portable_paths_agree_bit_for_bit() {
        for k in [1, 7, 8, 31, 32, 33, 100, 384, 1536, 1537] {
            let (a, b) = (values(k, 3), values(k, 4));
            let portable = dot_portable(&a, &b);
            assert_eq!(dot(&a, &b).to_bits(), portable.to_bits(), "k {k}");
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            assert!(
                (f64::from(portable) - exact).abs() < 1e-5 * (k as f64).sqrt(),
                "k {k}"
            );
        }
    }

    /// The weighted sum of strided rows: both paths bit for bit, ragged widths, against f64.
    #[test]
    fn weighted_rows_agree_with_the_portable_path_and_f64() {
        for (rows, width, stride) in [(1, 64, 384), (1500, 64, 384), (7, 13, 20), (3, 80, 80)] {
            let (p, v) = (values(rows, 7), values(rows * stride, 8));
            let mut fast = vec![f32::NAN; width];
            let mut portable = vec![f32::NAN; width];
            weighted_rows(&p, &v, stride, &mut fast);
            weighted_rows_portable(&p, &v, stride, 0, width, &mut portable);
            for c in 0..width {
                assert_eq!(
                    fast[c].to_bits(),
                    portable[c].to_bits(),
                    "{rows} {width} {c}"
                );
                let exact: f64 = (0..rows)
                    .map(|j| f64::from(p[j]) * f64::from(v[j * stride + c]))
                    .sum();
                assert!(
                    (f64::from(fast[c]) - exact).abs() < 1e-3,
                    "{rows} {width} {c}"
                );
            }
        }
    }

    /// Every output of every row, serial and parallel, against an f64 sum.
    #[test]
    fn product_computes_every_row_and_output() {
        for (rows, k, n) in [(1, 384, 3), (3, 40, 17), (4, 1536, 700), (2, 384, 2000)] {
            let (x, w) = (values(rows * k, 5), values(n * k, 6));
            let y = product(&x, rows, k, &w, n);
            for r in 0..rows {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|c| f64::from(x[r * k + c]) * f64::from(w[j * k + c]))
                        .sum();
                    let got = y[r * n + j];
                    assert!((f64::from(got) - exact).abs() < 1e-4, "({r}, {j})");
                    assert_eq!(
                        got.to_bits(),
                        dot(&x[r * k..][..k], &w[j * k..][..k]).to_bits()
                    );
                }
            }
        }
    }
}
