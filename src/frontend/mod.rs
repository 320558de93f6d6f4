//! Audio frontends: decoding audio files to mono samples, and the feature extractors that turn
//! samples into what a model's encoder takes.
//!
//! - [`audio`]: WAV (hound), FLAC, Ogg Vorbis and MP3 (symphonia) to mono `f32` in \[-1, 1\]. A
//!   sample rate other than the model's is an error; nothing is resampled.
//! - [`whisper_logmel`]: OpenAI Whisper's log-mel spectrogram, bit for bit what
//!   `whisper.transcribe()` feeds the model (within float rounding).
//!
//! `docs/frontend.md` states the exact definitions and the choices made.

pub mod audio;
pub mod whisper_logmel;

pub use audio::{decode_audio, read_audio, Audio};
pub use whisper_logmel::{slaney_mel_filters, LogMel, Padding, WhisperFrontend};
