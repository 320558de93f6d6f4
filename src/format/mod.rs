//! Semantic number formats: how a tensor is quantized ([`QuantArgs`]), the named presets
//! ([`Scheme`]), and the `quantization` object of an OASR v2 checkpoint ([`QuantizationSpec`]).

mod quant_args;
mod scheme;
mod spec;

pub use crate::numerics::QuantDtype;
pub mod compressed_tensors;
pub use quant_args::{Granularity, QuantArgs};
pub use scheme::{Scheme, SchemeArgs};
pub use spec::{
    AlgorithmRecord, CalibrationRecord, FusedNorm, GemmChain, LayerSpec, Links, ModuleKind,
    ProducerRecord, QuantizationSpec, SmoothFold, SourceRecord,
};
