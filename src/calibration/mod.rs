//! Calibration: manifests, the selection of utterances, observers, and the calibration loop.

mod manifest;
mod observer;
mod run;

pub use manifest::{Manifest, Utterance};
pub use observer::{AbsMaxObserver, Observer, ObservingExec};
pub use run::{observe, CalibrationSet, DEFAULT_UTTERANCES};
