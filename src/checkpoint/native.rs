//! `oasr_config.json`, the OASR native checkpoint's description (format versions 1 and 2).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::QuantizationSpec;

pub const CONFIG_FILE: &str = "oasr_config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const REPORT_FILE: &str = "quantization_report.json";
pub const TOKENIZER_DIR: &str = "tokenizer";
/// Version 2, optional, diagnostic only (never read by the server): the SmoothQuant factors of
/// every smoothing group whose 1/s was folded into another module (docs/format.md).
pub const SMOOTHING_FACTORS_FILE: &str = "smoothing_factors.safetensors";

/// The tokenizer assets, with paths relative to the checkpoint directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizerSpec {
    pub kind: String,
    pub files: BTreeMap<String, String>,
    pub options: serde_json::Value,
}

/// How the serving engine computes the model's input features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureSpec {
    pub kind: String,
    pub sample_rate: u32,
    pub feature_dim: u32,
    pub frame_length_ms: f64,
    pub frame_shift_ms: f64,
    pub dither: f64,
    pub lfr_m: u32,
    pub lfr_n: u32,
    pub window_type: String,
    pub normalize: Option<serde_json::Value>,
    pub audio_scale: f64,
    pub window_seconds: Option<f64>,
    pub preemphasis: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodingSpec {
    pub default_decode_type: String,
    pub blank_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub sos_id: Option<u32>,
    pub eos_id: Option<u32>,
}

/// The whole `oasr_config.json`. `quantization` is present exactly when `format_version` is 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NativeConfig {
    pub format_version: u32,
    pub architecture: String,
    pub model_config: serde_json::Value,
    pub aux: serde_json::Value,
    pub tokenizer: Option<TokenizerSpec>,
    pub features: Option<FeatureSpec>,
    pub decoding: DecodingSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantizationSpec>,
}

impl NativeConfig {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let config: NativeConfig = serde_json::from_str(&text)
            .map_err(|e| Error::corrupt(path, format!("invalid oasr_config.json: {e}")))?;
        match (config.format_version, &config.quantization) {
            (1, None) => {}
            (2, Some(spec)) => spec
                .validate()
                .map_err(|e| Error::corrupt(path, e.to_string()))?,
            (1, Some(_)) => {
                return Err(Error::corrupt(
                    path,
                    "format_version 1 must not carry a `quantization` object",
                ))
            }
            (2, None) => {
                return Err(Error::corrupt(
                    path,
                    "format_version 2 requires a `quantization` object",
                ))
            }
            (v, _) => {
                return Err(Error::corrupt(
                    path,
                    format!("format_version {v} is not supported (expected 1 or 2)"),
                ))
            }
        }
        Ok(config)
    }

    /// The JSON text as written: indent 2, trailing newline, keys in a fixed order.
    pub fn to_json(&self) -> String {
        // Serialising these plain data types cannot fail.
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}
