//! Which layers a run quantizes: the recipe's module types, `--ignore` globs, and the alignment
//! rules of the serving kernels. Layers left full precision are recorded with the reason.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::format::{ModuleKind, QuantDtype};
use crate::models::{QuantizableLayer, QuantizationLayout};

/// The outcome of selection.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    pub selected: Vec<QuantizableLayer>,
    /// Quantizable layers left full precision, with the reason.
    pub skipped: BTreeMap<String, String>,
}

/// Why a layer cannot be quantized by the serving kernels, if it cannot.
fn alignment_problem(layer: &QuantizableLayer) -> Option<String> {
    if layer.groups != 1 {
        return Some(format!(
            "grouped convolution (groups = {}); only groups = 1 is supported",
            layer.groups
        ));
    }
    if !layer.in_features.is_multiple_of(16) {
        return Some(format!(
            "in_features {} is not a multiple of 16",
            layer.in_features
        ));
    }
    if !layer.out_features.is_multiple_of(8) {
        return Some(format!(
            "out_features {} is not a multiple of 8",
            layer.out_features
        ));
    }
    None
}

/// Applies the selection rules. `has_conv_calibration` says whether the run computes the static
/// input scales convolutions need.
pub fn select(
    layout: &QuantizationLayout,
    module_types: &[ModuleKind],
    ignore: &[String],
    dtype: QuantDtype,
    has_conv_calibration: bool,
) -> Result<Selection> {
    let patterns = ignore
        .iter()
        .map(|p| {
            glob::Pattern::new(p)
                .map_err(|e| Error::option(format!("--ignore {p}"), format!("invalid glob: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut used = vec![false; patterns.len()];
    let mut selection = Selection::default();
    for layer in &layout.layers {
        if let Some(i) = patterns.iter().position(|p| p.matches(&layer.name)) {
            used[i] = true;
            selection.skipped.insert(
                layer.name.clone(),
                format!("ignored by --ignore {}", ignore[i]),
            );
            continue;
        }
        if !module_types.contains(&layer.kind) {
            selection.skipped.insert(
                layer.name.clone(),
                format!("module type {} not selected", layer.kind.name()),
            );
            continue;
        }
        if layer.kind.is_spatial_conv() {
            // Selected explicitly through --module-types: refuse rather than skip silently.
            let refuse = |reason: &str| {
                Err(Error::LayerRefused {
                    layer: layer.name.clone(),
                    reason: reason.into(),
                })
            };
            if dtype != QuantDtype::Int8 {
                return refuse(
                    "fp8 convolutions are refused: convolutions are quantized int8 only",
                );
            }
            if !has_conv_calibration {
                return refuse(
                    "a quantized convolution needs a static input scale from calibration (algorithm \
                     static_conv_inputs and --calib-manifest), which this run does not compute",
                );
            }
        }
        match alignment_problem(layer) {
            Some(reason) => {
                selection.skipped.insert(layer.name.clone(), reason);
            }
            None => selection.selected.push(layer.clone()),
        }
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(Error::option(
            format!("--ignore {}", ignore[i]),
            "matches no quantizable layer of this model",
        ));
    }
    Ok(selection)
}
