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

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use rayon::prelude::*;

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::calibration::{Manifest, Utterance};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::format::{QuantDtype, QuantizationSpec};
use crate::models::whisper::forward::{ce, gelu, to_vec, Linear, LinearExec};
use crate::models::whisper::{teacher_forced, FullPrecision};
use crate::numerics::{self, ActScale, Activation, GemmEpilogue, OutDtype};
use crate::transcribe::Transcriber;
use crate::wer::{word_errors, WordErrors};

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
    /// Producers of an armed GEMM chain.
    chain_producers: HashSet<String>,
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
                numerics::scaled_mm(
                    self.dtype,
                    &codes,
                    ActScale::PerTensor(scale),
                    &self.codes,
                    &self.weight_scale,
                    rows,
                    self.n,
                    k,
                    &epi,
                )
            }
            None => {
                let a = if norm_fed {
                    // The spec's arming rules guarantee no smoother here (checked on load).
                    numerics::norm_quant_per_token(values, rows, k, served, self.dtype)
                } else {
                    numerics::quantize_per_token(values, rows, k, smooth, self.dtype)
                };
                numerics::scaled_mm(
                    self.dtype,
                    &a.codes,
                    ActScale::PerRow(&a.scales),
                    &self.codes,
                    &self.weight_scale,
                    rows,
                    self.n,
                    k,
                    &epi,
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

    fn linear_gelu(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        match self.layers.get(&layer.name) {
            // The chain's producer emits its consumer's input: GELU belongs to its epilogue.
            Some(q) if self.links.chain_producers.contains(&layer.name) => {
                self.run(&layer.name, q, x, Activation::Gelu)
            }
            _ => gelu(self.linear(layer, x)?, &layer.name),
        }
    }
}

/// A quantized checkpoint made runnable: the f32 model (quantized layers as zero placeholders,
/// only for their shapes) and the quantized layers.
pub struct QuantizedModel {
    pub transcriber: Transcriber,
    layers: BTreeMap<String, QuantizedLayer>,
    links: LinkRoles,
    pub spec: QuantizationSpec,
}

impl QuantizedModel {
    pub fn load(dir: &Path) -> Result<Self> {
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
            };
            // The f32 model needs a float weight of the right shape to load; QuantizedExec runs
            // every quantized layer, so its values are never read.
            let placeholder = vec![0f32; layer.codes.len()];
            runnable.tensors.insert(
                format!("{name}.weight"),
                crate::checkpoint::Tensor::from_f32(weight.shape.clone(), &placeholder),
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
                .map(|c| c.producer.clone())
                .collect(),
        };
        Ok(QuantizedModel {
            transcriber: Transcriber::new(&runnable)?,
            layers,
            links,
            spec,
        })
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
        let audio = self.transcriber.encode(exec, samples)?;
        teacher_forced(
            &self.transcriber.model,
            exec,
            &audio,
            &self.transcriber.rules,
            tokens,
        )
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

    fn linear_gelu(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        match self {
            Exec::Cpu(e) => e.linear_gelu(layer, x),
            #[cfg(feature = "cuda")]
            Exec::Cuda(e) => e.linear_gelu(layer, x),
        }
    }
}

/// Logit agreement over decoding steps.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Agreement {
    pub steps: usize,
    pub cosine_mean: f64,
    pub cosine_min: f64,
    /// Fraction of steps whose arg-max token is the same.
    pub top1_agreement: f64,
}

#[derive(Default)]
struct AgreementSum {
    steps: usize,
    cosine_sum: f64,
    cosine_min: f64,
    top1_same: usize,
}

/// The cosine of two logit rows, in f64 (0 when either is all zero).
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if na > 0.0 && nb > 0.0 {
        dot / (na * nb)
    } else {
        0.0
    }
}

impl AgreementSum {
    fn add(&mut self, a: &[f32], b: &[f32]) {
        let cos = cosine(a, b);
        if self.steps == 0 || cos < self.cosine_min {
            self.cosine_min = cos;
        }
        self.steps += 1;
        self.cosine_sum += cos;
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .max_by(|x, y| x.1.total_cmp(y.1))
                .map(|(i, _)| i)
        };
        self.top1_same += usize::from(argmax(a) == argmax(b));
    }

    fn merge(&mut self, other: &AgreementSum) {
        if other.steps == 0 {
            return;
        }
        if self.steps == 0 || other.cosine_min < self.cosine_min {
            self.cosine_min = other.cosine_min;
        }
        self.steps += other.steps;
        self.cosine_sum += other.cosine_sum;
        self.top1_same += other.top1_same;
    }

    fn finish(&self) -> Agreement {
        let n = self.steps.max(1) as f64;
        Agreement {
            steps: self.steps,
            cosine_mean: self.cosine_sum / n,
            cosine_min: self.cosine_min,
            top1_agreement: self.top1_same as f64 / n,
        }
    }
}

/// One utterance of a verify run.
#[derive(Clone, Debug, Serialize)]
pub struct VerifiedUtterance {
    pub id: String,
    pub reference_text: Option<String>,
    pub full_precision: String,
    pub quantized: String,
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
    pub utterances: usize,
    pub wer_full_precision: Option<f64>,
    pub wer_quantized: Option<f64>,
    /// Quantized minus full precision (absolute).
    pub wer_delta: Option<f64>,
    pub word_errors_full_precision: WordErrors,
    pub word_errors_quantized: WordErrors,
    /// Each model decodes its own greedy tokens; logits compared step by step.
    pub free_running: Agreement,
    /// The quantized model scores the full-precision tokens.
    pub teacher_forced: Agreement,
    /// Non-finite values in the quantized model's GEMM outputs and logits.
    pub nonfinite: usize,
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
    transcript: VerifiedUtterance,
    per_layer: Option<per_layer::UtteranceFigures>,
}

/// Both models on one utterance: each decodes greedily, then the quantized model scores the
/// full-precision tokens.
fn verify_one(
    q: &QuantizedModel,
    r: &Transcriber,
    u: &Utterance,
    lane: &Lane,
    served: OutDtype,
    layers: Option<&per_layer::Plan>,
) -> Result<UtteranceRun> {
    let samples = r.read(u)?;
    let fp = r.decode(&mut FullPrecision, &samples, true)?;
    let mut exec = lane.exec(q, served);
    let audio = q.transcriber.encode(&mut exec, &samples)?;
    let qd = crate::models::whisper::greedy(
        &q.transcriber.model,
        &mut exec,
        &audio,
        &q.transcriber.rules,
        true,
    )?;
    let scored = teacher_forced(
        &q.transcriber.model,
        &mut exec,
        &audio,
        &q.transcriber.rules,
        &fp.tokens,
    )?;
    let nonfinite = exec.nonfinite()
        + qd.step_logits
            .iter()
            .chain(&scored)
            .flatten()
            .filter(|v| !v.is_finite())
            .count();
    let (mut free, mut forced) = (AgreementSum::default(), AgreementSum::default());
    for (a, b) in fp.step_logits.iter().zip(&qd.step_logits) {
        free.add(a, b);
    }
    for (a, b) in fp.step_logits.iter().zip(&scored) {
        forced.add(a, b);
    }
    let (hyp_r, hyp_q) = (r.text(&fp.tokens)?, q.transcriber.text(&qd.tokens)?);
    let word_errors = u
        .text
        .as_ref()
        .map(|text| (word_errors(text, &hyp_r), word_errors(text, &hyp_q)));
    let agreement = forced.finish();
    let per_layer = layers
        .map(|plan| per_layer::run_utterance(plan, r, u, &samples, &fp.tokens, &scored, served))
        .transpose()?;
    Ok(UtteranceRun {
        free,
        forced,
        word_errors,
        nonfinite,
        transcript: VerifiedUtterance {
            id: u.id.clone(),
            reference_text: u.text.clone(),
            full_precision: hyp_r,
            quantized: hyp_q,
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
        per_layer: false,
    };
    verify_with(quantized, reference, manifest, &options, progress)
}

/// What a verify run does beyond the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Only the first `limit` utterances of the manifest.
    pub limit: Option<usize>,
    /// The dtype the quantized GEMMs round to.
    pub served: OutDtype,
    /// Where the quantized model's GEMMs run (the per-layer breakdown always runs on the CPU).
    pub device: VerifyDevice,
    /// Adds the per-layer breakdown ([`per_layer`]): one teacher-forced pass of the reference
    /// model per quantized layer and utterance. A checkpoint with SmoothQuant folds into norms or
    /// V projections needs its recorded factors (`smoothing_factors.safetensors`).
    pub per_layer: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            limit: None,
            served: OutDtype::F16,
            device: VerifyDevice::Cpu,
            per_layer: false,
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
    let VerifyOptions {
        limit,
        served,
        device,
        per_layer: with_layers,
    } = *options;
    #[cfg(not(feature = "cuda"))]
    if device == VerifyDevice::Cuda {
        return Err(no_cuda());
    }
    let q = QuantizedModel::load(quantized)?;
    let r = Transcriber::new(&Checkpoint::open(reference)?)?;
    // Checked before any work: a checkpoint without its smoothing factors is refused here.
    let plan = with_layers
        .then(|| per_layer::Plan::new(&q, quantized, &r.model))
        .transpose()?;
    let lane = Lane::open(device, &q)?;
    let started = std::time::Instant::now();
    let chosen: Vec<_> = manifest
        .utterances
        .iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let done = Mutex::new(0usize);
    // Utterances run in parallel, each on its own executors; the results are merged in manifest
    // order, so the report does not depend on the scheduling.
    let runs = chosen
        .par_iter()
        .map(|u| {
            let run = verify_one(&q, &r, u, &lane, served, plan.as_ref()).map_err(|e| {
                Error::Utterance {
                    id: u.id.clone(),
                    source: Box::new(e),
                }
            })?;
            let mut n = done.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            progress(*n, chosen.len(), &u.id);
            Ok(run)
        })
        .collect::<Result<Vec<UtteranceRun>>>()?;
    let (mut free, mut forced) = (AgreementSum::default(), AgreementSum::default());
    let (mut we_r, mut we_q) = (WordErrors::default(), WordErrors::default());
    let mut nonfinite = 0;
    let mut transcripts = Vec::new();
    let mut layer_figures = Vec::new();
    for run in runs {
        layer_figures.extend(run.per_layer);
        free.merge(&run.free);
        forced.merge(&run.forced);
        if let Some((r, q)) = run.word_errors {
            we_r.add(r);
            we_q.add(q);
        }
        nonfinite += run.nonfinite;
        transcripts.push(run.transcript);
    }
    let seconds = started.elapsed().as_secs_f64();
    let has_text = chosen.iter().any(|u| u.text.is_some());
    let (wr, wq) = (has_text.then(|| we_r.rate()), has_text.then(|| we_q.rate()));
    Ok(VerifyReport {
        quantized_checkpoint: quantized.display().to_string(),
        reference_checkpoint: reference.display().to_string(),
        manifest: manifest.path.display().to_string(),
        served_dtype: served,
        device: lane.name(),
        utterances: chosen.len(),
        wer_full_precision: wr,
        wer_quantized: wq,
        wer_delta: wr.zip(wq).map(|(a, b)| b - a),
        word_errors_full_precision: we_r,
        word_errors_quantized: we_q,
        free_running: free.finish(),
        teacher_forced: forced.finish(),
        nonfinite,
        seconds,
        utterances_per_second: chosen.len() as f64 / seconds.max(1e-9),
        transcripts,
        per_layer: plan.map(|p| per_layer::report(&p, &layer_figures)),
    })
}
