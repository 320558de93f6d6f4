use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{QuantDtype, Scheme, SchemeArgs};
use crate::error::{Error, Result};
use crate::numerics::Activation;

/// The kinds of layer a recipe can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleKind {
    Linear,
    PointwiseConv,
    Conv1d,
    Conv2d,
}

impl ModuleKind {
    pub const ALL: [ModuleKind; 4] = [
        ModuleKind::Linear,
        ModuleKind::PointwiseConv,
        ModuleKind::Conv1d,
        ModuleKind::Conv2d,
    ];
    /// The recipe default: every GEMM.
    pub const DEFAULT: [ModuleKind; 2] = [ModuleKind::Linear, ModuleKind::PointwiseConv];

    pub fn name(self) -> &'static str {
        match self {
            ModuleKind::Linear => "linear",
            ModuleKind::PointwiseConv => "pointwise_conv",
            ModuleKind::Conv1d => "conv1d",
            ModuleKind::Conv2d => "conv2d",
        }
    }

    /// A convolution with a kernel wider than one tap (not a GEMM in disguise).
    pub fn is_spatial_conv(self) -> bool {
        matches!(self, ModuleKind::Conv1d | ModuleKind::Conv2d)
    }

    /// Parses a `--module-types` list: kind names plus `conv` (every conv kind) and `all`.
    pub fn parse_list(list: &str) -> Result<Vec<ModuleKind>> {
        let mut kinds = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "all" => kinds.extend(ModuleKind::ALL),
                "conv" => kinds.extend([
                    ModuleKind::PointwiseConv,
                    ModuleKind::Conv1d,
                    ModuleKind::Conv2d,
                ]),
                name => match ModuleKind::ALL.into_iter().find(|k| k.name() == name) {
                    Some(kind) => kinds.push(kind),
                    None => {
                        return Err(Error::option(
                            "--module-types",
                            format!(
                                "unknown module type `{name}`; expected linear, pointwise_conv, \
                                 conv1d, conv2d, conv or all"
                            ),
                        ))
                    }
                },
            }
        }
        if kinds.is_empty() {
            return Err(Error::option("--module-types", "the list is empty"));
        }
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }
}

/// Where the inverse SmoothQuant factor 1/s of a layer's input went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmoothFold {
    /// Not smoothed.
    None,
    /// Into the preceding LayerNorm's gamma and beta.
    NormAffine,
    /// Into the rows (and bias) of the attention's V projection.
    VToO,
    /// Into the rows (and bias) of the previous GEMM, across a ReLU.
    ProducerRows,
    /// Stored as `smooth_inv` on the layer and applied when its input is quantized.
    Runtime,
}

/// One quantized layer of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    pub scheme: Scheme,
    pub kind: ModuleKind,
    pub smooth: SmoothFold,
    /// The module that absorbed 1/s (a norm or producer GEMM), if any.
    pub smoothed_into: Option<String>,
    /// The fused norm or GEMM-chain producer that emits this layer's 8-bit input, if any.
    pub input_quantized_by: Option<String>,
}

/// A norm that emits the 8-bit input of its consumers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FusedNorm {
    pub norm: String,
    pub consumers: Vec<String>,
    pub dtype: QuantDtype,
}

/// A producer GEMM that emits its output as 8-bit at its consumer's static input scale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmChain {
    pub producer: String,
    pub consumer: String,
    pub dtype: QuantDtype,
    /// The activation between them, which the producer's epilogue applies before it quantizes.
    /// Omitted when it is GELU (Whisper's, and every chain written before the field existed).
    #[serde(default = "gelu", skip_serializing_if = "is_gelu")]
    pub activation: Activation,
}

fn gelu() -> Activation {
    Activation::Gelu
}

fn is_gelu(a: &Activation) -> bool {
    *a == Activation::Gelu
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    pub fused_norms: Vec<FusedNorm>,
    pub gemm_chains: Vec<GemmChain>,
}

/// One algorithm as the recipe ran it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlgorithmRecord {
    pub name: String,
    pub options: BTreeMap<String, serde_json::Value>,
}

/// What calibration audio was used, by hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationRecord {
    pub manifest_sha256: String,
    pub audio_sha256: String,
    pub utterances_total: usize,
    pub utterances_used: usize,
    pub selection: String,
    pub dtype: String,
    pub sample_rate: u32,
    /// The search options calibration decoded with (the architecture's effective ones; absent
    /// for a search without options, such as Whisper's greedy decoding).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decoding: BTreeMap<String, serde_json::Value>,
}

/// The checkpoint the output was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRecord {
    pub format: String,
    /// File name (relative to the source directory) to sha256.
    pub files: BTreeMap<String, String>,
}

/// Provenance: what made the checkpoint, from what. No timestamps, so that the same inputs give a
/// byte-identical output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerRecord {
    pub name: String,
    pub version: String,
    pub recipe: String,
    pub algorithms: Vec<AlgorithmRecord>,
    pub calibration: Option<CalibrationRecord>,
    pub source: SourceRecord,
    /// Layer to the reason it was left full precision.
    pub skipped: BTreeMap<String, String>,
    /// sha256 of the checkpoint's `model.safetensors`, as written.
    pub fingerprint: String,
}

/// The `quantization` object of `oasr_config.json` (format version 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantizationSpec {
    /// Preset name to its arguments; exactly the presets the layers use.
    pub schemes: BTreeMap<String, SchemeArgs>,
    /// `null` or `"fp8_e4m3"`; recorded only, the server scales the cache at run time.
    pub kv_cache: Option<String>,
    pub module_types: Vec<ModuleKind>,
    /// Module path to layer; every quantized layer and nothing else.
    pub layers: BTreeMap<String, LayerSpec>,
    pub links: Links,
    pub producer: ProducerRecord,
}

impl QuantizationSpec {
    /// Checks the spec's internal consistency: presets match their names, every layer's scheme is
    /// listed, links name quantized layers.
    pub fn validate(&self) -> Result<()> {
        for (name, args) in &self.schemes {
            let preset = Scheme::from_name(name)?;
            args.validate(name)?;
            if *args != preset.args() {
                return Err(Error::Scheme {
                    name: name.clone(),
                    message: "its arguments differ from the preset of that name".into(),
                });
            }
        }
        for (layer, spec) in &self.layers {
            if !self.schemes.contains_key(spec.scheme.name()) {
                return Err(Error::LayerRefused {
                    layer: layer.clone(),
                    reason: format!(
                        "uses scheme `{}`, which `schemes` does not list",
                        spec.scheme.name()
                    ),
                });
            }
            if spec.kind.is_spatial_conv() && spec.scheme != Scheme::Int8W8a8Static {
                return Err(Error::LayerRefused {
                    layer: layer.clone(),
                    reason: "a convolution must use int8_w8a8_static".into(),
                });
            }
        }
        if let Some(kv) = &self.kv_cache {
            if kv != "fp8_e4m3" {
                return Err(Error::option(
                    "kv_cache",
                    format!("unknown kv cache format `{kv}`; expected null or \"fp8_e4m3\""),
                ));
            }
        }
        let known = |name: &str| self.layers.contains_key(name);
        for chain in &self.links.gemm_chains {
            for layer in [&chain.producer, &chain.consumer] {
                if !known(layer) {
                    return Err(Error::LayerRefused {
                        layer: layer.clone(),
                        reason: "named by a GEMM chain but not quantized".into(),
                    });
                }
            }
        }
        // The arming rules (docs/format.md), and `input_quantized_by` naming exactly the link.
        let mut fed_by: BTreeMap<&str, &str> = BTreeMap::new();
        for norm in &self.links.fused_norms {
            for consumer in &norm.consumers {
                let refuse = |reason: String| {
                    Err(Error::LayerRefused {
                        layer: consumer.clone(),
                        reason,
                    })
                };
                let Some(spec) = self.layers.get(consumer) else {
                    return refuse(format!(
                        "consumer of fused norm `{}` but not quantized",
                        norm.norm
                    ));
                };
                if spec.scheme.is_static()
                    || spec.smooth == SmoothFold::Runtime
                    || spec.scheme.dtype() != norm.dtype
                {
                    return refuse(format!(
                        "fused norm `{}` emits per-token {} input, but this layer is {} with smooth {:?}",
                        norm.norm,
                        norm.dtype,
                        spec.scheme.name(),
                        spec.smooth
                    ));
                }
                if fed_by.insert(consumer, &norm.norm).is_some() {
                    return refuse("its input is emitted by two links".into());
                }
            }
        }
        for chain in &self.links.gemm_chains {
            let (p, c) = (&self.layers[&chain.producer], &self.layers[&chain.consumer]);
            if !c.scheme.is_static()
                || c.scheme.dtype() != chain.dtype
                || p.scheme.dtype() != chain.dtype
            {
                return Err(Error::LayerRefused {
                    layer: chain.consumer.clone(),
                    reason: format!(
                        "a {} GEMM chain from `{}` needs both ends in {} and a static consumer; \
                         found producer {} and consumer {}",
                        chain.dtype,
                        chain.producer,
                        chain.dtype,
                        p.scheme.name(),
                        c.scheme.name()
                    ),
                });
            }
            if fed_by.insert(&chain.consumer, &chain.producer).is_some() {
                return Err(Error::LayerRefused {
                    layer: chain.consumer.clone(),
                    reason: "its input is emitted by two links".into(),
                });
            }
        }
        for (layer, spec) in &self.layers {
            if spec.input_quantized_by.as_deref() != fed_by.get(layer.as_str()).copied() {
                return Err(Error::LayerRefused {
                    layer: layer.clone(),
                    reason: format!(
                        "input_quantized_by is {:?} but the links say {:?}",
                        spec.input_quantized_by,
                        fed_by.get(layer.as_str())
                    ),
                });
            }
        }
        Ok(())
    }
}
