//! GPTQ weight rounding: the per-output-channel codes of [`rtn`](super::rtn) (same scales, same
//! encode), but chosen column by column so that each column's rounding error is compensated by
//! the columns not yet quantized, weighted by the calibration inputs' second moments
//! H = E[x xᵀ] (Frantar et al., 2022). RTN minimises ‖W − Ŵ‖ element by element; GPTQ minimises
//! the layer's output error E‖(W − Ŵ) x‖² on inputs like the calibration's.
//!
//! Rows are independent given H: row r's error feedback only touches row r. So each row runs the
//! whole column sweep on its own (in parallel), with the upper Cholesky factor U of H⁻¹ shared:
//! after column i is rounded, `e = (w_i − ŵ_i) / U_ii` and `w_j −= e · U_ij` for every later
//! column j. The per-row scale is RTN's (`amax / Q` of the unmodified row); a compensated value
//! beyond it saturates as the encode does.

use rayon::prelude::*;

use super::rtn::QuantizedWeight;
use crate::error::{Error, Result};
use crate::models::exec::chunked_gemm;
use crate::numerics::{self, QuantDtype};

/// The default dampening: `damp · mean(diag H)` is added to H's diagonal.
pub const DEFAULT_DAMP: f64 = 0.01;

/// The options of the `gptq` algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptqOptions {
    /// Relative dampening of H's diagonal, in (0, 1].
    pub damp: f64,
    /// Quantize columns in the order of decreasing H_jj (the most active input channels first,
    /// while the most columns are left to absorb their error).
    pub act_order: bool,
}

impl Default for GptqOptions {
    fn default() -> Self {
        GptqOptions {
            damp: DEFAULT_DAMP,
            act_order: true,
        }
    }
}

/// A GPTQ-rounded weight, with the output error on the calibration inputs of it and of RTN.
#[derive(Clone, Debug)]
pub struct GptqWeight {
    pub weight: QuantizedWeight,
    /// `sqrt(Σ_r δ_rᵀ H δ_r / Σ_r w_rᵀ H w_r)` with δ the rounding error of GPTQ's codes: the
    /// relative L2 error of the layer's output on the calibration inputs (H undamped).
    pub output_error: f64,
    /// The same figure for RTN's codes.
    pub rtn_output_error: f64,
}

/// Quantizes `w` (`[n, k]` row-major) per output channel with GPTQ, given `gram` = Σ x xᵀ
/// (`[k, k]`, row-major, symmetric) over `rows` calibration inputs of the layer. `layer` names
/// the layer in errors.
#[allow(clippy::too_many_arguments)] // the weight, its shape, and its inputs' moments, by name
pub fn quantize_weight(
    layer: &str,
    w: &[f32],
    n: usize,
    k: usize,
    dtype: QuantDtype,
    gram: &[f32],
    rows: usize,
    options: GptqOptions,
) -> Result<GptqWeight> {
    let refuse = |reason: String| Error::LayerRefused {
        layer: layer.to_string(),
        reason,
    };
    if w.len() != n * k || gram.len() != k * k {
        return Err(refuse(format!(
            "GPTQ needs a [{n}, {k}] weight and a [{k}, {k}] input covariance; found {} and {} \
             values",
            w.len(),
            gram.len()
        )));
    }
    if rows == 0 {
        return Err(refuse(
            "GPTQ: calibration never ran this layer, so its input covariance is unknown".into(),
        ));
    }
    let h: Vec<f64> = gram.iter().map(|&g| f64::from(g) / rows as f64).collect();
    let order = column_order(&h, k, options.act_order);
    let u = inverse_cholesky_upper(&h, k, &order, options.damp).ok_or_else(|| {
        refuse(format!(
            "GPTQ: the input covariance is not positive definite after dampening {}; raise \
             gptq.damp",
            options.damp
        ))
    })?;

    let rtn = numerics::quantize_weight_per_channel(w, n, k, dtype);
    let codes = sweep(w, n, k, &u, &order, dtype);
    let weight = QuantizedWeight::new(w, k, codes, rtn.scales.clone(), dtype);
    let errors = OutputError::new(w, k, &h);
    Ok(GptqWeight {
        output_error: errors.of(&weight.codes, &weight.scales, dtype),
        rtn_output_error: errors.of(&rtn.codes, &rtn.scales, dtype),
        weight,
    })
}

/// The order columns are quantized in: by decreasing H_jj (ties by index), or as stored.
fn column_order(h: &[f64], k: usize, act_order: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..k).collect();
    if act_order {
        order.sort_by(|&a, &b| h[b * k + b].total_cmp(&h[a * k + a]).then(a.cmp(&b)));
    }
    order
}

/// The upper Cholesky factor U (row-major `[k, k]`, H⁻¹ = Uᵀ U) of the inverse of H permuted
/// into `order`, after dampening. A channel calibration never saw (H_jj = 0) gets H_jj = 1: it
/// has no error to pass on and takes none. `None` when H is not positive definite.
///
/// With P the reversal of the indices, the lower Cholesky factor of P H P gives H = R Rᵀ with
/// R = P L P upper triangular, so H⁻¹ = R⁻ᵀ R⁻¹ and U = R⁻¹ = P L⁻¹ P: one factorisation and one
/// triangular inverse, both blocked so that their work is matrix products.
fn inverse_cholesky_upper(h: &[f64], k: usize, order: &[usize], damp: f64) -> Option<Vec<f64>> {
    // P H P in the quantization order: row i of `a` is channel order[k - 1 - i].
    let mut a: Vec<f64> = vec![0.0; k * k];
    for (i, &oi) in order.iter().rev().enumerate() {
        for (j, &oj) in order.iter().rev().enumerate() {
            a[i * k + j] = h[oi * k + oj];
        }
    }
    for i in 0..k {
        if a[i * k + i] == 0.0 {
            a[i * k + i] = 1.0;
        }
    }
    let mean_diag = (0..k).map(|i| a[i * k + i]).sum::<f64>() / k.max(1) as f64;
    for i in 0..k {
        a[i * k + i] += damp * mean_diag;
    }
    cholesky_lower(&mut a, k)?;
    let l_inv = lower_inverse(&a, k);
    let mut u = vec![0.0; k * k];
    for i in 0..k {
        for j in i..k {
            u[i * k + j] = l_inv[(k - 1 - i) * k + (k - 1 - j)];
        }
    }
    Some(u)
}

/// The columns one diagonal block of the blocked factorisations and of the column sweep spans.
/// At most [`F64_DEPTH`], so the products over a block sum in one fixed order.
const BLOCK: usize = 128;

/// The deepest K one f64 product sums over: the gemm crate blocks a deeper K by the CPU's L1
/// cache, which would change the order of the sum (and so the last bits, and rarely a code) from
/// one machine to another; up to this depth it sums in one block everywhere.
const F64_DEPTH: usize = 128;

/// `dst[m, n] += beta · lhs[m, depth] · rhs[depth, n]` on row-major strided f64 views (row
/// stride, column stride), K in chunks of [`F64_DEPTH`] added in order, in parallel over the
/// output.
///
/// # Safety
/// The views must lie inside their buffers, and `dst` must not overlap `lhs` or `rhs`.
unsafe fn gemm_f64(
    (m, n, depth): (usize, usize, usize),
    dst: *mut f64,
    dst_rs: usize,
    lhs: (*const f64, usize, usize),
    rhs: (*const f64, usize, usize),
    beta: f64,
) {
    if m == 0 || n == 0 {
        return;
    }
    chunked_gemm(
        (m, n, depth),
        F64_DEPTH,
        dst,
        dst_rs,
        lhs,
        rhs,
        true,
        beta,
        gemm::Parallelism::Rayon(0),
    );
}

/// Factors a symmetric `[k, k]` matrix in place into its lower Cholesky factor (the strict
/// upper triangle is zeroed), block column by block column: the diagonal block, the panel below
/// it row by row in parallel, then the trailing matrix less the panel's product. `None` when it
/// is not positive definite.
fn cholesky_lower(a: &mut [f64], k: usize) -> Option<()> {
    for j0 in (0..k).step_by(BLOCK) {
        let j1 = (j0 + BLOCK).min(k);
        // The diagonal block (every earlier block column is already subtracted from it).
        for j in j0..j1 {
            let lj = &a[j * k + j0..j * k + j];
            let d = a[j * k + j] - dot(lj, lj);
            if d.is_nan() || d <= 0.0 || d.is_infinite() {
                return None;
            }
            a[j * k + j] = d.sqrt();
            for i in j + 1..j1 {
                let s = dot(&a[i * k + j0..i * k + j], &a[j * k + j0..j * k + j]);
                a[i * k + j] = (a[i * k + j] - s) / a[j * k + j];
            }
        }
        // The panel below it: row i solves x · L11ᵀ = a_i over the block's columns.
        let (done, rest) = a.split_at_mut(j1 * k);
        let diag = &done[j0 * k..];
        rest.par_chunks_mut(k).for_each(|row| {
            for c in j0..j1 {
                let s = dot(&row[j0..c], &diag[(c - j0) * k + j0..(c - j0) * k + c]);
                row[c] = (row[c] - s) / diag[(c - j0) * k + c];
            }
        });
        // The trailing matrix less L21 L21ᵀ.
        let m = k - j1;
        let base = a.as_mut_ptr();
        // SAFETY: L21 is rows j1.., columns j0..j1 and the destination rows j1.., columns
        // j1..: disjoint parts of the [k, k] buffer.
        unsafe {
            gemm_f64(
                (m, m, j1 - j0),
                base.add(j1 * k + j1),
                k,
                (base.add(j1 * k + j0), k, 1),
                (base.add(j1 * k + j0), 1, k),
                -1.0,
            );
        }
    }
    for i in 0..k {
        a[i * k + i + 1..(i + 1) * k].fill(0.0);
    }
    Some(())
}

/// The inverse X of a lower-triangular `[k, k]` matrix L with a positive diagonal, block row by
/// block row: L_bb X_b = [I]_b − L_b,<b X_<b, the product over the rows already solved.
fn lower_inverse(l: &[f64], k: usize) -> Vec<f64> {
    let mut x = vec![0.0; k * k];
    for r0 in (0..k).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(k);
        let (solved, block) = x.split_at_mut(r0 * k);
        // SAFETY: the destination is rows r0..r1 of X, columns 0..r0; the product reads rows
        // r0..r1 of L (another buffer) and rows 0..r0 of X (`solved`, before the destination).
        unsafe {
            gemm_f64(
                (r1 - r0, r0, r0),
                block.as_mut_ptr(),
                k,
                (l.as_ptr().add(r0 * k), k, 1),
                (solved.as_ptr(), k, 1),
                -1.0,
            );
        }
        // Forward substitution through L_bb, row by row over the block's first r1 columns.
        for r in r0..r1 {
            let (above, row) = block.split_at_mut((r - r0) * k);
            let row = &mut row[..r1];
            row[r] += 1.0;
            for m in r0..r {
                let lrm = l[r * k + m];
                let xm = &above[(m - r0) * k..(m - r0) * k + r1];
                row.iter_mut().zip(xm).for_each(|(v, &xv)| *v -= lrm * xv);
            }
            let d = l[r * k + r];
            row.iter_mut().for_each(|v| *v /= d);
        }
    }
    x
}

/// Σ a_i b_i over four lanes (i mod 4) summed in order: a fixed order the compiler can
/// vectorize.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut lanes = [0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    for (lane, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        lanes[lane] += x * y;
    }
    for (x, y) in ca.zip(cb) {
        for lane in 0..4 {
            lanes[lane] += x[lane] * y[lane];
        }
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// GPTQ's column sweep over every row, [`BLOCK`] columns at a time: codes by each row's RTN
/// multiplier, each rounding error passed on to the row's later columns through U. Within a
/// block a row rounds its columns in turn and passes each error on to the block's later columns;
/// the block's errors then reach every column after it in one product, E · U[block, after].
/// Rows are independent, so they run in parallel.
fn sweep(w: &[f32], n: usize, k: usize, u: &[f64], order: &[usize], dtype: QuantDtype) -> Vec<u8> {
    let mut codes = vec![0u8; n * k];
    if k == 0 {
        return codes;
    }
    // Untouched values are the row's own f32, so with nothing passed on (H diagonal) every
    // code is RTN's.
    let mut work: Vec<f64> = w
        .chunks(k)
        .flat_map(|row| order.iter().map(|&j| f64::from(row[j])))
        .collect();
    let rows: Vec<(f32, f32)> = w
        .chunks(k)
        .map(|row| numerics::row_multiplier(row, dtype))
        .collect();
    let mut errors = vec![0f64; n * BLOCK];
    for b0 in (0..k).step_by(BLOCK) {
        let b1 = (b0 + BLOCK).min(k);
        work.par_chunks_mut(k)
            .zip(codes.par_chunks_mut(k))
            .zip(errors.par_chunks_mut(BLOCK))
            .zip(rows.par_iter())
            .for_each(|(((row, c), e), &(multiplier, scale))| {
                for i in b0..b1 {
                    let code = numerics::encode(dtype, row[i] as f32 * multiplier);
                    c[order[i]] = code;
                    let rounded = f64::from(numerics::decode(dtype, code) * scale);
                    let ei = (row[i] - rounded) / u[i * k + i];
                    e[i - b0] = ei;
                    if ei != 0.0 {
                        let ui = &u[i * k + i + 1..i * k + b1];
                        row[i + 1..b1]
                            .iter_mut()
                            .zip(ui)
                            .for_each(|(v, &uij)| *v -= ei * uij);
                    }
                }
            });
        // SAFETY: the destination is columns b1.. of `work` ([n, k]); the product reads
        // `errors` ([n, BLOCK], its first b1 − b0 columns) and rows b0..b1, columns b1.. of U.
        unsafe {
            gemm_f64(
                (n, k - b1, b1 - b0),
                work.as_mut_ptr().add(b1),
                k,
                (errors.as_ptr(), BLOCK, 1),
                (u.as_ptr().add(b0 * k + b1), k, 1),
                -1.0,
            );
        }
    }
    codes
}

/// The relative output error `sqrt(Σ_r δ_rᵀ H δ_r / Σ_r w_rᵀ H w_r)` of a weight's codes, δ_r =
/// w_r − decode(codes_r) · scale_r; 0 for a zero weight. The denominator is computed once for
/// the weight and shared by every set of codes scored against it.
struct OutputError<'a> {
    w: &'a [f32],
    k: usize,
    h: &'a [f64],
    norm: f64,
}

impl<'a> OutputError<'a> {
    fn new(w: &'a [f32], k: usize, h: &'a [f64]) -> Self {
        let wide: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        OutputError {
            w,
            k,
            h,
            norm: quadratic_sum(&wide, k, h),
        }
    }

    fn of(&self, codes: &[u8], scales: &[f32], dtype: QuantDtype) -> f64 {
        if self.k == 0 || self.norm <= 0.0 {
            return 0.0;
        }
        let delta: Vec<f64> = self
            .w
            .chunks(self.k)
            .zip(codes.chunks(self.k))
            .zip(scales)
            .flat_map(|((row, c), &s)| {
                row.iter().zip(c).map(move |(&v, &code)| {
                    f64::from(v) - f64::from(numerics::decode(dtype, code) * s)
                })
            })
            .collect();
        (quadratic_sum(&delta, self.k, self.h) / self.norm)
            .max(0.0)
            .sqrt()
    }
}

/// Σ_r v_rᵀ H v_r over the rows of `v` (`[n, k]`), by products of [`BLOCK`] rows at a time.
fn quadratic_sum(v: &[f64], k: usize, h: &[f64]) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let mut product = vec![0f64; BLOCK * k];
    v.chunks(BLOCK * k)
        .map(|rows| {
            let m = rows.len() / k;
            let out = &mut product[..m * k];
            out.fill(0.0);
            // SAFETY: `rows` is [m, k], H [k, k] and `out` [m, k], a buffer of its own.
            unsafe {
                gemm_f64(
                    (m, k, k),
                    out.as_mut_ptr(),
                    k,
                    (rows.as_ptr(), k, 1),
                    (h.as_ptr(), k, 1),
                    1.0,
                );
            }
            dot(rows, out)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream in [-1, 1).
    fn stream(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Σ x xᵀ of `rows` inputs with strongly correlated channels (a few shared factors plus
    /// noise), as a layer's inputs are.
    fn correlated_gram(k: usize, rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut r = stream(seed);
        let factors = 4;
        let mix: Vec<f32> = (0..factors * k).map(|_| r()).collect();
        let mut xs = vec![0f32; rows * k];
        for row in xs.chunks_mut(k) {
            let f: Vec<f32> = (0..factors).map(|_| r() * 3.0).collect();
            for (j, x) in row.iter_mut().enumerate() {
                *x = (0..factors).map(|m| f[m] * mix[m * k + j]).sum::<f32>() + 0.1 * r();
            }
        }
        let mut g = vec![0f32; k * k];
        for row in xs.chunks(k) {
            for i in 0..k {
                for j in 0..k {
                    g[i * k + j] += row[i] * row[j];
                }
            }
        }
        (g, xs)
    }

    #[test]
    fn with_uncorrelated_inputs_every_code_is_rtns() {
        // H diagonal: nothing is passed on, so GPTQ must give RTN's codes and scales exactly.
        let (n, k) = (6, 40);
        let mut r = stream(7);
        let w: Vec<f32> = (0..n * k).map(|_| r() * 0.2).collect();
        let mut gram = vec![0f32; k * k];
        for i in 0..k {
            gram[i * k + i] = 1.0 + i as f32;
        }
        gram[3 * k + 3] = 0.0; // a channel calibration never saw
        for dtype in QuantDtype::ALL {
            for act_order in [false, true] {
                let opts = GptqOptions {
                    damp: 0.01,
                    act_order,
                };
                let g = quantize_weight("l", &w, n, k, dtype, &gram, 10, opts).unwrap();
                let rtn = numerics::quantize_weight_per_channel(&w, n, k, dtype);
                assert_eq!(g.weight.codes, rtn.codes, "{dtype} act_order {act_order}");
                assert_eq!(g.weight.scales, rtn.scales);
                assert_eq!(g.output_error, g.rtn_output_error);
            }
        }
    }

    #[test]
    fn correlated_inputs_lower_the_output_error_below_rtn() {
        let (n, k, rows) = (16, 64, 400);
        let (gram, xs) = correlated_gram(k, rows, 11);
        let mut r = stream(3);
        let w: Vec<f32> = (0..n * k).map(|_| r() * 0.5).collect();
        for dtype in QuantDtype::ALL {
            let g =
                quantize_weight("l", &w, n, k, dtype, &gram, rows, GptqOptions::default()).unwrap();
            assert!(
                g.output_error < 0.8 * g.rtn_output_error,
                "{dtype}: gptq {} rtn {}",
                g.output_error,
                g.rtn_output_error
            );
            // The figure is the output error on the inputs themselves.
            let deq: Vec<f32> = g
                .weight
                .codes
                .chunks(k)
                .zip(&g.weight.scales)
                .flat_map(|(c, &s)| c.iter().map(move |&c| numerics::decode(dtype, c) * s))
                .collect();
            let (mut err, mut norm) = (0f64, 0f64);
            for x in xs.chunks(k) {
                for r in 0..n {
                    let y: f64 = (0..k).map(|j| f64::from(w[r * k + j] * x[j])).sum();
                    let yq: f64 = (0..k).map(|j| f64::from(deq[r * k + j] * x[j])).sum();
                    err += (y - yq).powi(2);
                    norm += y * y;
                }
            }
            let direct = (err / norm).sqrt();
            assert!(
                (direct - g.output_error).abs() < 1e-3 * direct,
                "{direct} {}",
                g.output_error
            );
        }
    }

    #[test]
    fn the_blocked_sweep_gives_the_column_by_column_codes() {
        // 300 columns: the block products carry errors across two block boundaries.
        let (n, k, rows) = (9, 300, 400);
        let (gram, _) = correlated_gram(k, rows, 13);
        let h: Vec<f64> = gram.iter().map(|&v| f64::from(v) / rows as f64).collect();
        let order = column_order(&h, k, true);
        let u = inverse_cholesky_upper(&h, k, &order, 0.01).unwrap();
        let mut r = stream(17);
        let w: Vec<f32> = (0..n * k).map(|_| r() * 0.5).collect();
        for dtype in QuantDtype::ALL {
            let blocked = sweep(&w, n, k, &u, &order, dtype);
            // The sweep as the paper states it: every error passed on to every later column
            // at once.
            let mut flipped = 0;
            for (row, got) in w.chunks(k).zip(blocked.chunks(k)) {
                let (multiplier, scale) = numerics::row_multiplier(row, dtype);
                let mut work: Vec<f64> = order.iter().map(|&j| f64::from(row[j])).collect();
                for i in 0..k {
                    let code = numerics::encode(dtype, work[i] as f32 * multiplier);
                    flipped += usize::from(code != got[order[i]]);
                    let rounded = f64::from(numerics::decode(dtype, code) * scale);
                    let e = (work[i] - rounded) / u[i * k + i];
                    for j in i + 1..k {
                        work[j] -= e * u[i * k + j];
                    }
                }
            }
            assert_eq!(flipped, 0, "{dtype}");
        }
    }

    #[test]
    fn inverse_cholesky_factor_reconstructs_the_inverse() {
        // 12 columns: one block; 300: two whole blocks and a partial one, in a shuffled order.
        for k in [12, 300] {
            let rows = k + 40;
            let (gram, _) = correlated_gram(k, rows, 5);
            let h: Vec<f64> = gram.iter().map(|&v| f64::from(v) / rows as f64).collect();
            let order: Vec<usize> = (0..k).map(|i| (i * 7) % k).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert!(
                sorted.iter().enumerate().all(|(i, &v)| i == v),
                "a permutation"
            );
            let u = inverse_cholesky_upper(&h, k, &order, 0.01).unwrap();
            for i in 0..k {
                assert!(u[i * k + i] > 0.0);
                assert!((0..i).all(|j| u[i * k + j] == 0.0), "U is upper triangular");
            }
            // (Uᵀ U) · H_damped = I, with H permuted into `order`.
            let mean_diag = (0..k).map(|i| h[i * k + i]).sum::<f64>() / k as f64;
            let mut inv = vec![0.0; k * k];
            for t in 0..k {
                for i in t..k {
                    for m in t..k {
                        inv[i * k + m] += u[t * k + i] * u[t * k + m];
                    }
                }
            }
            for i in 0..k {
                for j in 0..k {
                    let s: f64 = (0..k)
                        .map(|m| {
                            let hd = h[order[m] * k + order[j]]
                                + if m == j { 0.01 * mean_diag } else { 0.0 };
                            inv[i * k + m] * hd
                        })
                        .sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((s - want).abs() < 1e-8, "k {k} ({i},{j}) {s}");
                }
            }
        }
    }

    #[test]
    fn a_layer_calibration_never_ran_is_refused_by_name() {
        let e = quantize_weight(
            "encoder.layers.0.fc1",
            &[0.0; 4],
            2,
            2,
            QuantDtype::Int8,
            &[0.0; 4],
            0,
            GptqOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("encoder.layers.0.fc1"), "{e}");
    }
}
