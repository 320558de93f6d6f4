//! One folder per architecture: its configuration and its `quantization_layout()`, which is data
//! only (which GEMMs exist, where smoothing folds, which links may arm).

pub mod conformer;
pub mod exec;
pub mod registry;
pub mod speech;
pub mod whisper;

pub use registry::load;
pub use speech::{Decoding, SpeechModel};

use crate::format::{ModuleKind, SmoothFold};
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
    /// Whether `layer` runs in the model's search (see `decode_step_layers`).
    pub fn in_decode_step(&self, layer: &str) -> bool {
        self.decode_step_layers.iter().any(|l| l == layer)
    }
}
