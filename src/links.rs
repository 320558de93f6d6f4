//! Arming the links (docs/format.md): fused norms and GEMM chains, from the layout and the
//! layers as quantized.

use std::collections::BTreeMap;

use crate::format::{FusedNorm, GemmChain, LayerSpec, Links, SmoothFold};
use crate::models::QuantizationLayout;

/// Arms the links and fills each consumer's `input_quantized_by`.
///
/// A norm emits 8-bit for its consumers when every consumer is quantized with a per-token input,
/// no runtime smoother, and one format. A GEMM chain arms when both ends are quantized in the same
/// format and the consumer has a static input scale.
pub fn arm(layout: &QuantizationLayout, layers: &mut BTreeMap<String, LayerSpec>) -> Links {
    let mut links = Links::default();
    for group in &layout.smooth_groups {
        let Some(norm) = &group.producer else {
            continue;
        };
        if !group.fuse_output_quant || group.fold != SmoothFold::NormAffine {
            continue;
        }
        let specs: Option<Vec<&LayerSpec>> =
            group.consumers.iter().map(|c| layers.get(c)).collect();
        let Some(specs) = specs else { continue };
        let dtype = specs[0].scheme.dtype();
        let armed = specs.iter().all(|s| {
            !s.scheme.is_static() && s.smooth != SmoothFold::Runtime && s.scheme.dtype() == dtype
        });
        if armed {
            links.fused_norms.push(FusedNorm {
                norm: norm.clone(),
                consumers: group.consumers.clone(),
                dtype,
            });
        }
    }
    for chain in &layout.gemm_chains {
        let (Some(p), Some(c)) = (layers.get(&chain.producer), layers.get(&chain.consumer)) else {
            continue;
        };
        if c.scheme.is_static() && p.scheme.dtype() == c.scheme.dtype() {
            links.gemm_chains.push(GemmChain {
                producer: chain.producer.clone(),
                consumer: chain.consumer.clone(),
                dtype: c.scheme.dtype(),
                activation: chain.activation,
            });
        }
    }
    for norm in &links.fused_norms {
        for consumer in &norm.consumers {
            if let Some(spec) = layers.get_mut(consumer) {
                spec.input_quantized_by = Some(norm.norm.clone());
            }
        }
    }
    for chain in &links.gemm_chains {
        if let Some(spec) = layers.get_mut(&chain.consumer) {
            spec.input_quantized_by = Some(chain.producer.clone());
        }
    }
    links
}
