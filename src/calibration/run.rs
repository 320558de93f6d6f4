//! The calibration set (a documented, recorded selection of a manifest) and the calibration loop:
//! one utterance at a time (never padded into a batch) through the model's own frontend in fp32,
//! the encoder, then the decoder scoring the model's own transcript (decoded with the model's
//! own search and safeguards, [`SpeechModel::decode`]), with an observer on every GEMM input.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;

use super::{Observer, ObservingExec};
use crate::error::{Error, Result};
use crate::format::CalibrationRecord;
use crate::manifest::{Manifest, Utterance};
use crate::models::exec::LinearExec;
use crate::models::SpeechModel;
use crate::parallel::one_utterance;

/// The default number of calibration utterances.
pub const DEFAULT_UTTERANCES: usize = 128;

/// The utterances a calibration uses, with their provenance.
#[derive(Clone, Debug)]
pub struct CalibrationSet {
    pub utterances: Vec<Utterance>,
    pub record: CalibrationRecord,
}

impl CalibrationSet {
    /// Sorts the manifest by id and takes `count` evenly strided entries (index ⌊i · total / count⌋),
    /// all of them when the manifest is smaller. Hashes the selected audio.
    pub fn select(manifest: &Manifest, count: usize, sample_rate: u32) -> Result<Self> {
        if count == 0 {
            return Err(Error::option("--calib-utterances", "must be at least 1"));
        }
        let mut sorted: Vec<&Utterance> = manifest.utterances.iter().collect();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        let total = sorted.len();
        if total == 0 {
            return Err(Error::corrupt(
                &manifest.path,
                "the calibration manifest has no utterances",
            ));
        }
        let used = count.min(total);
        let utterances: Vec<Utterance> = (0..used)
            .map(|i| sorted[i * total / used].clone())
            .collect();
        // sha256 over "<sha256 of the file>  <id>\n" lines, in selection order.
        let lines = utterances
            .par_iter()
            .map(|u| crate::sha256_file(&u.audio).map(|h| format!("{h}  {}\n", u.id)))
            .collect::<Result<Vec<_>>>()?;
        let audio_sha256 = crate::hashing::sha256_bytes(lines.concat().as_bytes());
        Ok(CalibrationSet {
            record: CalibrationRecord {
                manifest_sha256: manifest.sha256.clone(),
                audio_sha256,
                utterances_total: total,
                utterances_used: used,
                selection: format!("sorted by id; {used} of {total} evenly strided (index floor(i * {total} / {used}))"),
                dtype: "float32".into(),
                sample_rate,
                decoding: std::collections::BTreeMap::new(),
            },
            utterances,
        })
    }
}

/// What a calibration pass runs of the decoder.
#[derive(Clone, Copy, Debug)]
pub enum DecoderPass<'a> {
    /// Decode each utterance with the model's safeguards (not observed), then observe the decoder
    /// scoring the chosen transcript: the observers see the final transcript's steps only, never a
    /// discarded attempt or a loop the fallback replaced.
    Decode,
    /// Observe the decoder scoring these transcripts (one per utterance of the set, in order),
    /// from an earlier pass over the same model function.
    Tokens(&'a [Vec<u32>]),
    /// The encoder only: nothing the pass observes runs in the decoder.
    Skip,
}

/// The observers merged so far, and those that finished ahead of their turn.
struct Merging<O> {
    merged: O,
    pending: BTreeMap<usize, O>,
    next: usize,
    done: usize,
}

/// A pass's merged observer and each utterance's transcript (empty when the decoder was skipped).
pub struct Observed<O> {
    pub observer: O,
    pub tokens: Vec<Vec<u32>>,
}

/// Runs every utterance of the set through the model, observing each GEMM input with a fresh
/// observer per utterance and merging them. `exec` makes the GEMM executor (full precision, or a
/// smoothed model for a second pass). `progress(done, total, id)` is called after each utterance,
/// from whichever thread finished it.
pub fn observe<O, E>(
    t: &dyn SpeechModel,
    set: &CalibrationSet,
    exec: impl Fn() -> E + Sync,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<O>
where
    O: Observer + Default,
    E: LinearExec,
{
    observe_with(t, set, DecoderPass::Decode, exec, O::default, progress).map(|o| o.observer)
}

/// [`observe`] with observers made by `observer` (for observers that need configuration, such
/// as the layers a [`HistogramObserver`](super::HistogramObserver) records) and what to run of
/// the decoder. The merged result does not depend on the order utterances finish in, as long as
/// the observer's merge is exact.
pub fn observe_with<O, E>(
    t: &dyn SpeechModel,
    set: &CalibrationSet,
    decoder: DecoderPass<'_>,
    exec: impl Fn() -> E + Sync,
    observer: impl Fn() -> O + Sync,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<Observed<O>>
where
    O: Observer,
    E: LinearExec,
{
    observe_in_flight(t, set, decoder, exec, observer, usize::MAX, progress)
}

/// [`observe_with`] with at most `in_flight` utterances observed at once (each holds its own
/// observer: GPTQ's are large). The pool's threads all still work: with fewer utterances in
/// flight than threads, each utterance's products split across the pool. The result is the same
/// bits whatever `in_flight` (observers merge in utterance order).
pub fn observe_in_flight<O, E>(
    t: &dyn SpeechModel,
    set: &CalibrationSet,
    decoder: DecoderPass<'_>,
    exec: impl Fn() -> E + Sync,
    observer: impl Fn() -> O + Sync,
    in_flight: usize,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<Observed<O>>
where
    O: Observer,
    E: LinearExec,
{
    if let DecoderPass::Tokens(tokens) = decoder {
        if tokens.len() != set.utterances.len() {
            return Err(Error::Model {
                what: "calibration".into(),
                message: format!(
                    "{} transcripts for {} utterances",
                    tokens.len(),
                    set.utterances.len()
                ),
            });
        }
    }
    let total = set.utterances.len();
    // Observers are merged in utterance order as they finish (one that finishes early waits in
    // `pending`), so the merged statistics do not depend on the thread count, and at most about
    // one observer per thread is alive at a time (a GPTQ observer holds every layer's Σ x xᵀ).
    let merging = Mutex::new(Merging {
        merged: observer(),
        pending: BTreeMap::new(),
        next: 0,
        done: 0,
    });
    // Utterances are handed out in order, one at a time, to one worker per thread (at most
    // `in_flight` workers): each takes the next when it is free (a thread whose utterances decode
    // long keeps no others waiting), and the observers finish nearly in order, so few wait in
    // `pending`.
    let next_utterance = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let workers = rayon::current_num_threads()
        .min(in_flight)
        .clamp(1, total.max(1));
    let per_worker = (0..workers)
        .into_par_iter()
        .map(|_| {
            let mut mine = Vec::new();
            while !failed.load(Ordering::Relaxed) {
                let i = next_utterance.fetch_add(1, Ordering::Relaxed);
                let Some(u) = set.utterances.get(i) else {
                    break;
                };
                let (o, tokens) =
                    one_utterance(workers, || observe_one(t, u, i, decoder, &observer, &exec))
                        .map_err(|e| {
                            failed.store(true, Ordering::Relaxed);
                            Error::Utterance {
                                id: u.id.clone(),
                                error: Box::new(e),
                            }
                        })?;
                let mut m = merging.lock().unwrap_or_else(|p| p.into_inner());
                m.pending.insert(i, o);
                while let Some(o) = {
                    let next = m.next;
                    m.pending.remove(&next)
                } {
                    m.merged.merge(o);
                    m.next += 1;
                }
                m.done += 1;
                progress(m.done, total, &u.id);
                mine.push((i, tokens));
            }
            Ok(mine)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tokens = vec![Vec::new(); total];
    for (i, t) in per_worker.into_iter().flatten() {
        tokens[i] = t;
    }
    let merged = merging
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .merged;
    Ok(Observed {
        observer: merged,
        tokens,
    })
}

/// One utterance, alone (never batched with others, so no batch padding): the model's own
/// frontend, which for Whisper includes its 30 s window, the encoder, and the decoder over the
/// model's own transcript. (Whisper fed only the content frames never emits end-of-text on short
/// clips and would calibrate its decoder on 224 tokens of repetition; see docs/calibration.md.)
/// The decoder is observed while it decodes; when the safeguards retried (a decoding at a
/// temperature above 0 was kept, or every one failed), those observations are dropped and the
/// decoder scores the kept transcript in one teacher-forced call instead, which shows its GEMMs
/// the same rows a decoding of it computes: the prompt, then each generated token. A search
/// whose rows are not all the transcript's (a beam search) is always observed that way.
fn observe_one<O: Observer, E: LinearExec>(
    t: &dyn SpeechModel,
    u: &Utterance,
    index: usize,
    decoder: DecoderPass<'_>,
    observer: &impl Fn() -> O,
    exec: &impl Fn() -> E,
) -> Result<(O, Vec<u32>)> {
    let samples = t.read(u)?;
    let mut o = observer();
    let mut observing = ObservingExec {
        observer: &mut o,
        inner: exec(),
    };
    let audio = t.encode(&mut observing, &samples)?;
    let decoder = match decoder {
        DecoderPass::Tokens(_) if !t.score_replays_decode() => DecoderPass::Decode,
        other => other,
    };
    let tokens = match decoder {
        DecoderPass::Skip => Vec::new(),
        DecoderPass::Tokens(all) => {
            let tokens = all[index].clone();
            t.score(&mut observing, &audio, &tokens)?;
            tokens
        }
        DecoderPass::Decode if !t.calibration_keeps_the_search_rows() => {
            let decoded = t.decode(&mut exec(), &audio, samples.len(), false)?;
            t.score(&mut observing, &audio, &decoded.tokens)?;
            decoded.tokens
        }
        DecoderPass::Decode => {
            let mut steps = observer();
            let decoded = t.decode(
                &mut ObservingExec {
                    observer: &mut steps,
                    inner: exec(),
                },
                &audio,
                samples.len(),
                false,
            )?;
            if decoded.attempts == 1 {
                observing.observer.merge(steps);
            } else {
                t.score(&mut observing, &audio, &decoded.tokens)?;
            }
            decoded.tokens
        }
    };
    Ok((o, tokens))
}
