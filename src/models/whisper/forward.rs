//! Whisper's fp32 forward on the CPU with candle, as OpenAI's `model.py` computes it: a conv stem
//! with exact-erf GELU, the stored position tables, pre-norm attention and FFN blocks, and the
//! output head tied to the token embedding.
//!
//! Every quantizable layer (the 64 projections and the two convolutions, run as GEMMs over
//! im2col patches in OASR's KSC order) goes through a [`LinearExec`], so calibration can observe
//! GEMM inputs and a verify run can substitute the quantized numerics without touching the rest.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, IndexOp, Tensor};

use super::WhisperConfig;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::models::exec::{activate, add, ce, matmul, strided_gemm, to_vec, Linear, LinearExec};
use crate::models::gemv;
use crate::numerics::Activation;
use crate::parallel::min_task_len;

/// LayerNorm epsilon of Whisper.
const LN_EPS: f32 = 1e-5;

#[derive(Debug, Clone)]
struct Norm {
    name: String,
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl Norm {
    /// LayerNorm over the last dimension, on the calling thread: the arithmetic of the forward's
    /// earlier `candle_nn::ops::layer_norm` (f32 sums of x and x² in order, variance as
    /// E[x²] − mean²), so the figures stay the same bits, without its split of the rows across
    /// the pool (a nested split stalls utterances that run one per thread; `parallel::one_utterance`).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.len();
        if x.dim(candle_core::D::Minus1).ok() != Some(dim) {
            return Err(Error::Model {
                what: self.name.clone(),
                message: format!("input {:?} does not end in {dim}", x.dims()),
            });
        }
        let mut values = to_vec(x, &self.name)?;
        for row in values.chunks_exact_mut(dim) {
            let (mut sum, mut sum2) = (0f32, 0f32);
            for &v in row.iter() {
                sum += v;
                sum2 += v * v;
            }
            let mean = sum / dim as f32;
            let var = sum2 / dim as f32 - mean * mean;
            let inv_std = (var + LN_EPS).sqrt().recip();
            for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * inv_std * w + b;
            }
        }
        Tensor::from_vec(values, x.shape(), &Device::Cpu).map_err(ce(&self.name))
    }
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

thread_local! {
    /// Each thread's scores of one block of query rows, reused across heads, layers and calls.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Query rows per block of [`attention_core`]. A block's scores (128 × 1500 f32 over the
/// encoder's window, 768 KB) fit in a core's L2 from the product that writes them through the
/// softmax to the product that reads them, where a whole head's matrix (9 MB, per thread) went
/// to memory and back. Shorter blocks cost more repacking of K and V in gemm (64 rows: 5 % more
/// CPU in a calibration) than they save.
const QUERY_BLOCK: usize = 128;

/// Scaled dot-product attention of every head, straight from `[rows, heads · dh]` layouts:
/// `q` is `[T, D]`, `k` and `v` are `[S, D]`; query `i` sees keys `0..=causal_start + i` when
/// causal, all keys otherwise. Returns the heads merged, `[T, D]`.
///
/// Many queries (an encoder layer, a teacher-forced decoder) run in blocks of about
/// [`QUERY_BLOCK`] rows, the blocks in parallel, every head of a block on its thread. A row's
/// scores, softmax and weighted sum do not depend on the other rows of its block, so the
/// figures are the same bits as a whole-matrix evaluation. A few queries (a decoding step) run
/// their heads in parallel instead.
fn attention_core(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: usize,
    heads: usize,
    causal_start: Option<usize>,
) -> Vec<f32> {
    use rayon::prelude::*;
    let (dh, t, s) = (d / heads, q.len() / d, k.len() / d);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut merged = vec![0f32; t * d];
    if t <= gemv::MAX_ROWS {
        let per_head: Vec<Vec<f32>> = (0..heads)
            .into_par_iter()
            .with_min_len(min_task_len(heads))
            .map(|h| few_queries(q, k, v, d, h * dh, dh, causal_start, scale))
            .collect();
        for (h, out) in per_head.iter().enumerate() {
            for (row, src) in merged.chunks_exact_mut(d).zip(out.chunks_exact(dh)) {
                row[h * dh..(h + 1) * dh].copy_from_slice(src);
            }
        }
        return merged;
    }
    // Blocks of near-equal size, so none is as short as the few-row paths of gemm.
    let blocks = t.div_ceil(QUERY_BLOCK);
    let block_rows = t.div_ceil(blocks);
    merged
        .par_chunks_mut(block_rows * d)
        .enumerate()
        .with_min_len(min_task_len(blocks))
        .for_each(|(b, out)| {
            let (first, rows) = (b * block_rows, out.len() / d);
            SCORES.with_borrow_mut(|buffer| {
                if buffer.len() < rows * s {
                    buffer.resize(rows * s, 0.0);
                }
                let scores = &mut buffer[..rows * s];
                for h in 0..heads {
                    // SAFETY: q_h of this block is [rows, dh] at offset (first·D + h·dh) with row
                    // stride D; k_hᵀ is [dh, S] with element (c, j) at j·D + h·dh + c; scores is
                    // [rows, S] row-major. All in bounds.
                    unsafe {
                        strided_gemm(
                            rows,
                            s,
                            dh,
                            scores.as_mut_ptr(),
                            s,
                            q.as_ptr().add(first * d + h * dh),
                            d,
                            1,
                            k.as_ptr().add(h * dh),
                            1,
                            d,
                            scale,
                            gemm::Parallelism::None,
                        )
                    };
                    for (i, row) in scores.chunks_exact_mut(s).enumerate() {
                        let visible =
                            causal_start.map_or(s, |start| (start + first + i + 1).min(s));
                        let (seen, hidden) = row.split_at_mut(visible);
                        crate::numerics::softmax_in_place(seen);
                        hidden.fill(0.0);
                    }
                    // SAFETY: scores is [rows, S]; v_h is [S, dh] at offset h·dh with row stride
                    // D; the head's output is [rows, dh] at offset h·dh of this block's rows, row
                    // stride D. All in bounds.
                    unsafe {
                        strided_gemm(
                            rows,
                            dh,
                            s,
                            out.as_mut_ptr().add(h * dh),
                            d,
                            scores.as_ptr(),
                            s,
                            1,
                            v.as_ptr().add(h * dh),
                            d,
                            1,
                            1.0,
                            gemm::Parallelism::None,
                        )
                    };
                }
            })
        });
    merged
}

/// One head of [`attention_core`] for a few queries (a decoding step), without gemm's packing of
/// the keys and values on every call: each score a [`gemv::dot`], each output a
/// [`gemv::weighted_rows`] (the head's columns `off..off + dh`).
#[allow(clippy::too_many_arguments)]
fn few_queries(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: usize,
    off: usize,
    dh: usize,
    causal_start: Option<usize>,
    scale: f32,
) -> Vec<f32> {
    let s = k.len() / d;
    let mut out = vec![0f32; q.len() / d * dh];
    let mut row = vec![0f32; s];
    for (i, o) in out.chunks_exact_mut(dh).enumerate() {
        let qi = &q[i * d + off..i * d + off + dh];
        let visible = causal_start.map_or(s, |start| (start + i + 1).min(s));
        for (j, score) in row[..visible].iter_mut().enumerate() {
            *score = scale * gemv::dot(qi, &k[j * d + off..j * d + off + dh]);
        }
        crate::numerics::softmax_in_place(&mut row[..visible]);
        gemv::weighted_rows(&row[..visible], &v[off..], d, o);
    }
    out
}

/// Keys and values of one attention, `[S, D]` row-major.
#[derive(Debug, Clone, Default)]
struct KeysValues {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl Attention {
    /// Attends queries from `x` over `kv`; returns the output projection's result.
    fn attend(
        &self,
        exec: &mut dyn LinearExec,
        x: &Tensor,
        kv: &KeysValues,
        causal_start: Option<usize>,
    ) -> Result<Tensor> {
        let what = &self.out.name;
        let q = exec.linear(&self.q, x)?;
        let (rows, d) = q.dims2().map_err(ce(what))?;
        self.check(d, kv)?;
        let merged = attention_core(
            &to_vec(&q, what)?,
            &kv.keys,
            &kv.values,
            d,
            self.heads,
            causal_start,
        );
        let merged = Tensor::from_vec(merged, (rows, d), &Device::Cpu).map_err(ce(what))?;
        exec.linear(&self.out, &merged)
    }

    /// [`Self::attend`] for rows of different sequences: row r attends over `kvs[r]` alone,
    /// as the last position of its sequence (a decoding step of several hypotheses). The
    /// projections see the rows together.
    fn attend_each(
        &self,
        exec: &mut dyn LinearExec,
        x: &Tensor,
        kvs: &[&KeysValues],
    ) -> Result<Tensor> {
        let what = &self.out.name;
        let q = to_vec(&exec.linear(&self.q, x)?, what)?;
        let d = q.len() / kvs.len().max(1);
        let mut merged = Vec::with_capacity(q.len());
        for (row, kv) in q.chunks_exact(d.max(1)).zip(kvs) {
            self.check(d, kv)?;
            merged.extend(attention_core(
                row, &kv.keys, &kv.values, d, self.heads, None,
            ));
        }
        let merged = Tensor::from_vec(merged, (kvs.len(), d), &Device::Cpu).map_err(ce(what))?;
        exec.linear(&self.out, &merged)
    }

    /// Refuses heads that do not divide the width `d`, or keys and values that are not rows of it.
    fn check(&self, d: usize, kv: &KeysValues) -> Result<()> {
        if self.heads == 0
            || !d.is_multiple_of(self.heads)
            || kv.keys.len() != kv.values.len()
            || !kv.keys.len().is_multiple_of(d)
        {
            return Err(Error::Model {
                what: self.out.name.clone(),
                message: format!(
                    "{} heads over width {d} with {} keys and {} values",
                    self.heads,
                    kv.keys.len(),
                    kv.values.len()
                ),
            });
        }
        Ok(())
    }

    fn keys_values(&self, exec: &mut dyn LinearExec, source: &Tensor) -> Result<KeysValues> {
        Ok(KeysValues {
            keys: to_vec(&exec.linear(&self.k, source)?, &self.k.name)?,
            values: to_vec(&exec.linear(&self.v, source)?, &self.v.name)?,
        })
    }
}

#[derive(Debug, Clone)]
struct Ffn {
    norm: Norm,
    fc1: Linear,
    fc2: Linear,
}

impl Ffn {
    fn forward(&self, exec: &mut dyn LinearExec, x: &Tensor) -> Result<Tensor> {
        let h = exec.linear_act(&self.fc1, &self.norm.forward(x)?, Activation::Gelu)?;
        exec.linear(&self.fc2, &h)
    }
}

#[derive(Debug, Clone)]
struct EncoderLayer {
    attn_norm: Norm,
    attn: Attention,
    ffn: Ffn,
}

impl EncoderLayer {
    /// The layer's quantizable GEMMs, in forward order.
    fn gemms(&self) -> [&Linear; 6] {
        [
            &self.attn.q,
            &self.attn.k,
            &self.attn.v,
            &self.attn.out,
            &self.ffn.fc1,
            &self.ffn.fc2,
        ]
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    self_norm: Norm,
    self_attn: Attention,
    cross_norm: Norm,
    cross_attn: Attention,
    ffn: Ffn,
}

/// The whole model, ready to run.
#[derive(Debug, Clone)]
pub struct Whisper {
    pub config: WhisperConfig,
    conv1: Linear,
    conv2: Linear,
    encoder_positions: Tensor,
    encoder_layers: Vec<EncoderLayer>,
    encoder_norm: Norm,
    embed_tokens: Tensor,
    decoder_positions: Tensor,
    decoder_layers: Vec<DecoderLayer>,
    decoder_norm: Norm,
}

/// Loads tensors from a checkpoint into f32 candle tensors, each with the shape the config
/// gives it.
struct Loader<'a> {
    ckpt: &'a Checkpoint,
    shapes: BTreeMap<String, Vec<usize>>,
    device: Device,
}

impl Loader<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let t = self
            .ckpt
            .tensors
            .get(name)
            .ok_or_else(|| Error::tensor(&self.ckpt.dir, name, "missing"))?;
        if !t.dtype.is_float() {
            return Err(Error::tensor(
                &self.ckpt.dir,
                name,
                format!("expected a float tensor, found {}", t.dtype),
            ));
        }
        match self.shapes.get(name) {
            Some(shape) if shape == &t.shape => {}
            Some(shape) => {
                return Err(Error::tensor(
                    &self.ckpt.dir,
                    name,
                    format!(
                        "expected shape {shape:?} for this model_config, found {:?}",
                        t.shape
                    ),
                ))
            }
            None => {
                return Err(Error::tensor(
                    &self.ckpt.dir,
                    name,
                    "not a tensor of this Whisper model",
                ))
            }
        }
        Tensor::from_vec(t.to_f32(), t.shape.clone(), &self.device).map_err(ce(name))
    }

    fn linear(&self, name: &str, has_bias: bool) -> Result<Linear> {
        let mut weight = self.tensor(&format!("{name}.weight"))?;
        if weight.rank() == 3 {
            // KSC [out, k, in] → [out, k · in], the im2col order.
            let (o, k, i) = weight.dims3().map_err(ce(name))?;
            weight = weight.reshape((o, k * i)).map_err(ce(name))?;
        }
        let bias = if has_bias {
            Some(self.tensor(&format!("{name}.bias"))?)
        } else {
            None
        };
        Ok(Linear {
            name: name.to_string(),
            weight,
            bias,
        })
    }

    fn norm(&self, name: &str) -> Result<Norm> {
        let values = |part: &str| {
            let what = format!("{name}.{part}");
            to_vec(&self.tensor(&what)?, &what)
        };
        let (weight, bias) = (values("weight")?, values("bias")?);
        if weight.len() != bias.len() {
            return Err(Error::tensor(
                &self.ckpt.dir,
                format!("{name}.bias"),
                format!("{} values for a norm of {}", bias.len(), weight.len()),
            ));
        }
        Ok(Norm {
            name: name.to_string(),
            weight,
            bias,
        })
    }

    fn attention(&self, prefix: &str, heads: usize) -> Result<Attention> {
        Ok(Attention {
            q: self.linear(&format!("{prefix}.q_proj"), true)?,
            k: self.linear(&format!("{prefix}.k_proj"), false)?,
            v: self.linear(&format!("{prefix}.v_proj"), true)?,
            out: self.linear(&format!("{prefix}.out_proj"), true)?,
            heads,
        })
    }

    fn ffn(&self, prefix: &str) -> Result<Ffn> {
        Ok(Ffn {
            norm: self.norm(&format!("{prefix}.final_layer_norm"))?,
            fc1: self.linear(&format!("{prefix}.fc1"), true)?,
            fc2: self.linear(&format!("{prefix}.fc2"), true)?,
        })
    }
}

/// im2col for a 1-D convolution with kernel 3, padding 1: `[L, C]` → `[L_out, 3 · C]`, each row
/// the taps (t·stride − 1, t·stride, t·stride + 1) in order.
fn im2col3(x: &Tensor, stride: usize, what: &str) -> Result<Tensor> {
    let (len, _) = x.dims2().map_err(ce(what))?;
    if len == 0 || stride == 0 {
        return Err(Error::Model {
            what: what.into(),
            message: format!("a convolution over {len} frames with stride {stride}"),
        });
    }
    let out_len = (len - 1) / stride + 1;
    let padded = x.pad_with_zeros(0, 1, 1).map_err(ce(what))?;
    let taps = (0..3)
        .map(|j| {
            let idx: Vec<u32> = (0..out_len).map(|t| (t * stride + j) as u32).collect();
            let idx = Tensor::new(idx.as_slice(), x.device())?;
            padded.index_select(&idx, 0)
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(ce(what))?;
    Tensor::cat(&taps, 1).map_err(ce(what))
}

/// The decoder's caches for one utterance.
#[derive(Clone, Debug)]
pub struct DecoderState {
    /// Per layer: self-attention keys and values so far.
    self_kv: Vec<KeysValues>,
    /// Per layer: cross-attention keys and values over the encoder output. Never written after
    /// [`Whisper::start_decoder`], so the states of a beam search share them.
    cross_kv: Arc<Vec<KeysValues>>,
    /// Tokens consumed so far.
    pub position: usize,
}

impl Whisper {
    /// Builds the model from an imported full-precision checkpoint.
    pub fn load(ckpt: &Checkpoint) -> Result<Whisper> {
        let config: WhisperConfig = serde_json::from_value(ckpt.config.model_config.clone())
            .map_err(|e| Error::corrupt(&ckpt.dir, format!("invalid Whisper model_config: {e}")))?;
        // Checkpoint::open checked all of this; a Checkpoint built by hand is checked here too,
        // so no config value can reach an index or a division unchecked.
        config.check().map_err(|f| Error::ConfigKey {
            path: ckpt.dir.clone(),
            key: format!("model_config.{}", f.key),
            message: f.message,
        })?;
        if config.encoder_layers.saturating_add(config.decoder_layers) > ckpt.tensors.len() {
            return Err(Error::ConfigKey {
                path: ckpt.dir.clone(),
                key: "model_config.encoder_layers".into(),
                message: format!(
                    "{} encoder and {} decoder layers cannot fit in {} tensors",
                    config.encoder_layers,
                    config.decoder_layers,
                    ckpt.tensors.len()
                ),
            });
        }
        let l = Loader {
            ckpt,
            shapes: super::expected_tensors(&config).into_iter().collect(),
            device: Device::Cpu,
        };
        let encoder_layers = (0..config.encoder_layers)
            .map(|i| {
                let p = format!("encoder.layers.{i}");
                Ok(EncoderLayer {
                    attn_norm: l.norm(&format!("{p}.self_attn_layer_norm"))?,
                    attn: l.attention(&format!("{p}.self_attn"), config.encoder_attention_heads)?,
                    ffn: l.ffn(&p)?,
                })
            })
            .collect::<Result<_>>()?;
        let decoder_layers = (0..config.decoder_layers)
            .map(|i| {
                let p = format!("decoder.layers.{i}");
                Ok(DecoderLayer {
                    self_norm: l.norm(&format!("{p}.self_attn_layer_norm"))?,
                    self_attn: l
                        .attention(&format!("{p}.self_attn"), config.decoder_attention_heads)?,
                    cross_norm: l.norm(&format!("{p}.encoder_attn_layer_norm"))?,
                    cross_attn: l
                        .attention(&format!("{p}.encoder_attn"), config.decoder_attention_heads)?,
                    ffn: l.ffn(&p)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Whisper {
            conv1: l.linear("encoder.conv1", true)?,
            conv2: l.linear("encoder.conv2", true)?,
            encoder_positions: l.tensor("encoder.embed_positions.weight")?,
            encoder_layers,
            encoder_norm: l.norm("encoder.layer_norm")?,
            embed_tokens: l.tensor("decoder.embed_tokens.weight")?,
            decoder_positions: l.tensor("decoder.embed_positions.weight")?,
            decoder_layers,
            decoder_norm: l.norm("decoder.layer_norm")?,
            config,
        })
    }

    /// Every quantizable layer by name (the GEMMs and the two convolutions).
    pub fn linears(&self) -> BTreeMap<&str, &Linear> {
        let mut out: Vec<&Linear> = vec![&self.conv1, &self.conv2];
        for l in &self.encoder_layers {
            out.extend(l.gemms());
        }
        for l in &self.decoder_layers {
            out.extend([
                &l.self_attn.q,
                &l.self_attn.k,
                &l.self_attn.v,
                &l.self_attn.out,
            ]);
            out.extend([
                &l.cross_attn.q,
                &l.cross_attn.k,
                &l.cross_attn.v,
                &l.cross_attn.out,
                &l.ffn.fc1,
                &l.ffn.fc2,
            ]);
        }
        out.into_iter().map(|l| (l.name.as_str(), l)).collect()
    }

    /// The encoder over a log-mel `[n_mels, frames]` (row-major, as the frontend returns it);
    /// any number of frames up to twice the position table. Returns `[frames / 2, d_model]`.
    pub fn encode(
        &self,
        exec: &mut dyn LinearExec,
        mel: &[f32],
        n_mels: usize,
        frames: usize,
    ) -> Result<Tensor> {
        let x = self.encoder_stem(exec, mel, n_mels, frames)?;
        self.encode_from_layer(exec, x, 0)
    }

    /// [`Self::encode`], also returning the residual stream entering each encoder layer, from
    /// which [`Self::encode_from_layer`] resumes.
    pub fn encode_keeping_layer_inputs(
        &self,
        exec: &mut dyn LinearExec,
        mel: &[f32],
        n_mels: usize,
        frames: usize,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut x = self.encoder_stem(exec, mel, n_mels, frames)?;
        let mut inputs = Vec::with_capacity(self.encoder_layers.len());
        for layer in &self.encoder_layers {
            inputs.push(x.clone());
            x = self.encoder_layer(exec, layer, x)?;
        }
        Ok((self.encoder_norm.forward(&x)?, inputs))
    }

    /// The encoder from the residual stream `x` entering layer `first` (0-based) to its output.
    pub fn encode_from_layer(
        &self,
        exec: &mut dyn LinearExec,
        mut x: Tensor,
        first: usize,
    ) -> Result<Tensor> {
        for layer in self.encoder_layers.iter().skip(first) {
            x = self.encoder_layer(exec, layer, x)?;
        }
        self.encoder_norm.forward(&x)
    }

    /// The encoder layer (0-based) whose GEMMs include `layer`; `None` for the convolutions and
    /// every decoder layer.
    pub fn encoder_layer_of(&self, layer: &str) -> Option<usize> {
        self.encoder_layers
            .iter()
            .position(|l| l.gemms().iter().any(|g| g.name == layer))
    }

    /// The convolution stem with the positions added: the stream entering encoder layer 0.
    fn encoder_stem(
        &self,
        exec: &mut dyn LinearExec,
        mel: &[f32],
        n_mels: usize,
        frames: usize,
    ) -> Result<Tensor> {
        let what = "encoder";
        if n_mels != self.config.num_mel_bins || mel.len() != n_mels * frames || frames == 0 {
            return Err(Error::Model { what: what.into(), message: format!("expected a [{}, frames] log-mel, got {} values for {n_mels} bands x {frames} frames", self.config.num_mel_bins, mel.len()) });
        }
        let x = Tensor::from_slice(mel, (n_mels, frames), &Device::Cpu)
            .and_then(|t| t.t())
            .and_then(|t| t.contiguous())
            .map_err(ce(what))?;
        let x = activate(
            exec.linear(&self.conv1, &im2col3(&x, 1, what)?)?,
            Activation::Gelu,
            what,
        )?;
        let x = activate(
            exec.linear(&self.conv2, &im2col3(&x, 2, what)?)?,
            Activation::Gelu,
            what,
        )?;
        let len = x.dim(0).map_err(ce(what))?;
        if len > self.config.max_source_positions {
            return Err(Error::Model {
                what: what.into(),
                message: format!(
                    "{frames} frames exceed the encoder's {} positions",
                    self.config.max_source_positions
                ),
            });
        }
        add(
            &x,
            &self.encoder_positions.i(..len).map_err(ce(what))?,
            what,
        )
    }

    fn encoder_layer(
        &self,
        exec: &mut dyn LinearExec,
        layer: &EncoderLayer,
        x: Tensor,
    ) -> Result<Tensor> {
        let what = "encoder";
        let h = layer.attn_norm.forward(&x)?;
        let kv = layer.attn.keys_values(exec, &h)?;
        let x = add(&x, &layer.attn.attend(exec, &h, &kv, None)?, what)?;
        add(&x, &layer.ffn.forward(exec, &x)?, what)
    }

    /// A fresh decoder state over an encoder output (computes the cross-attention keys/values).
    pub fn start_decoder(&self, exec: &mut dyn LinearExec, audio: &Tensor) -> Result<DecoderState> {
        let cross_kv = self
            .decoder_layers
            .iter()
            .map(|l| l.cross_attn.keys_values(exec, audio))
            .collect::<Result<_>>()?;
        Ok(DecoderState {
            self_kv: vec![KeysValues::default(); self.decoder_layers.len()],
            cross_kv: Arc::new(cross_kv),
            position: 0,
        })
    }

    /// Refuses a decoder state of another depth, `n` more positions than the decoder has after
    /// `state`'s, and tokens outside the vocabulary.
    fn check_input(&self, state: &DecoderState, n: usize, tokens: &[u32]) -> Result<()> {
        let layers = self.decoder_layers.len();
        let start = state.position;
        let message = if state.self_kv.len() != layers || state.cross_kv.len() != layers {
            format!(
                "a decoder state of {} layers for a decoder of {layers}",
                state.self_kv.len()
            )
        } else if start + n > self.config.max_target_positions {
            format!(
                "{} tokens exceed the decoder's {} positions",
                start + n,
                self.config.max_target_positions
            )
        } else if let Some(bad) = tokens
            .iter()
            .find(|t| **t as usize >= self.config.vocab_size)
        {
            format!(
                "token {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )
        } else {
            return Ok(());
        };
        Err(Error::Model {
            what: "decoder".into(),
            message,
        })
    }

    /// Runs `tokens` through the decoder after what `state` holds; returns the logits of every
    /// new position, `[tokens, vocab]`.
    pub fn decode(
        &self,
        exec: &mut dyn LinearExec,
        state: &mut DecoderState,
        tokens: &[u32],
    ) -> Result<Tensor> {
        let what = "decoder";
        self.check_input(state, tokens.len(), tokens)?;
        let n = tokens.len();
        let start = state.position;
        let ids = Tensor::new(tokens, &Device::Cpu).map_err(ce(what))?;
        let embedded = self.embed_tokens.index_select(&ids, 0).map_err(ce(what))?;
        let positions = self
            .decoder_positions
            .i(start..start + n)
            .map_err(ce(what))?;
        let mut x = add(&embedded, &positions, what)?;
        for (i, layer) in self.decoder_layers.iter().enumerate() {
            let h = layer.self_norm.forward(&x)?;
            let new = layer.self_attn.keys_values(exec, &h)?;
            let cache = &mut state.self_kv[i];
            cache.keys.extend_from_slice(&new.keys);
            cache.values.extend_from_slice(&new.values);
            x = add(
                &x,
                &layer.self_attn.attend(exec, &h, cache, Some(start))?,
                what,
            )?;
            let h = layer.cross_norm.forward(&x)?;
            x = add(
                &x,
                &layer
                    .cross_attn
                    .attend(exec, &h, &state.cross_kv[i], None)?,
                what,
            )?;
            x = add(&x, &layer.ffn.forward(exec, &x)?, what)?;
        }
        state.position = start + n;
        let x = self.decoder_norm.forward(&x)?;
        matmul(&x, &self.embed_tokens.t().map_err(ce(what))?, what)
    }
}

impl Whisper {
    /// One decoding step of several hypotheses of one utterance: `tokens[b]` after what
    /// `states[b]` holds, every state at the same position (as a beam search's are); returns the
    /// logits `[hypotheses, vocab]`. The GEMMs take the hypotheses' rows together, so a weight is
    /// read once for all of them; up to [`gemv::MAX_ROWS`] hypotheses each row gets the bits
    /// [`Whisper::decode`] gives it alone.
    pub fn decode_step(
        &self,
        exec: &mut dyn LinearExec,
        states: &mut [DecoderState],
        tokens: &[u32],
    ) -> Result<Tensor> {
        let what = "decoder";
        let Some(start) = states.first().map(|s| s.position) else {
            return Err(Error::Model {
                what: what.into(),
                message: "a decoding step of no hypotheses".into(),
            });
        };
        let mismatch = if states.len() != tokens.len() {
            Some(format!(
                "{} tokens for {} hypotheses",
                tokens.len(),
                states.len()
            ))
        } else if states.iter().any(|s| s.position != start) {
            Some("hypotheses at different positions".to_string())
        } else {
            None
        };
        if let Some(message) = mismatch {
            return Err(Error::Model {
                what: what.into(),
                message,
            });
        }
        for state in states.iter() {
            self.check_input(state, 1, tokens)?;
        }
        let ids = Tensor::new(tokens, &Device::Cpu).map_err(ce(what))?;
        let embedded = self.embed_tokens.index_select(&ids, 0).map_err(ce(what))?;
        let position = self
            .decoder_positions
            .i(start..start + 1)
            .and_then(|p| p.broadcast_as(embedded.shape()))
            .map_err(ce(what))?;
        let mut x = add(&embedded, &position, what)?;
        for (i, layer) in self.decoder_layers.iter().enumerate() {
            let h = layer.self_norm.forward(&x)?;
            let new = layer.self_attn.keys_values(exec, &h)?;
            // One row of keys and one of values per hypothesis.
            let width = (new.keys.len() / states.len()).max(1);
            let rows = new
                .keys
                .chunks_exact(width)
                .zip(new.values.chunks_exact(width));
            for (state, (keys, values)) in states.iter_mut().zip(rows) {
                let cache = &mut state.self_kv[i];
                cache.keys.extend_from_slice(keys);
                cache.values.extend_from_slice(values);
            }
            let caches: Vec<&KeysValues> = states.iter().map(|s| &s.self_kv[i]).collect();
            x = add(&x, &layer.self_attn.attend_each(exec, &h, &caches)?, what)?;
            let h = layer.cross_norm.forward(&x)?;
            let cross: Vec<&KeysValues> = states.iter().map(|s| &s.cross_kv[i]).collect();
            x = add(&x, &layer.cross_attn.attend_each(exec, &h, &cross)?, what)?;
            x = add(&x, &layer.ffn.forward(exec, &x)?, what)?;
        }
        for state in states.iter_mut() {
            state.position = start + 1;
        }
        let x = self.decoder_norm.forward(&x)?;
        matmul(&x, &self.embed_tokens.t().map_err(ce(what))?, what)
    }
}

/// The logits as plain rows.
pub fn logits_rows(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    logits
        .to_dtype(DType::F32)
        .and_then(|l| l.to_vec2::<f32>())
        .map_err(ce("logits"))
}

/// Softmax-free argmax over a row with some ids masked out.
pub fn argmax_allowed(row: &[f32], allowed: impl Fn(usize) -> bool) -> Option<u32> {
    row.iter()
        .enumerate()
        .filter(|(i, v)| allowed(*i) && !v.is_nan())
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::exec::GEMM_DEPTH;

    /// Attention against an f64 evaluation: few queries (a decoding step), blocks of queries
    /// (the encoder, a teacher-forced decoder) with and without a causal mask, over more keys
    /// than one GEMM chunk sums (the encoder's 1500 positions).
    #[test]
    fn attention_matches_f64() {
        let many = 2 * QUERY_BLOCK + 5;
        for (t, s, causal_start) in [
            (3, GEMM_DEPTH * 2 + 37, None),
            (many, GEMM_DEPTH * 2 + 37, None),
            (many, many, Some(0)),
            (many, many + 9, Some(9)),
            (3, 20, Some(17)),
        ] {
            check_attention_against_f64(t, s, causal_start);
        }
    }

    fn check_attention_against_f64(t: usize, s: usize, causal_start: Option<usize>) {
        let (d, heads) = (8, 2);
        let gen = |n: usize, seed: u32| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5
                })
                .collect()
        };
        let (q, k, v) = (gen(t * d, 1), gen(s * d, 2), gen(s * d, 3));
        let out = attention_core(&q, &k, &v, d, heads, causal_start);
        let dh = d / heads;
        for h in 0..heads {
            for i in 0..t {
                let visible = causal_start.map_or(s, |start| (start + i + 1).min(s));
                let scores: Vec<f64> = (0..visible)
                    .map(|j| {
                        (0..dh)
                            .map(|c| {
                                f64::from(q[i * d + h * dh + c]) * f64::from(k[j * d + h * dh + c])
                            })
                            .sum::<f64>()
                            / (dh as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..dh {
                    let want: f64 = (0..visible)
                        .map(|j| e[j] / z * f64::from(v[j * d + h * dh + c]))
                        .sum();
                    let got = f64::from(out[i * d + h * dh + c]);
                    assert!(
                        (got - want).abs() < 1e-5,
                        "t {t} s {s} causal {causal_start:?}, head {h} row {i} col {c}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
