//! The histogram of |x| behind static input scales, and the clip observers that choose a
//! per-tensor clip from it (`mse`, `minmax`, `percentile`).
//!
//! The histogram has a fixed number of bins of width 2^e over [0, BINS · 2^e). It widens by
//! merging adjacent bin pairs (e grows by one), and since floor(floor(a / w) / 2) = floor(a / 2w)
//! and a / 2^e is exact in f32, every histogram ends up as the histogram of all its values at the
//! smallest e that holds the largest: utterances observed in parallel merge to the same counts in
//! any order.

use std::collections::BTreeMap;

use super::Observer;
use crate::numerics::{self, QuantDtype};

/// Bins per histogram (a power of two).
pub const BINS: usize = 4096;
const LOG2_BINS: i32 = 12;
/// The narrowest bin is 2^MIN_EXPONENT wide; smaller magnitudes never narrow the bins further.
const MIN_EXPONENT: i32 = -40;

/// 2^e as f32, for e in the normal range.
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// The smallest exponent whose range [0, BINS · 2^e) holds `a` (finite, >= 0).
fn exponent_for(a: f32) -> i32 {
    let field = ((a.to_bits() >> 23) & 0xFF) as i32;
    if field == 0 {
        // Zero or subnormal.
        return MIN_EXPONENT;
    }
    // a is in [2^f, 2^(f+1)): BINS · 2^e > a exactly when e >= f + 1 - LOG2_BINS.
    (field - 127 + 1 - LOG2_BINS).max(MIN_EXPONENT)
}

/// A histogram of |x| with exact, order-independent merging, and the exact max.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsHistogram {
    counts: Vec<u64>,
    /// Per bin, the sum of the values' integer weights (see [`channel_weights`]).
    weighted: Vec<u64>,
    exponent: i32,
    max_bits: u32,
    count: u64,
    nonfinite: u64,
    /// The expected squared error of quantizing the same values per token instead (each row
    /// with its own scale), weighted as the bins are, in fixed point (PER_TOKEN_UNIT) so that
    /// merging stays exact; 0 unless the rows were added with a per-token dtype.
    per_token_error: u128,
}

/// Fixed-point unit of [`AbsHistogram::per_token_error`]: 2^-32 value² · weight.
const PER_TOKEN_UNIT: f64 = 4_294_967_296.0;

impl Default for AbsHistogram {
    fn default() -> Self {
        AbsHistogram {
            counts: vec![0; BINS],
            weighted: vec![0; BINS],
            exponent: MIN_EXPONENT,
            max_bits: 0,
            count: 0,
            nonfinite: 0,
            per_token_error: 0,
        }
    }
}

impl AbsHistogram {
    /// The largest |x| seen (0 when empty).
    pub fn max(&self) -> f32 {
        f32::from_bits(self.max_bits)
    }

    /// Finite values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// NaN or infinite values seen (not counted in the bins).
    pub fn nonfinite(&self) -> u64 {
        self.nonfinite
    }

    /// The width of every bin, 2^e.
    pub fn bin_width(&self) -> f32 {
        pow2(self.exponent)
    }

    /// The bin counts; bin i holds |x| in [i · w, (i + 1) · w).
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Widens the bins to 2^e by merging adjacent pairs.
    fn widen_to(&mut self, e: i32) {
        if e <= self.exponent {
            return;
        }
        // After LOG2_BINS merges everything is in bin 0; further merges change nothing.
        let shift = (e - self.exponent).min(LOG2_BINS) as u32;
        for bins in [&mut self.counts, &mut self.weighted] {
            let mut merged = vec![0u64; BINS];
            for (i, &c) in bins.iter().enumerate() {
                merged[i >> shift] += c;
            }
            *bins = merged;
        }
        self.exponent = e;
    }

    /// Adds |x_j · smooth_j| for every element of `x` (row-major, `cols` columns), each with the
    /// integer weight of its column (1 without weights). With `per_token`, also adds the
    /// expected error of quantizing each row to that dtype with its own scale (its max |x|).
    pub fn add_rows(
        &mut self,
        x: &[f32],
        cols: usize,
        smooth: Option<&[f32]>,
        weights: Option<&[u32]>,
        per_token: Option<QuantDtype>,
    ) {
        if cols == 0 {
            return;
        }
        let value = |j: usize, v: f32| smooth.map_or(v, |s| v * s[j]).abs();
        // Widen once for the largest value, then bin everything at that width.
        let mut hi = 0f32;
        for row in x.chunks_exact(cols) {
            for (j, &v) in row.iter().enumerate() {
                let a = value(j, v);
                if a.is_finite() && a > hi {
                    hi = a;
                }
            }
        }
        self.widen_to(exponent_for(hi));
        let inv = pow2(-self.exponent);
        for row in x.chunks_exact(cols) {
            for (j, &v) in row.iter().enumerate() {
                let a = value(j, v);
                if !a.is_finite() {
                    self.nonfinite += 1;
                    continue;
                }
                // Exact: scaling by a power of two, and a < BINS · 2^e.
                let bin = (a * inv) as usize;
                self.counts[bin] += 1;
                self.weighted[bin] += weights.map_or(1, |w| u64::from(w[j]));
                self.count += 1;
            }
        }
        if hi > self.max() {
            self.max_bits = hi.to_bits();
        }
        if let Some(dtype) = per_token {
            for row in x.chunks_exact(cols) {
                let row_max = row
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| value(j, v))
                    .filter(|a| a.is_finite())
                    .fold(0f32, f32::max);
                let clip = f64::from(row_max.max(numerics::AMAX_FLOOR));
                let error: f64 = row
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        let a = f64::from(value(j, v));
                        let step = step_at(dtype, a.min(clip), clip);
                        let weight = weights.map_or(1.0, |w| f64::from(w[j]));
                        weight * (step * step / 12.0).min(a * a)
                    })
                    .filter(|e| e.is_finite())
                    .sum();
                // Rounded per row, then summed as integers: exact in any merge order.
                self.per_token_error = self
                    .per_token_error
                    .saturating_add((error * PER_TOKEN_UNIT).round() as u128);
            }
        }
    }

    /// The expected error of quantizing the values per token (see `add_rows`), in the units of
    /// [`Self::expected_error`].
    pub fn per_token_error(&self) -> f64 {
        self.per_token_error as f64 / PER_TOKEN_UNIT
    }

    /// Folds another histogram into this one (exact; the result does not depend on the order).
    pub fn merge(&mut self, other: &AbsHistogram) {
        self.widen_to(other.exponent);
        let shift = (self.exponent - other.exponent).min(LOG2_BINS) as u32;
        for (i, (&c, &w)) in other.counts.iter().zip(&other.weighted).enumerate() {
            self.counts[i >> shift] += c;
            self.weighted[i >> shift] += w;
        }
        self.count += other.count;
        self.nonfinite += other.nonfinite;
        self.per_token_error = self.per_token_error.saturating_add(other.per_token_error);
        if other.max() > self.max() {
            self.max_bits = other.max_bits;
        }
    }

    /// The upper edge of bin i, capped at the max (so the top bin's edge is the max itself).
    fn edge(&self, i: usize) -> f32 {
        // (i + 1) · 2^e is exact; it can only overflow to inf above the max, which caps it.
        ((i + 1) as f32 * self.bin_width()).min(self.max())
    }

    /// The clip an observer chooses for quantizing these values to `dtype`.
    pub fn clip(&self, observer: ClipObserver, dtype: QuantDtype) -> f32 {
        if self.count == 0 || self.max() == 0.0 {
            return self.max();
        }
        match observer {
            ClipObserver::MinMax => self.max(),
            ClipObserver::Percentile(p) => self.percentile(p),
            ClipObserver::Mse => self.mse_clip(dtype),
        }
    }

    /// The upper edge of the bin holding the ⌈p/100 · n⌉-th smallest |x| (capped at the max):
    /// the smallest bin edge below which at least p % of the values lie.
    fn percentile(&self, p: f64) -> f32 {
        let rank = ((p / 100.0 * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return self.edge(i);
            }
        }
        self.max()
    }

    /// The expected squared error of quantizing these values to `dtype` with `clip` mapped to
    /// Q, each value weighted by its channel weight (counts when no weights were given), in
    /// units of value² · weight: values inside the clip contribute the rounding noise step² / 12
    /// of the code at their magnitude (v² when that is smaller: they round to 0), clipped values
    /// (|x| − clip)²; each bin's values are taken at its centre (the top bin's at most the max).
    pub fn expected_error(&self, clip: f64, dtype: QuantDtype) -> f64 {
        self.centres()
            .map(|(v, n)| {
                let e = if v > clip {
                    (v - clip) * (v - clip)
                } else {
                    let step = step_at(dtype, v, clip);
                    (step * step / 12.0).min(v * v)
                };
                n * e
            })
            .sum()
    }

    /// The weighted energy of the values, Σ weight · v² (bin centres), in the units of
    /// [`Self::expected_error`]: what a relative error is relative to.
    pub fn energy(&self) -> f64 {
        self.centres().map(|(v, n)| n * v * v).sum()
    }

    /// Each non-empty bin as (its centre, capped at the max; its mass).
    fn centres(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let w = f64::from(self.bin_width());
        let max = f64::from(self.max());
        self.mass()
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(move |(i, &n)| (((i as f64 + 0.5) * w).min(max), n as f64))
    }

    /// Per bin, the values' weights (their counts when every weight is zero, since a weight of
    /// zeros would make every clip equally good).
    fn mass(&self) -> &[u64] {
        if self.weighted.iter().any(|&c| c > 0) {
            &self.weighted
        } else {
            &self.counts
        }
    }

    /// The clip by [`Self::expected_error`] (docs/calibration.md).
    ///
    /// int8: the candidate minimising it among every bin edge below the max and the max (ties
    /// to the larger). e4m3: the error inside the range is relative to the value whatever the
    /// scale, so clipping calibrated values only adds bias; the clip is the max times the
    /// largest power of two up to 2^FP8_MAX_HEADROOM whose error stays within
    /// FP8_HEADROOM_TOLERANCE of the error at the max (headroom for activations calibration
    /// never saw, paid for only by values pushed into the subnormal range).
    fn mse_clip(&self, dtype: QuantDtype) -> f32 {
        let cost = |c: f64| self.expected_error(c, dtype);
        let max = f64::from(self.max());
        match dtype {
            QuantDtype::Int8 => {
                let last = self.counts.iter().rposition(|&c| c > 0).unwrap_or(0);
                let (mut best, mut best_cost) = (self.max(), f64::INFINITY);
                for t in 0..=last {
                    let clip = self.edge(t);
                    let c = cost(f64::from(clip));
                    // Ties go to the larger clip (t ascends).
                    if c <= best_cost {
                        best_cost = c;
                        best = clip;
                    }
                }
                best
            }
            QuantDtype::Float8E4m3fn => {
                let limit = cost(max) * (1.0 + FP8_HEADROOM_TOLERANCE);
                (1..=FP8_MAX_HEADROOM)
                    .rev()
                    .map(|k| self.max() * pow2(k))
                    .find(|c| c.is_finite() && cost(f64::from(*c)) <= limit)
                    .unwrap_or(self.max())
            }
        }
    }
}

/// e4m3 static clips go up to 2^8 times the calibrated max (e4m3 spans 2^17 in magnitude).
const FP8_MAX_HEADROOM: i32 = 8;
/// The extra estimated error e4m3 headroom may cost: 1 %.
const FP8_HEADROOM_TOLERANCE: f64 = 0.01;

/// The quantization step at magnitude `v` (0 <= v <= clip) when `clip` maps to Q: int8's
/// uniform clip / 127; e4m3's step of the code at that magnitude (3 mantissa bits, subnormal
/// step 2^-9 below 2^-6), in the values' units.
fn step_at(dtype: QuantDtype, v: f64, clip: f64) -> f64 {
    let scale = clip / f64::from(dtype.qmax());
    match dtype {
        QuantDtype::Int8 => scale,
        QuantDtype::Float8E4m3fn => {
            let u = v / scale;
            let exp = if u < 2f64.powi(-6) {
                -6
            } else {
                // floor(log2 u) from the bits, so the choice never depends on a libm.
                ((u.to_bits() >> 52) & 0x7FF) as i32 - 1023
            };
            2f64.powi(exp - 3) * scale
        }
    }
}

/// Scale of the integer channel weights: the heaviest column weighs 2^20.
const WEIGHT_SCALE: f64 = (1u64 << 20) as f64;

/// Integer weights of a GEMM's input channels for the output-space error: column j of the
/// weight `w` (`[n, cols]` row-major, as it will be quantized) gets ‖W[:, j]‖², scaled so the
/// heaviest is 2^20 and rounded. An error e in input channel j adds about ‖W[:, j]‖² · e² to the
/// squared error of the layer's output (errors of different channels uncorrelated), so weighting
/// each observed value by its column's weight makes the histogram's squared error that of the
/// output. Integers keep merging exact.
pub fn channel_weights(w: &[f32], cols: usize) -> Vec<u32> {
    let mut norms = vec![0f64; cols];
    if cols > 0 {
        for row in w.chunks_exact(cols) {
            for (n, &v) in norms.iter_mut().zip(row) {
                *n += f64::from(v) * f64::from(v);
            }
        }
    }
    let top = norms.iter().fold(0f64, |m, &v| m.max(v));
    norms
        .iter()
        .map(|&v| {
            if top > 0.0 && v.is_finite() {
                (v / top * WEIGHT_SCALE).round() as u32
            } else {
                1
            }
        })
        .collect()
}

/// How a static input scale's clip is chosen from the histogram.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClipObserver {
    /// The clip minimising the expected quantization error, clipping included.
    Mse,
    /// The largest |x| seen.
    MinMax,
    /// The p-th percentile of |x| (at bin resolution, rounded up), p in (0, 100].
    Percentile(f64),
}

impl ClipObserver {
    pub fn name(self) -> &'static str {
        match self {
            ClipObserver::Mse => "mse",
            ClipObserver::MinMax => "minmax",
            ClipObserver::Percentile(_) => "percentile",
        }
    }
}

/// Histograms of the inputs of chosen layers, each multiplied by the layer's runtime smoother
/// first (the input its static quantize actually sees).
#[derive(Clone, Debug)]
pub struct HistogramObserver<'a> {
    targets: &'a BTreeMap<String, HistogramTarget>,
    pub histograms: BTreeMap<String, AbsHistogram>,
}

/// What a [`HistogramObserver`] records of one layer's input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramTarget {
    /// The runtime smoother the input is multiplied by before binning.
    pub smooth_inv: Option<Vec<f32>>,
    /// Per input channel, the weight of its values ([`channel_weights`]).
    pub channel_weights: Option<Vec<u32>>,
    /// Also measure the error of the per-token quantize to this dtype (the alternative to a
    /// static scale that a GEMM-chain consumer falls back to).
    pub per_token: Option<QuantDtype>,
}

impl<'a> HistogramObserver<'a> {
    pub fn new(targets: &'a BTreeMap<String, HistogramTarget>) -> Self {
        HistogramObserver {
            targets,
            histograms: BTreeMap::new(),
        }
    }
}

impl Observer for HistogramObserver<'_> {
    fn wants(&self, layer: &str) -> bool {
        self.targets.contains_key(layer)
    }

    fn observe(&mut self, layer: &str, x: &[f32], cols: usize) {
        let Some(target) = self.targets.get(layer) else {
            return;
        };
        let smooth = target.smooth_inv.as_deref().filter(|v| v.len() == cols);
        let weights = target
            .channel_weights
            .as_deref()
            .filter(|v| v.len() == cols);
        self.histograms
            .entry(layer.to_string())
            .or_default()
            .add_rows(x, cols, smooth, weights, target.per_token);
    }

    fn merge(&mut self, other: Self) {
        for (layer, h) in other.histograms {
            match self.histograms.get_mut(&layer) {
                Some(mine) => mine.merge(&h),
                None => {
                    self.histograms.insert(layer, h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[f32]) -> AbsHistogram {
        let mut h = AbsHistogram::default();
        h.add_rows(values, 1, None, None, None);
        h
    }

    #[test]
    fn exponent_is_the_smallest_that_fits() {
        for a in [1e-30f32, 1e-6, 0.3, 1.0, 4095.0, 4096.0, 1e20, f32::MAX] {
            let e = exponent_for(a);
            assert!(f64::from(a) < BINS as f64 * 2f64.powi(e), "{a}");
            if e > MIN_EXPONENT {
                assert!(f64::from(a) >= BINS as f64 * 2f64.powi(e - 1), "{a}");
            }
        }
        assert_eq!(exponent_for(0.0), MIN_EXPONENT);
        // 4096 needs bins of width 2 (range 8192); 4095.9 fits width 1.
        assert_eq!(exponent_for(4096.0), 1);
        assert_eq!(exponent_for(4095.9), 0);
    }

    #[test]
    fn values_land_in_their_bins_and_widening_keeps_them_there() {
        let mut h = hist(&[0.0, 1.0, 1.5, 3.0]);
        assert_eq!(h.bin_width(), pow2(-10));
        assert_eq!(h.counts()[1024], 1);
        assert_eq!(h.counts()[1536], 1);
        h.add_rows(&[-5000.0], 1, None, None, None);
        assert_eq!(h.bin_width(), 2.0);
        assert_eq!(
            &h.counts()[..3],
            &[3, 1, 0],
            "0, 1, 1.5 in [0, 2); 3 in [2, 4)"
        );
        assert_eq!(h.counts()[2500], 1);
        assert_eq!((h.max(), h.count()), (5000.0, 5));
        h.add_rows(&[f32::NAN, f32::INFINITY], 1, None, None, None);
        assert_eq!((h.count(), h.nonfinite()), (5, 2));
    }

    /// Uniform in [0, 1) from a 64-bit LCG (deterministic, no dependency).
    fn uniforms(n: usize, seed: u64) -> Vec<f64> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    const DTYPES: [QuantDtype; 2] = [QuantDtype::Int8, QuantDtype::Float8E4m3fn];

    #[test]
    fn mse_clips_a_heavy_tail_and_keeps_a_uniform_range() {
        let laplace: Vec<f32> = uniforms(100_000, 2)
            .iter()
            .map(|u| -(1.0 - u).ln() as f32)
            .collect();
        {
            let h = hist(&laplace);
            // int8: a uniform step of clip / 127 everywhere, so the rare tail is worth clipping
            // (for Laplace the known optimum is ≈ 10 scale units, here of a max of ≈ 14.5).
            let clip = h.clip(ClipObserver::Mse, QuantDtype::Int8);
            assert!(
                clip > 0.6 * h.max() && clip < 0.8 * h.max(),
                "int8: clip {clip} of max {}",
                h.max()
            );
            // e4m3: never below the max; headroom above it while the error allows.
            let clip = h.clip(ClipObserver::Mse, QuantDtype::Float8E4m3fn);
            assert!(
                clip >= h.max() && clip <= 256.0 * h.max(),
                "fp8: clip {clip} of max {}",
                h.max()
            );
        }
        // Uniform: clipping buys nothing worth its cost (int8: analytically ≈ 0.997).
        let uniform: Vec<f32> = uniforms(100_000, 3)
            .iter()
            .map(|u| (*u * 2.0 - 1.0) as f32)
            .collect();
        let h = hist(&uniform);
        let int8 = h.clip(ClipObserver::Mse, QuantDtype::Int8);
        assert!(int8 >= 0.99 * h.max() && int8 <= h.max(), "int8 {int8}");
        let fp8 = h.clip(ClipObserver::Mse, QuantDtype::Float8E4m3fn);
        assert!(fp8 >= h.max() && fp8 <= 256.0 * h.max(), "fp8 {fp8}");
    }

    #[test]
    fn fp8_headroom_stops_where_subnormals_start_to_cost() {
        let mut h = AbsHistogram::default();
        // Everything within a factor 4 of the max: headroom is free up to 2^8.
        let narrow: Vec<f32> = uniforms(10_000, 5)
            .iter()
            .map(|u| (0.25 + 0.75 * u) as f32)
            .collect();
        h.add_rows(&narrow, 1, None, None, None);
        let fp8 = QuantDtype::Float8E4m3fn;
        assert_eq!(h.clip(ClipObserver::Mse, fp8), 256.0 * h.max());
        // 99 % of the values at 2^-12: 2^k of headroom pushes them into the subnormal range
        // (below 2^-6 · max · 2^k / 448), which costs, so the headroom stops earlier.
        let mut wide = AbsHistogram::default();
        let mut values = vec![2f32.powi(-12); 9_900];
        values.extend([1.0; 100]);
        wide.add_rows(&values, 1, None, None, None);
        let clip = wide.clip(ClipObserver::Mse, fp8);
        assert!(
            clip >= 4.0 * wide.max() && clip < 256.0 * wide.max(),
            "{clip}"
        );
    }

    #[test]
    fn weights_move_the_mse_clip_to_what_the_output_sees() {
        // Channel 0: a bulk in [0, 1); channel 1: zeros but for two values of 1.3. Unweighted,
        // int8 clips the two (the bulk's finer step is worth more); when channel 1 multiplies a
        // weight column 1000x heavier (as a smoothed outlier channel does), it does not.
        let x: Vec<f32> = uniforms(100_000, 4)
            .iter()
            .enumerate()
            .flat_map(|(i, v)| [*v as f32, if i % 50_000 == 7 { 1.3 } else { 0.0 }])
            .collect();
        let mut plain = AbsHistogram::default();
        plain.add_rows(&x, 2, None, None, None);
        let mut weighted = AbsHistogram::default();
        weighted.add_rows(&x, 2, None, Some(&[1, 1000]), None);
        let dtype = QuantDtype::Int8;
        assert!(plain.clip(ClipObserver::Mse, dtype) < 0.85 * plain.max());
        assert!(weighted.clip(ClipObserver::Mse, dtype) > 0.95 * weighted.max());
        // Weights leave the counts (and so the percentile) alone.
        assert_eq!(plain.counts(), weighted.counts());
        assert_eq!(
            plain.clip(ClipObserver::Percentile(99.0), dtype),
            weighted.clip(ClipObserver::Percentile(99.0), dtype)
        );
    }

    #[test]
    fn channel_weights_are_squared_column_norms_scaled_to_2_pow_20() {
        // [n = 2, cols = 3]: column norms² 1 + 4 = 5, 0, 9 + 16 = 25.
        let w = [1.0, 0.0, 3.0, 2.0, 0.0, -4.0];
        assert_eq!(channel_weights(&w, 3), vec![209_715, 0, 1 << 20]);
        assert_eq!(channel_weights(&[0.0; 4], 2), vec![1, 1]);
    }

    #[test]
    fn minmax_is_the_exact_max() {
        let h = hist(&[0.25, -3.3, 1e-3, 2.0]);
        for dtype in DTYPES {
            assert_eq!(h.clip(ClipObserver::MinMax, dtype), 3.3);
        }
        assert_eq!(
            AbsHistogram::default().clip(ClipObserver::Mse, QuantDtype::Int8),
            0.0
        );
    }

    #[test]
    fn percentile_on_a_known_set() {
        // 9999 values in [0, 1) and one 1000: the bins are 1/4 wide (4096 · 0.25 > 1000), so
        // the 9999th smallest value lies in [0.75, 1) and the 99.99th percentile is 1 exactly.
        let mut values: Vec<f32> = (0..9999).map(|i| i as f32 / 9999.0).collect();
        values.push(-1000.0);
        let h = hist(&values);
        assert_eq!(h.bin_width(), 0.25);
        assert_eq!(
            h.clip(ClipObserver::Percentile(99.99), QuantDtype::Int8),
            1.0
        );
        assert_eq!(
            h.clip(ClipObserver::Percentile(100.0), QuantDtype::Int8),
            1000.0
        );
        // The 50th percentile: the 5000th smallest, 4999/9999 in [0.25, 0.5).
        assert_eq!(
            h.clip(ClipObserver::Percentile(50.0), QuantDtype::Int8),
            0.5
        );
    }

    /// The histogram of `values` at bin width 2^e, computed directly.
    fn direct(values: &[f32], e: i32) -> Vec<u64> {
        let mut counts = vec![0u64; BINS];
        for v in values {
            counts[(f64::from(v.abs()) / 2f64.powi(e)).floor() as usize] += 1;
        }
        counts
    }

    use proptest::prelude::*;

    fn magnitudes() -> impl Strategy<Value = f32> {
        // Values over many binades, so histograms of different chunks start at different widths.
        (-1f32..1.0, -30i32..30).prop_map(|(m, e)| m * 2f32.powi(e))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn merging_is_exact_and_order_independent(
            chunks in proptest::collection::vec(proptest::collection::vec(magnitudes(), 0..20), 1..8),
            order in any::<u64>(),
            weights in proptest::collection::vec(0u32..(1 << 20), 2),
        ) {
            // Rows of two columns, each column with its weight.
            let chunks: Vec<Vec<f32>> = chunks.iter().map(|c| c.iter().flat_map(|&v| [v, -v * 0.5]).collect()).collect();
            let add = |values: &[f32]| {
                let mut h = AbsHistogram::default();
                h.add_rows(values, 2, None, Some(&weights), None);
                h
            };
            let all: Vec<f32> = chunks.concat();
            let whole = add(&all);
            let parts: Vec<AbsHistogram> = chunks.iter().map(|c| add(c)).collect();
            // Left fold in the given order.
            let mut forward = AbsHistogram::default();
            parts.iter().for_each(|p| forward.merge(p));
            // A shuffled order, merged as a tree of pairs.
            let mut shuffled = parts.clone();
            let n = shuffled.len();
            for i in (1..n).rev() {
                shuffled.swap(i, (order.wrapping_mul(i as u64 + 7) % (i as u64 + 1)) as usize);
            }
            while shuffled.len() > 1 {
                let b = shuffled.pop().unwrap();
                let mut a = shuffled.remove(0);
                a.merge(&b);
                shuffled.push(a);
            }
            prop_assert_eq!(&forward, &whole);
            prop_assert_eq!(&shuffled[0], &whole);
            // And it is the histogram of all the values at the final width.
            prop_assert_eq!(whole.counts(), &direct(&all, whole.exponent)[..]);
            let max = all.iter().fold(0f32, |m, v| m.max(v.abs()));
            prop_assert_eq!(whole.max(), max);
            prop_assert_eq!(whole.count(), all.len() as u64);
        }

        #[test]
        fn percentile_is_the_bin_edge_above_the_ranked_value(
            values in proptest::collection::vec(magnitudes(), 1..300),
            p in 0.5f64..100.0,
        ) {
            let h = hist(&values);
            let mut sorted: Vec<f32> = values.iter().map(|v| v.abs()).collect();
            sorted.sort_by(f32::total_cmp);
            let rank = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            let v = sorted[rank - 1];
            let w = f64::from(h.bin_width());
            let expected = (((f64::from(v) / w).floor() + 1.0) * w).min(f64::from(h.max()));
            let got = h.clip(ClipObserver::Percentile(p), QuantDtype::Int8);
            prop_assert_eq!(f64::from(got), expected);
            prop_assert!(got >= v);
        }
    }

    #[test]
    fn the_smoother_scales_before_binning() {
        let mut h = AbsHistogram::default();
        h.add_rows(&[1.0, 1.0, -2.0, 3.0], 2, Some(&[0.5, 4.0]), None, None);
        assert_eq!(h.max(), 12.0);
        assert_eq!(h.count(), 4);
    }
}
