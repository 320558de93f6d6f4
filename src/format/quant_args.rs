use serde::{Deserialize, Serialize};

use super::QuantDtype;

/// Over which elements one scale is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// One scale per output channel (weights).
    PerChannel,
    /// One scale per row of the activation, computed at run time.
    PerToken,
    /// One scale for the whole tensor.
    PerTensor,
}

/// How one tensor (a weight or a GEMM input) is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantArgs {
    pub dtype: QuantDtype,
    pub granularity: Granularity,
    /// Scale computed at run time (true) or stored in the checkpoint (false).
    pub dynamic: bool,
    pub symmetric: bool,
}

impl QuantArgs {
    /// A per-output-channel static symmetric weight.
    pub const fn weight(dtype: QuantDtype) -> Self {
        QuantArgs {
            dtype,
            granularity: Granularity::PerChannel,
            dynamic: false,
            symmetric: true,
        }
    }

    /// A per-token dynamic symmetric activation.
    pub const fn per_token(dtype: QuantDtype) -> Self {
        QuantArgs {
            dtype,
            granularity: Granularity::PerToken,
            dynamic: true,
            symmetric: true,
        }
    }

    /// A per-tensor static symmetric activation (a calibrated `input_scale`).
    pub const fn static_per_tensor(dtype: QuantDtype) -> Self {
        QuantArgs {
            dtype,
            granularity: Granularity::PerTensor,
            dynamic: false,
            symmetric: true,
        }
    }
}
