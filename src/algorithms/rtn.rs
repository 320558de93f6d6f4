//! Round-to-nearest weights: one scale per output channel, by the reference numerics.

use rayon::prelude::*;

use crate::numerics::{self, QuantDtype};

/// A quantized weight with the figures the report records.
#[derive(Clone, Debug)]
pub struct QuantizedWeight {
    /// Row-major codes, one row per output channel.
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    /// ||W - dequant(Q(W))|| / ||W|| (0 for an all-zero weight).
    pub relative_error: f64,
}

/// Quantizes `w` ([n, k] row-major, k = everything after the output channel) per output channel.
pub fn quantize_weight(w: &[f32], n: usize, k: usize, dtype: QuantDtype) -> QuantizedWeight {
    let q = numerics::quantize_weight_per_channel(w, n, k, dtype);
    QuantizedWeight::new(w, k, q.codes, q.scales, dtype)
}

impl QuantizedWeight {
    /// The codes and scales of `w` (rows of `k`), with their relative error.
    pub fn new(w: &[f32], k: usize, codes: Vec<u8>, scales: Vec<f32>, dtype: QuantDtype) -> Self {
        // Squared error and squared norm per row, in parallel without a dequantized copy, then
        // summed in row order: the figure does not depend on the thread count.
        let decoded: Vec<f32> = (0..=255).map(|c| numerics::decode(dtype, c)).collect();
        let per_row: Vec<(f64, f64)> = if k == 0 {
            Vec::new()
        } else {
            w.par_chunks(k)
                .zip(codes.par_chunks(k))
                .zip(scales.par_iter())
                .map(|((row, codes), &scale)| squared_error(row, codes, scale, &decoded))
                .collect()
        };
        let (err, norm) = per_row
            .iter()
            .fold((0f64, 0f64), |(e, n), &(re, rn)| (e + re, n + rn));
        let relative_error = if norm > 0.0 { (err / norm).sqrt() } else { 0.0 };
        QuantizedWeight {
            codes,
            scales,
            relative_error,
        }
    }
}

/// `(Σ (w - decoded[c] * scale)², Σ w²)` over one row, in f64: element i is added to lane
/// i mod 8 and the lanes are summed in order (a fixed order, with additions that do not wait on
/// each other).
fn squared_error(row: &[f32], codes: &[u8], scale: f32, decoded: &[f32]) -> (f64, f64) {
    const LANES: usize = 8;
    let (mut err, mut norm) = ([0f64; LANES], [0f64; LANES]);
    let mut add = |lane: usize, a: f32, c: u8| {
        let a = f64::from(a);
        let d = a - f64::from(decoded[usize::from(c)] * scale);
        err[lane] += d * d;
        norm[lane] += a * a;
    };
    let (ws, cs) = (row.chunks_exact(LANES), codes.chunks_exact(LANES));
    let (w_tail, c_tail) = (ws.remainder(), cs.remainder());
    for (w, c) in ws.zip(cs) {
        for lane in 0..LANES {
            add(lane, w[lane], c[lane]);
        }
    }
    for (lane, (&a, &c)) in w_tail.iter().zip(c_tail).enumerate() {
        add(lane, a, c);
    }
    (err.iter().sum(), norm.iter().sum())
}
