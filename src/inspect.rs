//! A summary of a checkpoint for `oasr-quantize inspect`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::format::ProducerRecord;

/// What `inspect` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub path: String,
    pub source_format: String,
    pub format_version: u32,
    pub architecture: String,
    pub tensors: usize,
    pub parameters: usize,
    /// The presets used (empty for full precision).
    pub schemes: Vec<String>,
    /// Quantized layers counted by "kind / scheme".
    pub layers_by_kind_and_scheme: BTreeMap<String, usize>,
    pub quantized_layers: usize,
    pub fused_norms: usize,
    pub gemm_chains: usize,
    pub kv_cache: Option<String>,
    /// Layers left full precision, with the reason.
    pub skipped: BTreeMap<String, String>,
    pub producer: Option<ProducerRecord>,
}

/// Reads a checkpoint (any supported format) and summarises it.
pub fn inspect(path: &Path) -> Result<Summary> {
    let ckpt = Checkpoint::open(path)?;
    let spec = ckpt.config.quantization.as_ref();
    let mut by_kind = BTreeMap::new();
    for layer in spec.iter().flat_map(|s| s.layers.values()) {
        *by_kind
            .entry(format!("{} / {}", layer.kind.name(), layer.scheme.name()))
            .or_insert(0) += 1;
    }
    Ok(Summary {
        path: path.display().to_string(),
        source_format: ckpt.format.name().into(),
        format_version: ckpt.config.format_version,
        architecture: ckpt.config.architecture.clone(),
        tensors: ckpt.tensors.len(),
        parameters: ckpt.tensors.values().map(|t| t.numel()).sum(),
        schemes: spec
            .map(|s| s.schemes.keys().cloned().collect())
            .unwrap_or_default(),
        layers_by_kind_and_scheme: by_kind,
        quantized_layers: spec.map_or(0, |s| s.layers.len()),
        fused_norms: spec.map_or(0, |s| s.links.fused_norms.len()),
        gemm_chains: spec.map_or(0, |s| s.links.gemm_chains.len()),
        kv_cache: spec.and_then(|s| s.kv_cache.clone()),
        skipped: spec.map(|s| s.producer.skipped.clone()).unwrap_or_default(),
        producer: spec.map(|s| s.producer.clone()),
    })
}
