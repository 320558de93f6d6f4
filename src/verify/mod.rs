//! The verify run: the full-precision model and the quantized one on the same audio. The
//! quantized model runs its quantized GEMMs with the reference numerics of `numerics/`, exactly as
//! the serving kernels compute them (per-token quantize with the smoother, or the static
//! quantize; the scaled GEMM with its epilogue rounded once to the served dtype); every other
//! operation runs in f32 as in the full-precision forward. With the `cuda` feature the quantized
//! GEMMs and quantize steps can run on a GPU instead ([`VerifyDevice::Cuda`], module [`cuda`]),
//! with the same numerics.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod per_layer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use rayon::prelude::*;

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::checkpoint::{Checkpoint, DType};
use crate::error::{Error, Result};
use crate::format::{QuantDtype, QuantizationSpec};
use crate::manifest::{Manifest, Utterance};
use crate::models::exec::{activate, ce, to_vec, FullPrecision, Linear, LinearExec};
use crate::models::{DecodeOptions, Decoding, SpeechModel};
use crate::numerics::{self, ActScale, Activation, Fp8Accumulation, GemmEpilogue, OutDtype};
use crate::wer::{delta_interval, word_errors, WordErrors};

/// One quantized layer as stored in a v2 checkpoint.
#[derive(Clone, Debug)]
struct QuantizedLayer {
    dtype: QuantDtype,
    /// `[n, k]` codes (a convolution's KSC weight flattened to `[n, taps · in]`).
    codes: Vec<u8>,
    weight_scale: Vec<f32>,
    smooth_inv: Option<Vec<f32>>,
    input_scale: Option<f32>,
    bias: Option<Vec<f32>>,
    n: usize,
    /// How an fp8 GEMM sums on the CPU ([`VerifyOptions::fp8_accumulation`]).
    accumulation: Fp8Accumulation,
}

/// Runs the quantized layers with the reference numerics; the rest in f32.
///
/// Links run as the served kernels compute them: a fused norm's consumers quantize the norm
/// output rounded to the served dtype ([`numerics::norm_quant_per_token`]); an armed GEMM chain's
/// producer applies GELU in its epilogue and rounds once to the served dtype, and its consumer's
/// static quantize of that output gives exactly the codes of [`numerics::scaled_mm_quant`].
pub struct QuantizedExec<'a> {
    layers: &'a BTreeMap<String, QuantizedLayer>,
    links: &'a LinkRoles,
    served: OutDtype,
    /// Non-finite values seen in quantized GEMM outputs.
    pub nonfinite: usize,
}

/// The layers a link touches, from the spec.
#[derive(Clone, Debug, Default)]
struct LinkRoles {
    /// Consumers of an armed fused norm.
    norm_fed: HashSet<String>,
    /// Producers of an armed GEMM chain, with the activation their epilogue applies.
    chain_producers: HashMap<String, Activation>,
}

impl LinkRoles {
    /// Whether `layer`'s epilogue applies `activation` and emits its consumer's input (an armed
    /// chain's producer). A producer whose recorded activation is not the one the forward
    /// applies after it is refused: the chain would compute another function.
    fn chain_producer(&self, layer: &str, activation: Activation) -> Result<bool> {
        match self.chain_producers.get(layer) {
            None => Ok(false),
            Some(&recorded) if recorded == activation => Ok(true),
            Some(recorded) => Err(Error::Model {
                what: layer.to_string(),
                message: format!(
                    "the spec's GEMM chain records the activation `{}` after this layer, but the \
                     forward applies `{}`",
                    recorded.name(),
                    activation.name()
                ),
            }),
        }
    }
}

impl QuantizedLayer {
    /// The served numerics of this layer on `x` (`[rows, k]`, row-major): the quantize step (the
    /// static one, a fused norm's emission when `norm_fed`, or per token with the smoother), the
    /// scaled GEMM with its epilogue (bias, `activation`), rounded once to `served`. Returns the
    /// `[rows, n]` output widened back to f32. Both the verify run ([`QuantizedExec`]) and the
    /// per-layer breakdown ([`per_layer`]) run a quantized layer through this one function.
    fn forward_values(
        &self,
        values: &[f32],
        rows: usize,
        k: usize,
        norm_fed: bool,
        activation: Activation,
        served: OutDtype,
    ) -> Vec<f32> {
        let smooth = self.smooth_inv.as_deref();
        let epi = GemmEpilogue {
            bias: self.bias.as_deref(),
            activation,
            out: served,
        };
        let out = match self.input_scale {
            Some(scale) => {
                let codes = numerics::quantize_static(values, rows, k, smooth, scale, self.dtype);
                numerics::scaled_mm_accumulating(
                    self.dtype,
                    &codes,
                    ActScale::PerTensor(scale),
                    &self.codes,
                    &self.weight_scale,
                    rows,
                    self.n,
                    k,
                    &epi,
                    self.accumulation,
                )
            }
            None => {
                let a = if norm_fed {
                    // The spec's arming rules guarantee no smoother here (checked on load).
                    numerics::norm_quant_per_token(values, rows, k, served, self.dtype)
                } else {
                    numerics::quantize_per_token(values, rows, k, smooth, self.dtype)
                };
                numerics::scaled_mm_accumulating(
                    self.dtype,
                    &a.codes,
                    ActScale::PerRow(&a.scales),
                    &self.codes,
                    &self.weight_scale,
                    rows,
                    self.n,
                    k,
                    &epi,
                    self.accumulation,
                )
            }
        };
        out.into_iter()
            .map(|b| numerics::out_bits_to_f32(served, b))
            .collect()
    }
}

impl QuantizedExec<'_> {
    fn run(
        &mut self,
        name: &str,
        q: &QuantizedLayer,
        x: &Tensor,
        activation: Activation,
    ) -> Result<Tensor> {
        let (rows, k) = x.dims2().map_err(ce(name))?;
        let values = to_vec(x, name)?;
        let norm_fed = self.links.norm_fed.contains(name);
        let out = q.forward_values(&values, rows, k, norm_fed, activation, self.served);
        self.nonfinite += out.iter().filter(|v| !v.is_finite()).count();
        Tensor::from_vec(out, (rows, q.n), &Device::Cpu).map_err(ce(name))
    }
}

impl LinearExec for QuantizedExec<'_> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        match self.layers.get(&layer.name) {
            Some(q) => self.run(&layer.name, q, x, Activation::None),
            None => layer.forward(x),
        }
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        match self.layers.get(&layer.name) {
            // The chain's producer emits its consumer's input: the activation belongs to its
            // epilogue.
            Some(q) if self.links.chain_producer(&layer.name, activation)? => {
                self.run(&layer.name, q, x, activation)
            }
            _ => activate(self.linear(layer, x)?, activation, &layer.name),
        }
    }
}

/// A quantized checkpoint made runnable: the f32 model (quantized layers as zero placeholders,
/// only for their shapes) and the quantized layers.
pub struct QuantizedModel {
    /// The runnable model: quantized layers run through [`QuantizedModel::exec`].
    pub model: Box<dyn SpeechModel>,
    layers: BTreeMap<String, QuantizedLayer>,
    links: LinkRoles,
    pub spec: QuantizationSpec,
}

impl QuantizedModel {
    /// The quantized checkpoint in `dir`, searching with the architecture's defaults.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, &DecodeOptions::default())
    }

    /// [`Self::load`] with search options.
    pub fn load_with(dir: &Path, decode: &DecodeOptions) -> Result<Self> {
        let ckpt = Checkpoint::open(dir)?;
        let spec = ckpt.config.quantization.clone().ok_or_else(|| Error::UnknownFormat {
            path: dir.into(),
            message: "not a quantized checkpoint (format_version 2); verify compares a quantized checkpoint with its reference".into(),
        })?;
        let mut layers = BTreeMap::new();
        let mut runnable = ckpt.clone();
        for (name, l) in &spec.layers {
            let t = |key: &str| ckpt.tensors.get(&format!("{name}.{key}"));
            let weight = t("weight")
                .ok_or_else(|| Error::tensor(dir, format!("{name}.weight"), "missing"))?;
            let n = weight.shape[0];
            let codes = weight.bytes().to_vec();
            let weight_scale = t("weight_scale").map(|s| s.to_f32()).unwrap_or_default();
            let f32_of = |key: &str| t(key).filter(|x| x.dtype.is_float()).map(|x| x.to_f32());
            let layer = QuantizedLayer {
                dtype: l.scheme.dtype(),
                smooth_inv: f32_of("smooth_inv"),
                input_scale: f32_of("input_scale").and_then(|v| v.first().copied()),
                bias: f32_of("bias"),
                n,
                weight_scale,
                codes,
                accumulation: Fp8Accumulation::Sequential,
            };
            // The f32 model needs a float weight of the right shape to load; QuantizedExec runs
            // every quantized layer, so its values are never read, and zeros that are never
            // written take no memory.
            runnable.tensors.insert(
                format!("{name}.weight"),
                crate::checkpoint::Tensor::zeros(DType::F32, weight.shape.clone()),
            );
            layers.insert(name.clone(), layer);
        }
        runnable.config.quantization = None;
        runnable.config.format_version = 1;
        let links = LinkRoles {
            norm_fed: spec
                .links
                .fused_norms
                .iter()
                .flat_map(|n| n.consumers.iter().cloned())
                .collect(),
            chain_producers: spec
                .links
                .gemm_chains
                .iter()
                .map(|c| (c.producer.clone(), c.activation))
                .collect(),
        };
        Ok(QuantizedModel {
            model: crate::models::load_with(&runnable, decode)?,
            layers,
            links,
            spec,
        })
    }

    /// Sums this model's fp8 GEMMs on the CPU as `accumulation` says (the reference:
    /// [`Fp8Accumulation::Sequential`]).
    pub fn with_fp8_accumulation(mut self, accumulation: Fp8Accumulation) -> Self {
        for layer in self.layers.values_mut() {
            layer.accumulation = accumulation;
        }
        self
    }

    pub fn exec(&self, served: OutDtype) -> QuantizedExec<'_> {
        QuantizedExec {
            layers: &self.layers,
            links: &self.links,
            served,
            nonfinite: 0,
        }
    }

    /// The logits of every step when this model scores `tokens` (the prompt included) on
    /// `samples` (16 kHz mono) through `exec`: what a verify run's teacher-forced agreement
    /// compares, raw.
    pub fn teacher_forced_logits(
        &self,
        exec: &mut dyn LinearExec,
        samples: &[f32],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let audio = self.model.encode(exec, samples)?;
        self.model.score(exec, &audio, tokens)
    }
}

/// Where a verify run's quantized GEMMs and quantize steps run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyDevice {
    /// The reference numerics of `numerics/`.
    #[default]
    Cpu,
    /// GPU 0 through the CUDA lane (feature `cuda`): int8 bit-identical to `Cpu`.
    Cuda,
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> Error {
    Error::Cuda {
        what: "verify --device cuda".into(),
        message:
            "this oasr-quantize was built without the `cuda` feature; rebuild with --features cuda"
                .into(),
    }
}

/// Fails unless `device` can run here: a build without the `cuda` feature, or no usable GPU,
/// refuses [`VerifyDevice::Cuda`] ([`Error::Cuda`]), before any other work.
pub fn check_device(device: VerifyDevice) -> Result<()> {
    match device {
        VerifyDevice::Cpu => Ok(()),
        #[cfg(feature = "cuda")]
        VerifyDevice::Cuda => crate::runtime::CudaLane::new().map(drop),
        #[cfg(not(feature = "cuda"))]
        VerifyDevice::Cuda => Err(no_cuda()),
    }
}

/// The lane a verify run's quantized model uses, opened.
enum Lane {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaModel>),
}

impl Lane {
    fn open(device: VerifyDevice, q: &QuantizedModel) -> Result<Self> {
        match device {
            VerifyDevice::Cpu => Ok(Lane::Cpu),
            #[cfg(feature = "cuda")]
            VerifyDevice::Cuda => Ok(Lane::Cuda(Box::new(cuda::CudaModel::open(q)?))),
            #[cfg(not(feature = "cuda"))]
            VerifyDevice::Cuda => {
                let _ = q;
                Err(no_cuda())
            }
        }
    }

    /// The per-layer breakdown's second lane: one quantized layer on the GPU (none on the CPU,
    /// whose numerics the breakdown runs anyway).
    fn layer_runner<'a>(
        &'a self,
        q: &'a QuantizedModel,
        served: OutDtype,
    ) -> Option<Box<per_layer::LayerRunner<'a>>> {
        match self {
            Lane::Cpu => {
                let _ = (q, served);
                None
            }
            #[cfg(feature = "cuda")]
            Lane::Cuda(m) => Some(Box::new(move |name, values, rows, activation| {
                m.layer_output(q, name, values, rows, activation, served)
            })),
        }
    }

    fn name(&self) -> String {
        match self {
            Lane::Cpu => "cpu".into(),
            #[cfg(feature = "cuda")]
            Lane::Cuda(m) => m.device().into(),
        }
    }

    fn exec<'a>(&'a self, q: &'a QuantizedModel, served: OutDtype) -> Exec<'a> {
        match self {
            Lane::Cpu => Exec::Cpu(q.exec(served)),
            #[cfg(feature = "cuda")]
            Lane::Cuda(m) => Exec::Cuda(m.exec(q, served)),
        }
    }
}

/// One utterance's executor of the quantized model.
enum Exec<'a> {
    Cpu(QuantizedExec<'a>),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaExec<'a>),
}

impl Exec<'_> {
    fn nonfinite(&self) -> usize {
        match self {
            Exec::Cpu(e) => e.nonfinite,
            #[cfg(feature = "cuda")]
            Exec::Cuda(e) => e.nonfinite,
        }
    }
}

impl LinearExec for Exec<'_> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        match self {
            Exec::Cpu(e) => e.linear(layer, x),
            #[cfg(feature = "cuda")]
            Exec::Cuda(e) => e.linear(layer, x),
        }
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        match self {
            Exec::Cpu(e) => e.linear_act(layer, x, activation),
            #[cfg(feature = "cuda")]
            Exec::Cuda(e) => e.linear_act(layer, x, activation),
        }
    }
}

/// Logit agreement over decoding steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Agreement {
    pub steps: usize,
    pub cosine_mean: f64,
    pub cosine_min: f64,
    /// The cosine of the logits with each row's mean removed: blind to a uniform shift of a
    /// step's logits, which softmax ignores too.
    pub centered_cosine_mean: f64,
    pub centered_cosine_min: f64,
    /// KL(full precision ‖ quantized) of the softmax over the whole vocabulary, in nats.
    pub kl_mean: f64,
    pub kl_max: f64,
    /// Fraction of steps whose arg-max token is the same.
    pub top1_agreement: f64,
}

/// How closely the quantized model's sequence-level score of the full-precision hypothesis
/// follows the reference's (one named score of [`SpeechModel::hypothesis_scores`]: for attention
/// rescoring the CTC log-likelihood, each decoder's and the rescored total), in nats.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScoreAgreement {
    pub utterances: usize,
    /// The reference's mean score, for scale.
    pub full_precision_mean: f64,
    /// Mean and largest |quantized − full precision|.
    pub abs_diff_mean: f64,
    pub abs_diff_max: f64,
    /// Mean of |quantized − full precision| / |full precision|.
    pub relative_diff_mean: f64,
}

/// Sums and extremes of one named score's differences, mergeable.
#[derive(Clone, Debug, Default)]
struct ScoreSum {
    utterances: usize,
    full_precision_sum: f64,
    abs_diff_sum: f64,
    abs_diff_max: f64,
    relative_sum: f64,
}

impl ScoreSum {
    fn add(&mut self, fp: f64, q: f64) {
        let diff = (q - fp).abs();
        self.utterances += 1;
        self.full_precision_sum += fp;
        self.abs_diff_sum += diff;
        // NaN (a non-finite quantized score) counts as the worst.
        if diff > self.abs_diff_max || diff.is_nan() {
            self.abs_diff_max = diff;
        }
        self.relative_sum += diff / fp.abs().max(f64::MIN_POSITIVE);
    }

    fn merge(&mut self, other: &ScoreSum) {
        self.utterances += other.utterances;
        self.full_precision_sum += other.full_precision_sum;
        self.abs_diff_sum += other.abs_diff_sum;
        if other.abs_diff_max > self.abs_diff_max || other.abs_diff_max.is_nan() {
            self.abs_diff_max = other.abs_diff_max;
        }
        self.relative_sum += other.relative_sum;
    }

    fn finish(&self) -> ScoreAgreement {
        let n = self.utterances.max(1) as f64;
        ScoreAgreement {
            utterances: self.utterances,
            full_precision_mean: self.full_precision_sum / n,
            abs_diff_mean: self.abs_diff_sum / n,
            abs_diff_max: self.abs_diff_max,
            relative_diff_mean: self.relative_sum / n,
        }
    }
}

/// Sums and extremes of the agreement figures, mergeable.
#[derive(Clone, Debug, Default)]
struct AgreementSum {
    steps: usize,
    cosine_sum: f64,
    cosine_min: f64,
    centered_sum: f64,
    centered_min: f64,
    kl_sum: f64,
    kl_max: f64,
    top1_same: usize,
}

/// A row in f64.
pub(super) fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| f64::from(*x)).collect()
}

/// The cosine of two rows, in f64 (0 when either is all zero).
pub(super) fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    if na > 0.0 && nb > 0.0 {
        dot / (na * nb)
    } else {
        0.0
    }
}

/// log-softmax in f64 (non-finite logits count as −∞).
pub(super) fn log_softmax(v: &[f64]) -> Vec<f64> {
    let max = v
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = v
        .iter()
        .filter(|x| x.is_finite())
        .map(|x| (x - max).exp())
        .sum();
    let log_sum = max + sum.ln();
    v.iter()
        .map(|x| {
            if x.is_finite() {
                x - log_sum
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect()
}

/// KL(p ‖ q) from log-probabilities.
pub(super) fn kl(log_p: &[f64], log_q: &[f64]) -> f64 {
    log_p
        .iter()
        .zip(log_q)
        .filter(|(p, _)| p.is_finite())
        .map(|(p, q)| p.exp() * (p - q))
        .sum::<f64>()
        .max(0.0)
}

impl AgreementSum {
    /// One step: `a` the full-precision logits, `b` the quantized ones.
    fn add(&mut self, a: &[f32], b: &[f32]) {
        let (a, b) = (to_f64(a), to_f64(b));
        let cos = cosine(&a, &b);
        let centred = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            v.iter().map(|x| x - mean).collect::<Vec<f64>>()
        };
        let centered = cosine(&centred(&a), &centred(&b));
        let divergence = kl(&log_softmax(&a), &log_softmax(&b));
        let first = self.steps == 0;
        if first || cos < self.cosine_min {
            self.cosine_min = cos;
        }
        if first || centered < self.centered_min {
            self.centered_min = centered;
        }
        // NaN (a non-finite quantized logit) counts as the worst.
        if first || divergence > self.kl_max || divergence.is_nan() {
            self.kl_max = divergence;
        }
        self.steps += 1;
        self.cosine_sum += cos;
        self.centered_sum += centered;
        self.kl_sum += divergence;
        let argmax = |v: &[f64]| {
            v.iter()
                .enumerate()
                .max_by(|x, y| x.1.total_cmp(y.1))
                .map(|(i, _)| i)
        };
        self.top1_same += usize::from(argmax(&a) == argmax(&b));
    }

    fn merge(&mut self, other: &AgreementSum) {
        if other.steps == 0 {
            return;
        }
        if self.steps == 0 {
            *self = other.clone();
            return;
        }
        self.cosine_min = self.cosine_min.min(other.cosine_min);
        self.centered_min = self.centered_min.min(other.centered_min);
        self.kl_max = self.kl_max.max(other.kl_max);
        self.steps += other.steps;
        self.cosine_sum += other.cosine_sum;
        self.centered_sum += other.centered_sum;
        self.kl_sum += other.kl_sum;
        self.top1_same += other.top1_same;
    }

    fn finish(&self) -> Agreement {
        let n = self.steps.max(1) as f64;
        Agreement {
            steps: self.steps,
            cosine_mean: self.cosine_sum / n,
            cosine_min: self.cosine_min,
            centered_cosine_mean: self.centered_sum / n,
            centered_cosine_min: self.centered_min,
            kl_mean: self.kl_sum / n,
            kl_max: self.kl_max,
            top1_agreement: self.top1_same as f64 / n,
        }
    }
}

/// The figures of a set of utterances (a whole run, or one source of it).
#[derive(Default)]
struct Tally {
    utterances: usize,
    free: AgreementSum,
    forced: AgreementSum,
    /// Each utterance's (full precision, quantized) errors, for utterances with a reference text.
    word_errors: Vec<(WordErrors, WordErrors)>,
    nonfinite: usize,
    scores: BTreeMap<&'static str, ScoreSum>,
}

impl Tally {
    fn add(&mut self, run: &UtteranceRun) {
        self.utterances += 1;
        self.free.merge(&run.free);
        self.forced.merge(&run.forced);
        self.word_errors.extend(run.word_errors);
        self.nonfinite += run.nonfinite;
        for (name, sum) in &run.scores {
            self.scores.entry(name).or_default().merge(sum);
        }
    }

    fn finish(&self) -> SourceFigures {
        let (mut wr, mut wq) = (WordErrors::default(), WordErrors::default());
        for &(r, q) in &self.word_errors {
            wr.add(r);
            wq.add(q);
        }
        let (fp, q) = if self.word_errors.is_empty() {
            (None, None)
        } else {
            (Some(wr.rate()), Some(wq.rate()))
        };
        SourceFigures {
            utterances: self.utterances,
            wer_full_precision: fp,
            wer_quantized: q,
            wer_delta: fp.zip(q).map(|(a, b)| b - a),
            wer_delta_interval: delta_interval(&self.word_errors),
            word_errors_full_precision: wr,
            word_errors_quantized: wq,
            free_running: self.free.finish(),
            teacher_forced: self.forced.finish(),
            hypothesis_scores: self
                .scores
                .iter()
                .map(|(k, s)| (k.to_string(), s.finish()))
                .collect(),
            nonfinite: self.nonfinite,
        }
    }
}

/// A verify run's figures over the utterances of one source.
#[derive(Clone, Debug, Serialize)]
pub struct SourceFigures {
    pub utterances: usize,
    pub wer_full_precision: Option<f64>,
    pub wer_quantized: Option<f64>,
    pub wer_delta: Option<f64>,
    /// The 95 % paired-bootstrap interval of `wer_delta` over these utterances.
    pub wer_delta_interval: Option<[f64; 2]>,
    pub word_errors_full_precision: WordErrors,
    pub word_errors_quantized: WordErrors,
    pub free_running: Agreement,
    pub teacher_forced: Agreement,
    /// The sequence-level scores of the full-precision hypothesis, compared (empty for a search
    /// without them, such as Whisper's).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hypothesis_scores: BTreeMap<String, ScoreAgreement>,
    pub nonfinite: usize,
}

/// The key of utterances without a manifest `source` in the per-source breakdowns.
pub const UNNAMED_SOURCE: &str = "(none)";

/// The name of an utterance's source in a report ([`UNNAMED_SOURCE`] when the manifest names
/// none).
pub fn source_name(u: &Utterance) -> &str {
    u.source.as_deref().unwrap_or(UNNAMED_SOURCE)
}

/// One utterance of a verify run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerifiedUtterance {
    pub id: String,
    pub reference_text: Option<String>,
    pub full_precision: String,
    pub quantized: String,
    /// The manifest's `source` of the utterance.
    pub source: Option<String>,
    /// Temperatures of the two decodings (0 unless the fallback retried).
    pub temperature_full_precision: f32,
    pub temperature_quantized: f32,
    /// This utterance's teacher-forced agreement (finds the utterances at fault).
    pub teacher_forced: Agreement,
}

/// The verify report (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub quantized_checkpoint: String,
    pub reference_checkpoint: String,
    pub manifest: String,
    pub served_dtype: OutDtype,
    /// Where the quantized model's GEMMs ran: `cpu` (the reference numerics) or
    /// `cuda (<GPU name>, <architecture>)`.
    pub device: String,
    /// How the CPU lane summed fp8 GEMMs: `sequential` (the reference) or `tensor-core` (the
    /// model of Hopper's accumulation). The GPU lane runs its kernels whatever this says.
    pub fp8_accumulation: Fp8Accumulation,
    pub utterances: usize,
    pub wer_full_precision: Option<f64>,
    pub wer_quantized: Option<f64>,
    /// Quantized minus full precision (absolute).
    pub wer_delta: Option<f64>,
    /// The 95 % interval of `wer_delta` by the paired bootstrap over utterances (2000 seeded
    /// resamples): how far the difference could move on another draw of such utterances.
    pub wer_delta_interval: Option<[f64; 2]>,
    pub word_errors_full_precision: WordErrors,
    pub word_errors_quantized: WordErrors,
    /// Each model decodes its own greedy tokens; logits compared step by step.
    pub free_running: Agreement,
    /// The quantized model scores the full-precision tokens.
    pub teacher_forced: Agreement,
    /// The sequence-level scores the search gives the full-precision hypothesis (attention
    /// rescoring: `ctc`, `left_decoder`, `right_decoder`, `rescored`), quantized against full
    /// precision; empty for a search without them, such as Whisper's.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hypothesis_scores: BTreeMap<String, ScoreAgreement>,
    /// Non-finite values in the quantized model's GEMM outputs and logits.
    pub nonfinite: usize,
    /// The same figures per manifest `source` (`(none)` for utterances without one).
    pub by_source: BTreeMap<String, SourceFigures>,
    pub seconds: f64,
    pub utterances_per_second: f64,
    pub transcripts: Vec<VerifiedUtterance>,
    /// Each quantized layer's own error (`--per-layer`); absent unless asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_layer: Option<per_layer::PerLayerReport>,
}

/// What one utterance contributes to a verify report.
struct UtteranceRun {
    free: AgreementSum,
    forced: AgreementSum,
    /// Against the manifest's text: (full precision, quantized).
    word_errors: Option<(WordErrors, WordErrors)>,
    nonfinite: usize,
    scores: BTreeMap<&'static str, ScoreSum>,
    transcript: VerifiedUtterance,
    per_layer: Option<per_layer::UtteranceFigures>,
}

/// The reference model's part of an utterance: computed once, however many checkpoints are
/// compared with it.
struct ReferenceRun {
    samples: Vec<f32>,
    decoded: Decoding,
    scores: Vec<(&'static str, f64)>,
    text: String,
}

fn reference_run(r: &dyn SpeechModel, u: &Utterance) -> Result<ReferenceRun> {
    let samples = r.read(u)?;
    let audio = r.encode(&mut FullPrecision, &samples)?;
    let decoded = r.decode(&mut FullPrecision, &audio, samples.len(), true)?;
    let scores = r.hypothesis_scores(&mut FullPrecision, &audio, &decoded.tokens)?;
    let text = r.text(&decoded.tokens)?;
    Ok(ReferenceRun {
        samples,
        decoded,
        scores,
        text,
    })
}

/// One quantized checkpoint on an utterance the reference ran: it decodes as the reference
/// does, then scores the full-precision tokens.
fn quantized_run(
    q: &QuantizedModel,
    r: &dyn SpeechModel,
    u: &Utterance,
    fp: &ReferenceRun,
    lane: &Lane,
    served: OutDtype,
    layers: Option<&per_layer::Plan>,
) -> Result<UtteranceRun> {
    let samples = &fp.samples;
    let mut exec = lane.exec(q, served);
    let audio = q.model.encode(&mut exec, samples)?;
    let qd = q.model.decode(&mut exec, &audio, samples.len(), true)?;
    let scored = q.model.score(&mut exec, &audio, &fp.decoded.tokens)?;
    let mut scores: BTreeMap<&'static str, ScoreSum> = BTreeMap::new();
    let q_scores = q
        .model
        .hypothesis_scores(&mut exec, &audio, &fp.decoded.tokens)?;
    for ((name, a), (_, b)) in fp.scores.iter().zip(&q_scores) {
        scores.entry(name).or_default().add(*a, *b);
    }
    let nonfinite = exec.nonfinite()
        + qd.scores
            .iter()
            .chain(&scored)
            .flatten()
            .filter(|v| !v.is_finite())
            .count();
    let (mut free, mut forced) = (AgreementSum::default(), AgreementSum::default());
    for (a, b) in fp.decoded.scores.iter().zip(&qd.scores) {
        free.add(a, b);
    }
    for (a, b) in fp.decoded.scores.iter().zip(&scored) {
        forced.add(a, b);
    }
    let hyp_q = q.model.text(&qd.tokens)?;
    let word_errors = u
        .text
        .as_ref()
        .map(|text| (word_errors(text, &fp.text), word_errors(text, &hyp_q)));
    let agreement = forced.finish();
    let per_layer = layers
        .map(|plan| {
            let gpu = lane.layer_runner(q, served);
            let lanes = per_layer::Lanes {
                served,
                gpu: gpu.as_deref(),
            };
            per_layer::run_utterance(plan, r, u, samples, &fp.decoded.tokens, &scored, lanes)
        })
        .transpose()?;
    Ok(UtteranceRun {
        free,
        forced,
        word_errors,
        nonfinite,
        scores,
        transcript: VerifiedUtterance {
            id: u.id.clone(),
            reference_text: u.text.clone(),
            full_precision: fp.text.clone(),
            quantized: hyp_q,
            source: u.source.clone(),
            temperature_full_precision: fp.decoded.temperature,
            temperature_quantized: qd.temperature,
            teacher_forced: agreement,
        },
        per_layer,
    })
}

/// Runs the reference and the quantized checkpoint on the first `limit` utterances of a manifest,
/// the quantized GEMMs with the CPU reference numerics.
pub fn verify(
    quantized: &Path,
    reference: &Path,
    manifest: &Manifest,
    limit: Option<usize>,
    served: OutDtype,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<VerifyReport> {
    verify_on(
        quantized,
        reference,
        manifest,
        limit,
        served,
        VerifyDevice::Cpu,
        progress,
    )
}

/// [`verify`] with the quantized GEMMs and quantize steps on `device`. [`VerifyDevice::Cuda`]
/// fails with [`Error::Cuda`] in a build without the `cuda` feature, or without a usable GPU.
pub fn verify_on(
    quantized: &Path,
    reference: &Path,
    manifest: &Manifest,
    limit: Option<usize>,
    served: OutDtype,
    device: VerifyDevice,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<VerifyReport> {
    let options = VerifyOptions {
        limit,
        served,
        device,
        ..VerifyOptions::default()
    };
    verify_with(quantized, reference, manifest, &options, progress)
}

/// What a verify run does beyond the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyOptions {
    /// Only the first `limit` utterances of the manifest.
    pub limit: Option<usize>,
    /// The dtype the quantized GEMMs round to.
    pub served: OutDtype,
    /// Where the quantized model's GEMMs run. The per-layer breakdown runs on the CPU; with
    /// [`VerifyDevice::Cuda`] it also runs each layer on the GPU on the same input
    /// (`OutputError::gpu`).
    pub device: VerifyDevice,
    /// Adds the per-layer breakdown ([`per_layer`]): one teacher-forced pass of the reference
    /// model per quantized layer and utterance. A checkpoint with SmoothQuant folds into norms or
    /// V projections needs its recorded factors (`smoothing_factors.safetensors`).
    pub per_layer: bool,
    /// The search both models decode with (the architecture's default unless given).
    pub decode: DecodeOptions,
    /// How the CPU sums fp8 GEMMs: the reference's exact f32 order, or a model of Hopper's
    /// tensor cores that predicts what the GPU serves (docs/numerics.md).
    pub fp8_accumulation: Fp8Accumulation,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            limit: None,
            served: OutDtype::F16,
            device: VerifyDevice::Cpu,
            per_layer: false,
            decode: DecodeOptions::default(),
            fp8_accumulation: Fp8Accumulation::Sequential,
        }
    }
}

/// The verify run with every option; [`verify`] and [`verify_on`] are shorthands of it.
pub fn verify_with(
    quantized: &Path,
    reference: &Path,
    manifest: &Manifest,
    options: &VerifyOptions,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<VerifyReport> {
    let mut reports = verify_many(&[quantized], reference, manifest, options, progress)?;
    reports.pop().ok_or_else(|| Error::Model {
        what: "verify".into(),
        message: "no report".into(),
    })
}

/// [`verify_with`] for several quantized checkpoints of one reference: the reference runs once
/// per utterance and each checkpoint is compared with it, so each report has the figures
/// `verify_with` gives that checkpoint alone (`seconds` is the whole run's). Every checkpoint is
/// held in memory for the run. With more than one, an error of one names it
/// ([`Error::Checkpoint`]).
pub fn verify_many(
    quantized: &[&Path],
    reference: &Path,
    manifest: &Manifest,
    options: &VerifyOptions,
    progress: impl Fn(usize, usize, &str) + Sync,
) -> Result<Vec<VerifyReport>> {
    let VerifyOptions {
        limit,
        served,
        device,
        per_layer: with_layers,
        ref decode,
        fp8_accumulation,
    } = *options;
    crate::transcribe::check_limit(limit)?;
    // Without CUDA, refused before the models load (with it, opening the lanes checks the GPU).
    #[cfg(not(feature = "cuda"))]
    check_device(device)?;
    let named = |i: usize, e: Error| match quantized.len() {
        1 => e,
        _ => Error::Checkpoint {
            path: quantized[i].to_path_buf(),
            error: Box::new(e),
        },
    };
    let r = crate::models::load_with(&Checkpoint::open(reference)?, decode)?;
    let models = quantized
        .iter()
        .enumerate()
        .map(|(i, path)| {
            QuantizedModel::load_with(path, decode)
                .map(|q| q.with_fp8_accumulation(fp8_accumulation))
                .map_err(|e| named(i, e))
        })
        .collect::<Result<Vec<_>>>()?;
    // Checked before any work: a checkpoint without its smoothing factors is refused here.
    let plans = models
        .iter()
        .zip(quantized)
        .enumerate()
        .map(|(i, (q, path))| {
            with_layers
                .then(|| per_layer::Plan::new(q, path, r.as_ref()))
                .transpose()
                .map_err(|e| named(i, e))
        })
        .collect::<Result<Vec<_>>>()?;
    let lanes = models
        .iter()
        .enumerate()
        .map(|(i, q)| Lane::open(device, q).map_err(|e| named(i, e)))
        .collect::<Result<Vec<_>>>()?;
    let started = std::time::Instant::now();
    let chosen: Vec<_> = manifest
        .utterances
        .iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let done = Mutex::new(0usize);
    // Utterances run in parallel, each on its own executors; the results are merged in manifest
    // order, so the reports do not depend on the scheduling.
    let runs = chosen
        .par_iter()
        .with_max_len(1) // one task per utterance, as in calibration
        .map(|u| {
            crate::parallel::one_utterance(chosen.len(), || {
                let in_utterance = |e: Error| Error::Utterance {
                    id: u.id.clone(),
                    error: Box::new(e),
                };
                let fp = reference_run(r.as_ref(), u).map_err(in_utterance)?;
                let runs = (0..models.len())
                    .map(|i| {
                        let (q, lane, plan) = (&models[i], &lanes[i], plans[i].as_ref());
                        quantized_run(q, r.as_ref(), u, &fp, lane, served, plan)
                            .map_err(|e| named(i, in_utterance(e)))
                    })
                    .collect::<Result<Vec<UtteranceRun>>>()?;
                let mut n = done.lock().unwrap_or_else(|p| p.into_inner());
                *n += 1;
                progress(*n, chosen.len(), &u.id);
                Ok(runs)
            })
        })
        .collect::<Result<Vec<Vec<UtteranceRun>>>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let mut per_checkpoint: Vec<Vec<UtteranceRun>> = models.iter().map(|_| Vec::new()).collect();
    for utterance in runs {
        for (i, run) in utterance.into_iter().enumerate() {
            per_checkpoint[i].push(run);
        }
    }
    Ok(per_checkpoint
        .into_iter()
        .zip(plans.iter().zip(&lanes))
        .zip(quantized)
        .map(|((runs, (plan, lane)), path)| {
            let mut all = Tally::default();
            let mut by_source: BTreeMap<String, Tally> = BTreeMap::new();
            let mut transcripts = Vec::new();
            let mut layer_figures = Vec::new();
            for (u, mut run) in chosen.iter().zip(runs) {
                layer_figures.extend(run.per_layer.take());
                all.add(&run);
                by_source
                    .entry(source_name(u).to_string())
                    .or_default()
                    .add(&run);
                transcripts.push(run.transcript);
            }
            let total = all.finish();
            VerifyReport {
                quantized_checkpoint: path.display().to_string(),
                reference_checkpoint: reference.display().to_string(),
                manifest: manifest.path.display().to_string(),
                served_dtype: served,
                device: lane.name(),
                fp8_accumulation,
                utterances: chosen.len(),
                wer_full_precision: total.wer_full_precision,
                wer_quantized: total.wer_quantized,
                wer_delta: total.wer_delta,
                wer_delta_interval: total.wer_delta_interval,
                word_errors_full_precision: total.word_errors_full_precision,
                word_errors_quantized: total.word_errors_quantized,
                free_running: total.free_running,
                teacher_forced: total.teacher_forced,
                hypothesis_scores: total.hypothesis_scores,
                nonfinite: total.nonfinite,
                by_source: by_source
                    .iter()
                    .map(|(k, t)| (k.clone(), t.finish()))
                    .collect(),
                seconds,
                utterances_per_second: chosen.len() as f64 / seconds.max(1e-9),
                transcripts,
                per_layer: plan.as_ref().map(|p| per_layer::report(p, &layer_figures)),
            }
        })
        .collect())
}
