//! Kaldi's log mel filter bank ("fbank") features as WeNet computes them:
//! `torchaudio.compliance.kaldi.fbank` with WeNet's options, on samples scaled to 16-bit range.
//!
//! For 16 kHz mono samples in \[-1, 1\]: multiply by 32768 (WeNet's dataset scales torchaudio's
//! samples by `1 << 15`); cut frames of 400 samples (25 ms) every 160 (10 ms), only frames that
//! fit entirely (`snip_edges`); per frame, subtract its mean, apply preemphasis 0.97
//! (`x[i] -= 0.97 * x[i - 1]`, `x[-1] = x[0]`), multiply by the "povey" window
//! (`(0.5 − 0.5·cos(2πn/399))^0.85`), zero-pad to 512; power spectrum `|X|²`; Kaldi's
//! triangular mel filters (mel scale `1127·ln(1 + f/700)`, 20 Hz to Nyquist, no area
//! normalisation) over bins 0..256, the Nyquist bin weighted 0; `ln(max(energy, f32::EPSILON))`.
//! No dither, no energy term. The result is `[frames, n_mels]`.
//!
//! The framing, spectrum, mel projection and logarithm run in `f64`; the result is `f32`.
//! torchaudio itself computes in `f32`: `f64` here leaves only torchaudio's own rounding in the
//! difference, which is smaller than an `f32` reimplementation's (docs/frontend.md gives the
//! measurements against torchaudio and kaldi-native-fbank; tests/frontend_fbank.rs checks them).

use std::fmt;
use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use crate::error::{Error, Result};

/// The sample rate in Hz.
pub const SAMPLE_RATE: u32 = 16_000;
/// Samples per frame (25 ms).
pub const FRAME_LENGTH: usize = 400;
/// Samples between frame starts (10 ms).
pub const FRAME_SHIFT: usize = 160;
/// FFT size: the frame length rounded up to a power of two (`round_to_power_of_two`).
pub const N_FFT: usize = 512;
/// Bins of the one-sided spectrum.
pub const N_FREQS: usize = N_FFT / 2 + 1;
/// What the \[-1, 1\] samples are multiplied by first: WeNet's `1 << 15`.
pub const AUDIO_SCALE: f32 = 32768.0;
/// The preemphasis coefficient.
pub const PREEMPHASIS: f64 = 0.97;
/// The exponent of the "povey" window (a Hann window raised to it).
pub const POVEY_EXPONENT: f64 = 0.85;
/// The lowest filter's left edge, Hz.
pub const LOW_FREQ: f64 = 20.0;
/// The highest filter's right edge, Hz: Nyquist (`high_freq` 0).
pub const HIGH_FREQ: f64 = SAMPLE_RATE as f64 / 2.0;
/// The floor before the logarithm: `f32::EPSILON`, torchaudio's `_get_epsilon` for `float32`
/// (and Kaldi's `std::numeric_limits<float>::epsilon()`).
pub const LOG_FLOOR: f64 = f32::EPSILON as f64;

/// The frame count of `n_samples` samples (`snip_edges`): `1 + (n − 400) / 160` for
/// `n ≥ 400`, else 0.
pub fn num_frames(n_samples: usize) -> usize {
    if n_samples < FRAME_LENGTH {
        0
    } else {
        1 + (n_samples - FRAME_LENGTH) / FRAME_SHIFT
    }
}

/// Kaldi's mel scale: `1127·ln(1 + f/700)`.
pub fn mel_scale(hz: f64) -> f64 {
    1127.0 * (1.0 + hz / 700.0).ln()
}

/// Log mel filter bank features: `frames` rows of `n_mels` values, row-major, like
/// torchaudio's `(frames, n_mels)` tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Fbank {
    /// Frames (rows): [`num_frames`] of the input length.
    pub frames: usize,
    /// Mel bins (columns).
    pub n_mels: usize,
    /// `[frames, n_mels]`, row-major: `data[frame * n_mels + mel]`.
    pub data: Vec<f32>,
}

impl Fbank {
    /// The values of one frame.
    pub fn row(&self, frame: usize) -> &[f32] {
        &self.data[frame * self.n_mels..(frame + 1) * self.n_mels]
    }

    /// One value.
    pub fn at(&self, frame: usize, mel: usize) -> f32 {
        self.data[frame * self.n_mels + mel]
    }
}

/// The Kaldi fbank frontend with WeNet's options, set up once and reused: the window, the mel
/// filter bank and the FFT plan are computed in [`KaldiFbank::new`]. It is `Send + Sync`; each
/// call allocates its scratch buffers once, never per frame.
#[derive(Clone)]
pub struct KaldiFbank {
    n_mels: usize,
    /// The "povey" window, [`FRAME_LENGTH`] values.
    window: Vec<f64>,
    /// Dense filter bank `[n_mels, N_FREQS]` (the last column, Nyquist, is 0).
    filters: Vec<f64>,
    /// The non-zero span of each filter: first bin and weights.
    bands: Vec<(usize, Vec<f64>)>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl fmt::Debug for KaldiFbank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KaldiFbank")
            .field("n_mels", &self.n_mels)
            .field("frame_length", &FRAME_LENGTH)
            .field("frame_shift", &FRAME_SHIFT)
            .field("n_fft", &N_FFT)
            .finish_non_exhaustive()
    }
}

impl KaldiFbank {
    /// A frontend for `n_mels` mel bins (WeNet: 80). Fewer than 4 bins (torchaudio's own limit),
    /// or so many that a filter covers no FFT bin (Kaldi refuses those), is
    /// [`Error::InvalidOption`].
    pub fn new(n_mels: usize) -> Result<Self> {
        if n_mels < 4 {
            return Err(Error::option(
                "n_mels",
                format!("Kaldi fbank needs at least 4 mel bins, not {n_mels}"),
            ));
        }
        let filters = kaldi_mel_filters(n_mels);
        let mut bands = Vec::with_capacity(n_mels);
        for (m, row) in filters.chunks_exact(N_FREQS).enumerate() {
            let Some(first) = row.iter().position(|&w| w != 0.0) else {
                return Err(Error::option(
                    "n_mels",
                    format!(
                        "with {n_mels} mel bins, bin {m} covers no FFT bin of a {N_FFT}-point \
                         FFT (Kaldi refuses this too); use fewer bins"
                    ),
                ));
            };
            let last = row.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
            bands.push((first, row[first..last].to_vec()));
        }
        let window = povey_window(FRAME_LENGTH);
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Ok(Self {
            n_mels,
            window,
            filters,
            bands,
            fft,
        })
    }

    /// The number of mel bins.
    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The mel filter bank, `[n_mels, 257]` row-major, as torchaudio's `get_mel_banks` builds
    /// it with the zero Nyquist column `fbank` appends.
    pub fn filters(&self) -> &[f64] {
        &self.filters
    }

    /// The features of 16 kHz mono `samples` in \[-1, 1\] (as [`super::read_audio`] gives them):
    /// `[num_frames(len), n_mels]`.
    ///
    /// Fewer samples than one frame (400, 25 ms) is an error, as in torchaudio's
    /// `kaldi.fbank` (WeNet's frontend), rather than an empty feature matrix no encoder can take.
    pub fn compute(&self, samples: &[f32]) -> Result<Fbank> {
        let frames = num_frames(samples.len());
        if frames == 0 {
            return Err(Error::Model {
                what: "the Kaldi fbank frontend".into(),
                message: format!(
                    "the audio has {} samples ({:.1} ms), fewer than one {FRAME_LENGTH}-sample \
                     (25 ms) frame: no features can be computed",
                    samples.len(),
                    samples.len() as f64 * 1e3 / f64::from(SAMPLE_RATE)
                ),
            });
        }
        let mut frame = vec![0.0f64; FRAME_LENGTH];
        let mut input = self.fft.make_input_vec();
        let mut spectrum: Vec<Complex<f64>> = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0f64; N_FREQS];
        let mut data = vec![0.0f32; frames * self.n_mels];
        let scale = f64::from(AUDIO_SCALE);
        for (t, out) in data.chunks_exact_mut(self.n_mels).enumerate() {
            let src = &samples[t * FRAME_SHIFT..t * FRAME_SHIFT + FRAME_LENGTH];
            for (dst, &s) in frame.iter_mut().zip(src) {
                *dst = f64::from(s) * scale;
            }
            // remove_dc_offset: subtract the frame's mean.
            let mean = frame.iter().sum::<f64>() / FRAME_LENGTH as f64;
            for x in &mut frame {
                *x -= mean;
            }
            // Preemphasis, last sample first so that each step sees the unmodified previous
            // sample; the first sample's predecessor is itself.
            for j in (1..FRAME_LENGTH).rev() {
                frame[j] -= PREEMPHASIS * frame[j - 1];
            }
            frame[0] -= PREEMPHASIS * frame[0];
            for ((dst, &x), &w) in input.iter_mut().zip(&frame).zip(&self.window) {
                *dst = x * w;
            }
            input[FRAME_LENGTH..].fill(0.0);
            self.fft
                .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                .expect("FFT buffers are made by the plan itself");
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (v, (first, weights)) in out.iter_mut().zip(&self.bands) {
                let energy: f64 = weights
                    .iter()
                    .zip(&power[*first..])
                    .map(|(w, p)| w * p)
                    .sum();
                *v = energy.max(LOG_FLOOR).ln() as f32;
            }
        }
        Ok(Fbank {
            frames,
            n_mels: self.n_mels,
            data,
        })
    }
}

/// The "povey" window of `n` samples: a symmetric Hann window raised to 0.85,
/// `(0.5 − 0.5·cos(2πi/(n−1)))^0.85` (`n` ≥ 2).
fn povey_window(n: usize) -> Vec<f64> {
    let denom = (n - 1) as f64;
    (0..n)
        .map(|i| {
            let hann = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / denom).cos();
            hann.powf(POVEY_EXPONENT)
        })
        .collect()
}

/// Kaldi's mel filter bank for a [`N_FFT`]-point FFT at 16 kHz, `[n_mels, 257]` row-major.
///
/// `n_mels + 2` points evenly spaced on the mel scale from [`LOW_FREQ`] to [`HIGH_FREQ`] (step
/// `(mel(high) − mel(low)) / (n_mels + 1)`) are the left edge, centre and right edge of each
/// triangle; bin `i` (frequency `i·16000/512`) gets `max(0, min(up, down))` with
/// `up = (mel − left) / (centre − left)` and `down = (right − mel) / (right − centre)`, in the
/// mel domain. Bins 0..256 are weighted; the Nyquist bin 256 gets 0.
fn kaldi_mel_filters(n_mels: usize) -> Vec<f64> {
    let bin_hz = f64::from(SAMPLE_RATE) / N_FFT as f64;
    let mel_low = mel_scale(LOW_FREQ);
    let mel_high = mel_scale(HIGH_FREQ);
    let delta = (mel_high - mel_low) / (n_mels + 1) as f64;
    let mut filters = vec![0.0f64; n_mels * N_FREQS];
    for (m, row) in filters.chunks_exact_mut(N_FREQS).enumerate() {
        let left = mel_low + m as f64 * delta;
        let centre = mel_low + (m + 1) as f64 * delta;
        let right = mel_low + (m + 2) as f64 * delta;
        for (i, w) in row[..N_FFT / 2].iter_mut().enumerate() {
            let mel = mel_scale(bin_hz * i as f64);
            let up = (mel - left) / (centre - left);
            let down = (right - mel) / (right - centre);
            *w = up.min(down).max(0.0);
        }
    }
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_count_follows_snip_edges() {
        assert_eq!(num_frames(0), 0);
        assert_eq!(num_frames(399), 0);
        assert_eq!(num_frames(400), 1);
        assert_eq!(num_frames(559), 1);
        assert_eq!(num_frames(560), 2);
        assert_eq!(num_frames(16_000), 98);
    }

    #[test]
    fn povey_window_is_zero_at_the_edges_and_one_in_the_middle() {
        let w = povey_window(FRAME_LENGTH);
        assert_eq!(w[0], 0.0);
        assert!(w[FRAME_LENGTH - 1].abs() < 1e-12);
        // Symmetric, peak between samples 199 and 200.
        for i in 0..FRAME_LENGTH {
            assert!((w[i] - w[FRAME_LENGTH - 1 - i]).abs() < 1e-12, "{i}");
        }
        assert!(w[199] > 0.9999 && w[199] < 1.0);
        let hann = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * 100.0 / 399.0).cos();
        assert!((w[100] - hann.powf(0.85)).abs() < 1e-15);
    }

    #[test]
    fn filters_are_triangles_over_20hz_to_nyquist() {
        let fe = KaldiFbank::new(80).unwrap();
        let fb = fe.filters();
        assert_eq!(fb.len(), 80 * N_FREQS);
        for row in fb.chunks_exact(N_FREQS) {
            assert!(row.iter().all(|&w| (0.0..=1.0).contains(&w)));
            assert_eq!(row[0], 0.0); // DC lies below 20 Hz
            assert_eq!(row[N_FREQS - 1], 0.0); // Nyquist: torchaudio's zero column
        }
        // The first filter starts above 20 Hz: bin 1 (31.25 Hz) is in it.
        assert!(fb[1] > 0.0);
        // Kaldi's mel scale.
        assert!((mel_scale(700.0) - 1127.0 * 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn refuses_too_few_or_too_many_bins() {
        assert!(KaldiFbank::new(3).is_err());
        let err = KaldiFbank::new(400).unwrap_err().to_string();
        assert!(err.contains("covers no FFT bin"), "{err}");
        assert_eq!(KaldiFbank::new(23).unwrap().n_mels(), 23);
    }

    #[test]
    fn silence_hits_the_log_floor() {
        let fe = KaldiFbank::new(80).unwrap();
        let f = fe.compute(&[0.0; 800]).unwrap();
        assert_eq!((f.frames, f.n_mels), (3, 80));
        let floor = (f32::EPSILON as f64).ln() as f32;
        assert!(f.data.iter().all(|&v| v == floor));
        // A constant (pure DC) signal is removed by the DC offset step: silence too.
        let dc = fe.compute(&[0.25; 800]).unwrap();
        assert!(dc.data.iter().all(|&v| v == floor));
    }

    #[test]
    fn short_input_is_an_error() {
        let fe = KaldiFbank::new(80).unwrap();
        let err = fe.compute(&[0.1; 399]).unwrap_err().to_string();
        assert!(err.contains("399 samples"), "{err}");
        assert!(fe.compute(&[]).is_err());
    }
}
