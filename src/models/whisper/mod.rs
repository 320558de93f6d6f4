//! OpenAI Whisper (encoder-decoder), as OASR names and lays out its modules.

mod config;
mod layout;

pub use config::WhisperConfig;
pub use layout::{expected_tensors, quantization_layout};

/// The architecture's registry key in `oasr_config.json`.
pub const ARCHITECTURE: &str = "whisper";
