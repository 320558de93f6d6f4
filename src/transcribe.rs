//! Transcribing audio with a full-precision Whisper checkpoint: the frontend, the forward and
//! greedy decoding together, plus the manifest-level run behind `oasr-quantize transcribe`.

use std::path::Path;

use serde::Serialize;

use crate::calibration::{Manifest, Utterance};
use crate::checkpoint::Checkpoint;
use crate::error::{shown, Error, Result};
use crate::frontend::{read_audio, whisper_logmel::N_SAMPLES, WhisperFrontend};
use crate::models::whisper::{
    decode_with_fallback, token_limit, Decoded, DecodingRules, Fallback, FullPrecision, LinearExec,
    Whisper, WhisperTokenizer,
};
use crate::wer::{word_errors, WordErrors};

/// A Whisper model with its tokenizer, decoding rules and frontend.
pub struct Transcriber {
    pub model: Whisper,
    pub tokenizer: WhisperTokenizer,
    pub rules: DecodingRules,
    pub frontend: WhisperFrontend,
    pub sample_rate: u32,
    /// The decoding safeguards (temperature fallback); [`Fallback::default`] as Whisper's own.
    pub fallback: Fallback,
}

impl Transcriber {
    /// Builds a transcriber from a full-precision checkpoint (any supported format).
    pub fn new(ckpt: &Checkpoint) -> Result<Self> {
        if ckpt.config.architecture != crate::models::whisper::ARCHITECTURE {
            return Err(Error::NotImplemented {
                what: format!("transcribing architecture `{}`", ckpt.config.architecture),
                detail: "this version runs Whisper".into(),
            });
        }
        if ckpt.is_quantized() {
            return Err(Error::UnknownFormat { path: ckpt.dir.clone(), message: "a quantized checkpoint runs only in `oasr-quantize verify`; transcribe takes full precision".into() });
        }
        let tokenizer_path = ckpt
            .tokenizer_files
            .get("tokenizer")
            .ok_or_else(|| Error::corrupt(&ckpt.dir, "no tokenizer.json"))?;
        let tokenizer = WhisperTokenizer::from_file(tokenizer_path)?;
        let model = Whisper::load(ckpt)?;
        let rules = DecodingRules::new(&model, &tokenizer)?;
        let frontend = WhisperFrontend::new(model.config.num_mel_bins)?;
        let sample_rate = ckpt
            .config
            .features
            .as_ref()
            .map_or(16_000, |f| f.sample_rate);
        Ok(Transcriber {
            model,
            tokenizer,
            rules,
            frontend,
            sample_rate,
            fallback: Fallback::default(),
        })
    }

    /// Reads an utterance's audio; errors name the utterance. Audio longer than Whisper's 30 s
    /// window is refused by name: this version does not decode long-form audio window by window,
    /// and truncating it would drop speech silently.
    pub fn read(&self, utterance: &Utterance) -> Result<Vec<f32>> {
        let in_utterance = |e: Error| Error::Utterance {
            id: utterance.id.clone(),
            error: Box::new(e),
        };
        let samples = read_audio(&utterance.audio, self.sample_rate).map_err(in_utterance)?;
        if samples.len() > N_SAMPLES {
            return Err(in_utterance(Error::NotImplemented {
                what: format!(
                    "audio longer than Whisper's 30 s window ({}: {:.2} s)",
                    shown(&utterance.audio),
                    samples.len() as f64 / f64::from(self.sample_rate)
                ),
                detail: "long-form transcription (sequential 30 s windows) is not supported; \
                         split the file into clips of at most 30 s"
                    .into(),
            }));
        }
        Ok(samples)
    }

    /// The encoder output for 16 kHz samples, from the 30 s log-mel the model was trained on.
    pub fn encode(
        &self,
        exec: &mut dyn LinearExec,
        samples: &[f32],
    ) -> Result<candle_core::Tensor> {
        let mel = self.frontend.log_mel(samples);
        self.model.encode(exec, &mel.data, mel.n_mels, mel.frames)
    }

    /// Transcription of 16 kHz samples with Whisper's safeguards: greedy, with temperature
    /// fallback, up to [`token_limit`] tokens for the audio's length.
    pub fn decode(
        &self,
        exec: &mut dyn LinearExec,
        samples: &[f32],
        keep_logits: bool,
    ) -> Result<Decoded> {
        let audio = self.encode(exec, samples)?;
        self.decode_encoded(exec, &audio, samples.len(), keep_logits)
    }

    /// [`Self::decode`] over an encoder output of `samples` audio samples.
    pub fn decode_encoded(
        &self,
        exec: &mut dyn LinearExec,
        audio: &candle_core::Tensor,
        samples: usize,
        keep_logits: bool,
    ) -> Result<Decoded> {
        decode_with_fallback(
            &self.model,
            exec,
            audio,
            &self.rules,
            &self.tokenizer,
            &self.fallback,
            token_limit(samples, self.sample_rate),
            keep_logits,
        )
    }

    pub fn text(&self, tokens: &[u32]) -> Result<String> {
        self.tokenizer.decode(tokens)
    }
}

/// One transcribed utterance.
#[derive(Clone, Debug, Serialize)]
pub struct UtteranceResult {
    pub id: String,
    pub hypothesis: String,
    pub reference: Option<String>,
    pub word_errors: Option<WordErrors>,
    /// The manifest's `source` of the utterance.
    pub source: Option<String>,
    /// The temperature of the kept decoding (0 unless the fallback retried).
    pub temperature: f32,
    /// Decodings run (1 when greedy passed the fallback's checks).
    pub attempts: usize,
    /// The kept decoding stopped at the token limit without end-of-text.
    pub hit_token_limit: bool,
    pub tokens: usize,
}

/// The result of transcribing a manifest.
#[derive(Clone, Debug, Serialize)]
pub struct TranscriptionReport {
    pub checkpoint: String,
    pub manifest: String,
    pub manifest_sha256: String,
    pub utterances: Vec<UtteranceResult>,
    /// Over the utterances with a reference text.
    pub word_errors: WordErrors,
    pub wer: Option<f64>,
    /// Word errors per manifest `source` (`(none)` for utterances without one).
    pub word_errors_by_source: std::collections::BTreeMap<String, WordErrors>,
    /// Utterances whose greedy decoding failed the fallback's checks and was retried.
    pub fallbacks: usize,
    /// Utterances whose kept decoding still stopped at the token limit.
    pub hit_token_limit: usize,
    pub seconds: f64,
    pub utterances_per_second: f64,
}

/// Refuses a `--limit` that selects no utterance: a report over nothing would print figures
/// (a cosine of 0, a WER of 0) that were never measured.
pub(crate) fn check_limit(limit: Option<usize>) -> Result<()> {
    match limit {
        Some(0) => Err(Error::option(
            "--limit",
            "0 selects no utterance; give at least 1",
        )),
        _ => Ok(()),
    }
}

/// Transcribes the first `limit` utterances (all when `None`) of a manifest.
pub fn transcribe_manifest(
    checkpoint: &Path,
    manifest: &Manifest,
    limit: Option<usize>,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<TranscriptionReport> {
    check_limit(limit)?;
    let ckpt = Checkpoint::open(checkpoint)?;
    let t = Transcriber::new(&ckpt)?;
    let started = std::time::Instant::now();
    let chosen: Vec<&Utterance> = manifest
        .utterances
        .iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let mut results = Vec::with_capacity(chosen.len());
    let mut total = WordErrors::default();
    let mut by_source = std::collections::BTreeMap::new();
    for (i, u) in chosen.iter().enumerate() {
        let samples = t.read(u)?;
        let decoded =
            t.decode(&mut FullPrecision, &samples, false)
                .map_err(|e| Error::Utterance {
                    id: u.id.clone(),
                    error: Box::new(e),
                })?;
        let hypothesis = t.text(&decoded.tokens)?;
        let errors = u.text.as_deref().map(|r| word_errors(r, &hypothesis));
        if let Some(e) = errors {
            total.add(e);
            by_source
                .entry(crate::verify::source_name(u).to_string())
                .or_insert_with(WordErrors::default)
                .add(e);
        }
        results.push(UtteranceResult {
            id: u.id.clone(),
            hypothesis,
            reference: u.text.clone(),
            word_errors: errors,
            source: u.source.clone(),
            temperature: decoded.temperature,
            attempts: decoded.attempts,
            hit_token_limit: decoded.hit_limit,
            tokens: decoded.tokens.len(),
        });
        progress(i + 1, chosen.len(), &u.id);
    }
    let seconds = started.elapsed().as_secs_f64();
    let any_reference = results.iter().any(|r| r.reference.is_some());
    let fallbacks = results.iter().filter(|r| r.attempts > 1).count();
    let hit_token_limit = results.iter().filter(|r| r.hit_token_limit).count();
    Ok(TranscriptionReport {
        checkpoint: checkpoint.display().to_string(),
        manifest: manifest.path.display().to_string(),
        manifest_sha256: manifest.sha256.clone(),
        utterances_per_second: results.len() as f64 / seconds.max(1e-9),
        utterances: results,
        wer: any_reference.then(|| total.rate()),
        word_errors: total,
        word_errors_by_source: by_source,
        fallbacks,
        hit_token_limit,
        seconds,
    })
}
