//! Audio frontends: decoding audio files to mono samples, and the feature extractors that turn
//! samples into what a model's encoder takes.
//!
//! - [`audio`]: WAV (hound), FLAC, Ogg Vorbis and MP3 (symphonia) to mono `f32` in \[-1, 1\]. A
//!   sample rate other than the model's is an error; nothing is resampled.
//! - [`whisper_logmel`]: OpenAI Whisper's log-mel spectrogram, bit for bit what
//!   `whisper.transcribe()` feeds the model (within float rounding).
//! - [`kaldi_fbank`]: Kaldi's log mel filter bank as WeNet computes it
//!   (`torchaudio.compliance.kaldi.fbank` with WeNet's options), and [`cmvn`]: WeNet's global
//!   CMVN of those features.
//!
//! [`Frontend::from_spec`] picks the extractor a checkpoint's `features.kind` names.
//! `docs/frontend.md` states the exact definitions and the choices made.

pub mod audio;
pub mod cmvn;
pub mod kaldi_fbank;
pub mod whisper_logmel;

pub use audio::{decode_audio, read_audio, Audio};
pub use cmvn::GlobalCmvn;
pub use kaldi_fbank::{Fbank, KaldiFbank};
pub use whisper_logmel::{slaney_mel_filters, LogMel, Padding, WhisperFrontend};

use crate::checkpoint::FeatureSpec;
use crate::error::{Error, Result};

/// The `features.kind` of Whisper's log-mel spectrogram.
pub const WHISPER_LOGMEL: &str = "whisper_logmel";
/// The `features.kind` of Kaldi's fbank as WeNet computes it.
pub const KALDI_FBANK: &str = "kaldi_fbank";

/// A feature extractor, chosen by a checkpoint's `features.kind`.
#[derive(Clone, Debug)]
pub enum Frontend {
    /// Whisper's log-mel spectrogram of a 30 s window, `feature_dim` mel bands.
    WhisperLogMel(WhisperFrontend),
    /// Kaldi's log mel filter bank with WeNet's options, `feature_dim` mel bins.
    KaldiFbank(KaldiFbank),
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
            KALDI_FBANK => {
                check_kaldi_fbank_spec(spec)?;
                Ok(Frontend::KaldiFbank(KaldiFbank::new(
                    spec.feature_dim as usize,
                )?))
            }
            other => Err(Error::NotImplemented {
                what: format!("the frontend `features.kind` = {other:?}"),
                detail: format!("this version computes `{WHISPER_LOGMEL}` and `{KALDI_FBANK}`"),
            }),
        }
    }
}

/// Checks that a `kaldi_fbank` spec asks for what [`KaldiFbank`] computes: WeNet's options.
/// Anything else is refused by field and value, since the encoder would get features it was
/// not trained on. `normalize` is not the frontend's: the model applies its CMVN
/// ([`GlobalCmvn`]) to the features.
fn check_kaldi_fbank_spec(spec: &FeatureSpec) -> Result<()> {
    use kaldi_fbank as kf;
    let refuse = |field: &str, value: String, computed: String| {
        Err(Error::NotImplemented {
            what: format!("`features.{field}` = {value} for `{KALDI_FBANK}` features"),
            detail: format!("this version computes Kaldi fbank with {field} {computed} only"),
        })
    };
    if spec.sample_rate != kf::SAMPLE_RATE {
        return refuse(
            "sample_rate",
            spec.sample_rate.to_string(),
            kf::SAMPLE_RATE.to_string(),
        );
    }
    if spec.feature_dim == 0 {
        return refuse("feature_dim", "0".into(), "> 0".into());
    }
    let ms = |samples: usize| samples as f64 * 1e3 / f64::from(kf::SAMPLE_RATE);
    if spec.frame_length_ms != ms(kf::FRAME_LENGTH) {
        return refuse(
            "frame_length_ms",
            spec.frame_length_ms.to_string(),
            ms(kf::FRAME_LENGTH).to_string(),
        );
    }
    if spec.frame_shift_ms != ms(kf::FRAME_SHIFT) {
        return refuse(
            "frame_shift_ms",
            spec.frame_shift_ms.to_string(),
            ms(kf::FRAME_SHIFT).to_string(),
        );
    }
    if spec.dither != 0.0 {
        return refuse("dither", spec.dither.to_string(), "0".into());
    }
    if spec.window_type != "povey" {
        return refuse(
            "window_type",
            format!("{:?}", spec.window_type),
            "\"povey\"".into(),
        );
    }
    if spec.audio_scale != f64::from(kf::AUDIO_SCALE) {
        return refuse(
            "audio_scale",
            spec.audio_scale.to_string(),
            kf::AUDIO_SCALE.to_string(),
        );
    }
    if spec.preemphasis != Some(kf::PREEMPHASIS) {
        let value = spec
            .preemphasis
            .map_or_else(|| "null".to_string(), |p| p.to_string());
        return refuse("preemphasis", value, kf::PREEMPHASIS.to_string());
    }
    for (field, value) in [("lfr_m", spec.lfr_m), ("lfr_n", spec.lfr_n)] {
        if value != 1 {
            return refuse(
                field,
                value.to_string(),
                "1 (no low frame rate stacking)".into(),
            );
        }
    }
    if let Some(seconds) = spec.window_seconds {
        return refuse(
            "window_seconds",
            seconds.to_string(),
            "null (features of the whole clip, no fixed window)".into(),
        );
    }
    Ok(())
}
