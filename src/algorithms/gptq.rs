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
    let mut codes = vec![0u8; n * k];
    if k > 0 {
        codes
            .par_chunks_mut(k)
            .zip(w.par_chunks(k))
            .for_each(|(c, row)| round_row(row, c, &u, &order, dtype));
    }
    let weight = QuantizedWeight::new(w, k, codes, rtn.scales.clone(), dtype);
    Ok(GptqWeight {
        output_error: output_error(w, k, &weight.codes, &weight.scales, dtype, &h),
        rtn_output_error: output_error(w, k, &rtn.codes, &rtn.scales, dtype, &h),
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
fn inverse_cholesky_upper(h: &[f64], k: usize, order: &[usize], damp: f64) -> Option<Vec<f64>> {
    let mut a: Vec<f64> = vec![0.0; k * k];
    for (i, &oi) in order.iter().enumerate() {
        for (j, &oj) in order.iter().enumerate() {
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
    // H = L Lᵀ; H⁻¹ = L⁻ᵀ L⁻¹; H⁻¹ = M Mᵀ (M lower); U = Mᵀ.
    let l = cholesky_lower(&a, k)?;
    let l_inv = lower_inverse(&l, k);
    // H⁻¹_ij = Σ_m L⁻¹_mi L⁻¹_mj over m ≥ max(i, j) (L⁻¹ is lower triangular), from the
    // columns of L⁻¹ laid out as rows so that the sums run over contiguous memory.
    let mut columns = vec![0.0; k * k];
    for m in 0..k {
        for i in 0..=m {
            columns[i * k + m] = l_inv[m * k + i];
        }
    }
    let mut inv = vec![0.0; k * k];
    inv.par_chunks_mut(k.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            let ci = &columns[i * k + i..(i + 1) * k];
            for (j, out) in row.iter_mut().enumerate().take(i + 1) {
                let cj = &columns[j * k + i..(j + 1) * k];
                *out = dot(ci, cj);
            }
        });
    for i in 0..k {
        for j in i + 1..k {
            inv[i * k + j] = inv[j * k + i];
        }
    }
    let m = cholesky_lower(&inv, k)?;
    let mut u = vec![0.0; k * k];
    for i in 0..k {
        for j in i..k {
            u[i * k + j] = m[j * k + i];
        }
    }
    Some(u)
}

/// The lower Cholesky factor of a symmetric `[k, k]` matrix, or `None` when it is not positive
/// definite.
fn cholesky_lower(a: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; k * k];
    for j in 0..k {
        let lj = &l[j * k..j * k + j];
        let d = a[j * k + j] - dot(lj, lj);
        if d.is_nan() || d <= 0.0 || d.is_infinite() {
            return None;
        }
        let d = d.sqrt();
        l[j * k + j] = d;
        // Column j below the diagonal: rows are independent.
        let (done, rest) = l.split_at_mut((j + 1) * k);
        let lj = &done[j * k..j * k + j];
        rest.par_chunks_mut(k).enumerate().for_each(|(r, row)| {
            let i = j + 1 + r;
            row[j] = (a[i * k + j] - dot(&row[..j], lj)) / d;
        });
    }
    Some(l)
}

/// The inverse of a lower-triangular `[k, k]` matrix with a positive diagonal, column by
/// column (forward substitution on the unit vectors, in parallel).
fn lower_inverse(l: &[f64], k: usize) -> Vec<f64> {
    let columns: Vec<Vec<f64>> = (0..k)
        .into_par_iter()
        .map(|c| {
            let mut x = vec![0.0; k];
            for i in c..k {
                let rhs = if i == c { 1.0 } else { 0.0 };
                let s = dot(&l[i * k + c..i * k + i], &x[c..i]);
                x[i] = (rhs - s) / l[i * k + i];
            }
            x
        })
        .collect();
    let mut inv = vec![0.0; k * k];
    for (c, x) in columns.iter().enumerate() {
        for i in c..k {
            inv[i * k + c] = x[i];
        }
    }
    inv
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

/// GPTQ's column sweep over one row: codes by the row's RTN multiplier, each rounding error
/// passed on to the later columns through U.
fn round_row(row: &[f32], codes: &mut [u8], u: &[f64], order: &[usize], dtype: QuantDtype) {
    let k = row.len();
    let (multiplier, scale) = numerics::row_multiplier(row, dtype);
    let mut work: Vec<f64> = order.iter().map(|&j| f64::from(row[j])).collect();
    for i in 0..k {
        // Untouched values are the row's own f32, so with nothing passed on (H diagonal) every
        // code is RTN's.
        let v = work[i] as f32;
        let code = numerics::encode(dtype, v * multiplier);
        codes[order[i]] = code;
        let rounded = f64::from(numerics::decode(dtype, code) * scale);
        let e = (work[i] - rounded) / u[i * k + i];
        if e != 0.0 {
            let ui = &u[i * k + i + 1..(i + 1) * k];
            work[i + 1..]
                .iter_mut()
                .zip(ui)
                .for_each(|(w, &uij)| *w -= e * uij);
        }
    }
}

/// `sqrt(Σ_r δ_rᵀ H δ_r / Σ_r w_rᵀ H w_r)`, δ_r = w_r − decode(codes_r) · scale_r; 0 for a zero
/// weight.
fn output_error(
    w: &[f32],
    k: usize,
    codes: &[u8],
    scales: &[f32],
    dtype: QuantDtype,
    h: &[f64],
) -> f64 {
    if k == 0 {
        return 0.0;
    }
    let quad = |v: &[f64]| -> f64 {
        (0..k)
            .map(|i| {
                let hi = &h[i * k..(i + 1) * k];
                v[i] * dot(hi, v)
            })
            .sum()
    };
    let per_row: Vec<(f64, f64)> = w
        .par_chunks(k)
        .zip(codes.par_chunks(k))
        .zip(scales.par_iter())
        .map(|((row, c), &s)| {
            let wr: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
            let d: Vec<f64> = row
                .iter()
                .zip(c)
                .map(|(&v, &code)| f64::from(v) - f64::from(numerics::decode(dtype, code) * s))
                .collect();
            (quad(&d), quad(&wr))
        })
        .collect();
    let (err, norm) = per_row
        .iter()
        .fold((0.0, 0.0), |(e, n), &(a, b)| (e + a, n + b));
    if norm > 0.0 {
        (err / norm).max(0.0).sqrt()
    } else {
        0.0
    }
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
    fn inverse_cholesky_factor_reconstructs_the_inverse() {
        let k = 12;
        let (gram, _) = correlated_gram(k, 50, 5);
        let h: Vec<f64> = gram.iter().map(|&v| f64::from(v) / 50.0).collect();
        let order: Vec<usize> = (0..k).collect();
        let u = inverse_cholesky_upper(&h, k, &order, 0.01).unwrap();
        // (Uᵀ U) · H_damped = I.
        let mean_diag = (0..k).map(|i| h[i * k + i]).sum::<f64>() / k as f64;
        for i in 0..k {
            for j in 0..k {
                let mut s = 0.0;
                for m in 0..k {
                    let inv_im: f64 = (0..k).map(|t| u[t * k + i] * u[t * k + m]).sum();
                    let hd = h[m * k + j] + if m == j { 0.01 * mean_diag } else { 0.0 };
                    s += inv_im * hd;
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 1e-8, "({i},{j}) {s}");
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
