//! SmoothQuant: migrate activation outliers into the weights. For GEMMs sharing an input X,
//! s_j = max|X_j|^α / max|W_j|^(1−α) (max over every consumer's column j), and 1/s goes where the
//! architecture declares: a LayerNorm's affine, the V projection's rows, or a runtime smoother.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::WorkingTensors;
use crate::calibration::{AbsMaxObserver, RowSampleObserver};
use crate::error::{Error, Result};
use crate::format::SmoothFold;
use crate::models::exec::{ce, scale_columns, Linear, LinearExec};
use crate::models::{QuantizationLayout, SmoothGroup};
use crate::numerics::{self, QuantDtype};

/// The largest finite f16.
const F16_MAX: f32 = 65504.0;

/// The default migration strength.
pub const DEFAULT_ALPHA: f32 = 0.5;

/// One smoothed group: the factors and where they went.
#[derive(Clone, Debug, PartialEq)]
pub struct SmoothedGroup {
    pub fold: SmoothFold,
    /// The module that absorbed 1/s (a norm or a V projection); `None` for a runtime smoother.
    pub smoothed_into: Option<String>,
    pub consumers: Vec<String>,
    /// For a fold into a producer's rows: the first row 1/s divides.
    pub producer_rows_from: usize,
    /// s_j per input channel.
    pub factors: Vec<f32>,
    /// The calibrated max |X_j| per input channel.
    pub input_absmax: Vec<f32>,
    /// The migration strength used.
    pub alpha: f32,
}

/// A channel whose calibrated max |x| is below this fraction of the group's median channel max
/// counts as dormant (see [`factors`]).
pub const DORMANT_FRACTION: f32 = 1e-2;

/// The smoothing factors of one group, clamped to `[lower_j, upper_j]`. A channel calibration
/// never saw active, or saw only dormant (below [`DORMANT_FRACTION`] of the median channel's
/// max), or an all-zero weight column, keeps s = 1. (A dormant channel's s from the formula is
/// tiny: it would amplify the channel's input by 1/s and shrink its weight column to rounding
/// noise, so audio that wakes it up, as one gate utterance wakes a GELU channel of tiny.en's
/// `encoder.layers.3.fc2`, loses that channel's contribution: docs/recipes.md.)
///
/// `floor` (a fraction of the median channel max, 0 for none) raises the max of an active but
/// quiet channel to `floor · median` before the formula, so s never shrinks a channel's weight
/// column (and amplifies its input) as far as one quiet calibration would have it.
pub fn factors(x_max: &[f32], w_max: &[f32], alpha: f32, lower: &[f32], floor: f32) -> Vec<f32> {
    let mut sorted: Vec<f32> = x_max.iter().copied().filter(|x| x.is_finite()).collect();
    sorted.sort_by(f32::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let dormant = median * DORMANT_FRACTION;
    x_max
        .iter()
        .zip(w_max)
        .zip(lower)
        .map(|((&x, &w), &lo)| {
            if !(x > 0.0 && x >= dormant && w > 0.0) {
                return 1.0;
            }
            let x = x.max(floor * median);
            let s = x.powf(alpha) / w.powf(1.0 - alpha);
            // Keep W·s inside f16, then keep the folded parameter (divided by s) inside f16.
            let s = s.min(F16_MAX / w).max(lo).clamp(1.0 / F16_MAX, F16_MAX);
            if s.is_finite() && s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect()
}

/// How each group's α is chosen (`smoothquant.search`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlphaSearch {
    /// The recipe's α for every group.
    #[default]
    Off,
    /// The recipe's α, or no smoothing where that measures the lower output error.
    Decline,
    /// No smoothing or an α of [`SEARCH_ALPHAS`], whichever measures the lowest output error.
    Grid,
}

impl AlphaSearch {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "off" => Some(AlphaSearch::Off),
            "decline" => Some(AlphaSearch::Decline),
            "grid" => Some(AlphaSearch::Grid),
            _ => None,
        }
    }
}

/// The α values `search = "grid"` measures (besides no smoothing).
pub const SEARCH_ALPHAS: [f32; 6] = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8];

/// Input rows per calibration utterance the search measures on, by default.
pub const DEFAULT_SEARCH_ROWS: usize = 8;

/// Which groups are smoothed, and how far a factor may go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmoothingRules {
    /// Whether groups without a parameter to fold 1/s into (a runtime smoother on the input,
    /// `smooth_inv`) are smoothed.
    pub runtime: bool,
    /// See [`factors`]: the floor on a channel's max, as a fraction of the median's.
    pub floor: f32,
    /// Whether the layout's shared folds replace the runtime groups of their consumers
    /// ([`QuantizationLayout::shared_folds`]).
    pub shared_folds: bool,
    /// How each group's α is chosen.
    pub search: AlphaSearch,
    /// Input rows per calibration utterance kept for the search.
    pub search_rows: usize,
}

impl Default for SmoothingRules {
    fn default() -> Self {
        SmoothingRules {
            runtime: true,
            floor: 0.0,
            shared_folds: false,
            search: AlphaSearch::Off,
            search_rows: DEFAULT_SEARCH_ROWS,
        }
    }
}

/// What the per-group search measures on.
pub struct SearchInput<'a> {
    /// Sampled calibration input rows of every group's first consumer.
    pub rows: &'a RowSampleObserver,
    /// The format both operands are quantized to (per-token inputs, per-channel weights).
    pub dtype: QuantDtype,
    /// Consumers whose input takes a static scale: their groups keep the α they are given (the
    /// search models per-token inputs).
    pub static_consumers: HashSet<String>,
}

/// One group's search: each candidate's relative output error on the sampled rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSearch {
    pub consumers: Vec<String>,
    /// Sampled input rows measured on.
    pub rows: usize,
    /// (α, or null for no smoothing; Σ over the consumers of ||Ŷ − Y||² / ||Y||²).
    pub candidates: Vec<(Option<f32>, f64)>,
    /// The candidate kept: the lowest error (no smoothing on a tie).
    pub chosen: Option<f32>,
}

/// The groups to smooth, and what the search measured for each group it ran on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SmoothingPlan {
    pub groups: Vec<SmoothedGroup>,
    pub searched: Vec<GroupSearch>,
}

/// The groups `rules` smooth: the layout's, with the shared folds in place of the runtime groups
/// they cover when asked, and without runtime groups unless allowed.
fn active_groups(
    layout: &QuantizationLayout,
    rules: SmoothingRules,
) -> impl Iterator<Item = &SmoothGroup> {
    let shared: HashSet<&String> = if rules.shared_folds {
        layout
            .shared_folds
            .iter()
            .flat_map(|g| &g.consumers)
            .collect()
    } else {
        HashSet::new()
    };
    let replaced = move |g: &SmoothGroup| {
        g.fold == SmoothFold::Runtime && g.consumers.iter().all(|c| shared.contains(c))
    };
    layout
        .smooth_groups
        .iter()
        .filter(move |g| !replaced(g))
        .filter(move |g| g.fold != SmoothFold::Runtime || rules.runtime)
        .chain(
            layout
                .shared_folds
                .iter()
                .filter(move |_| rules.shared_folds),
        )
}

/// The groups [`plan_with`] smooths under `rules`: the active ones whose consumers are all
/// quantized.
fn smoothable_groups<'a>(
    layout: &'a QuantizationLayout,
    quantized: &'a HashSet<String>,
    rules: SmoothingRules,
) -> impl Iterator<Item = &'a SmoothGroup> {
    active_groups(layout, rules).filter(|g| g.consumers.iter().all(|c| quantized.contains(c)))
}

/// The layers whose weights (and, for a runtime group, input) [`plan_with`] would smooth under
/// `rules`: every consumer of a smoothable group.
pub fn smoothed_consumers(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    rules: SmoothingRules,
) -> HashSet<String> {
    smoothable_groups(layout, quantized, rules)
        .flat_map(|g| g.consumers.iter().cloned())
        .collect()
}

/// The layers whose input rows the per-group search measures on (the first consumer of every
/// smoothable group); none when `rules` asks for no search.
pub fn searched_inputs(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    rules: SmoothingRules,
) -> Vec<String> {
    if rules.search == AlphaSearch::Off {
        return Vec::new();
    }
    smoothable_groups(layout, quantized, rules)
        .map(|g| g.consumers[0].clone())
        .collect()
}

/// Computes the factors of every group whose consumers are all quantized, with one α.
pub fn plan(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    observed: &AbsMaxObserver,
    tensors: &WorkingTensors,
    alpha: f32,
) -> Result<Vec<SmoothedGroup>> {
    plan_with(
        layout,
        quantized,
        observed,
        tensors,
        |_| alpha,
        SmoothingRules::default(),
        None,
    )
    .map(|p| p.groups)
}

/// [`plan`] with α given per group from its consumers, or, where `rules.search` asks and
/// `search` has the group's rows, chosen per group by the measured output error.
pub fn plan_with(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    observed: &AbsMaxObserver,
    tensors: &WorkingTensors,
    alpha_of: impl Fn(&[String]) -> f32,
    rules: SmoothingRules,
    search: Option<&SearchInput>,
) -> Result<SmoothingPlan> {
    let mut plan = SmoothingPlan::default();
    for group in smoothable_groups(layout, quantized, rules) {
        let alpha = alpha_of(&group.consumers);
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(Error::option(
                "smoothquant.alpha",
                format!("{alpha} is outside (0, 1)"),
            ));
        }
        let first = &group.consumers[0];
        let x_max = observed
            .absmax
            .get(first)
            .ok_or_else(|| Error::LayerRefused {
                layer: first.clone(),
                reason: "its input was never observed during calibration".into(),
            })?;
        let k = x_max.len();
        let mut w_max = vec![0f32; k];
        for consumer in &group.consumers {
            let name = format!("{consumer}.weight");
            let w = tensors.get(&name)?;
            if w.len() % k != 0 {
                return Err(Error::LayerRefused {
                    layer: consumer.clone(),
                    reason: format!("its weight has {} values, which do not form rows of the {k} observed input channels", w.len()),
                });
            }
            for row in w.chunks_exact(k) {
                for (m, v) in w_max.iter_mut().zip(row) {
                    *m = m.max(v.abs());
                }
            }
        }
        // What 1/s divides must stay inside f16 too.
        let mut lower = vec![0f32; k];
        match (group.fold, &group.producer) {
            (SmoothFold::NormAffine, Some(norm)) => {
                for key in ["weight", "bias"] {
                    for (lo, v) in lower
                        .iter_mut()
                        .zip(tensors.get(&format!("{norm}.{key}"))?.iter())
                    {
                        *lo = lo.max(v.abs() / F16_MAX);
                    }
                }
            }
            (SmoothFold::VToO | SmoothFold::ProducerRows, Some(producer)) => {
                if let Ok(bias) = tensors.get(&format!("{producer}.bias")) {
                    let rows = bias.get(group.producer_rows_from..).unwrap_or_default();
                    for (lo, v) in lower.iter_mut().zip(rows) {
                        *lo = lo.max(v.abs() / F16_MAX);
                    }
                }
            }
            (SmoothFold::Runtime, None) => {}
            (fold, producer) => {
                return Err(Error::LayerRefused { layer: first.clone(), reason: format!("the layout's fold {fold:?} with producer {producer:?} is not supported by smoothquant") });
            }
        }
        let factors_at = |alpha: f32| factors(x_max, &w_max, alpha, &lower, rules.floor);
        let searched = match search {
            Some(input)
                if rules.search != AlphaSearch::Off
                    && !group
                        .consumers
                        .iter()
                        .any(|c| input.static_consumers.contains(c)) =>
            {
                let candidates = match rules.search {
                    AlphaSearch::Grid => SEARCH_ALPHAS.to_vec(),
                    _ => vec![alpha],
                };
                search_group(&group.consumers, tensors, input, &candidates, factors_at)?
            }
            _ => None,
        };
        let alpha = match &searched {
            Some(s) => s.chosen,
            None => Some(alpha),
        };
        plan.searched.extend(searched);
        let Some(alpha) = alpha else { continue };
        plan.groups.push(SmoothedGroup {
            fold: group.fold,
            smoothed_into: group.producer.clone(),
            consumers: group.consumers.clone(),
            producer_rows_from: group.producer_rows_from,
            factors: factors_at(alpha),
            input_absmax: x_max.clone(),
            alpha,
        });
    }
    Ok(plan)
}

/// Measures no smoothing and each candidate α on the group's sampled input rows; `None` when
/// calibration kept no rows of its input.
fn search_group(
    consumers: &[String],
    tensors: &WorkingTensors,
    input: &SearchInput,
    candidates: &[f32],
    factors_at: impl Fn(f32) -> Vec<f32>,
) -> Result<Option<GroupSearch>> {
    let Some((x, k)) = input.rows.rows(&consumers[0]) else {
        return Ok(None);
    };
    let rows = x.len() / k;
    if rows == 0 {
        return Ok(None);
    }
    let mut weights = Vec::new();
    for c in consumers {
        let w = tensors.get(&format!("{c}.weight"))?.into_owned();
        let reference = matmul_t(x, rows, k, &w, c)?;
        weights.push(Consumer {
            name: c,
            weight: w,
            reference,
        });
    }
    let error = |s: Option<&[f32]>| output_error(x, k, &weights, s, input.dtype);
    let mut measured = vec![(None, error(None)?)];
    for &alpha in candidates {
        measured.push((Some(alpha), error(Some(&factors_at(alpha)))?));
    }
    // `min_by` keeps the first of equal errors: no smoothing on a tie.
    let chosen = measured
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .and_then(|m| m.0);
    Ok(Some(GroupSearch {
        consumers: consumers.to_vec(),
        rows,
        candidates: measured,
        chosen,
    }))
}

/// A consumer of a searched group: its f32 weight `[n, k]` and its f32 output on the rows.
struct Consumer<'a> {
    name: &'a str,
    weight: Vec<f32>,
    reference: Vec<f32>,
}

/// Σ over the consumers of ||Ŷ − Y||² / ||Y||² on rows x `[rows, k]`: Ŷ the output served with
/// factors s (None: unsmoothed), x/s quantized per token and W·s per output channel in `dtype`;
/// Y the f32 output.
fn output_error(
    x: &[f32],
    k: usize,
    consumers: &[Consumer],
    s: Option<&[f32]>,
    dtype: QuantDtype,
) -> Result<f64> {
    let rows = x.len() / k;
    let scaled = |m: &[f32], by: &dyn Fn(f32, f32) -> f32| -> Vec<f32> {
        match s {
            None => m.to_vec(),
            Some(s) => m
                .chunks_exact(k)
                .flat_map(|r| r.iter().zip(s).map(|(&v, &f)| by(v, f)))
                .collect(),
        }
    };
    let xs = scaled(x, &|v, f| v / f);
    let xq = numerics::dequantize_rows(&numerics::quantize_per_token(&xs, rows, k, None, dtype));
    let mut total = 0.0;
    for c in consumers {
        let ws = scaled(&c.weight, &|v, f| v * f);
        let n = ws.len() / k;
        let wq =
            numerics::dequantize_rows(&numerics::quantize_weight_per_channel(&ws, n, k, dtype));
        let served = matmul_t(&xq, rows, k, &wq, c.name)?;
        let (mut diff, mut energy) = (0f64, 0f64);
        for (a, b) in served.iter().zip(&c.reference) {
            diff += f64::from(a - b).powi(2);
            energy += f64::from(*b).powi(2);
        }
        total += diff / energy.max(f64::MIN_POSITIVE);
    }
    Ok(total)
}

/// x `[rows, k]` times wᵀ (w `[n, k]`), in f32.
fn matmul_t(x: &[f32], rows: usize, k: usize, w: &[f32], layer: &str) -> Result<Vec<f32>> {
    let dev = candle_core::Device::Cpu;
    let x = candle_core::Tensor::from_slice(x, (rows, k), &dev).map_err(ce(layer))?;
    let w = candle_core::Tensor::from_slice(w, (w.len() / k, k), &dev).map_err(ce(layer))?;
    x.matmul(&w.t().map_err(ce(layer))?)
        .and_then(|y| y.flatten_all())
        .and_then(|y| y.to_vec1())
        .map_err(ce(layer))
}

/// Folds the factors into the tensors: consumers' columns times s; 1/s into the norm, the V rows,
/// or (runtime) returned as each consumer's `smooth_inv`.
pub fn apply(
    groups: &[SmoothedGroup],
    tensors: &mut WorkingTensors,
) -> Result<BTreeMap<String, Vec<f32>>> {
    let mut smooth_inv = BTreeMap::new();
    for g in groups {
        let s = &g.factors;
        let k = s.len();
        for consumer in &g.consumers {
            let w = tensors.get_mut(&format!("{consumer}.weight"))?;
            for row in w.chunks_exact_mut(k) {
                for (v, f) in row.iter_mut().zip(s) {
                    *v *= f;
                }
            }
        }
        let divide = |values: &mut Vec<f32>| values.iter_mut().zip(s).for_each(|(v, f)| *v /= f);
        match (g.fold, &g.smoothed_into) {
            (SmoothFold::NormAffine, Some(norm)) => {
                divide(tensors.get_mut(&format!("{norm}.weight"))?);
                divide(tensors.get_mut(&format!("{norm}.bias"))?);
            }
            (SmoothFold::VToO | SmoothFold::ProducerRows, Some(producer)) => {
                // Rows `from .. from + k` of the producer (its V rows, or all of a producer
                // across ReLU) and their bias.
                let from = g.producer_rows_from;
                let name = format!("{producer}.weight");
                let out_rows = tensors.shape(&name)?.first().copied().unwrap_or(0);
                let weight = tensors.get_mut(&name)?;
                let cols = weight.len() / out_rows.max(1);
                if from + k > out_rows || cols == 0 {
                    return Err(Error::LayerRefused {
                        layer: producer.clone(),
                        reason: format!(
                            "rows {from}..{} do not fit its {out_rows} output rows",
                            from + k
                        ),
                    });
                }
                for (row, f) in weight[from * cols..(from + k) * cols]
                    .chunks_exact_mut(cols)
                    .zip(s)
                {
                    row.iter_mut().for_each(|v| *v /= f);
                }
                if tensors.contains(&format!("{producer}.bias")) {
                    let bias = tensors.get_mut(&format!("{producer}.bias"))?;
                    if let Some(rows) = bias.get_mut(from..from + k) {
                        rows.iter_mut().zip(s).for_each(|(v, f)| *v /= f);
                    }
                }
            }
            _ => {
                let inv: Vec<f32> = s.iter().map(|f| 1.0 / f).collect();
                for consumer in &g.consumers {
                    smooth_inv.insert(consumer.clone(), inv.clone());
                }
            }
        }
    }
    Ok(smooth_inv)
}

/// Runs a smoothed full-precision model: layers with a runtime smoother multiply their input by
/// `smooth_inv` before the (W·s) GEMM, as the server does before quantizing.
pub struct RuntimeSmoothedExec<'a> {
    pub smooth_inv: &'a BTreeMap<String, Vec<f32>>,
}

impl LinearExec for RuntimeSmoothedExec<'_> {
    fn linear(&mut self, layer: &Linear, x: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        match self.smooth_inv.get(&layer.name) {
            Some(inv) => layer.forward(&scale_columns(x, inv, &layer.name)?),
            None => layer.forward(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_follow_the_formula_and_its_guards() {
        let s = factors(
            &[4.0, 0.0, 9.0, 1.0],
            &[1.0, 2.0, 0.0, 0.25],
            0.5,
            &[0.0; 4],
            0.0,
        );
        assert_eq!(s[0], 2.0);
        assert_eq!(s[1], 1.0, "never active");
        assert_eq!(s[2], 1.0, "zero weight column");
        assert_eq!(s[3], 2.0);
        // α = 0.75: 16^0.75 / 1^0.25 = 8.
        assert_eq!(factors(&[16.0], &[1.0], 0.75, &[0.0], 0.0)[0], 8.0);
        // W·s stays inside f16.
        assert_eq!(factors(&[1e12], &[1.0], 0.5, &[0.0], 0.0)[0], F16_MAX);
        // The folded parameter stays inside f16: s >= |γ| / 65504.
        assert_eq!(factors(&[1e-6], &[1.0], 0.5, &[0.5], 0.0)[0], 0.5);
    }

    /// One input channel 50 times the others: int8's per-token grid loses the quiet channels,
    /// and smoothing (α 0.5) measures a far lower error; in fp8, whose rounding is relative, the
    /// same factors buy much less. The measured error is what a direct computation gives.
    #[test]
    fn the_output_error_sees_what_smoothing_buys_in_each_format() {
        let (rows, k) = (16, 8);
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                let v = (i as f32 * 0.7548).sin();
                if i % k == 0 {
                    50.0 * v
                } else {
                    v
                }
            })
            .collect();
        let w: Vec<f32> = (0..3 * k).map(|i| (i as f32 * 1.3137).cos()).collect();
        let c = [Consumer {
            name: "c",
            reference: matmul_t(&x, rows, k, &w, "c").unwrap(),
            weight: w.clone(),
        }];
        let x_max: Vec<f32> = (0..k)
            .map(|j| {
                x.iter()
                    .skip(j)
                    .step_by(k)
                    .fold(0f32, |m, v| m.max(v.abs()))
            })
            .collect();
        let w_max: Vec<f32> = (0..k)
            .map(|j| {
                w.iter()
                    .skip(j)
                    .step_by(k)
                    .fold(0f32, |m, v| m.max(v.abs()))
            })
            .collect();
        let s = factors(&x_max, &w_max, 0.5, &[0.0; 8], 0.0);
        let int8 = |s| output_error(&x, k, &c, s, QuantDtype::Int8).unwrap();
        let fp8 = |s| output_error(&x, k, &c, s, QuantDtype::Float8E4m3fn).unwrap();
        let int8_gain = int8(Some(&s)) / int8(None);
        let fp8_gain = fp8(Some(&s)) / fp8(None);
        assert!(int8_gain < 0.1, "{int8_gain}");
        assert!(fp8_gain > 5.0 * int8_gain, "{fp8_gain} {int8_gain}");
        // Unsmoothed int8, computed directly.
        let xq = numerics::dequantize_rows(&numerics::quantize_per_token(
            &x,
            rows,
            k,
            None,
            QuantDtype::Int8,
        ));
        let wq = numerics::dequantize_rows(&numerics::quantize_weight_per_channel(
            &w,
            3,
            k,
            QuantDtype::Int8,
        ));
        let (mut diff, mut energy) = (0f64, 0f64);
        for r in 0..rows {
            for n in 0..3 {
                let dot = |a: &[f32], b: &[f32]| -> f64 {
                    a.iter()
                        .zip(b)
                        .map(|(p, q)| f64::from(*p) * f64::from(*q))
                        .sum()
                };
                let y = dot(&x[r * k..(r + 1) * k], &w[n * k..(n + 1) * k]);
                let yq = dot(&xq[r * k..(r + 1) * k], &wq[n * k..(n + 1) * k]);
                diff += (yq - y).powi(2);
                energy += y * y;
            }
        }
        let direct = diff / energy;
        assert!(
            (int8(None) - direct).abs() < 1e-4 * direct,
            "{} {direct}",
            int8(None)
        );
    }

    #[test]
    fn dormant_channels_keep_s_one() {
        // Median channel max 4: a channel below 4 · 1e-2 is dormant, one at it is not.
        let s = factors(&[4.0, 4.0, 1e-6, 0.04, 9.0], &[1.0; 5], 0.5, &[0.0; 5], 0.0);
        assert_eq!(s, [2.0, 2.0, 1.0, 0.2, 3.0]);
    }

    #[test]
    fn the_floor_raises_quiet_channels_only() {
        // Median 4, floor 0.25: the quiet channel (0.04) is taken as 1; dormant stays at s = 1.
        let s = factors(
            &[4.0, 4.0, 1e-6, 0.04, 9.0],
            &[1.0; 5],
            0.5,
            &[0.0; 5],
            0.25,
        );
        assert_eq!(s, [2.0, 2.0, 1.0, 1.0, 3.0]);
    }
}
