//! The verify run's CUDA lane (feature `cuda`): the quantized model's quantize steps and scaled
//! GEMMs on the GPU through [`CudaLane`], everything else as the CPU forward.
//!
//! Each quantized layer's codes, weight scales, bias, smoother and static multipliers are
//! uploaded once ([`CudaModel::new`]) and stay resident. Per call the activation is uploaded,
//! quantized on the GPU (per token with the optional runtime smoother, or statically), multiplied
//! by `scaled_mm` with the fused epilogue, and the rounded result downloaded. The producer of an
//! armed GEMM chain runs `scaled_mm_quant`: its epilogue (GELU, rounding to the served dtype, the
//! consumer's static quantize) writes the consumer's 8-bit input, which stays on the GPU and
//! which the consumer's GEMM reads directly. The numerics are those of [`super::QuantizedExec`],
//! so int8 results are bit-identical to the CPU reference (docs/cuda.md).
//!
//! One lane serves every utterance: utterances still run in parallel on the CPU, and each GPU
//! call (upload, kernels, download) holds the lane's lock, so calls never interleave.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use candle_core::{Device, Tensor, TensorId};
use cudarc::driver::CudaSlice;

use super::{QuantizedLayer, QuantizedModel};
use crate::error::{Error, Result};
use crate::format::QuantDtype;
use crate::models::exec::{activate, ce, to_vec, Linear, LinearExec};
use crate::numerics::{self, Activation, OutDtype};
use crate::runtime::{CudaLane, DeviceActScale, DeviceGemm, DeviceOutput};

/// Where a chain producer's epilogue writes: its consumer's 8-bit input.
struct ChainOutput {
    consumer: String,
    /// `numerics::static_multipliers(n, consumer smooth_inv, consumer input_scale)`.
    mult: CudaSlice<f32>,
    dtype: QuantDtype,
    /// The activation the producer's epilogue applies before quantizing (the spec's).
    activation: Activation,
}

/// One quantized layer, resident on the GPU.
struct DeviceLayer {
    dtype: QuantDtype,
    n: usize,
    k: usize,
    codes: CudaSlice<u8>,
    weight_scale: CudaSlice<f32>,
    bias: Option<CudaSlice<f32>>,
    smooth_inv: Option<CudaSlice<f32>>,
    /// Static layers: the input scale and `numerics::static_multipliers(k, smooth_inv, scale)`.
    input_scale: Option<(f32, CudaSlice<f32>)>,
    /// Producers of an armed GEMM chain whose consumer is static.
    chain: Option<ChainOutput>,
}

/// A quantized model's layers on one GPU.
pub struct CudaModel {
    lane: Mutex<CudaLane>,
    layers: BTreeMap<String, DeviceLayer>,
    device: String,
}

impl CudaModel {
    /// Uploads every quantized layer of `q` to `lane`'s GPU.
    pub fn new(q: &QuantizedModel, lane: CudaLane) -> Result<Self> {
        let info = lane.info();
        let device = format!("cuda ({}, {})", info.name, info.arch);
        let mut layers = BTreeMap::new();
        for (name, l) in &q.layers {
            layers.insert(name.clone(), upload_layer(&lane, q, name, l)?);
        }
        lane.synchronize()?;
        Ok(CudaModel {
            lane: Mutex::new(lane),
            layers,
            device,
        })
    }

    /// Opens GPU 0 (kernel cache from the environment) and uploads `q`'s layers.
    pub fn open(q: &QuantizedModel) -> Result<Self> {
        Self::new(q, CudaLane::new()?)
    }

    /// `cuda (<GPU name>, <architecture>)`, as the report names it.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// An executor of `q`'s forward (which must be the model these layers came from) whose
    /// quantized GEMMs run on this GPU, rounding to `served`.
    pub fn exec<'a>(&'a self, q: &'a QuantizedModel, served: OutDtype) -> CudaExec<'a> {
        CudaExec {
            model: self,
            q,
            served,
            pending: None,
            nonfinite: 0,
        }
    }

    fn lane(&self) -> MutexGuard<'_, CudaLane> {
        // A panic while holding the lock leaves no state half-written on the host side.
        self.lane.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn upload_layer(
    lane: &CudaLane,
    q: &QuantizedModel,
    name: &str,
    l: &QuantizedLayer,
) -> Result<DeviceLayer> {
    let n = l.n;
    let k = l.codes.len().checked_div(n).unwrap_or(0);
    if n == 0 || k * n != l.codes.len() || l.weight_scale.len() != n {
        return Err(Error::LayerRefused {
            layer: name.into(),
            reason: format!(
                "{} weight codes and {} weight scales do not make an [{n}, k] layer",
                l.codes.len(),
                l.weight_scale.len()
            ),
        });
    }
    let input_scale = l
        .input_scale
        .map(|s| -> Result<_> {
            let mult = numerics::static_multipliers(k, l.smooth_inv.as_deref(), s);
            Ok((s, lane.upload(&mult)?))
        })
        .transpose()?;
    let chain = if q.links.chain_producers.contains_key(name) {
        let consumer = q
            .spec
            .links
            .gemm_chains
            .iter()
            .find(|c| c.producer == name)
            .map(|c| (c.consumer.clone(), c.activation));
        match consumer.and_then(|(c, a)| q.layers.get(&c).map(|cl| (c, a, cl))) {
            Some((consumer, activation, cl)) => match cl.input_scale {
                Some(scale) => Some(ChainOutput {
                    mult: lane.upload(&numerics::static_multipliers(
                        n,
                        cl.smooth_inv.as_deref(),
                        scale,
                    ))?,
                    dtype: cl.dtype,
                    activation,
                    consumer,
                }),
                // A consumer without a static scale takes the rounded output, as on the CPU.
                None => None,
            },
            None => None,
        }
    } else {
        None
    };
    Ok(DeviceLayer {
        dtype: l.dtype,
        n,
        k,
        codes: lane.upload(&l.codes)?,
        weight_scale: lane.upload(&l.weight_scale)?,
        bias: l.bias.as_ref().map(|b| lane.upload(b)).transpose()?,
        smooth_inv: l.smooth_inv.as_ref().map(|s| lane.upload(s)).transpose()?,
        input_scale,
        chain,
    })
}

impl DeviceLayer {
    /// This layer's scaled GEMM on `rows` rows of its quantized input.
    fn gemm<'a>(
        &'a self,
        input: &'a DeviceInput,
        activation: Activation,
        served: OutDtype,
        rows: usize,
    ) -> DeviceGemm<'a> {
        let (a, a_scale) = match input {
            DeviceInput::PerRow(c, s) => (c, DeviceActScale::PerRow(s)),
            DeviceInput::PerTensor(c, s) => (c, DeviceActScale::PerTensor(*s)),
        };
        DeviceGemm {
            dtype: self.dtype,
            a,
            a_scale,
            w: &self.codes,
            weight_scale: &self.weight_scale,
            bias: self.bias.as_ref(),
            activation,
            out_dtype: served,
            m: rows,
            n: self.n,
            k: self.k,
        }
    }
}

/// A chain producer's output, kept on the GPU for its consumer.
struct Pending {
    /// The placeholder tensor the producer returned in its place.
    tensor: TensorId,
    consumer: String,
    codes: CudaSlice<u8>,
    rows: usize,
}

/// Runs the quantized layers on the GPU, the rest in f32 on the CPU (one per utterance).
pub struct CudaExec<'a> {
    model: &'a CudaModel,
    q: &'a QuantizedModel,
    served: OutDtype,
    pending: Option<Pending>,
    /// Non-finite values seen in the rounded outputs of quantized GEMMs (a chain producer's
    /// output stays on the GPU as its consumer's codes and is not scanned; the codes of an
    /// 8-bit encode are never NaN).
    pub nonfinite: usize,
}

/// The activation's 8-bit codes on the GPU and its scale.
enum DeviceInput {
    PerRow(CudaSlice<u8>, CudaSlice<f32>),
    PerTensor(CudaSlice<u8>, f32),
}

impl CudaExec<'_> {
    fn run(
        &mut self,
        name: &str,
        d: &DeviceLayer,
        x: &Tensor,
        activation: Activation,
    ) -> Result<Tensor> {
        let (rows, k) = x.dims2().map_err(ce(name))?;
        if k != d.k {
            return Err(Error::Model {
                what: name.into(),
                message: format!("input has {k} columns, the quantized layer {}", d.k),
            });
        }
        let pending = match self.pending.take() {
            Some(p) if p.tensor == x.id() => {
                if p.consumer != name || p.rows != rows {
                    return Err(Error::Model {
                        what: name.into(),
                        message: format!(
                            "received the GEMM-chain output meant for `{}`",
                            p.consumer
                        ),
                    });
                }
                Some(p.codes)
            }
            // An unconsumed chain output is dropped (the forward never leaves one).
            _ => None,
        };
        // The host side of the input, before the lane is taken.
        let values = match &pending {
            Some(_) => Vec::new(),
            None => host_input(self.q, name, d, to_vec(x, name)?, self.served),
        };
        let lane = self.model.lane();
        let input = match (&d.input_scale, pending) {
            (Some((scale, _)), Some(codes)) => DeviceInput::PerTensor(codes, *scale),
            (None, Some(_)) => {
                return Err(Error::Model {
                    what: name.into(),
                    message: "a GEMM-chain consumer without a static input scale".into(),
                })
            }
            (_, None) => quantize_input(&lane, self.q, name, d, &values, rows)?,
        };
        let gemm = d.gemm(&input, activation, self.served, rows);
        if let Some(chain) = d.chain.as_ref().filter(|c| c.activation == activation) {
            let mut codes = lane.zeros::<u8>(rows * d.n)?;
            lane.launch_scaled_mm(
                &gemm,
                DeviceOutput::Quantized {
                    codes: &mut codes,
                    mult: &chain.mult,
                    dtype: chain.dtype,
                },
                None,
            )?;
            drop(lane);
            // The forward hands this to the consumer, which reads the codes instead. NaN, so
            // that any other use of it would show in the report's non-finite count.
            let placeholder = Tensor::new(f32::NAN, &Device::Cpu)
                .and_then(|t| t.broadcast_as((rows, d.n)))
                .map_err(ce(name))?;
            self.pending = Some(Pending {
                tensor: placeholder.id(),
                consumer: chain.consumer.clone(),
                codes,
                rows,
            });
            return Ok(placeholder);
        }
        let out = rounded(&lane, &gemm)?;
        drop(lane);
        self.nonfinite += out.iter().filter(|v| !v.is_finite()).count();
        Tensor::from_vec(out, (rows, d.n), &Device::Cpu).map_err(ce(name))
    }
}

impl CudaModel {
    /// One quantized layer of `q` on the GPU, on `values` (`[rows, k]`, the layer's input in the
    /// frame its weights expect): its served output, rounded as the verify run rounds it. A
    /// chain producer applies `activation` in its epilogue and returns the rounded result, not
    /// its consumer's codes. What `verify --per-layer --device cuda` compares per layer.
    pub(crate) fn layer_output(
        &self,
        q: &QuantizedModel,
        name: &str,
        values: &[f32],
        rows: usize,
        activation: Activation,
        served: OutDtype,
    ) -> Result<Vec<f32>> {
        let d = self.layers.get(name).ok_or_else(|| Error::LayerRefused {
            layer: name.into(),
            reason: "not a quantized layer of the checkpoint on the GPU".into(),
        })?;
        if values.len() != rows * d.k {
            return Err(Error::Model {
                what: name.into(),
                message: format!(
                    "input has {} values, not {rows} rows of {}",
                    values.len(),
                    d.k
                ),
            });
        }
        let values = host_input(q, name, d, values.to_vec(), served);
        let lane = self.lane();
        let input = quantize_input(&lane, q, name, d, &values, rows)?;
        rounded(&lane, &d.gemm(&input, activation, served, rows))
    }
}

/// A layer's input as the host hands it to the GPU: a fused norm's consumer quantizes the norm
/// output rounded to the served dtype (numerics::norm_quant_per_token); every other input as is.
fn host_input(
    q: &QuantizedModel,
    name: &str,
    d: &DeviceLayer,
    values: Vec<f32>,
    served: OutDtype,
) -> Vec<f32> {
    if d.input_scale.is_none() && q.links.norm_fed.contains(name) {
        values
            .into_iter()
            .map(|v| numerics::out_bits_to_f32(served, numerics::round_to_out(served, v)))
            .collect()
    } else {
        values
    }
}

/// Uploads and quantizes a layer's host input: statically with its input scale, or per token
/// (with its runtime smoother, except a fused norm's consumer, which has none).
fn quantize_input(
    lane: &CudaLane,
    q: &QuantizedModel,
    name: &str,
    d: &DeviceLayer,
    values: &[f32],
    rows: usize,
) -> Result<DeviceInput> {
    let k = d.k;
    let xd = lane.upload(values)?;
    let mut codes = lane.zeros::<u8>(rows * k)?;
    Ok(match &d.input_scale {
        Some((scale, mult)) => {
            lane.launch_quantize_static(&xd, mult, &mut codes, rows, k, d.dtype)?;
            DeviceInput::PerTensor(codes, *scale)
        }
        None => {
            let smooth = if q.links.norm_fed.contains(name) {
                None
            } else {
                d.smooth_inv.as_ref()
            };
            let mut scales = lane.zeros::<f32>(rows)?;
            lane.launch_quantize_per_token(&xd, smooth, &mut codes, &mut scales, rows, k, d.dtype)?;
            DeviceInput::PerRow(codes, scales)
        }
    })
}

/// Runs `gemm` with its output rounded to the served dtype, downloaded as f32.
fn rounded(lane: &CudaLane, gemm: &DeviceGemm) -> Result<Vec<f32>> {
    let mut out = lane.zeros::<u16>(gemm.m * gemm.n)?;
    lane.launch_scaled_mm(gemm, DeviceOutput::Rounded(&mut out), None)?;
    Ok(lane
        .download(&out)?
        .into_iter()
        .map(|b| numerics::out_bits_to_f32(gemm.out_dtype, b))
        .collect())
}

impl LinearExec for CudaExec<'_> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        match self.model.layers.get(&layer.name) {
            Some(d) => self.run(&layer.name, d, x, Activation::None),
            None => layer.forward(x),
        }
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        match self.model.layers.get(&layer.name) {
            // The chain's producer emits its consumer's input: the activation belongs to its
            // epilogue.
            Some(d) if self.q.links.chain_producer(&layer.name, activation)? => {
                self.run(&layer.name, d, x, activation)
            }
            _ => activate(self.linear(layer, x)?, activation, &layer.name),
        }
    }
}
