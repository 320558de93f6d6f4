//! Real Whisper tiny.en weights and activations through the GPU lane: every quantize step and
//! every quantized GEMM of the decoder run once on the CPU reference and once on the GPU, and
//! every intermediate, down to the logits, must be bit-identical (int8). fp8 runs the same
//! pipeline to check batch invariance on real data (each utterance alone = the same utterance
//! inside the batch) and closeness to the CPU fp8 reference.
//!
//! The pipeline: token embedding rows of real transcripts (asterisk prompts, tokenized with the
//! model's own vocabulary) plus the stored position rows, through the real pre-norm decoder
//! layers (self-attention with per-token quantized q/k/v/out projections and a runtime
//! smoother on q/k/v; fc1 -> fc2 as a GEMM chain whose producer writes fc2's statically scaled,
//! smoothed int8 input), the final layer norm and the tied output head on a 4096-token slice of
//! the vocabulary. Cross-attention is left out (it needs the encoder, i.e. audio features);
//! `tests/cuda_verify.rs` runs the whole model on real audio (`oasr-quantize verify --device
//! cuda`).
//!
//! Weights come from `$OASR_WHISPER_SUBSET` (a small safetensors file that
//! `write_whisper_subset` extracts, for machines without the 75 MB checkpoint) or from the
//! checkpoint at `$OASR_WHISPER_TINY_EN` / `~/.cache/oasr-quantize/whisper-tiny.en`
//! (`calib/fetch-assets.sh`). Without either, or without a GPU, the test prints `SKIPPED`;
//! with `OASR_REQUIRE_GPU=1` both are failures.
#![cfg(feature = "cuda")]

mod cuda_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cuda_common::{gpu_required, lane, visible};
use half::f16;
use oasr_quantize::numerics::{
    self, out_bits_to_f32, ActScale, Activation, GemmEpilogue, OutDtype, QuantDtype,
};
use oasr_quantize::runtime::CudaLane;

/// Real prompts of the asterisk-core-sounds-en set (the project's gate audio).
const PROMPTS: [&str; 6] = [
    "Please enter your password followed by the pound key.",
    "All circuits are busy now.",
    "Login incorrect. Please enter your agent number followed by the pound key.",
    "Agent logged in.",
    "Thank you for calling. Please hold and your call will be answered in the order it was received.",
    "The number you have dialed is not in service.",
];
const SOT: u32 = 50257;
const NO_TIMESTAMPS: u32 = 50362;
/// The logits are computed on this slice of the vocabulary (the tied head is 51864 x 384).
const VOCAB_SLICE: usize = 4096;
const HEADS: usize = 6;

/// The f32 tensors the test needs, by OASR name, plus the token ids of each prompt.
struct Real {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    sequences: Vec<Vec<u32>>,
}

impl Real {
    fn get(&self, name: &str) -> &[f32] {
        &self
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("tensor {name} missing"))
            .1
    }
    fn layers(&self) -> usize {
        (0..)
            .take_while(|i| {
                self.tensors
                    .contains_key(&format!("decoder.layers.{i}.fc1.weight"))
            })
            .count()
    }
}

fn checkpoint_dir() -> PathBuf {
    std::env::var_os("OASR_WHISPER_TINY_EN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/oasr-quantize/whisper-tiny.en")
        })
}

/// Token ids of `text` by whole-word lookup in the vocabulary (`Ġword`, punctuation split off).
fn tokenize(vocab: &serde_json::Map<String, serde_json::Value>, text: &str) -> Vec<u32> {
    let mut ids = vec![SOT, NO_TIMESTAMPS];
    for word in text.split_whitespace() {
        let (core, punct) = word.split_at(word.trim_end_matches(['.', ',']).len());
        for piece in [format!("\u{120}{core}"), punct.to_string()] {
            if let Some(id) = vocab.get(&piece).and_then(|v| v.as_u64()) {
                ids.push(id as u32);
            }
        }
    }
    ids
}

fn layer_names(l: usize) -> Vec<String> {
    let p = format!("decoder.layers.{l}");
    [
        "self_attn_layer_norm.weight",
        "self_attn_layer_norm.bias",
        "self_attn.q_proj.weight",
        "self_attn.q_proj.bias",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.v_proj.bias",
        "self_attn.out_proj.weight",
        "self_attn.out_proj.bias",
        "final_layer_norm.weight",
        "final_layer_norm.bias",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    .iter()
    .map(|n| format!("{p}.{n}"))
    .collect()
}

/// From the full checkpoint: the needed tensors, embedding rows of the prompts' tokens only.
fn from_checkpoint(dir: &Path) -> Option<Real> {
    let ckpt = oasr_quantize::checkpoint::Checkpoint::open(dir).ok()?;
    let tokenizer = std::fs::read_to_string(dir.join("tokenizer.json")).ok()?;
    let tokenizer: serde_json::Value = serde_json::from_str(&tokenizer).ok()?;
    let vocab = tokenizer.get("model")?.get("vocab")?.as_object()?;
    let sequences: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tokenize(vocab, p)).collect();
    let mut tensors = BTreeMap::new();
    let mut take = |name: &str| -> Option<()> {
        let t = ckpt.tensors.get(name)?;
        tensors.insert(name.to_string(), (t.shape.clone(), t.to_f32()));
        Some(())
    };
    let layers = (0..)
        .take_while(|i| {
            ckpt.tensors
                .contains_key(&format!("decoder.layers.{i}.fc1.weight"))
        })
        .count();
    for l in 0..layers {
        for n in layer_names(l) {
            take(&n)?;
        }
    }
    take("decoder.layer_norm.weight")?;
    take("decoder.layer_norm.bias")?;
    let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
    let pos = ckpt.tensors.get("decoder.embed_positions.weight")?;
    let d = pos.shape[1];
    let pos_f = pos.to_f32();
    tensors.insert(
        "decoder.embed_positions.weight".into(),
        (vec![longest, d], pos_f[..longest * d].to_vec()),
    );
    // The head slice (rows 0..VOCAB_SLICE) and the rows of the tokens used.
    let embed = ckpt.tensors.get("decoder.embed_tokens.weight")?;
    let head = embed.slice_rows(0, VOCAB_SLICE).to_f32();
    tensors.insert("head_slice".into(), (vec![VOCAB_SLICE, d], head));
    let mut rows = Vec::new();
    for seq in &sequences {
        for &id in seq {
            rows.extend(embed.slice_rows(id as usize, 1).to_f32());
        }
    }
    let count = rows.len() / d;
    tensors.insert("token_rows".into(), (vec![count, d], rows));
    Some(Real { tensors, sequences })
}

fn from_subset(path: &Path) -> Option<Real> {
    let bytes = std::fs::read(path).ok()?;
    let st = safetensors::SafeTensors::deserialize(&bytes).ok()?;
    let mut tensors = BTreeMap::new();
    let mut sequences = Vec::new();
    for (name, view) in st.tensors() {
        if name == "sequence_ids" {
            let ids: Vec<i32> = view
                .data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            // Sequences are stored back to back, each preceded by its length.
            let mut i = 0;
            while i < ids.len() {
                let len = ids[i] as usize;
                sequences.push(ids[i + 1..i + 1 + len].iter().map(|&v| v as u32).collect());
                i += 1 + len;
            }
            continue;
        }
        let values: Vec<f32> = view
            .data()
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        tensors.insert(name, (view.shape().to_vec(), values));
    }
    Some(Real { tensors, sequences })
}

fn load() -> Option<Real> {
    if let Some(p) = std::env::var_os("OASR_WHISPER_SUBSET") {
        return from_subset(Path::new(&p));
    }
    from_checkpoint(&checkpoint_dir())
}

/// Writes the subset file for machines without the checkpoint:
/// `OASR_WRITE_WHISPER_SUBSET=out.safetensors cargo test --release --features cuda --test
/// cuda_whisper -- --ignored write_whisper_subset`. The tiny.en weights are fp16, so storing
/// them as f16 is exact.
#[test]
#[ignore = "writes a file; run explicitly with OASR_WRITE_WHISPER_SUBSET set"]
fn write_whisper_subset() {
    let Some(out) = std::env::var_os("OASR_WRITE_WHISPER_SUBSET") else {
        panic!("set OASR_WRITE_WHISPER_SUBSET to the output path");
    };
    let real = from_checkpoint(&checkpoint_dir()).unwrap_or_else(|| {
        panic!(
            "no tiny.en checkpoint at {} (calib/fetch-assets.sh)",
            checkpoint_dir().display()
        )
    });
    let mut owned: Vec<(String, Vec<usize>, safetensors::Dtype, Vec<u8>)> = Vec::new();
    for (name, (shape, values)) in &real.tensors {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        owned.push((name.clone(), shape.clone(), safetensors::Dtype::F16, bytes));
    }
    let mut ids = Vec::new();
    for s in &real.sequences {
        ids.push(s.len() as i32);
        ids.extend(s.iter().map(|&v| v as i32));
    }
    let id_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    owned.push((
        "sequence_ids".into(),
        vec![ids.len()],
        safetensors::Dtype::I32,
        id_bytes,
    ));
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, s, d, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b)
                .unwrap_or_else(|e| panic!("{n}: {e}"));
            (n.clone(), v)
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, &None, Path::new(&out))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The quantized operations of the pipeline, on one lane or the other.
trait Lane {
    fn quantize_per_token(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        smooth: Option<&[f32]>,
        dt: QuantDtype,
    ) -> numerics::QuantizedRows;
    #[allow(clippy::too_many_arguments)]
    fn scaled_mm(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Vec<u16>;
    #[allow(clippy::too_many_arguments)]
    fn scaled_mm_quant(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
        smooth: Option<&[f32]>,
        input_scale: f32,
        out8: QuantDtype,
    ) -> Vec<u8>;
}

struct Cpu;

impl Lane for Cpu {
    fn quantize_per_token(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        smooth: Option<&[f32]>,
        dt: QuantDtype,
    ) -> numerics::QuantizedRows {
        numerics::quantize_per_token(x, rows, cols, smooth, dt)
    }
    fn scaled_mm(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Vec<u16> {
        numerics::scaled_mm(dt, a, s, w, ws, m, n, k, epi)
    }
    fn scaled_mm_quant(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
        smooth: Option<&[f32]>,
        input_scale: f32,
        out8: QuantDtype,
    ) -> Vec<u8> {
        numerics::scaled_mm_quant(dt, a, s, w, ws, m, n, k, epi, smooth, input_scale, out8)
    }
}

impl Lane for CudaLane {
    fn quantize_per_token(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        smooth: Option<&[f32]>,
        dt: QuantDtype,
    ) -> numerics::QuantizedRows {
        CudaLane::quantize_per_token(self, x, rows, cols, smooth, dt)
            .unwrap_or_else(|e| panic!("{e}"))
    }
    fn scaled_mm(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Vec<u16> {
        CudaLane::scaled_mm(self, dt, a, s, w, ws, m, n, k, epi).unwrap_or_else(|e| panic!("{e}"))
    }
    fn scaled_mm_quant(
        &self,
        dt: QuantDtype,
        a: &[u8],
        s: ActScale,
        w: &[u8],
        ws: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
        smooth: Option<&[f32]>,
        input_scale: f32,
        out8: QuantDtype,
    ) -> Vec<u8> {
        CudaLane::scaled_mm_quant(
            self,
            dt,
            a,
            s,
            w,
            ws,
            m,
            n,
            k,
            epi,
            smooth,
            input_scale,
            out8,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A quantized linear layer: per-channel weight codes and scales, bias, and (for runtime-
/// smoothed layers) the input smoother folded into the weight.
struct QLinear {
    n: usize,
    k: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
    bias: Option<Vec<f32>>,
    smooth_inv: Option<Vec<f32>>,
}

impl QLinear {
    /// `w` [n, k]; with `act_amax` (per input column) a SmoothQuant smoother s_j =
    /// sqrt(amax_x_j / amax_w_j) is folded into the weight and 1/s_j applied to the input.
    fn new(
        w: &[f32],
        n: usize,
        k: usize,
        bias: Option<&[f32]>,
        act_amax: Option<&[f32]>,
        dt: QuantDtype,
    ) -> QLinear {
        let mut w = w.to_vec();
        let smooth_inv = act_amax.map(|ax| {
            let s: Vec<f32> = (0..k)
                .map(|j| {
                    let aw = (0..n).map(|i| w[i * k + j].abs()).fold(0.0f32, f32::max);
                    if ax[j] > 0.0 && aw > 0.0 {
                        (ax[j] / aw).sqrt().clamp(1e-2, 1e2)
                    } else {
                        1.0
                    }
                })
                .collect();
            for i in 0..n {
                for j in 0..k {
                    w[i * k + j] *= s[j];
                }
            }
            s.iter().map(|v| 1.0 / v).collect()
        });
        let q = numerics::quantize_weight_per_channel(&w, n, k, dt);
        QLinear {
            n,
            k,
            codes: q.codes,
            scales: q.scales,
            bias: bias.map(<[f32]>::to_vec),
            smooth_inv,
        }
    }
}

fn column_amax(x: &[f32], cols: usize) -> Vec<f32> {
    let mut m = vec![0.0f32; cols];
    for row in x.chunks_exact(cols) {
        for (a, v) in m.iter_mut().zip(row) {
            *a = a.max(v.abs());
        }
    }
    m
}

fn layer_norm(x: &[f32], d: usize, w: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + 1e-5).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .zip(b)
                .map(|((v, w), b)| (v - mean) * inv * w + b),
        );
    }
    out
}

fn matmul_t(x: &[f32], w: &[f32], n: usize, k: usize) -> Vec<f32> {
    x.chunks_exact(k)
        .flat_map(|r| {
            (0..n).map(move |i| {
                r.iter()
                    .zip(&w[i * k..(i + 1) * k])
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
            })
        })
        .collect()
}

/// Causal multi-head self-attention in f32 over each sequence of `lens` separately.
fn attention(q: &[f32], k: &[f32], v: &[f32], lens: &[usize], d: usize) -> Vec<f32> {
    let hd = d / HEADS;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    let mut start = 0;
    for &t in lens {
        for h in 0..HEADS {
            for i in 0..t {
                let qi = &q[(start + i) * d + h * hd..][..hd];
                let scores: Vec<f32> = (0..=i)
                    .map(|j| {
                        qi.iter()
                            .zip(&k[(start + j) * d + h * hd..][..hd])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let mx = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - mx).exp()).collect();
                let z: f32 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let vj = &v[(start + j) * d + h * hd..][..hd];
                    for (o, vv) in out[(start + i) * d + h * hd..][..hd].iter_mut().zip(vj) {
                        *o += ej / z * vv;
                    }
                }
            }
        }
        start += t;
    }
    out
}

/// The quantized model: per layer q/k/v (smoothed, per-token), out (per-token), fc1 -> fc2
/// chain (static, smoothed), and the head.
struct Model {
    d: usize,
    dt: QuantDtype,
    layers: Vec<[QLinear; 6]>,
    fc2_input_scale: Vec<f32>,
    head: QLinear,
}

const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const O: usize = 3;
const FC1: usize = 4;
const FC2: usize = 5;

/// Calibrates (full precision, on the CPU) and quantizes the model.
fn build(real: &Real, dt: QuantDtype, x0: &[f32], lens: &[usize]) -> Model {
    let d = real.get("decoder.layer_norm.weight").len();
    let mut x = x0.to_vec();
    let mut layers = Vec::new();
    let mut fc2_input_scale = Vec::new();
    for l in 0..real.layers() {
        let g = |n: &str| real.get(&format!("decoder.layers.{l}.{n}"));
        let h = layer_norm(
            &x,
            d,
            g("self_attn_layer_norm.weight"),
            g("self_attn_layer_norm.bias"),
        );
        let ax = column_amax(&h, d);
        let q = QLinear::new(
            g("self_attn.q_proj.weight"),
            d,
            d,
            Some(g("self_attn.q_proj.bias")),
            Some(&ax),
            dt,
        );
        let k = QLinear::new(g("self_attn.k_proj.weight"), d, d, None, Some(&ax), dt);
        let v = QLinear::new(
            g("self_attn.v_proj.weight"),
            d,
            d,
            Some(g("self_attn.v_proj.bias")),
            Some(&ax),
            dt,
        );
        let add_bias = |y: Vec<f32>, b: &[f32]| -> Vec<f32> {
            y.chunks_exact(d)
                .flat_map(|r| r.iter().zip(b).map(|(a, b)| a + b).collect::<Vec<_>>())
                .collect()
        };
        let qf = add_bias(
            matmul_t(&h, g("self_attn.q_proj.weight"), d, d),
            g("self_attn.q_proj.bias"),
        );
        let kf = matmul_t(&h, g("self_attn.k_proj.weight"), d, d);
        let vf = add_bias(
            matmul_t(&h, g("self_attn.v_proj.weight"), d, d),
            g("self_attn.v_proj.bias"),
        );
        let att = attention(&qf, &kf, &vf, lens, d);
        let o = QLinear::new(
            g("self_attn.out_proj.weight"),
            d,
            d,
            Some(g("self_attn.out_proj.bias")),
            None,
            dt,
        );
        let of = add_bias(
            matmul_t(&att, g("self_attn.out_proj.weight"), d, d),
            g("self_attn.out_proj.bias"),
        );
        x.iter_mut().zip(&of).for_each(|(a, b)| *a += b);
        let h2 = layer_norm(
            &x,
            d,
            g("final_layer_norm.weight"),
            g("final_layer_norm.bias"),
        );
        let f = 4 * d;
        let fc1 = QLinear::new(g("fc1.weight"), f, d, Some(g("fc1.bias")), None, dt);
        let u: Vec<f32> = add_bias_n(matmul_t(&h2, g("fc1.weight"), f, d), g("fc1.bias"), f)
            .into_iter()
            .map(numerics::gelu)
            .collect();
        let au = column_amax(&u, f);
        let fc2 = QLinear::new(g("fc2.weight"), d, f, Some(g("fc2.bias")), Some(&au), dt);
        // Static input scale of fc2: the calibrated amax of its smoothed input over Q.
        let smooth = fc2.smooth_inv.as_deref().unwrap_or(&[]);
        let amax = u
            .chunks_exact(f)
            .flat_map(|r| r.iter().zip(smooth).map(|(v, s)| (v * s).abs()))
            .fold(0.0f32, f32::max);
        fc2_input_scale.push(amax / dt.qmax());
        let y = add_bias(matmul_t(&u, g("fc2.weight"), d, f), g("fc2.bias"));
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        layers.push([q, k, v, o, fc1, fc2]);
    }
    let head = QLinear::new(real.get("head_slice"), VOCAB_SLICE, d, None, None, dt);
    Model {
        d,
        dt,
        layers,
        fc2_input_scale,
        head,
    }
}

fn add_bias_n(y: Vec<f32>, b: &[f32], n: usize) -> Vec<f32> {
    y.chunks_exact(n)
        .flat_map(|r| r.iter().zip(b).map(|(a, b)| a + b).collect::<Vec<_>>())
        .collect()
}

/// Every value the quantized pipeline produced, in order, for bitwise comparison.
#[derive(Default, PartialEq)]
struct Trace {
    steps: Vec<(String, Vec<u32>)>,
}

impl Trace {
    fn push_u8(&mut self, what: String, v: &[u8]) {
        self.steps
            .push((what, v.iter().map(|&b| u32::from(b)).collect()));
    }
    fn push_u16(&mut self, what: String, v: &[u16]) {
        self.steps
            .push((what, v.iter().map(|&b| u32::from(b)).collect()));
    }
    fn push_f32(&mut self, what: String, v: &[f32]) {
        self.steps
            .push((what, v.iter().map(|b| b.to_bits()).collect()));
    }
}

/// Runs the quantized decoder on `lane`; returns the trace and the logits [rows, VOCAB_SLICE].
fn run(
    model: &Model,
    real: &Real,
    lane: &dyn Lane,
    x0: &[f32],
    lens: &[usize],
) -> (Trace, Vec<f32>) {
    let (d, dt) = (model.d, model.dt);
    let rows = x0.len() / d;
    let out = OutDtype::F16;
    let widen = |v: &[u16], o: OutDtype| {
        v.iter()
            .map(|&b| out_bits_to_f32(o, b))
            .collect::<Vec<f32>>()
    };
    let mut trace = Trace::default();
    let mut x = x0.to_vec();
    let linear =
        |trace: &mut Trace, what: String, ql: &QLinear, h: &[f32], act: Activation| -> Vec<f32> {
            let q = lane.quantize_per_token(h, rows, ql.k, ql.smooth_inv.as_deref(), dt);
            trace.push_u8(format!("{what} input codes"), &q.codes);
            trace.push_f32(format!("{what} input scales"), &q.scales);
            let epi = GemmEpilogue {
                bias: ql.bias.as_deref(),
                activation: act,
                out,
            };
            let y = lane.scaled_mm(
                dt,
                &q.codes,
                ActScale::PerRow(&q.scales),
                &ql.codes,
                &ql.scales,
                rows,
                ql.n,
                ql.k,
                &epi,
            );
            trace.push_u16(format!("{what} output"), &y);
            widen(&y, out)
        };
    for (l, ql) in model.layers.iter().enumerate() {
        let g = |n: &str| real.get(&format!("decoder.layers.{l}.{n}"));
        let h = layer_norm(
            &x,
            d,
            g("self_attn_layer_norm.weight"),
            g("self_attn_layer_norm.bias"),
        );
        let q = linear(
            &mut trace,
            format!("layer {l} q_proj"),
            &ql[Q],
            &h,
            Activation::None,
        );
        let k = linear(
            &mut trace,
            format!("layer {l} k_proj"),
            &ql[K],
            &h,
            Activation::None,
        );
        let v = linear(
            &mut trace,
            format!("layer {l} v_proj"),
            &ql[V],
            &h,
            Activation::None,
        );
        let att = attention(&q, &k, &v, lens, d);
        let o = linear(
            &mut trace,
            format!("layer {l} out_proj"),
            &ql[O],
            &att,
            Activation::None,
        );
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let h2 = layer_norm(
            &x,
            d,
            g("final_layer_norm.weight"),
            g("final_layer_norm.bias"),
        );
        // fc1 (GELU epilogue) writes fc2's smoothed, statically quantized input directly.
        let (fc1, fc2) = (&ql[FC1], &ql[FC2]);
        let qa = lane.quantize_per_token(&h2, rows, d, None, dt);
        trace.push_u8(format!("layer {l} fc1 input codes"), &qa.codes);
        let epi1 = GemmEpilogue {
            bias: fc1.bias.as_deref(),
            activation: Activation::Gelu,
            out,
        };
        let input_scale = model.fc2_input_scale[l];
        let u8codes = lane.scaled_mm_quant(
            dt,
            &qa.codes,
            ActScale::PerRow(&qa.scales),
            &fc1.codes,
            &fc1.scales,
            rows,
            fc1.n,
            fc1.k,
            &epi1,
            fc2.smooth_inv.as_deref(),
            input_scale,
            dt,
        );
        trace.push_u8(format!("layer {l} fc1 -> fc2 codes"), &u8codes);
        let epi2 = GemmEpilogue {
            bias: fc2.bias.as_deref(),
            activation: Activation::None,
            out,
        };
        let y = lane.scaled_mm(
            dt,
            &u8codes,
            ActScale::PerTensor(input_scale),
            &fc2.codes,
            &fc2.scales,
            rows,
            fc2.n,
            fc2.k,
            &epi2,
        );
        trace.push_u16(format!("layer {l} fc2 output"), &y);
        x.iter_mut().zip(widen(&y, out)).for_each(|(a, b)| *a += b);
    }
    let hf = layer_norm(
        &x,
        d,
        real.get("decoder.layer_norm.weight"),
        real.get("decoder.layer_norm.bias"),
    );
    let q = lane.quantize_per_token(&hf, rows, d, None, dt);
    let epi = GemmEpilogue {
        bias: None,
        activation: Activation::None,
        out: OutDtype::Bf16,
    };
    let logits = lane.scaled_mm(
        dt,
        &q.codes,
        ActScale::PerRow(&q.scales),
        &model.head.codes,
        &model.head.scales,
        rows,
        VOCAB_SLICE,
        d,
        &epi,
    );
    trace.push_u16("logits".into(), &logits);
    (trace, widen(&logits, OutDtype::Bf16))
}

/// Embedding + position rows of every sequence, stacked.
fn inputs(real: &Real) -> (Vec<f32>, Vec<usize>) {
    let emb = real.get("token_rows");
    let pos = real.get("decoder.embed_positions.weight");
    let d = real.get("decoder.layer_norm.weight").len();
    let mut x = Vec::new();
    let mut lens = Vec::new();
    let mut row = 0;
    for s in &real.sequences {
        for t in 0..s.len() {
            x.extend(
                emb[row * d..(row + 1) * d]
                    .iter()
                    .zip(&pos[t * d..(t + 1) * d])
                    .map(|(a, b)| a + b),
            );
            row += 1;
        }
        lens.push(s.len());
    }
    (x, lens)
}

fn first_difference(a: &Trace, b: &Trace) -> String {
    for ((wa, va), (_, vb)) in a.steps.iter().zip(&b.steps) {
        let diff = va.iter().zip(vb).filter(|(x, y)| x != y).count();
        if diff > 0 {
            return format!("{wa}: {diff} of {} values differ", va.len());
        }
    }
    "traces differ in length".into()
}

#[test]
fn real_tiny_en_decoder_int8_gpu_is_bit_identical_and_fp8_batch_invariant() {
    let Some(lane) = lane("real_tiny_en_decoder") else {
        return;
    };
    let Some(real) = load() else {
        let msg = format!(
            "no Whisper tiny.en weights (OASR_WHISPER_SUBSET, or a checkpoint at {})",
            checkpoint_dir().display()
        );
        assert!(!gpu_required(), "OASR_REQUIRE_GPU=1 but {msg}");
        visible(&format!("SKIPPED real_tiny_en_decoder: {msg}"));
        return;
    };
    let (x0, lens) = inputs(&real);
    let rows: usize = lens.iter().sum();
    visible(&format!(
        "whisper tiny.en: {} decoder layers, {} utterances, {rows} token rows",
        real.layers(),
        lens.len()
    ));

    // int8: the GPU lane reproduces every intermediate and the logits bit for bit.
    let model = build(&real, QuantDtype::Int8, &x0, &lens);
    let (cpu_trace, cpu_logits) = run(&model, &real, &Cpu, &x0, &lens);
    let (gpu_trace, _) = run(&model, &real, lane, &x0, &lens);
    assert!(
        cpu_trace == gpu_trace,
        "int8: GPU differs from the CPU reference at {}",
        first_difference(&cpu_trace, &gpu_trace)
    );
    let values: usize = cpu_trace.steps.iter().map(|s| s.1.len()).sum();
    visible(&format!(
        "whisper tiny.en int8: {} quantize/GEMM steps, {values} values, logits [{rows}, {VOCAB_SLICE}] bit-identical CPU = GPU",
        cpu_trace.steps.len()
    ));
    assert!(cpu_logits.iter().all(|v| v.is_finite()));

    // fp8: each utterance alone gives bitwise the rows it gets inside the batch, and the
    // logits stay close to the CPU fp8 reference.
    if lane.info().arch.supports_fp8() {
        let model8 = build(&real, QuantDtype::Float8E4m3fn, &x0, &lens);
        let (batch_trace, batch_logits) = run(&model8, &real, lane, &x0, &lens);
        let d = model8.d;
        let mut start = 0;
        for (i, &t) in lens.iter().enumerate() {
            let (_, alone) = run(&model8, &real, lane, &x0[start * d..(start + t) * d], &[t]);
            assert!(
                alone
                    .iter()
                    .map(|v| v.to_bits())
                    .eq(batch_logits[start * VOCAB_SLICE..(start + t) * VOCAB_SLICE]
                        .iter()
                        .map(|v| v.to_bits())),
                "fp8: utterance {i} alone differs from the same utterance inside the batch"
            );
            start += t;
        }
        let (_, cpu8) = run(&model8, &real, &Cpu, &x0, &lens);
        let num: f64 = cpu8
            .iter()
            .zip(&batch_logits)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let den: f64 = cpu8.iter().map(|a| f64::from(*a).powi(2)).sum();
        let rel = (num / den).sqrt();
        visible(&format!(
            "whisper tiny.en fp8: batch-invariant per utterance; GPU vs CPU fp8 logits relative L2 {rel:.2e} ({} steps)",
            batch_trace.steps.len()
        ));
        assert!(
            rel < 5e-2,
            "fp8 GPU logits too far from the CPU fp8 reference: {rel}"
        );
    }
}
