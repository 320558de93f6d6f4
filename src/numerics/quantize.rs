//! Activation and weight quantization: the per-token (dynamic), static and per-channel rules.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::e4m3::{e4m3_decode, e4m3_encode};
use super::rounding::{out_bits_to_f32, round_half_even, round_to_out, OutDtype};

/// The 8-bit dtype of quantized weights and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum QuantDtype {
    #[serde(rename = "int8")]
    Int8,
    #[serde(rename = "float8_e4m3fn")]
    Float8E4m3fn,
}

impl QuantDtype {
    /// Both dtypes, in a fixed order.
    pub const ALL: [QuantDtype; 2] = [QuantDtype::Int8, QuantDtype::Float8E4m3fn];

    /// Q, the largest code magnitude: 127 for int8 (symmetric, -128 unused), 448 for e4m3.
    pub fn qmax(self) -> f32 {
        match self {
            QuantDtype::Int8 => 127.0,
            QuantDtype::Float8E4m3fn => 448.0,
        }
    }

    /// The serialized name: `"int8"` or `"float8_e4m3fn"`.
    pub fn name(self) -> &'static str {
        match self {
            QuantDtype::Int8 => "int8",
            QuantDtype::Float8E4m3fn => "float8_e4m3fn",
        }
    }

    /// The dtype with this serialized name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl std::fmt::Display for QuantDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Lower bound of a row's absolute maximum, so an all-zero row gets a finite, nonzero scale.
pub const AMAX_FLOOR: f32 = 1e-8;

/// Encode an already scaled value.
///
/// int8: `clamp(round_half_even(v), -127, 127)` as a two's-complement byte; NaN gives 0.
/// e4m3: [`e4m3_encode`], whose saturation at 448 is the clamp to ±Q; NaN gives 0.
#[inline]
pub fn encode(dtype: QuantDtype, v: f32) -> u8 {
    match dtype {
        QuantDtype::Int8 => encode_int8(v),
        QuantDtype::Float8E4m3fn => e4m3_encode(v),
    }
}

/// [`encode`] for int8: NaN gives 0 (`clamp` keeps NaN, and the float-to-int cast maps it to 0).
#[inline]
fn encode_int8(v: f32) -> u8 {
    round_half_even(v).clamp(-127.0, 127.0) as i32 as i8 as u8
}

/// Decode one code to f32 (exact). int8 `0x80` decodes to -128 although it is never written.
#[inline]
pub fn decode(dtype: QuantDtype, code: u8) -> f32 {
    match dtype {
        QuantDtype::Int8 => f32::from(code as i8),
        QuantDtype::Float8E4m3fn => e4m3_decode(code),
    }
}

/// Quantized rows: `codes` is row-major `[rows, cols]` (int8 stored as two's-complement bytes,
/// fp8 as e4m3 codes), `scales` has one f32 per row.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    pub dtype: QuantDtype,
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

impl QuantizedRows {
    /// The codes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.codes[r * self.cols..(r + 1) * self.cols]
    }
}

/// Rows per rayon task: small rows are not worth a task each.
const MIN_ELEMS_PER_TASK: usize = 16 * 1024;

/// Inside one of several utterances that run one per thread, all `rows` in one task
/// (`parallel::one_utterance`).
fn min_rows_per_task(rows: usize, cols: usize) -> usize {
    crate::parallel::min_task_len(rows).max(MIN_ELEMS_PER_TASK / cols.max(1))
}

fn check_matrix(what: &str, len: usize, rows: usize, cols: usize) {
    assert_eq!(
        Some(len),
        rows.checked_mul(cols),
        "{what} has {len} elements, expected rows * cols = {rows} * {cols}"
    );
}

fn check_smoother(smooth_inv: Option<&[f32]>, cols: usize) {
    if let Some(s) = smooth_inv {
        assert_eq!(
            s.len(),
            cols,
            "smooth_inv has {} entries, expected one per column ({cols})",
            s.len()
        );
    }
}

/// Quantize one row in place by the per-token rule; returns the row's scale.
fn quantize_row(x: &[f32], smooth_inv: Option<&[f32]>, dtype: QuantDtype, codes: &mut [u8]) -> f32 {
    // x'_j = x_j * smooth_inv_j, recomputed in both passes (identical values, no scratch row).
    // max is exact and order independent, so any reduction tree (the GPU's) gives this value.
    // f32::max ignores NaN, like CUDA's fmaxf.
    let amax = match smooth_inv {
        None => abs_max(x),
        Some(s) => x
            .iter()
            .zip(s)
            .fold(AMAX_FLOOR, |m, (&v, &s)| m.max((v * s).abs())),
    };
    let q = dtype.qmax();
    let mult = q / amax;
    // `encode(dtype, x'_j * mult)` per element, with the dtype and the smoother chosen once per
    // row so that the loops vectorize.
    fn encode_all(
        codes: &mut [u8],
        x: &[f32],
        s: Option<&[f32]>,
        mult: f32,
        e: impl Fn(f32) -> u8,
    ) {
        match s {
            None => codes.iter_mut().zip(x).for_each(|(c, &v)| *c = e(v * mult)),
            Some(s) => codes
                .iter_mut()
                .zip(x.iter().zip(s))
                .for_each(|(c, (&v, &s))| *c = e(v * s * mult)),
        }
    }
    match dtype {
        QuantDtype::Int8 => encode_all(codes, x, smooth_inv, mult, encode_int8),
        QuantDtype::Float8E4m3fn => encode_all(codes, x, smooth_inv, mult, e4m3_encode),
    }
    amax / q
}

/// `max(max_j |x_j|, AMAX_FLOOR)`, NaN ignored, over 8 lanes (max is exact and order
/// independent, so the lanes give the value of one sequential fold).
fn abs_max(x: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut m = [AMAX_FLOOR; LANES];
    let chunks = x.chunks_exact(LANES);
    for (lane, &v) in chunks.remainder().iter().enumerate() {
        m[lane] = m[lane].max(v.abs());
    }
    for c in chunks {
        for lane in 0..LANES {
            m[lane] = m[lane].max(c[lane].abs());
        }
    }
    m.iter().fold(AMAX_FLOOR, |a, &b| a.max(b))
}

/// Per-token (dynamic) quantization of `x` `[rows, cols]`, one scale per row.
///
/// Per row: `x'_j = x_j * smooth_inv_j` (only with a smoother); `amax = max(max_j |x'_j|,
/// AMAX_FLOOR)`; `mult = Q / amax`; `q_j = encode(x'_j * mult)`; `scale = amax / Q`.
/// NaN inputs are ignored by the max and encode to 0; an infinite input makes the row's scale
/// infinite and its codes 0 (`x * (Q / inf)` is 0 or NaN).
pub fn quantize_per_token(
    x: &[f32],
    rows: usize,
    cols: usize,
    smooth_inv: Option<&[f32]>,
    dtype: QuantDtype,
) -> QuantizedRows {
    check_matrix("x", x.len(), rows, cols);
    check_smoother(smooth_inv, cols);
    let mut codes = vec![0u8; x.len()];
    let scales = if cols == 0 {
        vec![AMAX_FLOOR / dtype.qmax(); rows]
    } else {
        codes
            .par_chunks_mut(cols)
            .zip(x.par_chunks(cols))
            .with_min_len(min_rows_per_task(rows, cols))
            .map(|(c, xr)| quantize_row(xr, smooth_inv, dtype, c))
            .collect()
    };
    QuantizedRows {
        dtype,
        rows,
        cols,
        codes,
        scales,
    }
}

/// The per-column multipliers of static quantization: `smooth_inv_j * (1 / input_scale)`, or
/// `1 / input_scale` for every column without a smoother.
pub fn static_multipliers(cols: usize, smooth_inv: Option<&[f32]>, input_scale: f32) -> Vec<f32> {
    check_smoother(smooth_inv, cols);
    assert!(
        input_scale.is_finite() && input_scale > 0.0,
        "input_scale must be finite and positive, got {input_scale}"
    );
    let inv = 1.0 / input_scale;
    match smooth_inv {
        Some(s) => s.iter().map(|&s| s * inv).collect(),
        None => vec![inv; cols],
    }
}

/// Static quantization of `x` `[rows, cols]` at a calibrated `input_scale`:
/// `q = encode(x * mult_j)` with `mult_j` from [`static_multipliers`].
pub fn quantize_static(
    x: &[f32],
    rows: usize,
    cols: usize,
    smooth_inv: Option<&[f32]>,
    input_scale: f32,
    dtype: QuantDtype,
) -> Vec<u8> {
    check_matrix("x", x.len(), rows, cols);
    let mult = static_multipliers(cols, smooth_inv, input_scale);
    let mut codes = vec![0u8; x.len()];
    if cols > 0 {
        codes
            .par_chunks_mut(cols)
            .zip(x.par_chunks(cols))
            .with_min_len(min_rows_per_task(rows, cols))
            .for_each(|(c, xr)| {
                for ((c, &v), &m) in c.iter_mut().zip(xr).zip(&mult) {
                    *c = encode(dtype, v * m);
                }
            });
    }
    codes
}

/// The static `input_scale` for a calibrated clip: `max(clip, AMAX_FLOOR) / Q`, the per-token
/// rule's scale with the clip in place of the row's amax.
pub fn static_input_scale(clip: f32, dtype: QuantDtype) -> f32 {
    clip.max(AMAX_FLOOR) / dtype.qmax()
}

/// The quantizing epilogue of a fused norm: the norm's f32 output `y` `[rows, cols]` rounded
/// once to the served dtype, widened back to f32 (exact), then [`quantize_per_token`] without a
/// smoother. This is what the unfused pair computes (the norm writes `served`, its consumer
/// quantizes that per token), so one emission serves every consumer of an armed fused norm.
pub fn norm_quant_per_token(
    y: &[f32],
    rows: usize,
    cols: usize,
    served: OutDtype,
    dtype: QuantDtype,
) -> QuantizedRows {
    let widened: Vec<f32> = y
        .iter()
        .map(|&v| out_bits_to_f32(served, round_to_out(served, v)))
        .collect();
    quantize_per_token(&widened, rows, cols, None, dtype)
}

/// One row's per-token (per-channel) multiplier and scale: `(Q / amax, amax / Q)` with
/// `amax = max(max_j |x_j|, AMAX_FLOOR)`, the values [`quantize_per_token`] uses for the row
/// (no smoother). A method that chooses the codes itself (GPTQ) encodes `x_j * multiplier`.
pub fn row_multiplier(x: &[f32], dtype: QuantDtype) -> (f32, f32) {
    let amax = abs_max(x);
    let q = dtype.qmax();
    (q / amax, amax / q)
}

/// Per-output-channel weight quantization of `w` `[n, k]`: the per-token rule on each row, with
/// no smoother (smoothing is folded into the weight before this is called).
pub fn quantize_weight_per_channel(
    w: &[f32],
    n: usize,
    k: usize,
    dtype: QuantDtype,
) -> QuantizedRows {
    quantize_per_token(w, n, k, None, dtype)
}

/// `decode(code) * scale[row]` for every element.
pub fn dequantize_rows(q: &QuantizedRows) -> Vec<f32> {
    check_matrix("codes", q.codes.len(), q.rows, q.cols);
    assert_eq!(
        q.scales.len(),
        q.rows,
        "scales has {} entries, expected one per row ({})",
        q.scales.len(),
        q.rows
    );
    if q.cols == 0 {
        return Vec::new();
    }
    q.codes
        .chunks(q.cols)
        .zip(&q.scales)
        .flat_map(|(row, &s)| row.iter().map(move |&c| decode(q.dtype, c) * s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in QuantDtype::ALL {
            assert_eq!(QuantDtype::from_name(d.name()), Some(d));
        }
        assert_eq!(QuantDtype::from_name("nvfp4"), None);
    }

    #[test]
    fn int8_decode_is_twos_complement() {
        assert_eq!(decode(QuantDtype::Int8, 0x81), -127.0);
        assert_eq!(decode(QuantDtype::Int8, 0x7F), 127.0);
        assert_eq!(decode(QuantDtype::Int8, 0xFF), -1.0);
    }

    #[test]
    fn empty_shapes_are_fine() {
        let q = quantize_per_token(&[], 3, 0, None, QuantDtype::Int8);
        assert_eq!(q.scales, vec![AMAX_FLOOR / 127.0; 3]);
        assert!(q.codes.is_empty());
        assert!(dequantize_rows(&q).is_empty());
        assert!(quantize_static(&[], 0, 5, None, 1.0, QuantDtype::Int8).is_empty());
    }

    #[test]
    #[should_panic(expected = "smooth_inv has 1 entries")]
    fn smoother_length_is_checked() {
        quantize_per_token(&[1.0, 2.0], 1, 2, Some(&[1.0]), QuantDtype::Int8);
    }

    #[test]
    fn parallel_and_serial_rows_agree() {
        let cols = 64;
        let rows = 700;
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013)
            .collect();
        for dtype in QuantDtype::ALL {
            let all = quantize_per_token(&x, rows, cols, None, dtype);
            for r in [0, 1, 350, rows - 1] {
                let one = quantize_per_token(&x[r * cols..(r + 1) * cols], 1, cols, None, dtype);
                assert_eq!(one.codes, all.row(r));
                assert_eq!(one.scales[0].to_bits(), all.scales[r].to_bits());
            }
        }
    }
}
