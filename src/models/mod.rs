//! One folder per architecture: its configuration and its `quantization_layout()`, which is data
//! only (which GEMMs exist, where smoothing folds, which links may arm).

pub mod conformer;
pub mod exec;
mod gemv;
pub mod registry;
pub mod speech;
pub mod whisper;

pub use registry::{load, load_with};
pub use speech::{DecodeOptions, Decoding, LogMelPadding, SpeechModel, Task};

use std::collections::HashSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{ModuleKind, QuantizationSpec, SmoothFold};
use crate::numerics::Activation;

/// A quantizable layer: a GEMM (linear or pointwise conv) or a convolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizableLayer {
    /// Module path; the weight is `<name>.weight`.
    pub name: String,
    pub kind: ModuleKind,
    pub out_features: usize,
    /// Input channels (for a convolution, per tap).
    pub in_features: usize,
    /// Convolution groups (1 for GEMMs).
    pub groups: usize,
}

/// GEMMs that share one input X and the place the inverse smoothing factor folds into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmoothGroup {
    /// The module that produces X: a norm, a producer GEMM, or None for a runtime smoother.
    pub producer: Option<String>,
    pub fold: SmoothFold,
    pub consumers: Vec<String>,
    /// Whether the producer (a norm) may emit the consumers' 8-bit input.
    pub fuse_output_quant: bool,
    /// For `v_to_o` and `producer_rows`: the first of the producer's output rows that 1/s
    /// divides (the V rows of a fused q;k;v projection start at 2·d); 0 otherwise.
    pub producer_rows_from: usize,
}

/// A producer GEMM whose output feeds one consumer GEMM (possibly across an activation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmChainLayout {
    pub producer: String,
    pub consumer: String,
    /// The activation between them, applied in the producer's epilogue when the chain is armed.
    pub activation: Activation,
    /// The chain runs inside an autoregressive decoder's step (a handful of rows per call):
    /// arming it saves one small quantize launch, while a static scale costs the decoder's
    /// logits the most, so `static_inputs` leaves it per-token unless asked
    /// (`static_inputs.decoder=true`; docs/recipes.md).
    pub decode_step: bool,
}

/// What an architecture declares about quantization.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizationLayout {
    pub layers: Vec<QuantizableLayer>,
    pub smooth_groups: Vec<SmoothGroup>,
    /// Folds one factor shared across layers can make in place of runtime smoothers (Whisper:
    /// every decoder layer's cross-attention k/v read the encoder output, so one factor folds
    /// into `encoder.layer_norm`); used when a recipe asks (`smoothquant.shared_folds`), and
    /// then the runtime groups of the same consumers are not.
    pub shared_folds: Vec<SmoothGroup>,
    pub gemm_chains: Vec<GemmChainLayout>,
    /// Tensors that always stay full precision, with the reason.
    pub kept_full_precision: Vec<(String, String)>,
    /// Layers whose rows must not depend on the batch they are computed in.
    pub batch_invariant: Vec<String>,
    /// Layers that run in the model's search (`SpeechModel::decode`: an autoregressive
    /// decoder's steps, or a rescoring decoder) rather than in its encoder: a calibration pass
    /// that observes none of them runs no search.
    pub decode_step_layers: Vec<String>,
}

impl QuantizationLayout {
    /// Checks a quantization spec (`path`'s) against this layout: every quantized layer is a
    /// quantizable layer of the model, of its kind; every `smoothed_into` names one of the
    /// model's `modules` (its tensors' module paths); every fused norm is a norm the layout lets
    /// emit its consumers' 8-bit input; every GEMM chain is one of the layout's, with its
    /// activation. `model` names the architecture in the errors.
    pub(crate) fn check_spec(
        &self,
        path: &Path,
        modules: &HashSet<String>,
        spec: &QuantizationSpec,
        model: &str,
    ) -> Result<()> {
        for (name, layer) in &spec.layers {
            let key = format!("quantization.layers.{name}");
            let Some(known) = self.layers.iter().find(|l| &l.name == name) else {
                return Err(Error::config_key(
                    path,
                    key,
                    format!("is not a quantizable layer of this {model}"),
                ));
            };
            if known.kind != layer.kind {
                return Err(Error::config_key(
                    path,
                    format!("{key}.kind"),
                    format!(
                        "is {}; the layer is a {}",
                        layer.kind.name(),
                        known.kind.name()
                    ),
                ));
            }
            if let Some(into) = &layer.smoothed_into {
                if !modules.contains(into) {
                    return Err(Error::config_key(
                        path,
                        format!("{key}.smoothed_into"),
                        format!("`{into}` is not a module of this {model}"),
                    ));
                }
            }
        }
        for norm in &spec.links.fused_norms {
            let fusable = self
                .smooth_groups
                .iter()
                .any(|g| g.fuse_output_quant && g.producer.as_deref() == Some(norm.norm.as_str()));
            if !fusable {
                return Err(Error::config_key(
                    path,
                    "quantization.links.fused_norms",
                    format!(
                        "`{}` is not a norm of this {model} that may emit its consumers' 8-bit input",
                        norm.norm
                    ),
                ));
            }
        }
        for chain in &spec.links.gemm_chains {
            let known = self
                .gemm_chains
                .iter()
                .find(|c| c.producer == chain.producer && c.consumer == chain.consumer);
            match known {
                None => {
                    return Err(Error::config_key(
                        path,
                        "quantization.links.gemm_chains",
                        format!(
                            "`{}` -> `{}` is not a GEMM chain of this {model}",
                            chain.producer, chain.consumer
                        ),
                    ))
                }
                Some(c) if c.activation != chain.activation => {
                    return Err(Error::config_key(
                        path,
                        "quantization.links.gemm_chains",
                        format!(
                            "`{}` -> `{}` records the activation `{}`; this {model} applies `{}`",
                            chain.producer,
                            chain.consumer,
                            chain.activation.name(),
                            c.activation.name()
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Whether `layer` runs in the model's search (see `decode_step_layers`).
    pub fn in_decode_step(&self, layer: &str) -> bool {
        self.decode_step_layers.iter().any(|l| l == layer)
    }
}
