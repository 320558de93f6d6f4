//! SmoothQuant: migrate activation outliers into the weights. For GEMMs sharing an input X,
//! s_j = max|X_j|^α / max|W_j|^(1−α) (max over every consumer's column j), and 1/s goes where the
//! architecture declares: a LayerNorm's affine, the V projection's rows, or a runtime smoother.

use std::collections::{BTreeMap, HashSet};

use super::WorkingTensors;
use crate::calibration::AbsMaxObserver;
use crate::error::{Error, Result};
use crate::format::SmoothFold;
use crate::models::exec::{scale_columns, Linear, LinearExec};
use crate::models::{QuantizationLayout, SmoothGroup};

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
}

impl Default for SmoothingRules {
    fn default() -> Self {
        SmoothingRules {
            runtime: true,
            floor: 0.0,
            shared_folds: false,
        }
    }
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

/// The layers whose weights (and, for a runtime group, input) [`plan_with`] would smooth under
/// `rules`: every consumer of an active group whose consumers are all quantized.
pub fn smoothed_consumers(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    rules: SmoothingRules,
) -> HashSet<String> {
    active_groups(layout, rules)
        .filter(|g| g.consumers.iter().all(|c| quantized.contains(c)))
        .flat_map(|g| g.consumers.iter().cloned())
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
    )
}

/// [`plan`] with α chosen per group from its consumers.
pub fn plan_with(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    observed: &AbsMaxObserver,
    tensors: &WorkingTensors,
    alpha_of: impl Fn(&[String]) -> f32,
    rules: SmoothingRules,
) -> Result<Vec<SmoothedGroup>> {
    let mut groups = Vec::new();
    for group in active_groups(layout, rules) {
        // The same rule as `smoothed_consumers`.
        if !group.consumers.iter().all(|c| quantized.contains(c)) {
            continue;
        }
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
        groups.push(SmoothedGroup {
            fold: group.fold,
            smoothed_into: group.producer.clone(),
            consumers: group.consumers.clone(),
            producer_rows_from: group.producer_rows_from,
            factors: factors(x_max, &w_max, alpha, &lower, rules.floor),
            input_absmax: x_max.clone(),
            alpha,
        });
    }
    Ok(groups)
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
