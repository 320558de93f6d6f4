//! oasr-quantize: turns full-precision speech-recognition checkpoints into serving-ready W8A8
//! checkpoints (int8 and fp8 e4m3) for the OASR serving engine.
//!
//! The library never prints. Long operations report through a progress callback, and every
//! failure is an [`Error`] that names the file, layer or option at fault.

pub mod algorithms;
pub mod calibration;
pub mod checkpoint;
pub mod error;
pub mod export;
pub mod format;
pub mod frontend;
pub mod gate;
mod hashing;
pub mod inspect;
mod links;
pub mod manifest;
pub mod models;
pub mod numerics;
mod parallel;
mod quantizer;
pub mod recipe;
pub mod report;
mod rng;
#[cfg(feature = "cuda")]
pub mod runtime;
pub mod selection;
pub mod transcribe;
pub mod verify;
pub mod wer;

pub use error::{Error, Result};
pub use hashing::sha256_file;
pub use manifest::{Manifest, Utterance};
pub use models::registry::layout_of;
pub use quantizer::{convert, Outcome, Progress, Quantizer, Stage};
pub use recipe::Recipe;
