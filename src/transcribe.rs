//! Transcribing audio with a full-precision checkpoint: the manifest-level run behind
//! `oasr-quantize transcribe`, through the architecture's model ([`crate::models::SpeechModel`]).

use std::path::Path;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::manifest::{Manifest, Utterance};
use crate::models::exec::FullPrecision;
use crate::models::DecodeOptions;
use crate::wer::{word_errors, WordErrors};

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
    /// The language decoded in (multilingual models: detected or given), as its code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
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

/// Transcribes the first `limit` utterances (all when `None`) of a manifest, with the
/// architecture's default search.
pub fn transcribe_manifest(
    checkpoint: &Path,
    manifest: &Manifest,
    limit: Option<usize>,
    progress: impl FnMut(usize, usize, &str),
) -> Result<TranscriptionReport> {
    transcribe_manifest_with(
        checkpoint,
        manifest,
        limit,
        &DecodeOptions::default(),
        progress,
    )
}

/// [`transcribe_manifest`] with search options.
pub fn transcribe_manifest_with(
    checkpoint: &Path,
    manifest: &Manifest,
    limit: Option<usize>,
    decode: &DecodeOptions,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<TranscriptionReport> {
    check_limit(limit)?;
    let ckpt = Checkpoint::open(checkpoint)?;
    let t = crate::models::load_with(&ckpt, decode)?;
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
        let decoded = t
            .transcribe(&mut FullPrecision, &samples, false)
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
            language: decoded.language,
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
