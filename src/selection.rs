//! Which layers a run quantizes: the recipe's module types and `keep_full_precision` globs,
//! `--ignore` globs, and the alignment rules of the serving kernels. Layers left full precision are recorded with the reason.

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

/// The recipe's part of selection.
#[derive(Clone, Copy, Debug)]
pub struct RecipeRules<'a> {
    /// The recipe's name, for the reasons recorded.
    pub name: &'a str,
    pub module_types: &'a [ModuleKind],
    /// Globs of layers the recipe keeps full precision; unlike `--ignore`, a glob may match
    /// nothing (a recipe serves every architecture).
    pub keep_full_precision: &'a [String],
}

/// Applies the selection rules. `has_conv_calibration` says whether the run computes the static
/// input scales convolutions need.
pub fn select(
    layout: &QuantizationLayout,
    recipe: RecipeRules<'_>,
    ignore: &[String],
    dtype: QuantDtype,
    has_conv_calibration: bool,
) -> Result<Selection> {
    let module_types = recipe.module_types;
    // Validated when the recipe was parsed.
    let kept: Vec<(glob::Pattern, &String)> = recipe
        .keep_full_precision
        .iter()
        .filter_map(|g| glob::Pattern::new(g).ok().map(|p| (p, g)))
        .collect();
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
        if let Some((_, glob)) = kept.iter().find(|(p, _)| p.matches(&layer.name)) {
            selection.skipped.insert(
                layer.name.clone(),
                format!(
                    "kept full precision by recipe {} (keep_full_precision {glob})",
                    recipe.name
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(
        name: &str,
        kind: ModuleKind,
        out: usize,
        inp: usize,
        groups: usize,
    ) -> QuantizableLayer {
        QuantizableLayer {
            name: name.into(),
            kind,
            out_features: out,
            in_features: inp,
            groups,
        }
    }

    #[test]
    fn grouped_and_misaligned_layers_are_skipped_with_the_reason() {
        let layout = QuantizationLayout {
            layers: vec![
                layer("conv.ok", ModuleKind::Conv1d, 64, 80, 1),
                layer("conv.depthwise", ModuleKind::Conv1d, 64, 64, 64),
                layer("conv.narrow", ModuleKind::Conv2d, 64, 40, 1),
                layer("fc.odd", ModuleKind::Linear, 12, 64, 1),
            ],
            ..Default::default()
        };
        let kinds = [ModuleKind::Linear, ModuleKind::Conv1d, ModuleKind::Conv2d];
        let rules = RecipeRules {
            name: "r",
            module_types: &kinds,
            keep_full_precision: &[],
        };
        let s = select(&layout, rules, &[], QuantDtype::Int8, true).unwrap();
        assert_eq!(
            s.selected
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>(),
            ["conv.ok"]
        );
        assert!(s.skipped["conv.depthwise"].contains("groups = 64"));
        assert!(s.skipped["conv.narrow"].contains("in_features 40"));
        assert!(s.skipped["fc.odd"].contains("out_features 12"));
        // Without the static scales a convolution needs, or in fp8, selecting one is refused.
        for (dtype, calibrated) in [(QuantDtype::Int8, false), (QuantDtype::Float8E4m3fn, true)] {
            let e = select(&layout, rules, &[], dtype, calibrated).unwrap_err();
            assert!(e.to_string().contains("conv.ok"), "{e}");
        }
    }

    #[test]
    fn a_recipe_keep_glob_may_match_nothing_but_an_ignore_glob_may_not() {
        let layout = QuantizationLayout {
            layers: vec![
                layer("decoder.layers.0.fc1", ModuleKind::Linear, 64, 16, 1),
                layer("decoder.layers.0.fc2", ModuleKind::Linear, 16, 64, 1),
            ],
            ..Default::default()
        };
        let keep = ["decoder.layers.*.fc2".to_string(), "ctc.*".to_string()];
        let rules = RecipeRules {
            name: "smoothquant_w8a8",
            module_types: &[ModuleKind::Linear],
            keep_full_precision: &keep,
        };
        let s = select(&layout, rules, &[], QuantDtype::Int8, false).unwrap();
        assert_eq!(s.selected.len(), 1);
        assert_eq!(s.selected[0].name, "decoder.layers.0.fc1");
        let reason = &s.skipped["decoder.layers.0.fc2"];
        assert!(
            reason.contains("recipe smoothquant_w8a8") && reason.contains("decoder.layers.*.fc2"),
            "{reason}"
        );
        let e = select(
            &layout,
            rules,
            &["ctc.*".to_string()],
            QuantDtype::Int8,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("--ignore ctc.*"), "{e}");
    }
}
