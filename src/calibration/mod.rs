//! Calibration: the selection of utterances, observers, and the calibration loop.

mod gram;
mod histogram;
mod observer;
mod rows;
mod run;
mod shared;

pub use gram::{available_memory, gram_bytes, gram_workers, GramObserver};
pub use histogram::{
    channel_weights, AbsHistogram, ClipObserver, HistogramObserver, HistogramTarget,
    BINS as HISTOGRAM_BINS,
};
pub use observer::{AbsMaxObserver, BothObservers, Observer, ObservingExec};
pub use rows::RowSampleObserver;
pub use run::{
    observe, observe_in_flight, observe_with, CalibrationSet, DecoderPass, Observed,
    DEFAULT_UTTERANCES,
};
pub use shared::SharedObservations;
