//! Round-to-nearest weights: one scale per output channel, by the reference numerics.

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
    let restored = numerics::dequantize_rows(&q);
    let (mut err, mut norm) = (0f64, 0f64);
    for (a, b) in w.iter().zip(&restored) {
        let d = f64::from(*a) - f64::from(*b);
        err += d * d;
        norm += f64::from(*a) * f64::from(*a);
    }
    let relative_error = if norm > 0.0 { (err / norm).sqrt() } else { 0.0 };
    QuantizedWeight {
        codes: q.codes,
        scales: q.scales,
        relative_error,
    }
}
