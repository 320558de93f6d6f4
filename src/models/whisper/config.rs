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
