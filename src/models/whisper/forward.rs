//! Whisper's fp32 forward on the CPU with candle, as OpenAI's `model.py` computes it: a conv stem
//! with exact-erf GELU, the stored position tables, pre-norm attention and FFN blocks, and the
//! output head tied to the token embedding.
//!
//! Every quantizable layer (the 64 projections and the two convolutions, run as GEMMs over
//! im2col patches in OASR's KSC order) goes through a [`LinearExec`], so calibration can observe
//! GEMM inputs and a verify run can substitute the quantized numerics without touching the rest.

use std::collections::BTreeMap;

use candle_core::{DType, Device, IndexOp, Tensor};

use super::WhisperConfig;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// LayerNorm epsilon of Whisper.
const LN_EPS: f32 = 1e-5;

/// Maps a candle error into the crate's error, naming what was being computed.
pub(crate) fn ce(what: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |e| Error::Model { what: what.to_string(), message: e.to_string() }
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
        let y = x.matmul(&self.weight.t().map_err(ce(&self.name))?).map_err(ce(&self.name))?;
        match &self.bias {
            Some(b) => y.broadcast_add(b).map_err(ce(&self.name)),
            None => Ok(y),
        }
    }
}

/// How the forward runs its quantizable GEMMs.
pub trait LinearExec {
    /// `x` is `[rows, in]`; returns `[rows, out]`.
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor>;
}

/// Plain fp32.
#[derive(Debug, Default, Clone, Copy)]
pub struct FullPrecision;

impl LinearExec for FullPrecision {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        layer.forward(x)
    }
}

#[derive(Debug, Clone)]
struct Norm {
    name: String,
    weight: Tensor,
    bias: Tensor,
}

impl Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.weight, &self.bias, LN_EPS).map_err(ce(&self.name))
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

/// `[rows, heads · dh]` → `[heads, rows, dh]`.
fn split_heads(x: &Tensor, heads: usize, what: &str) -> Result<Tensor> {
    let (rows, d) = x.dims2().map_err(ce(what))?;
    x.reshape((rows, heads, d / heads)).and_then(|t| t.transpose(0, 1)).and_then(|t| t.contiguous()).map_err(ce(what))
}

impl Attention {
    /// Attends queries from `x` over `keys`/`values` (`[heads, S, dh]`) with an optional additive
    /// mask `[T, S]`; returns the output projection's result.
    fn attend(&self, exec: &mut dyn LinearExec, x: &Tensor, keys: &Tensor, values: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let what = &self.out.name;
        let q = split_heads(&exec.linear(&self.q, x)?, self.heads, what)?;
        let dh = q.dim(2).map_err(ce(what))?;
        let scale = 1.0 / (dh as f64).sqrt();
        let mut scores = q.matmul(&keys.t().map_err(ce(what))?).and_then(|s| s * scale).map_err(ce(what))?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask).map_err(ce(what))?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores).map_err(ce(what))?;
        let heads_out = probs.matmul(values).map_err(ce(what))?;
        let (h, t, dh) = heads_out.dims3().map_err(ce(what))?;
        let merged = heads_out.transpose(0, 1).and_then(|o| o.contiguous()).and_then(|o| o.reshape((t, h * dh))).map_err(ce(what))?;
        exec.linear(&self.out, &merged)
    }

    fn keys_values(&self, exec: &mut dyn LinearExec, source: &Tensor) -> Result<(Tensor, Tensor)> {
        let k = split_heads(&exec.linear(&self.k, source)?, self.heads, &self.k.name)?;
        let v = split_heads(&exec.linear(&self.v, source)?, self.heads, &self.v.name)?;
        Ok((k, v))
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
        let h = exec.linear(&self.fc1, &self.norm.forward(x)?)?;
        let h = h.gelu_erf().map_err(ce(&self.fc1.name))?;
        exec.linear(&self.fc2, &h)
    }
}

#[derive(Debug, Clone)]
struct EncoderLayer {
    attn_norm: Norm,
    attn: Attention,
    ffn: Ffn,
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

/// Loads tensors from a checkpoint into f32 candle tensors.
struct Loader<'a> {
    ckpt: &'a Checkpoint,
    device: Device,
}

impl Loader<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let t = self.ckpt.tensors.get(name).ok_or_else(|| Error::tensor(&self.ckpt.dir, name, "missing"))?;
        if !t.dtype.is_float() {
            return Err(Error::tensor(&self.ckpt.dir, name, format!("expected a float tensor, found {}", t.dtype)));
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
        let bias = if has_bias { Some(self.tensor(&format!("{name}.bias"))?) } else { None };
        Ok(Linear { name: name.to_string(), weight, bias })
    }

    fn norm(&self, name: &str) -> Result<Norm> {
        Ok(Norm { name: name.to_string(), weight: self.tensor(&format!("{name}.weight"))?, bias: self.tensor(&format!("{name}.bias"))? })
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

/// What one decoder step returns.
pub struct DecoderState {
    /// Per layer: self-attention keys and values so far (`[heads, S, dh]`).
    self_kv: Vec<Option<(Tensor, Tensor)>>,
    /// Per layer: cross-attention keys and values over the encoder output.
    cross_kv: Vec<(Tensor, Tensor)>,
    /// Tokens consumed so far.
    pub position: usize,
}

impl Whisper {
    /// Builds the model from an imported full-precision checkpoint.
    pub fn load(ckpt: &Checkpoint) -> Result<Whisper> {
        let config: WhisperConfig = serde_json::from_value(ckpt.config.model_config.clone())
            .map_err(|e| Error::corrupt(&ckpt.dir, format!("invalid Whisper model_config: {e}")))?;
        let l = Loader { ckpt, device: Device::Cpu };
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
                    self_attn: l.attention(&format!("{p}.self_attn"), config.decoder_attention_heads)?,
                    cross_norm: l.norm(&format!("{p}.encoder_attn_layer_norm"))?,
                    cross_attn: l.attention(&format!("{p}.encoder_attn"), config.decoder_attention_heads)?,
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
            out.extend([&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.out, &l.ffn.fc1, &l.ffn.fc2]);
        }
        for l in &self.decoder_layers {
            out.extend([&l.self_attn.q, &l.self_attn.k, &l.self_attn.v, &l.self_attn.out]);
            out.extend([&l.cross_attn.q, &l.cross_attn.k, &l.cross_attn.v, &l.cross_attn.out, &l.ffn.fc1, &l.ffn.fc2]);
        }
        out.into_iter().map(|l| (l.name.as_str(), l)).collect()
    }

    /// The encoder over a log-mel `[n_mels, frames]` (row-major, as the frontend returns it);
    /// any number of frames up to twice the position table. Returns `[frames / 2, d_model]`.
    pub fn encode(&self, exec: &mut dyn LinearExec, mel: &[f32], n_mels: usize, frames: usize) -> Result<Tensor> {
        let what = "encoder";
        if n_mels != self.config.num_mel_bins || mel.len() != n_mels * frames || frames == 0 {
            return Err(Error::Model { what: what.into(), message: format!("expected a [{}, frames] log-mel, got {} values for {n_mels} bands x {frames} frames", self.config.num_mel_bins, mel.len()) });
        }
        let x = Tensor::from_slice(mel, (n_mels, frames), &Device::Cpu).and_then(|t| t.t()).and_then(|t| t.contiguous()).map_err(ce(what))?;
        let x = exec.linear(&self.conv1, &im2col3(&x, 1, what)?)?.gelu_erf().map_err(ce(what))?;
        let x = exec.linear(&self.conv2, &im2col3(&x, 2, what)?)?.gelu_erf().map_err(ce(what))?;
        let len = x.dim(0).map_err(ce(what))?;
        if len > self.config.max_source_positions {
            return Err(Error::Model { what: what.into(), message: format!("{frames} frames exceed the encoder's {} positions", self.config.max_source_positions) });
        }
        let mut x = x.broadcast_add(&self.encoder_positions.i(..len).map_err(ce(what))?).map_err(ce(what))?;
        for layer in &self.encoder_layers {
            let h = layer.attn_norm.forward(&x)?;
            let (k, v) = layer.attn.keys_values(exec, &h)?;
            x = (x + layer.attn.attend(exec, &h, &k, &v, None)?).map_err(ce(what))?;
            x = (&x + layer.ffn.forward(exec, &x)?).map_err(ce(what))?;
        }
        self.encoder_norm.forward(&x)
    }

    /// A fresh decoder state over an encoder output (computes the cross-attention keys/values).
    pub fn start_decoder(&self, exec: &mut dyn LinearExec, audio: &Tensor) -> Result<DecoderState> {
        let cross_kv = self.decoder_layers.iter().map(|l| l.cross_attn.keys_values(exec, audio)).collect::<Result<_>>()?;
        Ok(DecoderState { self_kv: vec![None; self.decoder_layers.len()], cross_kv, position: 0 })
    }

    /// Runs `tokens` through the decoder after what `state` holds; returns the logits of every
    /// new position, `[tokens, vocab]`.
    pub fn decode(&self, exec: &mut dyn LinearExec, state: &mut DecoderState, tokens: &[u32]) -> Result<Tensor> {
        let what = "decoder";
        let n = tokens.len();
        let start = state.position;
        if start + n > self.config.max_target_positions {
            return Err(Error::Model { what: what.into(), message: format!("{} tokens exceed the decoder's {} positions", start + n, self.config.max_target_positions) });
        }
        let ids = Tensor::new(tokens, &Device::Cpu).map_err(ce(what))?;
        let mut x = self.embed_tokens.index_select(&ids, 0).and_then(|e| e + self.decoder_positions.i(start..start + n)?).map_err(ce(what))?;
        // Causal mask over [new tokens, all tokens so far].
        let total = start + n;
        let mask: Vec<f32> = (0..n).flat_map(|i| (0..total).map(move |j| if j > start + i { f32::NEG_INFINITY } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (n, total), &Device::Cpu).map_err(ce(what))?;
        for (i, layer) in self.decoder_layers.iter().enumerate() {
            let h = layer.self_norm.forward(&x)?;
            let (k_new, v_new) = layer.self_attn.keys_values(exec, &h)?;
            let (k, v) = match state.self_kv[i].take() {
                Some((k, v)) => (Tensor::cat(&[&k, &k_new], 1).map_err(ce(what))?, Tensor::cat(&[&v, &v_new], 1).map_err(ce(what))?),
                None => (k_new, v_new),
            };
            x = (x + layer.self_attn.attend(exec, &h, &k, &v, Some(&mask))?).map_err(ce(what))?;
            state.self_kv[i] = Some((k, v));
            let h = layer.cross_norm.forward(&x)?;
            let (ck, cv) = &state.cross_kv[i];
            x = (x + layer.cross_attn.attend(exec, &h, ck, cv, None)?).map_err(ce(what))?;
            x = (&x + layer.ffn.forward(exec, &x)?).map_err(ce(what))?;
        }
        state.position = total;
        let x = self.decoder_norm.forward(&x)?;
        x.matmul(&self.embed_tokens.t().map_err(ce(what))?).map_err(ce(what))
    }
}

/// The logits as plain rows.
pub fn logits_rows(logits: &Tensor) -> Result<Vec<Vec<f32>>> {
    logits.to_dtype(DType::F32).and_then(|l| l.to_vec2::<f32>()).map_err(ce("logits"))
}

/// Softmax-free argmax over a row with some ids masked out.
pub fn argmax_allowed(row: &[f32], allowed: impl Fn(usize) -> bool) -> Option<u32> {
    row.iter().enumerate().filter(|(i, v)| allowed(*i) && !v.is_nan()).max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32)
}
