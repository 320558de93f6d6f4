use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whisper's `model_config` in `oasr_config.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhisperConfig {
    pub model_type: String,
    pub vocab_size: usize,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub decoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_ffn_dim: usize,
    pub num_mel_bins: usize,
    pub max_source_positions: usize,
    pub max_target_positions: usize,
    pub activation_function: String,
    pub decoder_start_token_id: u32,
    pub eos_token_id: u32,
    /// (position, token) pairs forced after the start token; a null token is chosen at run time
    /// (the language of a multilingual model).
    pub forced_decoder_ids: Vec<(usize, Option<u32>)>,
    pub suppress_tokens: Vec<u32>,
    pub begin_suppress_tokens: Vec<u32>,
    pub task_token_ids: BTreeMap<String, u32>,
    pub language_token_ids: Vec<u32>,
    pub alignment_heads: Vec<(u32, u32)>,
}

impl WhisperConfig {
    /// English-only checkpoints have a 51864-token vocabulary; multilingual ones more.
    pub fn is_multilingual(&self) -> bool {
        self.vocab_size >= 51865
    }
}

/// A `model_config` value the forward cannot run: the key at fault (as named in
/// [`WhisperConfig`]) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFault {
    pub key: &'static str,
    pub message: String,
}

/// The encoder positions Whisper's 30 s window needs (3000 frames, halved by conv2's stride).
pub const ENCODER_POSITIONS: usize = 1500;

/// The mel band counts the Whisper frontend computes.
pub const MEL_BINS: [usize; 2] = [80, 128];

impl WhisperConfig {
    /// Checks every value against the others and against what the forward implements: positive
    /// sizes, head counts that divide `d_model`, the GELU activation, 80 or 128 mel bands, enough
    /// positions for the 30 s window and the prompt, and every token id inside the vocabulary
    /// and every alignment head inside the decoder. Returns the first key at fault.
    pub fn check(&self) -> Result<(), ConfigFault> {
        let fault = |key: &'static str, message: String| Err(ConfigFault { key, message });
        if self.model_type != "whisper" {
            return fault(
                "model_type",
                format!("is {:?}; expected \"whisper\"", self.model_type),
            );
        }
        for (key, value) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("max_target_positions", self.max_target_positions),
        ] {
            if value == 0 {
                return fault(key, "is 0; it must be positive".into());
            }
        }
        for (key, heads) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            if !self.d_model.is_multiple_of(heads) {
                return fault(
                    key,
                    format!("{heads} heads do not divide d_model {}", self.d_model),
                );
            }
        }
        if !MEL_BINS.contains(&self.num_mel_bins) {
            return fault(
                "num_mel_bins",
                format!(
                    "is {}; the Whisper frontend computes 80 or 128 mel bands",
                    self.num_mel_bins
                ),
            );
        }
        if self.max_source_positions < ENCODER_POSITIONS {
            return fault(
                "max_source_positions",
                format!(
                    "is {}; Whisper's 30 s window needs {ENCODER_POSITIONS} encoder positions",
                    self.max_source_positions
                ),
            );
        }
        if self.activation_function != "gelu" {
            return fault(
                "activation_function",
                format!(
                    "is {:?}; the forward implements Whisper's exact-erf \"gelu\" only",
                    self.activation_function
                ),
            );
        }
        let vocab = self.vocab_size;
        let in_vocab = |key: &'static str, id: u32| -> Result<(), ConfigFault> {
            if (id as usize) < vocab {
                Ok(())
            } else {
                fault(
                    key,
                    format!("token id {id} is outside the vocabulary of {vocab}"),
                )
            }
        };
        in_vocab("decoder_start_token_id", self.decoder_start_token_id)?;
        in_vocab("eos_token_id", self.eos_token_id)?;
        for id in &self.suppress_tokens {
            in_vocab("suppress_tokens", *id)?;
        }
        for id in &self.begin_suppress_tokens {
            in_vocab("begin_suppress_tokens", *id)?;
        }
        for id in self.task_token_ids.values() {
            in_vocab("task_token_ids", *id)?;
        }
        for id in &self.language_token_ids {
            in_vocab("language_token_ids", *id)?;
        }
        // The prompt: start-of-transcript at 0, then the forced ids at 1, 2, ... in order.
        let mut positions: Vec<usize> = self.forced_decoder_ids.iter().map(|f| f.0).collect();
        positions.sort_unstable();
        if positions.iter().enumerate().any(|(i, p)| *p != i + 1) {
            return fault(
                "forced_decoder_ids",
                format!("positions {positions:?} are not 1, 2, ... without gaps"),
            );
        }
        for (_, token) in &self.forced_decoder_ids {
            if let Some(id) = token {
                in_vocab("forced_decoder_ids", *id)?;
            }
        }
        let prompt = 1 + self.forced_decoder_ids.len();
        if self.max_target_positions <= prompt {
            return fault(
                "max_target_positions",
                format!(
                    "is {}; the decoder needs room for the {prompt}-token prompt and a token",
                    self.max_target_positions
                ),
            );
        }
        for (layer, head) in &self.alignment_heads {
            if *layer as usize >= self.decoder_layers
                || *head as usize >= self.decoder_attention_heads
            {
                return fault(
                    "alignment_heads",
                    format!(
                        "[{layer}, {head}] is outside the decoder's {} layers of {} heads",
                        self.decoder_layers, self.decoder_attention_heads
                    ),
                );
            }
        }
        Ok(())
    }
}
