//! Calibration: manifests, the selection of utterances, observers, and the calibration loop.

mod manifest;

pub use manifest::{Manifest, Utterance};
