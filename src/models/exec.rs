//! The executor seam every architecture's forward runs its quantizable GEMMs through: a
//! [`LinearExec`] decides how a [`Linear`] is computed (full precision, observed by calibration,
//! or with the quantized numerics of a verify run), so the rest of a forward never changes.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::gemv;

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

/// The deepest K one f32 GEMM call sums over. The gemm crate splits a deeper K into blocks sized
/// from the CPU's L1 cache (512 on a 32 KiB 8-way L1, 768 on a 48 KiB 12-way one for K 1536),
/// which changes the order of the sum from one machine to another; up to 512 it sums in one
/// block everywhere. So every f32 GEMM of a forward sums K in chunks of 512, each from zero,
/// added in order: the figures of a gate are then the same on every x86-64 machine.
pub(crate) const GEMM_DEPTH: usize = 512;

/// `x · w_t` for `x` `[rows, k]` and `w_t` `[k, n]`, K summed in chunks of [`GEMM_DEPTH`]; up to
/// [`gemv::MAX_ROWS`] rows with a weight stored as `[n, k]` (`w_t` its transposed view), in the
/// fixed order of [`gemv`] instead.
pub(crate) fn matmul(x: &Tensor, w_t: &Tensor, what: &str) -> Result<Tensor> {
    let k = w_t.dim(0).map_err(ce(what))?;
    if let Some(y) = few_rows(x, w_t, what)? {
        return Ok(y);
    }
    let chunk = |k0: usize| {
        let depth = GEMM_DEPTH.min(k - k0);
        x.narrow(candle_core::D::Minus1, k0, depth)?
            .matmul(&w_t.narrow(0, k0, depth)?)
    };
    if k <= GEMM_DEPTH {
        return x.matmul(w_t).map_err(ce(what));
    }
    let mut y = chunk(0).map_err(ce(what))?;
    for k0 in (GEMM_DEPTH..k).step_by(GEMM_DEPTH) {
        y = chunk(k0).and_then(|part| y + part).map_err(ce(what))?;
    }
    Ok(y)
}

/// [`gemv::product`] when `x` has at most [`gemv::MAX_ROWS`] rows of f32 and `w_t` is the
/// transposed view of a contiguous f32 `[n, k]` weight on the CPU; `None` otherwise.
fn few_rows(x: &Tensor, w_t: &Tensor, what: &str) -> Result<Option<Tensor>> {
    let (Ok((k, n)), Ok(w), DType::F32) = (w_t.dims2(), w_t.t(), x.dtype()) else {
        return Ok(None);
    };
    let rows = x.elem_count() / k.max(1);
    if rows == 0 || rows > gemv::MAX_ROWS || x.dim(candle_core::D::Minus1).ok() != Some(k) {
        return Ok(None);
    }
    let (storage, layout) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(data)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let xs = to_vec(x, what)?;
    let y = gemv::product(&xs, rows, k, &data[start..end], n);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Tensor::from_vec(y, dims, &Device::Cpu)
        .map(Some)
        .map_err(ce(what))
}

impl Linear {
    /// The full-precision product.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w_t = self.weight.t().map_err(ce(&self.name))?;
        let y = matmul(x, &w_t, &self.name)?;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Seeded values in [-0.5, 0.5).
    pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    /// Depths below, at and across the chunk size, with a ragged last chunk: every chunk is
    /// summed once (an off-by-one at a boundary would drop or repeat a column).
    #[test]
    fn chunked_matmul_sums_every_column_once() {
        for k in [1, 7, GEMM_DEPTH, GEMM_DEPTH + 1, 1153, 1536] {
            let (m, n) = (5, 9);
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let x = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
            let w_t = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
            let y = matmul(&x, &w_t, "test").unwrap().to_vec2::<f32>().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|c| f64::from(a[i * k + c]) * f64::from(b[c * n + j]))
                        .sum();
                    let got = f64::from(y[i][j]);
                    assert!(
                        (got - exact).abs() < 1e-4 * (k as f64).sqrt(),
                        "k {k} ({i}, {j}): {got} vs {exact}"
                    );
                }
            }
        }
    }
}
