//! The WeNet U2++ Conformer (a CTC head and an attention-rescoring decoder), as OASR names and
//! lays out its modules: the WeNet importer, the fp32 forward, WeNet's searches, and the model
//! behind the seam (docs/conformer.md).

mod asr;
mod config;
mod forward;
mod import;
mod layout;
mod search;

pub use asr::ConformerAsr;
pub use config::{ConformerConfig, MODEL_TYPE, VOCAB_ALIGN};
pub use forward::Conformer;
pub use import::{FINAL_PT, GLOBAL_CMVN, PADDING_LOGIT, TRAIN_YAML, UNITS};
pub use layout::{decoder_prefixes, expected_tensors, quantization_layout};
pub use search::{
    ctc_greedy, ctc_log_likelihood, ctc_prefix_beam_search, decoder_score, rescored,
    RescoringOptions,
};

use super::registry::{Architecture, SourceKind};

/// The architecture's registry key in `oasr_config.json`.
pub const NAME: &str = "u2pp_conformer";

/// The source-format name provenance records for a WeNet model directory.
pub const WENET: &str = "wenet";

/// The Conformer in the architecture registry.
pub static ARCHITECTURE: Architecture = Architecture {
    name: NAME,
    sources: &[SourceKind {
        name: WENET,
        described: "train.yaml + final.pt (WeNet U2++ Conformer)",
        detect: import::detect,
        import: import::import,
    }],
    open_native: import::open_native,
    layout: import::layout,
    load: asr::load,
    hf: None,
};
