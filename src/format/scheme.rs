use serde::{Deserialize, Serialize};

use super::{Granularity, QuantArgs, QuantDtype};
use crate::error::{Error, Result};

/// The weight and input arguments of one scheme, as the spec stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemeArgs {
    pub weight: QuantArgs,
    pub input: QuantArgs,
}

/// The four W8A8 presets a checkpoint may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    Int8W8a8,
    Int8W8a8Static,
    Fp8W8a8,
    Fp8W8a8Static,
}

/// Scheme names that are known but refused, with the reason.
const REFUSED: &[(&str, &str)] = &[(
    "nvfp4",
    "4-bit NVFP4 is a known scheme but oasr-quantize writes 8-bit W8A8 checkpoints only",
)];

impl Scheme {
    pub const ALL: [Scheme; 4] = [
        Scheme::Int8W8a8,
        Scheme::Int8W8a8Static,
        Scheme::Fp8W8a8,
        Scheme::Fp8W8a8Static,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::Int8W8a8 => "int8_w8a8",
            Scheme::Int8W8a8Static => "int8_w8a8_static",
            Scheme::Fp8W8a8 => "fp8_w8a8",
            Scheme::Fp8W8a8Static => "fp8_w8a8_static",
        }
    }

    /// Parses a preset name; `nvfp4` and unknown names are refused by name.
    pub fn from_name(name: &str) -> Result<Self> {
        if let Some(scheme) = Scheme::ALL.into_iter().find(|s| s.name() == name) {
            return Ok(scheme);
        }
        let message = match REFUSED.iter().find(|(n, _)| *n == name) {
            Some((_, why)) => (*why).to_string(),
            None => format!(
                "unknown scheme; the presets are {}",
                Scheme::ALL.map(Scheme::name).join(", ")
            ),
        };
        Err(Error::Scheme {
            name: name.to_string(),
            message,
        })
    }

    pub fn dtype(self) -> QuantDtype {
        match self {
            Scheme::Int8W8a8 | Scheme::Int8W8a8Static => QuantDtype::Int8,
            Scheme::Fp8W8a8 | Scheme::Fp8W8a8Static => QuantDtype::Float8E4m3fn,
        }
    }

    /// Whether the input scale is a calibrated per-tensor `input_scale`.
    pub fn is_static(self) -> bool {
        matches!(self, Scheme::Int8W8a8Static | Scheme::Fp8W8a8Static)
    }

    /// The same format with a static (true) or per-token (false) input.
    pub fn with_static_input(self, is_static: bool) -> Self {
        match (self.dtype(), is_static) {
            (QuantDtype::Int8, false) => Scheme::Int8W8a8,
            (QuantDtype::Int8, true) => Scheme::Int8W8a8Static,
            (QuantDtype::Float8E4m3fn, false) => Scheme::Fp8W8a8,
            (QuantDtype::Float8E4m3fn, true) => Scheme::Fp8W8a8Static,
        }
    }

    pub fn args(self) -> SchemeArgs {
        let dtype = self.dtype();
        SchemeArgs {
            weight: QuantArgs::weight(dtype),
            input: if self.is_static() {
                QuantArgs::static_per_tensor(dtype)
            } else {
                QuantArgs::per_token(dtype)
            },
        }
    }
}

impl SchemeArgs {
    /// Checks that the arguments are ones the serving kernels implement.
    pub fn validate(&self, name: &str) -> Result<()> {
        let refuse = |message: &str| {
            Err(Error::Scheme {
                name: name.to_string(),
                message: message.to_string(),
            })
        };
        let (w, x) = (self.weight, self.input);
        if !w.symmetric || !x.symmetric {
            return refuse("asymmetric quantization is not supported");
        }
        if w.dynamic || w.granularity != Granularity::PerChannel {
            return refuse("weights must be static and per output channel");
        }
        if w.dtype != x.dtype {
            return refuse("weight and input must use the same 8-bit format");
        }
        match (x.granularity, x.dynamic) {
            (Granularity::PerToken, true) | (Granularity::PerTensor, false) => Ok(()),
            (Granularity::PerTensor, true) => refuse(
                "a per-tensor dynamic activation scale is refused: it needs a global reduction \
                 before every GEMM; use per_token (dynamic) or per_tensor static",
            ),
            (Granularity::PerToken, false) => {
                refuse("a per-token activation scale must be dynamic")
            }
            (Granularity::PerChannel, _) => refuse("activations cannot be per channel"),
        }
    }
}
