//! First-pass observations shared between the quantization runs of one process.
//!
//! The first calibration pass of a SmoothQuant recipe runs the full-precision model over the
//! calibration set and records each GEMM input's per-channel maxima and each utterance's
//! transcript. Nothing in it depends on the recipe, so the gate, which regenerates several
//! SmoothQuant checkpoints from one model and one calibration set, runs it once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{AbsMaxObserver, CalibrationSet, Observed};
use crate::error::Result;

/// A handle to the shared observations; clones share one store.
#[derive(Clone, Default)]
pub struct SharedObservations {
    store: Arc<Mutex<HashMap<String, Arc<Observed<AbsMaxObserver>>>>>,
}

impl SharedObservations {
    /// The observations of `source` on `set`, run by `pass` when no earlier run of this store
    /// made them. The key is the source's path, the calibration record (manifest and audio
    /// hashes, the selection, the decoding options) and nothing else: the pass observes the
    /// full-precision model, so the recipe cannot change what it sees. The second value is
    /// `true` when the observations came from the store.
    pub fn get_or_run(
        &self,
        source: &Path,
        set: &CalibrationSet,
        pass: impl FnOnce() -> Result<Observed<AbsMaxObserver>>,
    ) -> Result<(Arc<Observed<AbsMaxObserver>>, bool)> {
        let source = std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
        let record = serde_json::to_string(&set.record).unwrap_or_default();
        let key = format!("{}\n{record}", source.display());
        if let Some(hit) = self.lock().get(&key) {
            return Ok((hit.clone(), true));
        }
        // The pass runs without the lock held: it takes minutes, and a failure stores nothing.
        let observed = Arc::new(pass()?);
        self.lock().insert(key, observed.clone());
        Ok((observed, false))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Observed<AbsMaxObserver>>>> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
