//! OpenAI Whisper (encoder-decoder), as OASR names and lays out its modules.

mod asr;
mod config;
pub mod decoding;
pub mod forward;
mod hf_export;
mod import;
mod import_ct;
mod layout;

use super::registry::{Architecture, SourceKind};

pub use asr::WhisperAsr;
pub use config::{ConfigFault, WhisperConfig, ENCODER_POSITIONS, MEL_BINS};
pub use decoding::{
    decode_with_fallback, greedy, teacher_forced, teacher_forced_from, token_limit, Decoded,
    DecodingRules, Fallback, WhisperTokenizer,
};
pub use forward::Whisper;
pub use layout::{expected_tensors, quantization_layout};

/// The architecture's registry key in `oasr_config.json`.
pub const NAME: &str = "whisper";

/// The source-format names provenance records.
pub const HF_WHISPER: &str = "hf_whisper";
pub const CT2_WHISPER: &str = "ctranslate2_whisper";
/// A Hugging Face Whisper with a compressed-tensors `quantization_config` (read as quantized).
pub const CT_WHISPER: &str = "compressed_tensors_whisper";

/// Whisper in the architecture registry.
pub static ARCHITECTURE: Architecture = Architecture {
    name: NAME,
    sources: &[
        SourceKind {
            name: HF_WHISPER,
            described:
                "config.json with model_type \"whisper\" + model.safetensors or its shards with model.safetensors.index.json (Hugging Face Whisper)",
            detect: import::detect_hf,
            import: import::import_hf,
        },
        SourceKind {
            name: CT2_WHISPER,
            described: "model.bin + config.json (CTranslate2 Whisper)",
            detect: import::detect_ct2,
            import: import::import_ct2,
        },
    ],
    open_native: import::open_native,
    layout: import::layout,
    load: asr::load,
    hf: Some(&hf_export::HF_LAYOUT),
};
