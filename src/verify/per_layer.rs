//! `verify --per-layer`: each quantized GEMM's own error, measured inside the full-precision
//! reference model.
//!
//! Two figures per layer, both teacher-forced on the full-precision model's tokens:
//!
//! - **output error**: the reference forward runs in f32; at every quantized layer, the same input
//!   also goes through the layer's served numerics (`QuantizedLayer::forward_values`, the code
//!   the verify run uses) and the two outputs are compared (relative L2 over all rows, and the
//!   worst row). The stream continues with the f32 output, so every layer sees the reference
//!   input.
//! - **logit share**: the reference model with only this layer quantized scores the tokens; its
//!   logit error against the reference (1 − cosine and KL, mean over steps) divided by the same
//!   error of the fully quantized checkpoint.
//!
//! A quantized checkpoint stores SmoothQuant-smoothed weights, so a layer's numerics run in the
//! layer's own frame: a consumer of a group folded into a norm or V projection (`norm_affine`,
//! `v_to_o`) reads `x_ref / s`, and a V projection that absorbed a `v_to_o` group's 1/s writes
//! `v_ref / s`; a `runtime` group's consumer reads `x_ref` (its `smooth_inv` is applied by the
//! quantize step). The factors s of the folded groups come from the checkpoint's
//! `smoothing_factors.safetensors` (docs/format.md).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use super::{cosine, kl, log_softmax, to_f64, QuantizedLayer, QuantizedModel, UNNAMED_SOURCE};
use crate::checkpoint::{read_smoothing_factors, SMOOTHING_FACTORS_FILE, SMOOTHING_FACTORS_SUFFIX};
use crate::error::{Error, Result};
use crate::format::{ModuleKind, Scheme, SmoothFold};
use crate::manifest::Utterance;
use crate::models::exec::{activate, ce, to_vec, Linear, LinearExec};
use crate::models::whisper::WhisperAsr;
use crate::models::SpeechModel;
use crate::numerics::{self, Activation, OutDtype};

/// Whether a fold put a group's 1/s into another module (so the checkpoint's tensors no longer
/// show s).
fn folded(fold: SmoothFold) -> bool {
    matches!(
        fold,
        SmoothFold::NormAffine | SmoothFold::VToO | SmoothFold::ProducerRows
    )
}

/// One quantized layer, ready to run inside the reference forward.
pub(crate) struct Target<'a> {
    pub(crate) name: String,
    layer: &'a QuantizedLayer,
    scheme: Scheme,
    kind: ModuleKind,
    smooth: SmoothFold,
    k: usize,
    /// Its input is emitted by an armed fused norm (quantized from the norm output rounded to the
    /// served dtype).
    norm_fed: bool,
    /// The producer of an armed GEMM chain: GELU in its epilogue, before the rounding.
    chain_producer: bool,
    /// s of the group that smoothed its input when 1/s was folded upstream: the layer's input
    /// frame is `x_ref / s`.
    input_div: Option<Vec<f32>>,
    /// s of a group whose 1/s went into this layer's rows (a `v_to_o` V projection): its output
    /// frame is `y_ref / s`.
    output_mul: Option<Vec<f32>>,
    /// The stored weight dequantized (`decode(code) · weight_scale`), with the stored bias: the
    /// layer in f32 in its own frame.
    dequantized: Linear,
}

impl Target<'_> {
    /// The reference input mapped into the layer's frame: `[rows, k]` values.
    fn frame_input(&self, x: &Tensor) -> Result<(Vec<f32>, usize)> {
        let (rows, k) = x.dims2().map_err(ce(&self.name))?;
        if k != self.k {
            return Err(Error::LayerRefused {
                layer: self.name.clone(),
                reason: format!(
                    "the reference feeds it {k} input channels, the checkpoint stores {}",
                    self.k
                ),
            });
        }
        let mut values = to_vec(x, &self.name)?;
        if let Some(s) = &self.input_div {
            for row in values.chunks_exact_mut(k) {
                row.iter_mut().zip(s).for_each(|(v, s)| *v /= s);
            }
        }
        Ok((values, rows))
    }

    /// A layer output in its frame, mapped back to the reference's.
    fn frame_output(&self, mut y: Vec<f32>) -> Vec<f32> {
        if let Some(s) = &self.output_mul {
            for row in y.chunks_exact_mut(s.len()) {
                row.iter_mut().zip(s).for_each(|(v, s)| *v *= s);
            }
        }
        y
    }

    /// The served numerics on a frame input, in the reference frame.
    fn quantized(
        &self,
        input: &[f32],
        rows: usize,
        activation: Activation,
        served: OutDtype,
    ) -> Vec<f32> {
        let y = self
            .layer
            .forward_values(input, rows, self.k, self.norm_fed, activation, served);
        self.frame_output(y)
    }

    /// The dequantized weights in f32 on an unquantized frame input (times `smooth_inv` where the
    /// layer has one), in the reference frame: only the weight's rounding differs from the
    /// reference, so this is close to it exactly when the frame mapping is right.
    fn weight_only(&self, input: &[f32], rows: usize, activation: Activation) -> Result<Vec<f32>> {
        let mut x = input.to_vec();
        if let Some(inv) = &self.layer.smooth_inv {
            for row in x.chunks_exact_mut(self.k) {
                row.iter_mut().zip(inv).for_each(|(v, s)| *v *= s);
            }
        }
        let x = Tensor::from_vec(x, (rows, self.k), &Device::Cpu).map_err(ce(&self.name))?;
        let y = activate(self.dequantized.forward(&x)?, activation, &self.name)?;
        Ok(self.frame_output(to_vec(&y, &self.name)?))
    }

    /// The layer's quantized output for a reference input, as a tensor in the reference frame.
    fn run(
        &self,
        x: &Tensor,
        activation: Activation,
        served: OutDtype,
        nonfinite: &mut usize,
    ) -> Result<Tensor> {
        let (input, rows) = self.frame_input(x)?;
        let y = self.quantized(&input, rows, activation, served);
        *nonfinite += y.iter().filter(|v| !v.is_finite()).count();
        Tensor::from_vec(y, (rows, self.layer.n), &Device::Cpu).map_err(ce(&self.name))
    }
}

/// Every quantized layer of a checkpoint, mapped onto the reference model.
pub(crate) struct Plan<'a> {
    pub(crate) targets: Vec<Target<'a>>,
    index: HashMap<String, usize>,
}

impl<'a> Plan<'a> {
    /// Matches `q`'s quantized layers (loaded from `dir`) with the reference model's and reads the
    /// smoothing factors. A checkpoint with folded smoothing but without the recorded factors is
    /// refused: its layers' input frames cannot be reconstructed.
    pub(crate) fn new(
        q: &'a QuantizedModel,
        dir: &Path,
        reference: &dyn SpeechModel,
    ) -> Result<Self> {
        let reference = &whisper_of(reference)?.model;
        let spec = &q.spec;
        let path = dir.join(SMOOTHING_FACTORS_FILE);
        let needs_factors = spec.layers.values().any(|l| folded(l.smooth));
        let factors = match read_smoothing_factors(dir)? {
            Some(f) => f,
            None if needs_factors => {
                let count = spec.layers.values().filter(|l| folded(l.smooth)).count();
                return Err(Error::MissingDiagnostics {
                    path,
                    message: format!(
                        "verify --per-layer needs the SmoothQuant factors of the groups folded \
                         into a norm or V projection ({count} quantized layers read such an \
                         input), and this checkpoint does not record them; re-quantize it with \
                         this version of oasr-quantize ({}), which writes them",
                        env!("CARGO_PKG_VERSION")
                    ),
                });
            }
            None => BTreeMap::new(),
        };
        let factor = |module: &str, len: usize, layer: &str| -> Result<Vec<f32>> {
            let name = format!("{module}{SMOOTHING_FACTORS_SUFFIX}");
            let s = factors.get(module).ok_or_else(|| {
                Error::tensor(
                    &path,
                    &name,
                    format!(
                        "missing: `{layer}` is smoothed through `{module}`; re-quantize the \
                         checkpoint with this version of oasr-quantize"
                    ),
                )
            })?;
            if s.len() != len {
                return Err(Error::tensor(
                    &path,
                    &name,
                    format!("has {} factors, `{layer}` needs {len}", s.len()),
                ));
            }
            Ok(s.clone())
        };
        let linears = reference.linears();
        let mut targets = Vec::new();
        for (name, spec_layer) in &spec.layers {
            let layer = q.layers.get(name).ok_or_else(|| Error::LayerRefused {
                layer: name.clone(),
                reason: "in the spec but not loaded".into(),
            })?;
            let n = layer.n;
            let k = layer.codes.len().checked_div(n).unwrap_or(0);
            if n == 0 || n * k != layer.codes.len() || layer.weight_scale.len() != n {
                return Err(Error::LayerRefused {
                    layer: name.clone(),
                    reason: format!(
                        "{} weight codes and {} weight scales do not make an [{n}, k] layer",
                        layer.codes.len(),
                        layer.weight_scale.len()
                    ),
                });
            }
            let reference_layer =
                linears
                    .get(name.as_str())
                    .ok_or_else(|| Error::LayerRefused {
                        layer: name.clone(),
                        reason:
                            "quantized in the checkpoint but not a layer of the reference model"
                                .into(),
                    })?;
            let dims = reference_layer.weight.dims();
            if dims != [n, k] {
                return Err(Error::LayerRefused {
                    layer: name.clone(),
                    reason: format!(
                        "the reference's weight is {dims:?}, the checkpoint's [{n}, {k}]"
                    ),
                });
            }
            let input_div = match (&spec_layer.smoothed_into, folded(spec_layer.smooth)) {
                (Some(module), true) => Some(factor(module, k, name)?),
                (None, true) => {
                    return Err(Error::LayerRefused {
                        layer: name.clone(),
                        reason: format!("smooth {:?} without `smoothed_into`", spec_layer.smooth),
                    })
                }
                _ => None,
            };
            // A group folded into this layer's rows: its output is y_ref / s.
            let output_mul = if spec.layers.values().any(|l| {
                matches!(l.smooth, SmoothFold::VToO | SmoothFold::ProducerRows)
                    && l.smoothed_into.as_deref() == Some(name.as_str())
            }) {
                Some(factor(name, n, name)?)
            } else {
                None
            };
            let weights: Vec<f32> = layer
                .codes
                .chunks_exact(k)
                .zip(&layer.weight_scale)
                .flat_map(|(row, &scale)| {
                    row.iter()
                        .map(move |&c| numerics::decode(layer.dtype, c) * scale)
                })
                .collect();
            let weight = Tensor::from_vec(weights, (n, k), &Device::Cpu).map_err(ce(name))?;
            let bias = layer
                .bias
                .as_ref()
                .map(|b| Tensor::from_slice(b, b.len(), &Device::Cpu))
                .transpose()
                .map_err(ce(name))?;
            targets.push(Target {
                name: name.clone(),
                layer,
                scheme: spec_layer.scheme,
                kind: spec_layer.kind,
                smooth: spec_layer.smooth,
                k,
                norm_fed: q.links.norm_fed.contains(name),
                chain_producer: q.links.chain_producers.contains_key(name),
                input_div,
                output_mul,
                dequantized: Linear {
                    name: name.clone(),
                    weight,
                    bias,
                },
            });
        }
        let index = targets
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Plan { targets, index })
    }

    fn target(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}

/// The worst row of a layer's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorstRow {
    /// ‖y_q − y_f32‖ / ‖y_f32‖ of the row.
    pub relative_l2: f64,
    pub utterance: String,
    /// The row of the layer's input within the utterance's pass: an encoder frame (the
    /// convolutions: their output frame) for encoder layers and the cross-attention k/v, a
    /// decoder position (the prompt included) for the other decoder layers.
    pub row: usize,
}

/// Sums of a layer's output error.
#[derive(Clone, Debug, Default)]
struct OutputSum {
    diff2: f64,
    weight_only_diff2: f64,
    ref2: f64,
    rows: usize,
    worst: Option<WorstRow>,
    /// The GPU's output against the f32 reference and against the CPU's quantized
    /// output, when the run has one.
    gpu: Option<(f64, f64)>,
}

impl OutputSum {
    fn merge(&mut self, other: &OutputSum) {
        self.diff2 += other.diff2;
        self.weight_only_diff2 += other.weight_only_diff2;
        self.ref2 += other.ref2;
        self.rows += other.rows;
        if let Some((d2, c2)) = other.gpu {
            let sum = self.gpu.get_or_insert((0.0, 0.0));
            sum.0 += d2;
            sum.1 += c2;
        }
        if let Some(w) = &other.worst {
            if self
                .worst
                .as_ref()
                .is_none_or(|m| w.relative_l2 > m.relative_l2)
            {
                self.worst = Some(w.clone());
            }
        }
    }

    fn finish(&self) -> OutputError {
        let rel = |d: f64| {
            if self.ref2 > 0.0 {
                (d / self.ref2).sqrt()
            } else {
                0.0
            }
        };
        OutputError {
            relative_l2: rel(self.diff2),
            weight_only_relative_l2: rel(self.weight_only_diff2),
            rows: self.rows,
            worst_row: self.worst.clone(),
            gpu: self.gpu.map(|(d2, c2)| LaneOutputError {
                relative_l2: rel(d2),
                relative_l2_to_cpu: rel(c2),
            }),
        }
    }
}

/// A layer's output against its f32 counterpart on the same (reference) input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputError {
    /// ‖y_q − y_f32‖ / ‖y_f32‖ over every row of every utterance.
    pub relative_l2: f64,
    /// The same with the dequantized weights in f32 and an unquantized input (in the layer's
    /// frame): the weight rounding alone, which also checks the frame mapping.
    pub weight_only_relative_l2: f64,
    pub rows: usize,
    pub worst_row: Option<WorstRow>,
    /// The same layer on the GPU lane (`verify --per-layer --device cuda`), on the same inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<LaneOutputError>,
}

/// A layer's GPU output on the reference input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LaneOutputError {
    /// ‖y_gpu − y_f32‖ / ‖y_f32‖: the served error on the GPU, beside `relative_l2` (the CPU's).
    pub relative_l2: f64,
    /// ‖y_gpu − y_cpu‖ / ‖y_f32‖: how far the GPU's result is from the CPU reference numerics
    /// (0 for int8, which is bit-identical; fp8's accumulation order shows here).
    pub relative_l2_to_cpu: f64,
}

/// Teacher-forced logit error against the reference, summed over steps.
#[derive(Clone, Debug, Default)]
struct LogitSum {
    steps: usize,
    one_minus_cosine: f64,
    kl: f64,
}

impl LogitSum {
    /// Adds the steps of `other` against `reference` (whose log-softmax is `reference_log`).
    fn add(&mut self, reference: &[Vec<f32>], reference_log: &[Vec<f64>], other: &[Vec<f32>]) {
        for ((r, rl), o) in reference.iter().zip(reference_log).zip(other) {
            self.steps += 1;
            let (r, o) = (to_f64(r), to_f64(o));
            self.one_minus_cosine += 1.0 - cosine(&r, &o);
            self.kl += kl(rl, &log_softmax(&o));
        }
    }

    fn merge(&mut self, other: &LogitSum) {
        self.steps += other.steps;
        self.one_minus_cosine += other.one_minus_cosine;
        self.kl += other.kl;
    }

    fn finish(&self) -> LogitError {
        let n = self.steps.max(1) as f64;
        LogitError {
            steps: self.steps,
            one_minus_cosine_mean: self.one_minus_cosine / n,
            kl_mean: self.kl / n,
        }
    }
}

/// Teacher-forced logit error against the full-precision model's own teacher-forced logits.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LogitError {
    pub steps: usize,
    /// Mean over steps of 1 − cosine(logits, reference logits).
    pub one_minus_cosine_mean: f64,
    /// Mean over steps of KL(softmax(reference) ‖ softmax(logits)), in nats.
    pub kl_mean: f64,
}

/// A layer's logit error over the fully quantized model's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogitShare {
    /// Of the mean 1 − cosine; null when the fully quantized model's is 0.
    pub one_minus_cosine: Option<f64>,
    /// Of the mean KL divergence; null when the fully quantized model's is 0.
    pub kl: Option<f64>,
}

impl LogitShare {
    fn of(layer: &LogitError, full: &LogitError) -> Self {
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        LogitShare {
            one_minus_cosine: ratio(layer.one_minus_cosine_mean, full.one_minus_cosine_mean),
            kl: ratio(layer.kl_mean, full.kl_mean),
        }
    }
}

/// A layer's figures over the utterances of one manifest `source`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceFigures {
    pub utterances: usize,
    pub output_error: OutputError,
    pub logit_error: LogitError,
    pub logit_share: LogitShare,
}

/// One quantized layer's breakdown.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerBreakdown {
    pub name: String,
    pub scheme: Scheme,
    pub kind: ModuleKind,
    pub smooth: SmoothFold,
    /// Whether the compared output is after GELU: an armed GEMM chain's producer applies GELU
    /// in its epilogue, so its output is compared after GELU (against GELU of the f32 output);
    /// every other layer's before any activation.
    pub compared_after_gelu: bool,
    pub output_error: OutputError,
    /// The reference model with only this layer quantized.
    pub logit_error: LogitError,
    /// `logit_error` over the fully quantized model's (shares need not sum to 1).
    pub logit_share: LogitShare,
    /// The same figures per manifest `source` (absent when the manifest names none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_source: BTreeMap<String, SourceFigures>,
}

/// The `per_layer` section of a verify report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerLayerReport {
    pub utterances: usize,
    /// The fully quantized checkpoint's teacher-forced logit error against the full-precision
    /// model's teacher-forced logits: the denominator of every share.
    pub full_model: LogitError,
    /// The same per manifest `source` (absent when the manifest names none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub full_model_by_source: BTreeMap<String, LogitError>,
    /// Non-finite values in the quantized layers' outputs of the per-layer runs.
    pub nonfinite: usize,
    /// Every quantized layer, in name order.
    pub layers: Vec<LayerBreakdown>,
}

impl PerLayerReport {
    /// The `n` layers with the largest share of the logit error (1 − cosine), largest first.
    pub fn top_by_share(&self, n: usize) -> Vec<&LayerBreakdown> {
        let key = |l: &LayerBreakdown| l.logit_share.one_minus_cosine.unwrap_or(f64::NEG_INFINITY);
        let mut layers: Vec<&LayerBreakdown> = self.layers.iter().collect();
        layers.sort_by(|a, b| key(b).total_cmp(&key(a)));
        layers.truncate(n);
        layers
    }
}

/// Runs the reference forward in f32 and, at each quantized layer, the layer's numerics on the
/// same input, accumulating the output errors. Returns the f32 outputs, so the stream is the
/// reference's.
struct MeasureExec<'p, 'a> {
    plan: &'p Plan<'a>,
    /// The GPU's run of a layer (`verify --per-layer --device cuda`).
    gpu: Option<&'p LayerRunner<'p>>,
    served: OutDtype,
    utterance: &'p str,
    sums: Vec<OutputSum>,
    /// Rows seen so far per target (a layer called twice in a pass continues its row count).
    rows: Vec<usize>,
    nonfinite: usize,
}

impl MeasureExec<'_, '_> {
    fn measure(
        &mut self,
        i: usize,
        x: &Tensor,
        reference: &Tensor,
        activation: Activation,
    ) -> Result<()> {
        let t = &self.plan.targets[i];
        let (input, rows) = t.frame_input(x)?;
        let q = t.quantized(&input, rows, activation, self.served);
        let w = t.weight_only(&input, rows, activation)?;
        let r = to_vec(reference, &t.name)?;
        let n = t.layer.n;
        self.nonfinite += q.iter().filter(|v| !v.is_finite()).count();
        let gpu_y = self
            .gpu
            .map(|gpu| gpu(&t.name, &input, rows, activation).map(|y| t.frame_output(y)))
            .transpose()?;
        if let Some(g) = gpu_y.as_ref().filter(|g| g.len() != q.len()) {
            return Err(Error::Model {
                what: t.name.clone(),
                message: format!("the GPU returned {} values, the CPU {}", g.len(), q.len()),
            });
        }
        let first = self.rows[i];
        let sum = &mut self.sums[i];
        for (row, ((qr, wr), rr)) in q
            .chunks_exact(n)
            .zip(w.chunks_exact(n))
            .zip(r.chunks_exact(n))
            .enumerate()
        {
            let (mut d2, mut w2, mut r2) = (0f64, 0f64, 0f64);
            for ((&qv, &wv), &rv) in qr.iter().zip(wr).zip(rr) {
                let rv = f64::from(rv);
                d2 += (f64::from(qv) - rv).powi(2);
                w2 += (f64::from(wv) - rv).powi(2);
                r2 += rv * rv;
            }
            sum.diff2 += d2;
            sum.weight_only_diff2 += w2;
            sum.ref2 += r2;
            sum.rows += 1;
            // The GPU's row in the same order, so equal outputs give equal figures.
            if let Some(gr) = gpu_y.as_ref().map(|g| &g[row * n..(row + 1) * n]) {
                let (mut gd2, mut gc2) = (0f64, 0f64);
                for ((&gv, &qv), &rv) in gr.iter().zip(qr).zip(rr) {
                    gd2 += (f64::from(gv) - f64::from(rv)).powi(2);
                    gc2 += (f64::from(gv) - f64::from(qv)).powi(2);
                }
                let acc = sum.gpu.get_or_insert((0.0, 0.0));
                acc.0 += gd2;
                acc.1 += gc2;
            }
            if r2 > 0.0 {
                let rel = (d2 / r2).sqrt();
                if sum.worst.as_ref().is_none_or(|m| rel > m.relative_l2) {
                    sum.worst = Some(WorstRow {
                        relative_l2: rel,
                        utterance: self.utterance.to_string(),
                        row: first + row,
                    });
                }
            }
        }
        if let Some(g) = &gpu_y {
            self.nonfinite += g.iter().filter(|v| !v.is_finite()).count();
        }
        self.rows[i] += rows;
        Ok(())
    }
}

impl LinearExec for MeasureExec<'_, '_> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        let y = layer.forward(x)?;
        if let Some(i) = self.plan.target(&layer.name) {
            self.measure(i, x, &y, Activation::None)?;
        }
        Ok(y)
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        match self.plan.target(&layer.name) {
            Some(i) if self.plan.targets[i].chain_producer => {
                let y = activate(layer.forward(x)?, activation, &layer.name)?;
                self.measure(i, x, &y, activation)?;
                Ok(y)
            }
            _ => activate(self.linear(layer, x)?, activation, &layer.name),
        }
    }
}

/// The reference forward with one layer quantized (in its frame), the rest in f32.
struct OneLayerExec<'p, 'a> {
    target: &'p Target<'a>,
    served: OutDtype,
    nonfinite: usize,
}

impl LinearExec for OneLayerExec<'_, '_> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        if layer.name == self.target.name {
            self.target
                .run(x, Activation::None, self.served, &mut self.nonfinite)
        } else {
            layer.forward(x)
        }
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        if layer.name == self.target.name && self.target.chain_producer {
            self.target
                .run(x, activation, self.served, &mut self.nonfinite)
        } else {
            activate(self.linear(layer, x)?, activation, &layer.name)
        }
    }
}

/// Another lane's run of one quantized layer (the GPU's, `CudaModel::layer_output`): the layer's
/// name, its input in its frame, the rows, the activation of a chain producer's epilogue; its
/// served output in its frame.
pub(crate) type LayerRunner<'a> =
    dyn Fn(&str, &[f32], usize, Activation) -> Result<Vec<f32>> + Sync + 'a;

/// What one utterance contributes to the per-layer report.
pub(crate) struct UtteranceFigures {
    source: Option<String>,
    outputs: Vec<OutputSum>,
    layers: Vec<LogitSum>,
    full: LogitSum,
    nonfinite: usize,
}

/// The per-layer breakdown resumes Whisper's forward at an encoder layer or the decoder's start,
/// so it needs Whisper's internals; another architecture is refused by name.
fn whisper_of(model: &dyn SpeechModel) -> Result<&WhisperAsr> {
    model
        .as_any()
        .downcast_ref::<WhisperAsr>()
        .ok_or_else(|| Error::NotImplemented {
            what: format!(
                "verify --per-layer for architecture `{}`",
                model.architecture()
            ),
            detail: "the per-layer breakdown is implemented for Whisper".into(),
        })
}

/// How the per-layer breakdown runs a quantized layer: the served dtype its outputs round to, and
/// the GPU's run of it when the verify run has one.
#[derive(Clone, Copy)]
pub(crate) struct Lanes<'a> {
    pub(crate) served: OutDtype,
    pub(crate) gpu: Option<&'a LayerRunner<'a>>,
}

/// The per-layer figures of one utterance: `tokens` are the full-precision model's, and
/// `quantized_logits` the fully quantized checkpoint's teacher-forced logits on them.
pub(crate) fn run_utterance(
    plan: &Plan,
    r: &dyn SpeechModel,
    u: &Utterance,
    samples: &[f32],
    tokens: &[u32],
    quantized_logits: &[Vec<f32>],
    lanes: Lanes,
) -> Result<UtteranceFigures> {
    let Lanes { served, gpu } = lanes;
    let r = whisper_of(r)?;
    let mel = r.log_mel(samples);
    let mut m = MeasureExec {
        plan,
        gpu,
        served,
        utterance: &u.id,
        sums: vec![OutputSum::default(); plan.targets.len()],
        rows: vec![0; plan.targets.len()],
        nonfinite: 0,
    };
    let (audio, layer_inputs) = r
        .model
        .encode_keeping_layer_inputs(&mut m, &mel.data, mel.n_mels, mel.frames)?;
    // The layers the encoder ran; the others start from the reference encoder output.
    let in_encoder: Vec<bool> = m.rows.iter().map(|&rows| rows > 0).collect();
    let start = r.model.start_decoder(&mut m, &audio)?;
    // The layers the decoder's start ran (cross-attention keys and values); the others start
    // from the reference's decoder state.
    let in_start: Vec<bool> = m
        .rows
        .iter()
        .zip(&in_encoder)
        .map(|(&rows, &enc)| rows > 0 && !enc)
        .collect();
    let reference = r.score_from(&mut m, start.clone(), tokens)?;
    let reference_log: Vec<Vec<f64>> = reference
        .iter()
        .map(|row| log_softmax(&to_f64(row)))
        .collect();
    let mut full = LogitSum::default();
    full.add(&reference, &reference_log, quantized_logits);
    let targets = plan.targets.len();
    let runs = (0..targets)
        .into_par_iter()
        .with_min_len(crate::parallel::min_task_len(targets))
        .map(|i| {
            let target = &plan.targets[i];
            let mut exec = OneLayerExec {
                target,
                served,
                nonfinite: 0,
            };
            // Everything the target does not change is the reference's: an encoder layer's
            // pass resumes from the reference stream entering its encoder layer, a decoder
            // layer's starts from the reference encoder output or decoder state.
            let state = if in_encoder[i] {
                let encoded = match r.model.encoder_layer_of(&target.name) {
                    Some(layer) => {
                        r.model
                            .encode_from_layer(&mut exec, layer_inputs[layer].clone(), layer)?
                    }
                    None => r
                        .model
                        .encode(&mut exec, &mel.data, mel.n_mels, mel.frames)?,
                };
                r.model.start_decoder(&mut exec, &encoded)?
            } else if in_start[i] {
                r.model.start_decoder(&mut exec, &audio)?
            } else {
                start.clone()
            };
            let logits = r.score_from(&mut exec, state, tokens)?;
            let mut sum = LogitSum::default();
            sum.add(&reference, &reference_log, &logits);
            Ok((sum, exec.nonfinite))
        })
        .collect::<Result<Vec<_>>>()?;
    let nonfinite = m.nonfinite + runs.iter().map(|r| r.1).sum::<usize>();
    Ok(UtteranceFigures {
        source: u.source.clone(),
        outputs: m.sums,
        layers: runs.into_iter().map(|r| r.0).collect(),
        full,
        nonfinite,
    })
}

/// Sums over a set of utterances.
#[derive(Clone, Default)]
struct Totals {
    utterances: usize,
    outputs: Vec<OutputSum>,
    layers: Vec<LogitSum>,
    full: LogitSum,
}

impl Totals {
    fn new(targets: usize) -> Self {
        Totals {
            utterances: 0,
            outputs: vec![OutputSum::default(); targets],
            layers: vec![LogitSum::default(); targets],
            full: LogitSum::default(),
        }
    }

    fn add(&mut self, u: &UtteranceFigures) {
        self.utterances += 1;
        self.outputs
            .iter_mut()
            .zip(&u.outputs)
            .for_each(|(a, b)| a.merge(b));
        self.layers
            .iter_mut()
            .zip(&u.layers)
            .for_each(|(a, b)| a.merge(b));
        self.full.merge(&u.full);
    }

    fn figures(&self, i: usize) -> SourceFigures {
        let (logit_error, full) = (self.layers[i].finish(), self.full.finish());
        SourceFigures {
            utterances: self.utterances,
            output_error: self.outputs[i].finish(),
            logit_share: LogitShare::of(&logit_error, &full),
            logit_error,
        }
    }
}

/// Merges the utterances' figures, in the order given (manifest order).
pub(crate) fn report(plan: &Plan, utterances: &[UtteranceFigures]) -> PerLayerReport {
    let n = plan.targets.len();
    let mut all = Totals::new(n);
    let mut by_source: BTreeMap<String, Totals> = BTreeMap::new();
    let named = utterances.iter().any(|u| u.source.is_some());
    for u in utterances {
        all.add(u);
        if named {
            let key = u.source.clone().unwrap_or_else(|| UNNAMED_SOURCE.into());
            by_source
                .entry(key)
                .or_insert_with(|| Totals::new(n))
                .add(u);
        }
    }
    let layers = plan
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = all.figures(i);
            LayerBreakdown {
                name: t.name.clone(),
                scheme: t.scheme,
                kind: t.kind,
                smooth: t.smooth,
                compared_after_gelu: t.chain_producer,
                output_error: f.output_error,
                logit_error: f.logit_error,
                logit_share: f.logit_share,
                by_source: by_source
                    .iter()
                    .map(|(s, totals)| (s.clone(), totals.figures(i)))
                    .collect(),
            }
        })
        .collect();
    PerLayerReport {
        utterances: utterances.len(),
        full_model: all.full.finish(),
        full_model_by_source: by_source
            .iter()
            .map(|(s, t)| (s.clone(), t.full.finish()))
            .collect(),
        nonfinite: utterances.iter().map(|u| u.nonfinite).sum(),
        layers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::QuantDtype;

    /// A small deterministic generator (xorshift), uniform in [-1, 1).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    fn relative(a: &[f32], b: &[f32]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let r: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / r).sqrt()
    }

    /// A folded layer: W's columns times s_in (the input group folded upstream) and its rows and
    /// bias divided by s_out (a v_to_o group folded into it), quantized per output channel.
    fn folded_target<'a>(
        layer: &'a QuantizedLayer,
        k: usize,
        input_div: Option<Vec<f32>>,
        output_mul: Option<Vec<f32>>,
    ) -> Target<'a> {
        let n = layer.n;
        let weights: Vec<f32> = layer
            .codes
            .chunks_exact(k)
            .zip(&layer.weight_scale)
            .flat_map(|(row, &s)| {
                row.iter()
                    .map(move |&c| numerics::decode(layer.dtype, c) * s)
            })
            .collect();
        Target {
            name: "layer".into(),
            layer,
            scheme: Scheme::Int8W8a8,
            kind: ModuleKind::Linear,
            smooth: SmoothFold::NormAffine,
            k,
            norm_fed: false,
            chain_producer: false,
            input_div,
            output_mul,
            dequantized: Linear {
                name: "layer".into(),
                weight: Tensor::from_vec(weights, (n, k), &Device::Cpu).unwrap(),
                bias: layer
                    .bias
                    .as_ref()
                    .map(|b| Tensor::from_slice(b, n, &Device::Cpu).unwrap()),
            },
        }
    }

    #[test]
    fn the_frame_mapping_recovers_the_reference_output() {
        let (rows, k, n) = (24, 64, 32);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Inputs with outlier channels, the case smoothing is for.
        let x: Vec<f32> = (0..rows * k)
            .map(|i| rng.next() * if i % k < 4 { 40.0 } else { 1.0 })
            .collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.next()).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.next()).collect();
        let s_in: Vec<f32> = (0..k)
            .map(|j| if j < 4 { 6.0 } else { 0.4 + 0.02 * j as f32 })
            .collect();
        let s_out: Vec<f32> = (0..n).map(|i| 0.25 + 0.1 * i as f32).collect();
        let reference: Vec<f32> = x
            .chunks_exact(k)
            .flat_map(|xr| {
                w.chunks_exact(k)
                    .zip(&bias)
                    .map(|(wr, b)| xr.iter().zip(wr).map(|(a, c)| a * c).sum::<f32>() + b)
                    .collect::<Vec<_>>()
            })
            .collect();
        // What the checkpoint stores: diag(1/s_out) · W · diag(s_in), bias / s_out.
        let stored: Vec<f32> = w
            .chunks_exact(k)
            .zip(&s_out)
            .flat_map(|(row, so)| row.iter().zip(&s_in).map(move |(v, si)| v * si / so))
            .collect();
        let q = numerics::quantize_weight_per_channel(&stored, n, k, QuantDtype::Int8);
        let layer = QuantizedLayer {
            dtype: QuantDtype::Int8,
            codes: q.codes,
            weight_scale: q.scales,
            smooth_inv: None,
            input_scale: None,
            bias: Some(bias.iter().zip(&s_out).map(|(b, s)| b / s).collect()),
            n,
            accumulation: Default::default(),
        };
        let x_t = Tensor::from_vec(x.clone(), (rows, k), &Device::Cpu).unwrap();
        let error = |input_div: Option<Vec<f32>>, output_mul: Option<Vec<f32>>| {
            let t = folded_target(&layer, k, input_div, output_mul);
            let (input, r) = t.frame_input(&x_t).unwrap();
            let weight_only = t.weight_only(&input, r, Activation::None).unwrap();
            let quantized = t.quantized(&input, r, Activation::None, OutDtype::F16);
            (
                relative(&weight_only, &reference),
                relative(&quantized, &reference),
            )
        };
        let (w_err, q_err) = error(Some(s_in.clone()), Some(s_out.clone()));
        assert!(w_err < 1e-2, "weight-only error {w_err}");
        assert!(q_err < 3e-2, "quantized error {q_err}");
        // Either map left out and the output is far off.
        assert!(error(None, Some(s_out.clone())).0 > 0.3);
        assert!(error(Some(s_in.clone()), None).0 > 0.3);
        let inverted: Vec<f32> = s_in.iter().map(|s| 1.0 / s).collect();
        assert!(error(Some(inverted), Some(s_out)).0 > 0.3);
    }

    #[test]
    fn logit_error_is_zero_for_the_reference_and_kl_is_positive_otherwise() {
        let reference = vec![vec![1.0f32, 2.0, 3.0, -1.0]];
        let log: Vec<Vec<f64>> = reference.iter().map(|r| log_softmax(&to_f64(r))).collect();
        let mut same = LogitSum::default();
        same.add(&reference, &log, &reference);
        let e = same.finish();
        assert_eq!(e.steps, 1);
        assert!(
            e.one_minus_cosine_mean.abs() < 1e-12 && e.kl_mean.abs() < 1e-12,
            "{e:?}"
        );
        let mut other = LogitSum::default();
        other.add(&reference, &log, &[vec![1.0, 2.5, 2.0, -1.0]]);
        let e = other.finish();
        assert!(e.one_minus_cosine_mean > 0.0 && e.kl_mean > 0.0, "{e:?}");
    }
}
