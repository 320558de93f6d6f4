//! The calibration set (a documented, recorded selection of a manifest) and the calibration loop:
//! one utterance at a time (never padded into a batch) through the model's own frontend in fp32,
//! the encoder, then the decoder driven by its own greedy decoding, with an observer on every
//! GEMM input.

use std::sync::Mutex;

use rayon::prelude::*;

use super::{Manifest, Observer, ObservingExec, Utterance};
use crate::error::{Error, Result};
use crate::format::CalibrationRecord;
use crate::models::whisper::LinearExec;
use crate::transcribe::Transcriber;

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
            },
            utterances,
        })
    }
}

/// Runs every utterance of the set through the model, observing each GEMM input with a fresh
/// observer per utterance and merging them. `exec` makes the GEMM executor (full precision, or a
/// smoothed model for a second pass). `progress(done, total, id)` is called after each utterance,
/// from whichever thread finished it.
pub fn observe<O, E>(
    t: &Transcriber,
    set: &CalibrationSet,
    exec: impl Fn() -> E + Sync,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<O>
where
    O: Observer + Default,
    E: LinearExec,
{
    observe_with(t, set, exec, O::default, progress)
}

/// [`observe`] with observers made by `observer` (for observers that need configuration, such
/// as the layers a [`HistogramObserver`](super::HistogramObserver) records). The merged result
/// does not depend on the order utterances finish in, as long as the observer's merge is exact.
pub fn observe_with<O, E>(
    t: &Transcriber,
    set: &CalibrationSet,
    exec: impl Fn() -> E + Sync,
    observer: impl Fn() -> O + Sync,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<O>
where
    O: Observer,
    E: LinearExec,
{
    let total = set.utterances.len();
    let done = Mutex::new(0usize);
    let observed = set
        .utterances
        .par_iter()
        .map(|u| {
            let mut o = observer();
            observe_one(
                t,
                u,
                &mut ObservingExec {
                    observer: &mut o,
                    inner: exec(),
                },
            )
            .map_err(|e| Error::Utterance {
                id: u.id.clone(),
                source: Box::new(e),
            })?;
            let mut n = done.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            progress(*n, total, &u.id);
            Ok(o)
        })
        .collect::<Result<Vec<O>>>()?;
    let mut merged = observer();
    for o in observed {
        merged.merge(o);
    }
    Ok(merged)
}

/// One utterance, alone (never batched with others, so no batch padding): the model's own
/// frontend, which for Whisper includes its 30 s window, the encoder, and greedy decoding with
/// the model's own tokens. (Whisper fed only the content frames never emits end-of-text on short
/// clips and would calibrate its decoder on 224 tokens of repetition; see docs/calibration.md.)
fn observe_one(t: &Transcriber, u: &Utterance, exec: &mut dyn LinearExec) -> Result<()> {
    let samples = t.read(u)?;
    t.decode(exec, &samples, false)?;
    Ok(())
}
