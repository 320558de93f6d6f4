//! The U2++ Conformer's fp32 forward on the CPU, as WeNet computes it: Conv2dSubsampling4, the
//! Conformer blocks (macaron feed-forward modules with swish, WeNet's relative-position
//! attention without `rel_shift`, the convolution module, causal or not), `after_norm`, the CTC
//! head, and the transformer decoders that score a hypothesis for attention rescoring.
//!
//! Every quantizable layer goes through a [`LinearExec`]: the GEMMs, and the subsampling
//! convolutions as GEMMs over im2col patches in OASR's `[out, kh, kw, in]` order.

use candle_core::{Device, Tensor};

use super::{decoder_prefixes, ConformerConfig};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::models::exec::{ce, to_vec, Linear, LinearExec};
use crate::numerics::Activation;

/// LayerNorm and BatchNorm epsilon of WeNet.
const EPS: f32 = 1e-5;

fn model_error(what: &str, message: impl Into<String>) -> Error {
    Error::Model {
        what: what.to_string(),
        message: message.into(),
    }
}

fn tensor2(values: Vec<f32>, rows: usize, cols: usize, what: &str) -> Result<Tensor> {
    Tensor::from_vec(values, (rows, cols), &Device::Cpu).map_err(ce(what))
}

/// A LayerNorm over the last dimension, or an eval-mode BatchNorm over channels.
#[derive(Debug, Clone)]
struct Norm {
    name: String,
    weight: Vec<f32>,
    bias: Vec<f32>,
    /// BatchNorm's running statistics (mean, 1 / sqrt(var + eps)).
    batch: Option<(Vec<f32>, Vec<f32>)>,
}

impl Norm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let d = self.weight.len();
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks_exact(d) {
            match &self.batch {
                Some((mean, inv)) => {
                    for c in 0..d {
                        out.push((row[c] - mean[c]) * inv[c] * self.weight[c] + self.bias[c]);
                    }
                }
                None => {
                    let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
                    let var = row
                        .iter()
                        .map(|&v| (f64::from(v) - mean).powi(2))
                        .sum::<f64>()
                        / d as f64;
                    let inv = 1.0 / (var + f64::from(EPS)).sqrt();
                    for ((&v, w), b) in row.iter().zip(&self.weight).zip(&self.bias) {
                        let n = ((f64::from(v) - mean) * inv) as f32;
                        out.push(n * w + b);
                    }
                }
            }
        }
        out
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (rows, cols) = x.dims2().map_err(ce(&self.name))?;
        tensor2(self.apply(&to_vec(x, &self.name)?), rows, cols, &self.name)
    }
}

/// Multi-head attention: `linear_q/k/v` (or one fused `linear_qkv`), `linear_out`, and for the
/// encoder the relative-position terms.
#[derive(Debug, Clone)]
struct Attention {
    name: String,
    /// Fused q;k;v (encoder) or separate (decoder).
    qkv: Option<Linear>,
    q: Option<Linear>,
    k: Option<Linear>,
    v: Option<Linear>,
    out: Linear,
    heads: usize,
    /// Encoder: `linear_pos`, `pos_bias_u`, `pos_bias_v` (`[heads · dk]` each).
    rel: Option<(Linear, Vec<f32>, Vec<f32>)>,
}

/// `[rows, d]` values.
struct Rows {
    data: Vec<f32>,
    rows: usize,
}

fn rows_of(x: &Tensor, what: &str) -> Result<Rows> {
    let (rows, _) = x.dims2().map_err(ce(what))?;
    Ok(Rows {
        data: to_vec(x, what)?,
        rows,
    })
}

impl Attention {
    /// Attends `q` over `k`/`v` (`[*, d]` row-major); `pos` is the projected positions `p`
    /// (encoder), `causal` masks future keys (decoder self-attention).
    fn core(
        &self,
        q: &Rows,
        k: &Rows,
        v: &Rows,
        pos: Option<&Rows>,
        causal: bool,
        d: usize,
    ) -> Vec<f32> {
        let h = self.heads;
        let dk = d / h;
        let scale = 1.0 / (dk as f32).sqrt();
        let mut merged = vec![0f32; q.rows * d];
        let mut scores = vec![0f32; k.rows];
        for head in 0..h {
            let col = head * dk;
            for i in 0..q.rows {
                let qi = &q.data[i * d + col..i * d + col + dk];
                for (j, score) in scores.iter_mut().enumerate() {
                    let kj = &k.data[j * d + col..j * d + col + dk];
                    let mut s = match (&self.rel, pos) {
                        (Some((_, u, vb)), Some(p)) => {
                            let pj = &p.data[j * d + col..j * d + col + dk];
                            let (u, vb) = (&u[col..col + dk], &vb[col..col + dk]);
                            let mut ac = 0f32;
                            let mut bd = 0f32;
                            for x in 0..dk {
                                ac += (qi[x] + u[x]) * kj[x];
                                bd += (qi[x] + vb[x]) * pj[x];
                            }
                            ac + bd
                        }
                        _ => qi.iter().zip(kj).map(|(a, b)| a * b).sum(),
                    };
                    s *= scale;
                    *score = if causal && j > i {
                        f32::NEG_INFINITY
                    } else {
                        s
                    };
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let out = &mut merged[i * d + col..i * d + col + dk];
                for (j, s) in scores.iter().enumerate() {
                    let w = s / sum;
                    let vj = &v.data[j * d + col..j * d + col + dk];
                    for x in 0..dk {
                        out[x] += w * vj[x];
                    }
                }
            }
        }
        merged
    }

    /// Self-attention (encoder: with the positions) or attention over `memory` (decoder).
    fn forward(
        &self,
        exec: &mut dyn LinearExec,
        x: &Tensor,
        memory: Option<&Tensor>,
        pos_emb: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        let what = &self.name;
        let (rows, d) = x.dims2().map_err(ce(what))?;
        let (q, k, v) = match (&self.qkv, &self.q, &self.k, &self.v) {
            (Some(qkv), ..) => {
                let all = rows_of(&exec.linear(qkv, x)?, what)?;
                let split = |part: usize| Rows {
                    data: all
                        .data
                        .chunks_exact(3 * d)
                        .flat_map(|r| r[part * d..(part + 1) * d].iter().copied())
                        .collect(),
                    rows,
                };
                (split(0), split(1), split(2))
            }
            (None, Some(q), Some(k), Some(v)) => {
                let source = memory.unwrap_or(x);
                (
                    rows_of(&exec.linear(q, x)?, what)?,
                    rows_of(&exec.linear(k, source)?, what)?,
                    rows_of(&exec.linear(v, source)?, what)?,
                )
            }
            _ => return Err(model_error(what, "an attention without projections")),
        };
        let pos = match (&self.rel, pos_emb) {
            (Some((linear_pos, _, _)), Some(p)) => {
                Some(rows_of(&exec.linear(linear_pos, p)?, what)?)
            }
            _ => None,
        };
        let merged = self.core(&q, &k, &v, pos.as_ref(), causal, d);
        exec.linear(&self.out, &tensor2(merged, rows, d, what)?)
    }
}

/// A feed-forward module: `w_2(act(w_1 x))`.
#[derive(Debug, Clone)]
struct FeedForward {
    w1: Linear,
    w2: Linear,
    activation: Activation,
}

impl FeedForward {
    fn forward(&self, exec: &mut dyn LinearExec, x: &Tensor) -> Result<Tensor> {
        let h = exec.linear_act(&self.w1, x, self.activation)?;
        exec.linear(&self.w2, &h)
    }
}

/// The convolution module: pointwise_conv1 → GLU → depthwise conv → norm → swish →
/// pointwise_conv2, channels last (`[frames, d]`).
#[derive(Debug, Clone)]
struct ConvModule {
    name: String,
    pointwise1: Linear,
    /// `[kernel, d]` and `[d]`.
    depthwise: Vec<f32>,
    depthwise_bias: Vec<f32>,
    kernel: usize,
    norm: Norm,
    pointwise2: Linear,
    causal: bool,
}

impl ConvModule {
    fn forward(&self, exec: &mut dyn LinearExec, x: &Tensor) -> Result<Tensor> {
        let what = &self.name;
        let (t, d) = x.dims2().map_err(ce(what))?;
        let mut input = to_vec(x, what)?;
        // Causal: kernel − 1 zero frames before pointwise_conv1 (WeNet pads its input, so the
        // padded frames become GLU(bias) before the unpadded depthwise convolution).
        let lorder = if self.causal { self.kernel - 1 } else { 0 };
        if lorder > 0 {
            let mut padded = vec![0f32; lorder * d];
            padded.extend_from_slice(&input);
            input = padded;
        }
        let frames = t + lorder;
        let h = to_vec(
            &exec.linear(&self.pointwise1, &tensor2(input, frames, d, what)?)?,
            what,
        )?;
        let glu: Vec<f32> = h
            .chunks_exact(2 * d)
            .flat_map(|r| {
                (0..d).map(move |c| {
                    let gate = r[d + c];
                    r[c] * (1.0 / (1.0 + (-gate).exp()))
                })
            })
            .collect();
        // Depthwise: non-causal pads (kernel − 1) / 2 zeros on each side inside the conv.
        let pad = if self.causal {
            0
        } else {
            (self.kernel - 1) / 2
        };
        let mut y = vec![0f32; t * d];
        for out_t in 0..t {
            let row = &mut y[out_t * d..(out_t + 1) * d];
            row.copy_from_slice(&self.depthwise_bias);
            for k in 0..self.kernel {
                let src = out_t + k;
                if src < pad || src - pad >= frames {
                    continue;
                }
                let s = &glu[(src - pad) * d..(src - pad + 1) * d];
                let w = &self.depthwise[k * d..(k + 1) * d];
                for c in 0..d {
                    row[c] += w[c] * s[c];
                }
            }
        }
        let mut y = self.norm.apply(&y);
        for v in y.iter_mut() {
            *v = crate::numerics::swish(*v);
        }
        exec.linear(&self.pointwise2, &tensor2(y, t, d, what)?)
    }
}

/// One Conformer block (macaron style, norms before each module).
#[derive(Debug, Clone)]
struct Block {
    ff_macaron: FeedForward,
    attention: Attention,
    conv: ConvModule,
    ff: FeedForward,
    norm_ff_macaron: Norm,
    norm_mha: Norm,
    norm_conv: Norm,
    norm_ff: Norm,
    norm_final: Norm,
}

fn add(a: &Tensor, b: &Tensor, scale: f64, what: &str) -> Result<Tensor> {
    let b = if scale == 1.0 {
        b.clone()
    } else {
        (b * scale).map_err(ce(what))?
    };
    (a + b).map_err(ce(what))
}

impl Block {
    fn forward(
        &self,
        exec: &mut dyn LinearExec,
        x: &Tensor,
        pos: &Tensor,
        what: &str,
    ) -> Result<Tensor> {
        let h = self
            .ff_macaron
            .forward(exec, &self.norm_ff_macaron.forward(x)?)?;
        let x = add(x, &h, 0.5, what)?;
        let h =
            self.attention
                .forward(exec, &self.norm_mha.forward(&x)?, None, Some(pos), false)?;
        let x = add(&x, &h, 1.0, what)?;
        let h = self.conv.forward(exec, &self.norm_conv.forward(&x)?)?;
        let x = add(&x, &h, 1.0, what)?;
        let h = self.ff.forward(exec, &self.norm_ff.forward(&x)?)?;
        let x = add(&x, &h, 0.5, what)?;
        self.norm_final.forward(&x)
    }
}

/// One transformer decoder block.
#[derive(Debug, Clone)]
struct DecoderBlock {
    self_attn: Attention,
    src_attn: Attention,
    ff: FeedForward,
    norm1: Norm,
    norm2: Norm,
    norm3: Norm,
}

/// A transformer decoder (the left one, or the right one of a bitransformer).
#[derive(Debug, Clone)]
struct Decoder {
    name: String,
    /// `[vocab, d]`.
    embed: Vec<f32>,
    blocks: Vec<DecoderBlock>,
    after_norm: Norm,
    output: Linear,
}

/// The sinusoid table `pe[pos, 2i] = sin(pos / 10000^(2i/d))`, `pe[pos, 2i+1] = cos(…)`.
fn sinusoids(rows: usize, d: usize) -> Vec<f32> {
    let mut pe = vec![0f32; rows * d];
    for pos in 0..rows {
        for i in (0..d).step_by(2) {
            let div = (-(i as f64) * (10000f64.ln() / d as f64)).exp();
            let angle = pos as f64 * div;
            pe[pos * d + i] = angle.sin() as f32;
            if i + 1 < d {
                pe[pos * d + i + 1] = angle.cos() as f32;
            }
        }
    }
    pe
}

/// The U2++ Conformer, loaded for the CPU forward.
pub struct Conformer {
    pub config: ConformerConfig,
    convs: [Linear; 2],
    embed_out: Linear,
    blocks: Vec<Block>,
    after_norm: Norm,
    ctc: Linear,
    decoders: Vec<Decoder>,
}

impl Conformer {
    /// Loads every tensor of a full-precision (format version 1) checkpoint as f32.
    pub fn load(ckpt: &Checkpoint) -> Result<Conformer> {
        let config: ConformerConfig = serde_json::from_value(ckpt.config.model_config.clone())
            .map_err(|e| {
                Error::corrupt(&ckpt.dir, format!("invalid Conformer model_config: {e}"))
            })?;
        let values = |name: &str| -> Result<Vec<f32>> {
            ckpt.tensors
                .get(name)
                .map(|t| t.to_f32())
                .ok_or_else(|| Error::tensor(&ckpt.dir, name, "missing"))
        };
        let linear = |name: &str, bias: bool| -> Result<Linear> {
            let t = ckpt
                .tensors
                .get(&format!("{name}.weight"))
                .ok_or_else(|| Error::tensor(&ckpt.dir, format!("{name}.weight"), "missing"))?;
            let out = t.shape[0];
            let cols = t.shape.iter().skip(1).product::<usize>();
            let weight = tensor2(t.to_f32(), out, cols, name)?;
            let bias = if bias {
                let b = values(&format!("{name}.bias"))?;
                Some(Tensor::from_vec(b, out, &Device::Cpu).map_err(ce(name))?)
            } else {
                None
            };
            Ok(Linear {
                name: name.to_string(),
                weight,
                bias,
            })
        };
        let norm = |name: &str, batch: bool| -> Result<Norm> {
            let stats = if batch {
                let var = values(&format!("{name}.running_var"))?;
                Some((
                    values(&format!("{name}.running_mean"))?,
                    var.iter().map(|v| 1.0 / (v + EPS).sqrt()).collect(),
                ))
            } else {
                None
            };
            Ok(Norm {
                name: name.to_string(),
                weight: values(&format!("{name}.weight"))?,
                bias: values(&format!("{name}.bias"))?,
                batch: stats,
            })
        };
        let batch = config.cnn_module_norm == "batch_norm";
        let mut blocks = Vec::with_capacity(config.encoder_blocks);
        for i in 0..config.encoder_blocks {
            let p = format!("encoder.encoders.{i}");
            let ff = |m: &str| -> Result<FeedForward> {
                Ok(FeedForward {
                    w1: linear(&format!("{p}.{m}.w_1"), true)?,
                    w2: linear(&format!("{p}.{m}.w_2"), true)?,
                    activation: Activation::Swish,
                })
            };
            let a = format!("{p}.self_attn");
            let m = format!("{p}.conv_module");
            blocks.push(Block {
                ff_macaron: ff("feed_forward_macaron")?,
                attention: Attention {
                    name: a.clone(),
                    qkv: Some(linear(&format!("{a}.linear_qkv"), true)?),
                    q: None,
                    k: None,
                    v: None,
                    out: linear(&format!("{a}.linear_out"), true)?,
                    heads: config.encoder_heads,
                    rel: Some((
                        linear(&format!("{a}.linear_pos"), false)?,
                        values(&format!("{a}.pos_bias_u"))?,
                        values(&format!("{a}.pos_bias_v"))?,
                    )),
                },
                conv: ConvModule {
                    name: m.clone(),
                    pointwise1: linear(&format!("{m}.pointwise_conv1"), true)?,
                    depthwise: values(&format!("{m}.depthwise_conv.weight"))?,
                    depthwise_bias: values(&format!("{m}.depthwise_conv.bias"))?,
                    kernel: config.cnn_module_kernel,
                    norm: norm(&format!("{m}.norm_activation"), batch)?,
                    pointwise2: linear(&format!("{m}.pointwise_conv2"), true)?,
                    causal: config.causal,
                },
                ff: ff("feed_forward")?,
                norm_ff_macaron: norm(&format!("{p}.norm_ff_macaron"), false)?,
                norm_mha: norm(&format!("{p}.norm_mha"), false)?,
                norm_conv: norm(&format!("{p}.norm_conv"), false)?,
                norm_ff: norm(&format!("{p}.norm_ff"), false)?,
                norm_final: norm(&format!("{p}.norm_final"), false)?,
            });
        }
        let mut decoders = Vec::new();
        for (prefix, count) in decoder_prefixes(&config) {
            let mut dblocks = Vec::with_capacity(count);
            for i in 0..count {
                let q = format!("{prefix}.decoders.{i}");
                let att = |a: &str| -> Result<Attention> {
                    let n = format!("{q}.{a}");
                    Ok(Attention {
                        name: n.clone(),
                        qkv: None,
                        q: Some(linear(&format!("{n}.linear_q"), true)?),
                        k: Some(linear(&format!("{n}.linear_k"), true)?),
                        v: Some(linear(&format!("{n}.linear_v"), true)?),
                        out: linear(&format!("{n}.linear_out"), true)?,
                        heads: config.decoder_heads,
                        rel: None,
                    })
                };
                dblocks.push(DecoderBlock {
                    self_attn: att("self_attn")?,
                    src_attn: att("src_attn")?,
                    ff: FeedForward {
                        w1: linear(&format!("{q}.feed_forward.w_1"), true)?,
                        w2: linear(&format!("{q}.feed_forward.w_2"), true)?,
                        activation: Activation::Relu,
                    },
                    norm1: norm(&format!("{q}.norm1"), false)?,
                    norm2: norm(&format!("{q}.norm2"), false)?,
                    norm3: norm(&format!("{q}.norm3"), false)?,
                });
            }
            decoders.push(Decoder {
                name: prefix.to_string(),
                embed: values(&format!("{prefix}.embed.0.weight"))?,
                blocks: dblocks,
                after_norm: norm(&format!("{prefix}.after_norm"), false)?,
                output: linear(&format!("{prefix}.output_layer"), true)?,
            });
        }
        Ok(Conformer {
            convs: [
                linear("encoder.embed.convs.0", true)?,
                linear("encoder.embed.convs.1", true)?,
            ],
            embed_out: linear("encoder.embed.out", true)?,
            blocks,
            after_norm: norm("encoder.after_norm", false)?,
            ctc: linear("ctc.ctc_lo", true)?,
            decoders,
            config,
        })
    }

    /// A 3x3 convolution of stride 2 (no padding) over `[h, w, c]` (channels last) through
    /// `exec`, then ReLU: `[h', w', out]`.
    fn conv3x3(
        &self,
        exec: &mut dyn LinearExec,
        layer: &Linear,
        x: &[f32],
        h: usize,
        w: usize,
        c: usize,
    ) -> Result<(Vec<f32>, usize, usize)> {
        let what = &layer.name;
        if h < 3 || w < 3 {
            return Err(model_error(
                what,
                format!("{h} x {w} input is smaller than the 3x3 kernel"),
            ));
        }
        let (ho, wo) = ((h - 3) / 2 + 1, (w - 3) / 2 + 1);
        let mut patches = Vec::with_capacity(ho * wo * 9 * c);
        for i in 0..ho {
            for j in 0..wo {
                for kh in 0..3 {
                    let row = (2 * i + kh) * w;
                    for kw in 0..3 {
                        let at = (row + 2 * j + kw) * c;
                        patches.extend_from_slice(&x[at..at + c]);
                    }
                }
            }
        }
        let y = exec.linear_act(
            layer,
            &tensor2(patches, ho * wo, 9 * c, what)?,
            Activation::Relu,
        )?;
        Ok((to_vec(&y, what)?, ho, wo))
    }

    /// The encoder output `[frames', d]` for normalised features `[frames, input_dim]`.
    pub fn encode(
        &self,
        exec: &mut dyn LinearExec,
        features: &[f32],
        frames: usize,
    ) -> Result<Tensor> {
        let c = &self.config;
        let d = c.d_model;
        if features.len() != frames * c.input_dim {
            return Err(model_error(
                "encoder",
                format!(
                    "{} feature values for {frames} frames of {}",
                    features.len(),
                    c.input_dim
                ),
            ));
        }
        let (x, h, w) = self.conv3x3(exec, &self.convs[0], features, frames, c.input_dim, 1)?;
        let (x, t, f) = self.conv3x3(exec, &self.convs[1], &x, h, w, d)?;
        // [t, f, d] per frame is the frequency-major layout embed.out's columns were reordered to.
        let x = exec.linear(&self.embed_out, &tensor2(x, t, f * d, "encoder.embed.out")?)?;
        // RelPositionalEncoding: x · √d, and the positions enter only through linear_pos.
        let x = (x * (d as f64).sqrt()).map_err(ce("encoder.embed"))?;
        let pos = tensor2(sinusoids(t, d), t, d, "encoder.embed.pos_enc")?;
        let mut x = x;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(exec, &x, &pos, &format!("encoder.encoders.{i}"))?;
        }
        self.after_norm.forward(&x)
    }

    /// The CTC log-posteriors `[frames', vocab]` (the padding rows of the head excluded).
    pub fn ctc_log_probs(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
    ) -> Result<Vec<Vec<f32>>> {
        let logits = to_vec(&exec.linear(&self.ctc, encoded)?, "ctc.ctc_lo")?;
        Ok(log_softmax_rows(
            &logits,
            self.config.padded_vocab(),
            self.config.vocab_size,
        ))
    }

    /// The log-probabilities `[len(hyp) + 1, vocab]` decoder `index` (0 left, 1 right) gives at
    /// each position when fed `sos` followed by `tokens` (already reversed for the right one).
    pub fn decoder_log_probs(
        &self,
        exec: &mut dyn LinearExec,
        index: usize,
        encoded: &Tensor,
        sos: u32,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let dec = self
            .decoders
            .get(index)
            .ok_or_else(|| model_error("decoder", format!("no decoder {index}")))?;
        let d = self.config.d_model;
        let mut input = vec![sos];
        input.extend_from_slice(tokens);
        let l = input.len();
        let pe = sinusoids(l, d);
        let scale = (d as f32).sqrt();
        let mut x = Vec::with_capacity(l * d);
        for (pos, &tok) in input.iter().enumerate() {
            let tok = tok as usize;
            if tok >= self.config.vocab_size {
                return Err(model_error(
                    &dec.name,
                    format!("token {tok} is outside the vocabulary"),
                ));
            }
            for c in 0..d {
                x.push(dec.embed[tok * d + c] * scale + pe[pos * d + c]);
            }
        }
        let mut x = tensor2(x, l, d, &dec.name)?;
        for b in &dec.blocks {
            let h = b
                .self_attn
                .forward(exec, &b.norm1.forward(&x)?, None, None, true)?;
            x = add(&x, &h, 1.0, &dec.name)?;
            let h = b
                .src_attn
                .forward(exec, &b.norm2.forward(&x)?, Some(encoded), None, false)?;
            x = add(&x, &h, 1.0, &dec.name)?;
            let h = b.ff.forward(exec, &b.norm3.forward(&x)?)?;
            x = add(&x, &h, 1.0, &dec.name)?;
        }
        let x = dec.after_norm.forward(&x)?;
        let logits = to_vec(&exec.linear(&dec.output, &x)?, &dec.output.name)?;
        Ok(log_softmax_rows(
            &logits,
            self.config.padded_vocab(),
            self.config.vocab_size,
        ))
    }

    /// How many decoders the model has (1 or 2).
    pub fn decoder_count(&self) -> usize {
        self.decoders.len()
    }
}

/// The log-softmax of each row's first `keep` of `cols` values.
fn log_softmax_rows(values: &[f32], cols: usize, keep: usize) -> Vec<Vec<f32>> {
    values
        .chunks_exact(cols)
        .map(|row| {
            let row = &row[..keep];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
            let log = sum.ln() as f32 + max;
            row.iter().map(|&v| v - log).collect()
        })
        .collect()
}
