//! OpenAI Whisper's log-mel spectrogram, as `whisper/audio.py` and `whisper/transcribe.py`
//! (openai-whisper 20240930 and later) compute it.
//!
//! 16 kHz mono samples; STFT with `n_fft` 400, hop 160, a periodic Hann window, centred with
//! reflect padding of 200 on each side (`torch.stft(center=True)`); power spectrum; the last
//! frame dropped; Slaney mel filter bank (0–8 kHz, area normalised, librosa's
//! `mel(htk=False, norm="slaney")`); `log10(max(mel, 1e-10))`; floor at `max − 8`; `(x + 4) / 4`;
//! 3000 frames (30 s). How the audio is padded to 30 s, and so which frames the `max` runs over,
//! depends on the code path being imitated: see [`Padding`]. The default, [`Padding::Transcribe`],
//! is what `whisper.transcribe()` feeds the model.
//!
//! The STFT, the mel projection and the logarithm run in `f64`; the result is `f32`. Against an
//! independent numpy implementation with OpenAI's own `mel_filters.npz` the largest difference
//! is below 1e-5 (tests/frontend_logmel.rs).

use std::fmt;
use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use crate::error::{Error, Result};

/// Whisper's sample rate in Hz.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size (25 ms window).
pub const N_FFT: usize = 400;
/// Hop between frames (10 ms).
pub const HOP_LENGTH: usize = 160;
/// Samples in one 30 s window.
pub const N_SAMPLES: usize = 30 * SAMPLE_RATE as usize;
/// Frames in one 30 s window: what the encoder takes.
pub const N_FRAMES: usize = N_SAMPLES / HOP_LENGTH;
/// Frequency bins of the one-sided spectrum.
pub const N_FREQS: usize = N_FFT / 2 + 1;
/// The mel-band counts Whisper models use: 80, and 128 for large-v3.
pub const SUPPORTED_N_MELS: [usize; 2] = [80, 128];

/// Reflect padding on each side of the signal (`n_fft / 2`).
const PAD: usize = N_FFT / 2;
/// The clamp before the logarithm.
const MEL_CLAMP: f64 = 1e-10;

/// How the audio is brought to 30 s before (or after) the spectrogram, i.e. which of
/// openai-whisper's code paths is reproduced. They differ in the padded frames and in the range
/// the `max − 8` floor is taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Padding {
    /// What `whisper.transcribe()` feeds the model for the first 30 s window (seek 0):
    /// `mel = log_mel_spectrogram(audio, padding=N_SAMPLES)` (30 s of zeros appended *before* the
    /// STFT, the floor taken over that whole padded spectrogram), then
    /// `pad_or_trim(mel[:, :min(3000, content_frames)], 3000)` with
    /// `content_frames = len(audio) // 160`. Frames past the content are therefore exactly 0.0
    /// (zero padding of the normalised log-mel), not the log-mel of silence. For audio longer
    /// than 30 s this is the first window, with the floor taken over the whole clip.
    #[default]
    Transcribe,
    /// What `transcribe()` gives `detect_language()` (multilingual models without a set
    /// language): the same padded spectrogram as [`Padding::Transcribe`] but
    /// `pad_or_trim(mel, 3000)`, i.e. its first 3000 frames, the trailing silence included.
    DetectLanguage,
    /// `log_mel_spectrogram(pad_or_trim(audio))`: the audio zero-padded or trimmed to 30 s first,
    /// the floor taken over those 3000 frames only. The whisper README's low-level example, and
    /// what Hugging Face's `WhisperFeatureExtractor` computes.
    PadOrTrimAudio,
}

/// A log-mel spectrogram: `n_mels` rows of `frames` values, row-major, like Whisper's
/// `(n_mels, 3000)` tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    /// Mel bands (rows).
    pub n_mels: usize,
    /// Frames (columns): always [`N_FRAMES`] (3000) from [`WhisperFrontend`].
    pub frames: usize,
    /// Frames computed from the audio itself, at most `frames`: `min(len(audio), 480000) / 160`.
    /// What lies beyond is padding (zeros under [`Padding::Transcribe`]).
    pub content_frames: usize,
    /// `[n_mels, frames]`, row-major: `data[mel * frames + frame]`.
    pub data: Vec<f32>,
}

impl LogMel {
    /// The values of one mel band over all frames.
    pub fn row(&self, mel: usize) -> &[f32] {
        &self.data[mel * self.frames..(mel + 1) * self.frames]
    }

    /// One value.
    pub fn at(&self, mel: usize, frame: usize) -> f32 {
        self.data[mel * self.frames + frame]
    }
}

/// Whisper's frontend, set up once and reused: the Hann window, the mel filter bank and the FFT
/// plan are computed in [`WhisperFrontend::new`]. It is `Send + Sync`; each call allocates its
/// scratch buffers once, never per frame.
#[derive(Clone)]
pub struct WhisperFrontend {
    n_mels: usize,
    /// Periodic Hann window, `N_FFT` values.
    window: Vec<f64>,
    /// Dense filter bank `[n_mels, N_FREQS]`, `f32` as librosa (and `mel_filters.npz`) has it.
    filters: Vec<f32>,
    /// The non-zero span of each filter: first bin and weights (as `f64`).
    bands: Vec<(usize, Vec<f64>)>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl fmt::Debug for WhisperFrontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WhisperFrontend")
            .field("n_mels", &self.n_mels)
            .field("n_fft", &N_FFT)
            .field("hop_length", &HOP_LENGTH)
            .finish_non_exhaustive()
    }
}

/// Scratch buffers for one call.
struct Scratch {
    frame: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
    fft: Vec<Complex<f64>>,
    power: Vec<f64>,
}

/// The signal the STFT sees: `audio` followed by zeros up to `len` samples, reflect-padded by
/// [`PAD`] on both sides (`len > PAD` always holds: it is at least 30 s).
struct Signal<'a> {
    audio: &'a [f32],
    len: usize,
}

impl Signal<'_> {
    /// Sample `p` of the reflect-padded signal (`p` in `0..len + 2 * PAD`).
    fn padded(&self, p: usize) -> f32 {
        let j = if p < PAD {
            PAD - p
        } else if p - PAD < self.len {
            p - PAD
        } else {
            // torch/numpy "reflect": x[len-2], x[len-3], ... after the last sample.
            2 * self.len - 2 - (p - PAD)
        };
        self.audio.get(j).copied().unwrap_or(0.0)
    }
}

impl WhisperFrontend {
    /// A frontend for `n_mels` mel bands: 80 (every Whisper model but large-v3) or 128
    /// (large-v3). Any other count is refused with [`Error::InvalidOption`].
    pub fn new(n_mels: usize) -> Result<Self> {
        if !SUPPORTED_N_MELS.contains(&n_mels) {
            return Err(Error::option(
                "n_mels",
                format!("Whisper uses 80 or 128 mel bands, not {n_mels}"),
            ));
        }
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
            .collect();
        let filters = slaney_mel_filters(SAMPLE_RATE, N_FFT, n_mels);
        let bands = filters
            .chunks_exact(N_FREQS)
            .map(|row| {
                let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let last = row.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
                (
                    first,
                    row[first..last].iter().map(|&w| f64::from(w)).collect(),
                )
            })
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Ok(Self {
            n_mels,
            window,
            filters,
            bands,
            fft,
        })
    }

    /// The number of mel bands.
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The mel filter bank, `[n_mels, 201]` row-major, as `librosa.filters.mel(sr=16000,
    /// n_fft=400, n_mels, htk=False, norm="slaney")` returns it (and OpenAI ships it).
    pub fn filters(&self) -> &[f32] {
        &self.filters
    }

    /// The log-mel spectrogram `whisper.transcribe()` feeds the model for 16 kHz `samples`
    /// ([`Padding::Transcribe`]): `(n_mels, 3000)`.
    pub fn log_mel(&self, samples: &[f32]) -> LogMel {
        self.log_mel_with(samples, Padding::Transcribe)
    }

    /// The log-mel spectrogram of 16 kHz `samples` under the given [`Padding`]:
    /// `(n_mels, 3000)`.
    pub fn log_mel_with(&self, samples: &[f32], padding: Padding) -> LogMel {
        // The signal before the STFT, how many of its frames are computed (the floor's range),
        // and how many of them are kept.
        let (signal, n_computed, n_kept, content_frames) = match padding {
            Padding::Transcribe | Padding::DetectLanguage => {
                let len = samples.len() + N_SAMPLES;
                // Frames of the padded spectrogram (torch.stft gives len / hop + 1; the last is
                // dropped). Those from ceil((len(audio) + PAD) / hop) on see only zeros (the
                // reflection at the far end mirrors the appended zeros), so their value is
                // log10(1e-10) and they are not computed.
                let total = len / HOP_LENGTH;
                let audible = (samples.len() + PAD).div_ceil(HOP_LENGTH);
                let content = (samples.len() / HOP_LENGTH).min(N_FRAMES);
                let kept = match padding {
                    Padding::Transcribe => content,
                    _ => N_FRAMES,
                };
                (
                    Signal {
                        audio: samples,
                        len,
                    },
                    audible.min(total),
                    kept,
                    content,
                )
            }
            Padding::PadOrTrimAudio => {
                let audio = &samples[..samples.len().min(N_SAMPLES)];
                let content = audio.len() / HOP_LENGTH;
                (
                    Signal {
                        audio,
                        len: N_SAMPLES,
                    },
                    N_FRAMES,
                    N_FRAMES,
                    content,
                )
            }
        };

        let mut data = vec![0.0f32; self.n_mels * N_FRAMES];
        let max_log = self.log10_mel_frames(&signal, n_computed, n_kept, &mut data);
        let silence = MEL_CLAMP.log10() as f32;
        for t in n_computed.min(n_kept)..n_kept {
            for m in 0..self.n_mels {
                data[m * N_FRAMES + t] = silence;
            }
        }
        // torch does these steps in f32: max, floor, shift and scale.
        let floor = max_log - 8.0;
        for m in 0..self.n_mels {
            for v in &mut data[m * N_FRAMES..m * N_FRAMES + n_kept] {
                *v = (v.max(floor) + 4.0) / 4.0;
            }
        }
        LogMel {
            n_mels: self.n_mels,
            frames: N_FRAMES,
            content_frames,
            data,
        }
    }

    /// Computes `log10(max(mel, 1e-10))` for frames `0..n_computed` of `signal`, writes the first
    /// `n_kept` of them into `out` (`[n_mels, N_FRAMES]`), and returns the largest value over all
    /// computed frames (at least `log10(1e-10)`, the value of a silent frame).
    fn log10_mel_frames(
        &self,
        signal: &Signal<'_>,
        n_computed: usize,
        n_kept: usize,
        out: &mut [f32],
    ) -> f32 {
        let mut scratch = Scratch {
            frame: self.fft.make_input_vec(),
            spectrum: self.fft.make_output_vec(),
            fft: self.fft.make_scratch_vec(),
            power: vec![0.0; N_FREQS],
        };
        let silence = MEL_CLAMP.log10();
        let mut max_log = silence;
        let audio = signal.audio;
        for t in 0..n_computed {
            // Frame t covers padded samples t*hop .. t*hop + n_fft, i.e. signal samples
            // t*hop - PAD .. t*hop + PAD.
            let start = t * HOP_LENGTH;
            let mut silent = true;
            if start >= PAD && start - PAD + N_FFT <= audio.len() {
                let src = &audio[start - PAD..start - PAD + N_FFT];
                for ((dst, &s), &w) in scratch.frame.iter_mut().zip(src).zip(&self.window) {
                    silent &= s == 0.0;
                    *dst = f64::from(s) * w;
                }
            } else {
                for (j, (dst, &w)) in scratch.frame.iter_mut().zip(&self.window).enumerate() {
                    let s = signal.padded(start + j);
                    silent &= s == 0.0;
                    *dst = f64::from(s) * w;
                }
            }
            if silent {
                // An all-zero frame has exactly zero power: its log-mel is log10(1e-10).
                if t < n_kept {
                    for m in 0..self.n_mels {
                        out[m * N_FRAMES + t] = silence as f32;
                    }
                }
                continue;
            }
            self.fft
                .process_with_scratch(&mut scratch.frame, &mut scratch.spectrum, &mut scratch.fft)
                .expect("FFT buffers are made by the plan itself");
            for (p, c) in scratch.power.iter_mut().zip(&scratch.spectrum) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (m, (first, weights)) in self.bands.iter().enumerate() {
                let mel: f64 = weights
                    .iter()
                    .zip(&scratch.power[*first..])
                    .map(|(w, p)| w * p)
                    .sum();
                let log = mel.max(MEL_CLAMP).log10();
                max_log = max_log.max(log);
                if t < n_kept {
                    out[m * N_FRAMES + t] = log as f32;
                }
            }
        }
        max_log as f32
    }
}

/// The Slaney-style mel filter bank, `[n_mels, n_fft / 2 + 1]` row-major, exactly as
/// `librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=0, fmax=sample_rate / 2,
/// htk=False, norm="slaney", dtype=float32)` computes it (and so OpenAI's `mel_filters.npz`).
///
/// The mel scale is linear below 1 kHz (`f / (200/3)`) and logarithmic above (step
/// `ln(6.4) / 27`); `n_mels + 2` points evenly spaced on it from 0 Hz to Nyquist define the
/// triangles over the FFT bin frequencies, each scaled by `2 / (f[i + 2] − f[i])` to unit area.
pub fn slaney_mel_filters(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let n_freqs = n_fft / 2 + 1;
    let fmax = f64::from(sample_rate) / 2.0;
    // np.fft.rfftfreq(n_fft, d=1/sr): i * (1 / (n * d))
    let bin_hz = 1.0 / (n_fft as f64 * (1.0 / f64::from(sample_rate)));
    let fft_freqs: Vec<f64> = (0..n_freqs).map(|i| i as f64 * bin_hz).collect();
    // librosa.mel_frequencies: np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2)
    let (min_mel, max_mel) = (hz_to_mel(0.0), hz_to_mel(fmax));
    let points = n_mels + 2;
    let step = (max_mel - min_mel) / (points - 1) as f64;
    let mel_f: Vec<f64> = (0..points)
        .map(|i| {
            if i == points - 1 {
                mel_to_hz(max_mel)
            } else {
                mel_to_hz(i as f64 * step + min_mel)
            }
        })
        .collect();
    let mut weights = vec![0.0f32; n_mels * n_freqs];
    for (i, row) in weights.chunks_exact_mut(n_freqs).enumerate() {
        let (lo, mid, hi) = (mel_f[i], mel_f[i + 1], mel_f[i + 2]);
        let enorm = 2.0 / (hi - lo);
        for (w, &f) in row.iter_mut().zip(&fft_freqs) {
            let lower = -(lo - f) / (mid - lo);
            let upper = (hi - f) / (hi - mid);
            // librosa stores the triangle as f32, then multiplies by the f64 norm in place.
            let tri = 0f64.max(lower.min(upper)) as f32;
            *w = (f64::from(tri) * enorm) as f32;
        }
    }
    weights
}

/// The Slaney mel scale's constants: linear part's Hz per mel, the break at 1 kHz, log step.
const F_SP: f64 = 200.0 / 3.0;
const MIN_LOG_HZ: f64 = 1000.0;

fn log_step() -> f64 {
    6.4f64.ln() / 27.0
}

/// librosa.hz_to_mel(f, htk=False).
fn hz_to_mel(f: f64) -> f64 {
    let min_log_mel = MIN_LOG_HZ / F_SP;
    if f >= MIN_LOG_HZ {
        min_log_mel + (f / MIN_LOG_HZ).ln() / log_step()
    } else {
        f / F_SP
    }
}

/// librosa.mel_to_hz(m, htk=False).
fn mel_to_hz(m: f64) -> f64 {
    let min_log_mel = MIN_LOG_HZ / F_SP;
    if m >= min_log_mel {
        MIN_LOG_HZ * (log_step() * (m - min_log_mel)).exp()
    } else {
        F_SP * m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_scale_round_trips_and_breaks_at_1khz() {
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
        for f in [0.0, 300.0, 999.0, 1000.0, 4321.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(f)) - f).abs() < 1e-9, "{f}");
        }
    }

    #[test]
    fn filters_have_unit_area_in_hz_and_cover_the_band() {
        let fb = slaney_mel_filters(16_000, 400, 80);
        assert_eq!(fb.len(), 80 * 201);
        // Each row is a non-negative triangle, with non-zero weights somewhere.
        for row in fb.chunks_exact(201) {
            assert!(row.iter().all(|&w| w >= 0.0));
            assert!(row.iter().any(|&w| w > 0.0));
        }
    }

    #[test]
    fn refuses_other_mel_counts() {
        assert!(WhisperFrontend::new(64).is_err());
        assert_eq!(WhisperFrontend::new(128).unwrap().n_mels(), 128);
    }

    #[test]
    fn silence_is_constant() {
        let fe = WhisperFrontend::new(80).unwrap();
        // All-zero input: every computed value is log10(1e-10) = -10, the max is -10, so
        // (-10 + 4) / 4 = -1.5; Transcribe pads past the (empty) content with zeros.
        let zeros = vec![0.0f32; 16_000];
        let lm = fe.log_mel_with(&zeros, Padding::PadOrTrimAudio);
        assert!(lm.data.iter().all(|&v| (v + 1.5).abs() < 1e-6));
        let lm = fe.log_mel(&zeros);
        assert_eq!(lm.content_frames, 100);
        assert!(lm.row(0)[..100].iter().all(|&v| (v + 1.5).abs() < 1e-6));
        assert!(lm.row(0)[100..].iter().all(|&v| v == 0.0));
        let empty = fe.log_mel(&[]);
        assert_eq!((empty.content_frames, empty.frames), (0, N_FRAMES));
        assert!(empty.data.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn signal_reflects_like_numpy() {
        let audio: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let s = Signal {
            audio: &audio,
            len: 300,
        };
        // Left: x[PAD], x[PAD-1], ... x[1], then x[0] at p = PAD.
        assert_eq!(s.padded(PAD - 1), 1.0);
        assert_eq!(s.padded(PAD - 9), 9.0);
        assert_eq!(s.padded(PAD - 10), 0.0); // past the audio: appended zeros
        assert_eq!(s.padded(PAD + 3), 3.0);
        // Right: x[len-2] right after x[len-1]; with len = 300 those are zeros.
        assert_eq!(s.padded(PAD + 300), 0.0);
    }
}
