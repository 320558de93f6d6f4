//! Audio frontends: decoding audio files to mono samples, and the feature extractors that turn
//! samples into what a model's encoder takes.
//!
//! - [`audio`]: WAV (hound), FLAC, Ogg Vorbis and MP3 (symphonia) to mono `f32` in \[-1, 1\]. A
//!   sample rate other than the model's is an error; nothing is resampled.
//! - [`whisper_logmel`]: OpenAI Whisper's log-mel spectrogram, bit for bit what
//!   `whisper.transcribe()` feeds the model (within float rounding).
//!
//! [`Frontend::from_spec`] picks the extractor a checkpoint's `features.kind` names.
//! `docs/frontend.md` states the exact definitions and the choices made.

pub mod audio;
pub mod whisper_logmel;

pub use audio::{decode_audio, read_audio, Audio};
pub use whisper_logmel::{slaney_mel_filters, LogMel, Padding, WhisperFrontend};

use crate::checkpoint::FeatureSpec;
use crate::error::{Error, Result};

/// The `features.kind` of Whisper's log-mel spectrogram.
pub const WHISPER_LOGMEL: &str = "whisper_logmel";

/// A feature extractor, chosen by a checkpoint's `features.kind`.
#[derive(Clone, Debug)]
pub enum Frontend {
    /// Whisper's log-mel spectrogram of a 30 s window, `feature_dim` mel bands.
    WhisperLogMel(WhisperFrontend),
}

impl Frontend {
    /// The frontend `spec.kind` names, set up for `spec`. A kind this version does not compute
    /// is refused by name: running an encoder on another frontend's features would be silently
    /// wrong.
    pub fn from_spec(spec: &FeatureSpec) -> Result<Self> {
        match spec.kind.as_str() {
            WHISPER_LOGMEL => Ok(Frontend::WhisperLogMel(WhisperFrontend::new(
                spec.feature_dim as usize,
            )?)),
            other => Err(Error::NotImplemented {
                what: format!("the frontend `features.kind` = {other:?}"),
                detail: format!("this version computes `{WHISPER_LOGMEL}`"),
            }),
        }
    }
}
