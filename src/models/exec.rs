//! The executor seam every architecture's forward runs its quantizable GEMMs through: a
//! [`LinearExec`] decides how a [`Linear`] is computed (full precision, observed by calibration,
//! or with the quantized numerics of a verify run), so the rest of a forward never changes.

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::numerics::Activation;

/// Maps a candle error into the crate's error, naming what was being computed.
pub(crate) fn ce(what: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |e| Error::Model {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// A GEMM layer: `y = x · Wᵀ + b`. Convolutions are stored here flattened to `[out, k · in]`,
/// matching im2col patches ordered (tap, channel).
#[derive(Debug, Clone)]
pub struct Linear {
    pub name: String,
    /// `[out, in]` (convolutions: `[out, k · in]`).
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// The full-precision product.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x
            .matmul(&self.weight.t().map_err(ce(&self.name))?)
            .map_err(ce(&self.name))?;
        match &self.bias {
            Some(b) => y.broadcast_add(b).map_err(ce(&self.name)),
            None => Ok(y),
        }
    }
}

/// How a forward runs its quantizable GEMMs.
pub trait LinearExec {
    /// `x` is `[rows, in]`; returns `[rows, out]`.
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor>;

    /// The layer followed by `activation` (an FFN's first projection). An executor whose GEMM
    /// applies the activation in its epilogue (a GEMM-chain producer) overrides this.
    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        activate(self.linear(layer, x)?, activation, &layer.name)
    }
}

/// Plain fp32.
#[derive(Debug, Default, Clone, Copy)]
pub struct FullPrecision;

impl LinearExec for FullPrecision {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        layer.forward(x)
    }
}

/// The tensor's values, row-major.
pub(crate) fn to_vec(x: &Tensor, what: &str) -> Result<Vec<f32>> {
    x.flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce(what))
}

/// `activation` of every element with the reference numerics (`crate::numerics`), so the
/// forward, the verify run and the kernels' epilogues compute the same bits. GELU runs
/// vectorised (libm's scalar `erff` made GELU a tenth of Whisper's forward).
pub(crate) fn activate(x: Tensor, activation: Activation, what: &str) -> Result<Tensor> {
    if activation == Activation::None {
        return Ok(x);
    }
    let shape = x.shape().clone();
    let mut values = to_vec(&x, what)?;
    match activation {
        Activation::Gelu => crate::numerics::gelu_in_place(&mut values),
        other => values
            .iter_mut()
            .for_each(|v| *v = crate::numerics::activate(other, *v)),
    }
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(ce(what))
}
