//! `quantization_report.json`: what happened to every layer, for people and for CI.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::algorithms::smoothquant::GroupSearch as SmoothingSearch;
use crate::algorithms::static_inputs::StaticInput;
use crate::format::{ModuleKind, Scheme, SmoothFold};

/// Per-layer figures of one quantized layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerReport {
    pub name: String,
    pub scheme: Scheme,
    pub kind: ModuleKind,
    /// The stored weight's shape.
    pub shape: Vec<usize>,
    pub weight_scale_min: f32,
    pub weight_scale_max: f32,
    /// ||W - dequant(Q(W))|| / ||W|| (W as quantized: after smoothing, W·s).
    pub relative_weight_error: f64,
    /// Where SmoothQuant's 1/s for this layer's input went (`none` when not smoothed).
    pub smooth: SmoothFold,
    /// The module that absorbed 1/s (a norm or the V projection); null for runtime or none.
    pub smoothed_into: Option<String>,
    /// The migration strength α its smoothing group used.
    #[serde(default)]
    pub smoothing_alpha: Option<f32>,
    pub smoothing_factor_min: Option<f32>,
    pub smoothing_factor_max: Option<f32>,
    /// The calibrated per-channel max |x| of the layer's input (before smoothing).
    pub input_absmax_min: Option<f32>,
    pub input_absmax_max: Option<f32>,
    /// The calibrated static input scale (`*_static` schemes): the observer, the chosen clip,
    /// the calibrated max |x| and their ratio.
    #[serde(default)]
    pub static_input: Option<StaticInput>,
    /// A GEMM-chain consumer's static scale that was calibrated but not applied, because its
    /// expected error exceeded `static_inputs.max_error_ratio` times the per-token one: the
    /// layer keeps its per-token input and its chain does not arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_input_declined: Option<StaticInput>,
    /// With GPTQ weights: the relative L2 error of the layer's output on the calibration inputs
    /// (sqrt(Σ δᵀHδ / Σ wᵀHw), H = Σ x xᵀ, δ the weight's rounding error), of GPTQ's codes and
    /// of RTN's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gptq_output_error: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtn_output_error: Option<f64>,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizationReport {
    pub recipe: String,
    pub source_format: String,
    pub layers: Vec<LayerReport>,
    /// Quantizable layers left full precision, with the reason.
    pub skipped: BTreeMap<String, String>,
    /// Tensors that the architecture always keeps full precision, with the reason.
    pub kept_full_precision: BTreeMap<String, String>,
    /// `smoothquant.search`: each searched group's candidates, their measured output errors on
    /// sampled calibration rows, and the one kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub smoothing_search: Vec<SmoothingSearch>,
}

impl QuantizationReport {
    /// The layer with the largest relative weight error, if any.
    pub fn worst_layer(&self) -> Option<&LayerReport> {
        self.layers
            .iter()
            .max_by(|a, b| a.relative_weight_error.total_cmp(&b.relative_weight_error))
    }
}
