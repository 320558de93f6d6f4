//! The U2++ Conformer's `model_config` in `oasr_config.json`, and how it is read from WeNet's
//! `train.yaml`.

use serde::{Deserialize, Serialize};

/// The architecture's geometry and decoding weights, as `oasr_config.json` stores them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConformerConfig {
    /// Always `"u2pp_conformer"`.
    pub model_type: String,
    /// Feature dimension (mel bins) the encoder takes.
    pub input_dim: usize,
    /// Output units (`units.txt`), before the CTC head and the decoders' output layers are
    /// padded to a multiple of 8.
    pub vocab_size: usize,
    /// The encoder's width (`encoder_conf.output_size`).
    pub d_model: usize,
    pub encoder_blocks: usize,
    pub encoder_heads: usize,
    pub encoder_linear_units: usize,
    pub cnn_module_kernel: usize,
    /// A causal convolution module (left padding of kernel − 1 before `pointwise_conv1`).
    pub causal: bool,
    /// `"layer_norm"` or `"batch_norm"` after the depthwise convolution.
    pub cnn_module_norm: String,
    /// `"bitransformer"` (left and right decoders) or `"transformer"` (left only).
    pub decoder_type: String,
    pub decoder_heads: usize,
    pub decoder_linear_units: usize,
    pub decoder_left_blocks: usize,
    /// 0 for a `"transformer"` decoder.
    pub decoder_right_blocks: usize,
}

/// The value of `model_type`.
pub const MODEL_TYPE: &str = "u2pp_conformer";

/// The multiple the CTC head and the decoders' output layers are padded to.
pub const VOCAB_ALIGN: usize = 8;

/// Kernel and stride of each of the two subsampling convolutions (Conv2dSubsampling4).
pub const SUBSAMPLING_KERNEL: usize = 3;

/// A `model_config` value the forward cannot run: the key at fault and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFault {
    pub key: &'static str,
    pub message: String,
}

impl ConformerConfig {
    /// The CTC head's and the output layers' row count: `vocab_size` rounded up to
    /// [`VOCAB_ALIGN`].
    pub fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(VOCAB_ALIGN) * VOCAB_ALIGN
    }

    /// The frequency bins after Conv2dSubsampling4: two 3x3 convolutions of stride 2 without
    /// padding, `((input_dim − 1) / 2 − 1) / 2`.
    pub fn subsampled_bins(&self) -> usize {
        (self.input_dim.saturating_sub(1) / 2).saturating_sub(1) / 2
    }

    /// The width of one attention head in the encoder.
    pub fn encoder_head_dim(&self) -> usize {
        self.d_model / self.encoder_heads.max(1)
    }

    /// Whether the model has a right-to-left decoder.
    pub fn has_right_decoder(&self) -> bool {
        self.decoder_right_blocks > 0
    }

    /// Checks every value against the others and against what this version implements.
    pub fn check(&self) -> Result<(), ConfigFault> {
        let fault = |key: &'static str, message: String| Err(ConfigFault { key, message });
        if self.model_type != MODEL_TYPE {
            return fault(
                "model_type",
                format!("is {:?}; expected {MODEL_TYPE:?}", self.model_type),
            );
        }
        for (key, v) in [
            ("input_dim", self.input_dim),
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("encoder_blocks", self.encoder_blocks),
            ("encoder_heads", self.encoder_heads),
            ("encoder_linear_units", self.encoder_linear_units),
            ("cnn_module_kernel", self.cnn_module_kernel),
            ("decoder_heads", self.decoder_heads),
            ("decoder_linear_units", self.decoder_linear_units),
            ("decoder_left_blocks", self.decoder_left_blocks),
        ] {
            if v == 0 {
                return fault(key, "must be positive".into());
            }
            if v > 1 << 20 {
                return fault(key, format!("{v} is not a plausible size"));
            }
        }
        if !self.d_model.is_multiple_of(self.encoder_heads) {
            return fault(
                "encoder_heads",
                format!(
                    "{} heads do not divide d_model {}",
                    self.encoder_heads, self.d_model
                ),
            );
        }
        if !self.d_model.is_multiple_of(self.decoder_heads) {
            return fault(
                "decoder_heads",
                format!(
                    "{} heads do not divide d_model {}",
                    self.decoder_heads, self.d_model
                ),
            );
        }
        if self.subsampled_bins() == 0 {
            return fault(
                "input_dim",
                format!(
                    "{} feature bins leave nothing after the 4x subsampling",
                    self.input_dim
                ),
            );
        }
        if !self.causal && self.cnn_module_kernel.is_multiple_of(2) {
            return fault(
                "cnn_module_kernel",
                format!(
                    "a non-causal convolution module needs an odd kernel, not {}",
                    self.cnn_module_kernel
                ),
            );
        }
        if !matches!(self.cnn_module_norm.as_str(), "layer_norm" | "batch_norm") {
            return fault(
                "cnn_module_norm",
                format!(
                    "is {:?}; expected \"layer_norm\" or \"batch_norm\"",
                    self.cnn_module_norm
                ),
            );
        }
        match (self.decoder_type.as_str(), self.decoder_right_blocks) {
            ("bitransformer", 0) => {
                return fault(
                    "decoder_right_blocks",
                    "a bitransformer decoder needs at least one right-to-left block".into(),
                )
            }
            ("transformer", n) if n > 0 => {
                return fault(
                    "decoder_right_blocks",
                    format!("a transformer decoder has no right-to-left blocks, not {n}"),
                )
            }
            ("bitransformer" | "transformer", _) => {}
            (other, _) => {
                return fault(
                    "decoder_type",
                    format!("is {other:?}; expected \"bitransformer\" or \"transformer\""),
                )
            }
        }
        Ok(())
    }
}
