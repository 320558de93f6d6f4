//! Static input scales (`static_inputs` for GEMM-chain consumers, `static_conv_inputs` for
//! convolutions): a per-tensor `input_scale` from a histogram of the input the layer's static
//! quantize will see, measured in a second calibration pass on the smoothed model.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use crate::calibration::{AbsHistogram, ClipObserver};
use crate::error::{Error, Result};
use crate::models::QuantizationLayout;
use crate::numerics::{self, QuantDtype};

/// The percentile of `observer = "percentile"` when none is given.
pub const DEFAULT_PERCENTILE: f64 = 99.99;

/// The observer options of a static-scale algorithm, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticInputOptions {
    pub observer: ClipObserver,
    /// Layers (globs) that keep their per-token input: no static scale, so no chain arms.
    pub exclude: Vec<String>,
    /// A GEMM-chain consumer keeps its per-token input when its static quantize's expected
    /// output error exceeds this multiple of the per-token quantize's (None: never).
    pub max_error_ratio: Option<f64>,
    /// Whether chains inside a decoder step get static scales too (default false).
    pub decoder: bool,
    /// The clip is the observer's times this (>= 1; 1 by default): room above what calibration
    /// saw, for audio louder in some channel than any calibration utterance.
    pub headroom: f64,
}

impl StaticInputOptions {
    /// Parses `observer` (`mse` default, `minmax`, `percentile`) and `percentile` (a number in
    /// (0, 100], only with the percentile observer) of algorithm `algorithm`.
    pub fn parse(algorithm: &str, options: &BTreeMap<String, Value>) -> Result<Self> {
        let key = |k: &str| format!("{algorithm}.{k}");
        let observer = match options.get("observer") {
            None => "mse",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(Error::option(
                    key("observer"),
                    format!("{other} is not an observer name; expected mse, minmax or percentile"),
                ))
            }
        };
        let percentile = match options.get("percentile") {
            None => None,
            Some(v) => {
                let p = v.as_f64().ok_or_else(|| {
                    Error::option(key("percentile"), format!("{v} is not a number"))
                })?;
                if !(p > 0.0 && p <= 100.0) {
                    return Err(Error::option(
                        key("percentile"),
                        format!("{p} is outside (0, 100]"),
                    ));
                }
                Some(p)
            }
        };
        let observer = match observer {
            "mse" => ClipObserver::Mse,
            "minmax" => ClipObserver::MinMax,
            "percentile" => ClipObserver::Percentile(percentile.unwrap_or(DEFAULT_PERCENTILE)),
            other => {
                return Err(Error::option(
                    key("observer"),
                    format!("unknown observer `{other}`; expected mse, minmax or percentile"),
                ))
            }
        };
        let exclude = match options.get("exclude") {
            None => Vec::new(),
            Some(Value::String(g)) => vec![g.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        Error::option(key("exclude"), format!("{v} is not a glob string"))
                    })
                })
                .collect::<Result<_>>()?,
            Some(other) => {
                return Err(Error::option(
                    key("exclude"),
                    format!("{other} is not a glob or a list of globs"),
                ))
            }
        };
        for g in &exclude {
            glob::Pattern::new(g)
                .map_err(|e| Error::option(key("exclude"), format!("invalid glob `{g}`: {e}")))?;
        }
        if percentile.is_some() && !matches!(observer, ClipObserver::Percentile(_)) {
            return Err(Error::option(
                key("percentile"),
                format!(
                    "applies only with {algorithm}.observer=percentile (the observer is `{}`)",
                    observer.name()
                ),
            ));
        }
        let max_error_ratio = match options.get("max_error_ratio") {
            None => None,
            Some(v) => match v.as_f64() {
                Some(r) if r >= 1.0 && r.is_finite() => Some(r),
                _ => {
                    return Err(Error::option(
                        key("max_error_ratio"),
                        format!("{v} is not a number >= 1"),
                    ))
                }
            },
        };
        let decoder = match options.get("decoder") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(Error::option(
                    key("decoder"),
                    format!("{other} is not true or false"),
                ))
            }
        };
        let headroom = match options.get("headroom") {
            None => 1.0,
            Some(v) => match v.as_f64() {
                Some(h) if h >= 1.0 && h.is_finite() => h,
                _ => {
                    return Err(Error::option(
                        key("headroom"),
                        format!("{v} is not a number >= 1"),
                    ))
                }
            },
        };
        Ok(StaticInputOptions {
            observer,
            exclude,
            max_error_ratio,
            decoder,
            headroom,
        })
    }

    /// The effective options of `algorithm`, as `producer.algorithms` records them.
    pub fn record(&self, algorithm: &str) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        out.insert("observer".into(), Value::from(self.observer.name()));
        if let ClipObserver::Percentile(p) = self.observer {
            out.insert("percentile".into(), Value::from(p));
        }
        if !self.exclude.is_empty() {
            out.insert("exclude".into(), Value::from(self.exclude.clone()));
        }
        if let Some(r) = self.max_error_ratio {
            out.insert("max_error_ratio".into(), Value::from(r));
        }
        if algorithm == "static_inputs" {
            out.insert("decoder".into(), Value::from(self.decoder));
        }
        if self.headroom != 1.0 {
            out.insert("headroom".into(), Value::from(self.headroom));
        }
        out
    }

    /// Whether `layer` is excluded from static scales.
    pub fn excludes(&self, layer: &str) -> bool {
        self.exclude
            .iter()
            .filter_map(|g| glob::Pattern::new(g).ok())
            .any(|p| p.matches(layer))
    }
}

/// The GEMM-chain consumers that get a static input scale: those whose producer is quantized
/// too, so the chain can arm, that run outside a decoder step (unless `decoder`), and that
/// `exclude` does not name. (A consumer whose producer stays full precision keeps its
/// per-token input: a static scale would only cost accuracy there.)
/// An exclude glob that matches no chain consumer is an error naming it.
pub fn chain_consumers(
    layout: &QuantizationLayout,
    quantized: &HashSet<String>,
    options: &StaticInputOptions,
) -> Result<Vec<String>> {
    for g in &options.exclude {
        let one = StaticInputOptions {
            exclude: vec![g.clone()],
            ..options.clone()
        };
        if !layout.gemm_chains.iter().any(|c| one.excludes(&c.consumer)) {
            return Err(Error::option(
                "static_inputs.exclude",
                format!("`{g}` matches no GEMM-chain consumer of this model"),
            ));
        }
    }
    Ok(layout
        .gemm_chains
        .iter()
        .filter(|c| quantized.contains(&c.producer) && quantized.contains(&c.consumer))
        .filter(|c| options.decoder || !c.decode_step)
        .filter(|c| !options.excludes(&c.consumer))
        .map(|c| c.consumer.clone())
        .collect())
}

/// A calibrated static input scale and how it was chosen (recorded in the report).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct StaticInput {
    /// `mse`, `minmax` or `percentile`.
    pub observer: String,
    /// The percentile, for the percentile observer.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub percentile: Option<f64>,
    /// The chosen clip: |x| above it saturates.
    pub clip: f32,
    /// The largest |x| seen in calibration (after the runtime smoother, if any).
    pub calibrated_max: f32,
    /// clip / calibrated_max (1 when nothing was seen).
    pub clip_to_max: f32,
    /// max(clip, 1e-8) / Q.
    pub input_scale: f32,
    /// Values observed.
    pub values: u64,
    /// The expected output error of this static quantize over that of quantizing the same
    /// inputs per token (GEMM-chain consumers, whose alternative is the per-token input).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error_vs_per_token: Option<f64>,
    /// The expected output error of this static quantize relative to the output's energy
    /// (Σ‖W[:, j]‖² x_j², from the histogram).
    #[serde(default)]
    pub relative_error: f64,
}

/// The static input of a layer from its histogram.
pub fn static_input(
    layer: &str,
    hist: &AbsHistogram,
    options: &StaticInputOptions,
    dtype: QuantDtype,
) -> Result<StaticInput> {
    if hist.count() == 0 {
        return Err(Error::LayerRefused {
            layer: layer.into(),
            reason: "its input was never observed during calibration, so it has no static input \
                     scale"
                .into(),
        });
    }
    if hist.nonfinite() > 0 {
        return Err(Error::LayerRefused {
            layer: layer.into(),
            reason: format!(
                "{} non-finite input values during calibration; no static scale can hold them",
                hist.nonfinite()
            ),
        });
    }
    let clip = (f64::from(hist.clip(options.observer, dtype)) * options.headroom) as f32;
    let max = hist.max();
    Ok(StaticInput {
        observer: options.observer.name().into(),
        percentile: match options.observer {
            ClipObserver::Percentile(p) => Some(p),
            _ => None,
        },
        clip,
        calibrated_max: max,
        clip_to_max: if max > 0.0 { clip / max } else { 1.0 },
        input_scale: numerics::static_input_scale(clip, dtype),
        values: hist.count(),
        error_vs_per_token: (hist.per_token_error() > 0.0)
            .then(|| hist.expected_error(f64::from(clip), dtype) / hist.per_token_error()),
        relative_error: match hist.energy() {
            e if e > 0.0 => hist.expected_error(f64::from(clip), dtype) / e,
            _ => 0.0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(pairs: &[(&str, Value)]) -> Result<StaticInputOptions> {
        let options = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        StaticInputOptions::parse("static_inputs", &options)
    }

    #[test]
    fn options_are_validated_by_name() {
        assert_eq!(parse(&[]).unwrap().observer, ClipObserver::Mse);
        assert_eq!(
            parse(&[("observer", json!("minmax"))]).unwrap().observer,
            ClipObserver::MinMax
        );
        assert_eq!(
            parse(&[("observer", json!("percentile"))])
                .unwrap()
                .observer,
            ClipObserver::Percentile(DEFAULT_PERCENTILE)
        );
        let p = parse(&[
            ("observer", json!("percentile")),
            ("percentile", json!(99.9)),
        ])
        .unwrap();
        assert_eq!(p.observer, ClipObserver::Percentile(99.9));
        assert_eq!(p.record("static_inputs")["percentile"], json!(99.9));
        for (pairs, needle) in [
            (vec![("observer", json!("kl"))], "static_inputs.observer"),
            (vec![("observer", json!(3))], "static_inputs.observer"),
            (
                vec![("observer", json!("percentile")), ("percentile", json!(0))],
                "static_inputs.percentile",
            ),
            (
                vec![
                    ("observer", json!("percentile")),
                    ("percentile", json!(100.5)),
                ],
                "static_inputs.percentile",
            ),
            (
                vec![
                    ("observer", json!("percentile")),
                    ("percentile", json!("high")),
                ],
                "static_inputs.percentile",
            ),
            (vec![("percentile", json!(99))], "static_inputs.percentile"),
            (vec![("exclude", json!(3))], "static_inputs.exclude"),
            (
                vec![("exclude", json!(["ok.*", 4]))],
                "static_inputs.exclude",
            ),
            (
                vec![("exclude", json!("[unclosed"))],
                "static_inputs.exclude",
            ),
            (
                vec![("max_error_ratio", json!(0.5))],
                "static_inputs.max_error_ratio",
            ),
            (
                vec![("max_error_ratio", json!("big"))],
                "static_inputs.max_error_ratio",
            ),
            (vec![("decoder", json!("yes"))], "static_inputs.decoder"),
        ] {
            let e = parse(&pairs).unwrap_err().to_string();
            assert!(e.contains(needle), "{pairs:?}: {e}");
        }
    }

    /// fc1 → fc2 chains under each prefix (with its decode_step), and every layer's name.
    fn chains(prefixes: &[(&str, bool)]) -> (QuantizationLayout, HashSet<String>) {
        use crate::models::GemmChainLayout;
        let layout = QuantizationLayout {
            gemm_chains: prefixes
                .iter()
                .map(|(p, decode_step)| GemmChainLayout {
                    producer: format!("{p}.fc1"),
                    consumer: format!("{p}.fc2"),
                    activation: crate::numerics::Activation::Gelu,
                    decode_step: *decode_step,
                })
                .collect(),
            ..Default::default()
        };
        let all = layout
            .gemm_chains
            .iter()
            .flat_map(|c| [c.producer.clone(), c.consumer.clone()])
            .collect();
        (layout, all)
    }

    #[test]
    fn exclude_keeps_chain_consumers_per_token_and_must_match() {
        let (layout, all) = chains(&[("encoder.layers.0", false), ("decoder.layers.0", false)]);
        let o = parse(&[("exclude", json!("encoder.*"))]).unwrap();
        assert_eq!(o.record("static_inputs")["exclude"], json!(["encoder.*"]));
        assert_eq!(
            chain_consumers(&layout, &all, &o).unwrap(),
            ["decoder.layers.0.fc2"]
        );
        // A chain whose producer stays full precision gets no static scale.
        let mut no_fc1 = all.clone();
        no_fc1.remove("decoder.layers.0.fc1");
        assert!(chain_consumers(&layout, &no_fc1, &o).unwrap().is_empty());
        let o = parse(&[("exclude", json!(["decoder.*", "conformer.*"]))]).unwrap();
        let e = chain_consumers(&layout, &all, &o).unwrap_err().to_string();
        assert!(
            e.contains("static_inputs.exclude") && e.contains("conformer.*"),
            "{e}"
        );
    }

    #[test]
    fn decode_step_chains_stay_per_token_unless_asked() {
        let (layout, all) = chains(&[("encoder.layers.0", false), ("decoder.layers.0", true)]);
        let default = parse(&[]).unwrap();
        assert_eq!(default.record("static_inputs")["decoder"], json!(false));
        assert_eq!(
            chain_consumers(&layout, &all, &default).unwrap(),
            ["encoder.layers.0.fc2"]
        );
        let with_decoder = parse(&[("decoder", json!(true))]).unwrap();
        assert_eq!(
            chain_consumers(&layout, &all, &with_decoder).unwrap(),
            ["encoder.layers.0.fc2", "decoder.layers.0.fc2"]
        );
    }

    #[test]
    fn the_error_ratio_compares_the_static_quantize_with_the_per_token_one() {
        // Two rows a hundred times apart: one per-tensor scale costs the small row ~100² in
        // squared error, while per token each row has its own step.
        let rows: Vec<f32> = [1.0f32, 0.5, -0.25, 0.75]
            .iter()
            .chain([100.0f32, 50.0, -25.0, 75.0].iter())
            .copied()
            .collect();
        let mut h = AbsHistogram::default();
        h.add_rows(&rows, 4, None, None, Some(QuantDtype::Int8));
        let minmax = parse(&[("observer", json!("minmax"))]).unwrap();
        let s = static_input("l", &h, &minmax, QuantDtype::Int8).unwrap();
        let ratio = s.error_vs_per_token.unwrap();
        assert!(ratio > 1.5 && ratio < 2.5, "{ratio}");
        // Per token: each row's step is its max / 127, so the error is Σ_rows 4 · step² / 12.
        let expected = 4.0 * ((1.0f64 / 127.0).powi(2) + (100.0f64 / 127.0).powi(2)) / 12.0;
        assert!((h.per_token_error() / expected - 1.0).abs() < 1e-6);
        // Equal rows: the static and per-token quantizes agree up to the bin resolution.
        let mut same = AbsHistogram::default();
        let twice: Vec<f32> = rows[4..].iter().chain(&rows[4..]).copied().collect();
        same.add_rows(&twice, 4, None, None, Some(QuantDtype::Int8));
        let s = static_input("l", &same, &minmax, QuantDtype::Int8).unwrap();
        assert!((s.error_vs_per_token.unwrap() - 1.0).abs() < 0.05, "{s:?}");
        // Without the per-token measurement there is no ratio (convolutions).
        let mut plain = AbsHistogram::default();
        plain.add_rows(&rows, 4, None, None, None);
        let s = static_input("l", &plain, &minmax, QuantDtype::Int8).unwrap();
        assert_eq!(s.error_vs_per_token, None);
        assert!(s.relative_error > 0.0);
    }

    #[test]
    fn the_scale_is_the_clip_over_q_with_the_amax_floor() {
        let mut h = AbsHistogram::default();
        h.add_rows(&[0.5, -2.0, 1.0], 1, None, None, None);
        let s = static_input("l", &h, &parse(&[]).unwrap(), QuantDtype::Int8).unwrap();
        assert!(s.clip > 0.0 && s.clip <= 2.0);
        assert_eq!(s.input_scale, s.clip / 127.0);
        let s = static_input(
            "l",
            &h,
            &parse(&[("observer", json!("minmax"))]).unwrap(),
            QuantDtype::Float8E4m3fn,
        )
        .unwrap();
        assert_eq!(
            (s.clip, s.clip_to_max, s.input_scale),
            (2.0, 1.0, 2.0 / 448.0)
        );
        let mut zeros = AbsHistogram::default();
        zeros.add_rows(&[0.0; 4], 1, None, None, None);
        let s = static_input("l", &zeros, &parse(&[]).unwrap(), QuantDtype::Int8).unwrap();
        assert_eq!(s.input_scale, numerics::AMAX_FLOOR / 127.0);
        let e = static_input(
            "enc.fc2",
            &AbsHistogram::default(),
            &parse(&[]).unwrap(),
            QuantDtype::Int8,
        )
        .unwrap_err();
        assert!(e.to_string().contains("enc.fc2"), "{e}");
    }
}
