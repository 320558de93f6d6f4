//! OpenAI Whisper (encoder-decoder), as OASR names and lays out its modules.

mod config;
pub mod decoding;
pub mod forward;
mod layout;

pub use config::{ConfigFault, WhisperConfig, ENCODER_POSITIONS, MEL_BINS};
pub use decoding::{
    decode_with_fallback, greedy, teacher_forced, teacher_forced_from, token_limit, Decoded,
    DecodingRules, Fallback, WhisperTokenizer,
};
pub use forward::{FullPrecision, Linear, LinearExec, Whisper};
pub use layout::{expected_tensors, quantization_layout};

/// The architecture's registry key in `oasr_config.json`.
pub const ARCHITECTURE: &str = "whisper";
