//! `oasr-quantize bench-gemm`: our int8 and fp8 `scaled_mm` against cuBLASLt on the same GPU,
//! in the same run, on the same shapes.
//!
//! For each M x N x K it times, with CUDA events around CUDA-graph replays (warm-up first, the
//! median of repeated samples):
//! - ours int8: `scaled_mm` with its fused epilogue (per-row a_scale, per-column weight_scale,
//!   bias, the chosen activation, f16 out);
//! - cuBLASLt int8: i8·i8 -> i32 alone ("raw"), and followed by our stand-alone epilogue kernel
//!   doing the same epilogue (the unfused pipeline);
//! - ours fp8 and cuBLASLt fp8 (e4m3 -> bf16 with per-tensor scales);
//! - cuBLASLt fp16 with a bias epilogue (the unquantized layer).
//!
//! Inputs are random (never zeros), and rotated between several copies when one copy would fit
//! in L2. After timing, our int8 output is compared bit for bit with cuBLASLt + epilogue.
//! The library prints nothing: [`run`] reports progress through a callback and returns a
//! [`BenchReport`] that renders as a Markdown table or JSON.

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use half::f16;
use serde_json::json;

use super::blas::{Blas, BlasKind, BlasPlan};
use super::kernels::GemmConfig;
use super::lane::{cuda_err, CudaLane, DeviceActScale, DeviceGemm, DeviceOutput};
use crate::error::{Error, Result};
use crate::numerics::{e4m3_decode, Activation, OutDtype, QuantDtype};

/// The command-line arguments of `bench-gemm` (parsed by the binary's clap front end).
#[derive(Clone, Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct BenchArgs {
    /// Shapes as M,N,K separated by `;`, or a set name: `default` (model shapes and the two
    /// squares), `model`, `model-all` (every K, N pair), `squares`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "default"))]
    pub shapes: String,
    /// Also write the results as JSON to this file.
    #[cfg_attr(feature = "cli", arg(long, value_name = "OUT"))]
    pub json: Option<PathBuf>,
    /// Epilogue activation of the int8 / fp8 GEMMs: none, relu, swish, gelu.
    #[cfg_attr(feature = "cli", arg(long, default_value = "none"))]
    pub activation: String,
    /// Also time every tile configuration of our kernels (second table).
    #[cfg_attr(feature = "cli", arg(long))]
    pub all_configs: bool,
    /// Timed samples per measurement (the median is reported).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 15))]
    pub samples: usize,
    /// GPU ordinal.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub device: usize,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            shapes: "default".into(),
            json: None,
            activation: "none".into(),
            all_configs: false,
            samples: 15,
            device: 0,
        }
    }
}

/// A GEMM shape: out [M, N] = A [M, K] · W [N, K]ᵀ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Shape {
    pub fn ops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.n, self.k)
    }
}

/// (N, K) pairs of the Whisper (tiny 384, base 512, small 768) and Conformer (256, 512)
/// projections: attention (d, d), feed-forward up (4d, d) and down (d, 4d) where 4d is in
/// the set, and the Whisper-base fused QKV-like (1536, 512).
const MODEL_NK: [(usize, usize); 10] = [
    (256, 256),
    (384, 384),
    (512, 512),
    (768, 768),
    (1536, 384),
    (384, 1536),
    (2048, 512),
    (512, 2048),
    (1536, 512),
    (2048, 768),
];
const MODEL_M: [usize; 2] = [1500, 8192];
const DIMS: [usize; 6] = [256, 384, 512, 768, 1536, 2048];

/// Parses `--shapes`.
pub fn parse_shapes(spec: &str) -> Result<Vec<Shape>> {
    let squares = || {
        vec![
            Shape {
                m: 4096,
                n: 4096,
                k: 4096,
            },
            Shape {
                m: 8192,
                n: 8192,
                k: 8192,
            },
        ]
    };
    let model = || {
        MODEL_M
            .iter()
            .flat_map(|&m| MODEL_NK.iter().map(move |&(n, k)| Shape { m, n, k }))
            .collect::<Vec<_>>()
    };
    match spec.trim() {
        "default" => return Ok([model(), squares()].concat()),
        "model" => return Ok(model()),
        "squares" => return Ok(squares()),
        "model-all" => {
            return Ok(MODEL_M
                .iter()
                .flat_map(|&m| {
                    DIMS.iter()
                        .flat_map(move |&n| DIMS.iter().map(move |&k| Shape { m, n, k }))
                })
                .collect())
        }
        _ => {}
    }
    let bad = |s: &str, why: &str| Error::InvalidOption {
        option: "--shapes".into(),
        message: format!(
            "`{s}`: {why} (expected M,N,K;M,N,K... or default/model/model-all/squares)"
        ),
    };
    let mut out = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let v: Vec<usize> = part
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad(part, "not three integers"))?;
        let [m, n, k] = v[..] else {
            return Err(bad(part, "not three integers"));
        };
        if m == 0 || n % 8 != 0 || n == 0 || k % 16 != 0 || k == 0 {
            return Err(bad(part, "need M >= 1, N % 8 == 0, K % 16 == 0"));
        }
        out.push(Shape { m, n, k });
    }
    if out.is_empty() {
        return Err(bad(spec, "no shape"));
    }
    Ok(out)
}

fn parse_activation(s: &str) -> Result<Activation> {
    match s {
        "none" => Ok(Activation::None),
        "relu" => Ok(Activation::Relu),
        "swish" => Ok(Activation::Swish),
        "gelu" => Ok(Activation::Gelu),
        _ => Err(Error::InvalidOption {
            option: "--activation".into(),
            message: format!("`{s}`: expected none, relu, swish or gelu"),
        }),
    }
}

/// One timed measurement.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Median time of one GEMM, microseconds.
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Operations per second at the median, in tera (TOP/s or TFLOP/s).
    pub tera_ops: f64,
    /// GEMMs per timed sample (a CUDA graph of this many launches).
    pub per_sample: usize,
    /// Whether the launches were replayed from a CUDA graph.
    pub graph: bool,
}

impl Timing {
    fn json(&self) -> serde_json::Value {
        json!({
            "median_us": self.median_us, "min_us": self.min_us, "max_us": self.max_us,
            "tera_ops": self.tera_ops, "launches_per_sample": self.per_sample, "graph": self.graph,
        })
    }
}

/// The measurements of one shape; a baseline that could not run holds its error text.
#[derive(Clone, Debug)]
pub struct ShapeResult {
    pub shape: Shape,
    pub ours_int8: Timing,
    pub ours_int8_config: GemmConfig,
    pub ours_fp8: std::result::Result<(Timing, GemmConfig), String>,
    pub lt_int8: std::result::Result<Timing, String>,
    pub lt_int8_epilogue: std::result::Result<Timing, String>,
    pub epilogue_alone: Timing,
    pub lt_fp8: std::result::Result<Timing, String>,
    pub lt_f16_bias: std::result::Result<Timing, String>,
    /// Our int8 output equals cuBLASLt int32 + epilogue, bit for bit (None: not compared).
    pub int8_matches_lt: Option<bool>,
    /// Every tile configuration with its CTAs per SM, with `--all-configs`.
    pub configs: Vec<(GemmConfig, usize, Timing)>,
}

impl ShapeResult {
    fn ratio(num: &std::result::Result<Timing, String>, den: f64) -> Option<f64> {
        num.as_ref().ok().map(|t| t.median_us / den)
    }
    /// (cuBLASLt int8 + epilogue time) / ours: how much faster the fused kernel is.
    pub fn fused_speedup(&self) -> Option<f64> {
        Self::ratio(&self.lt_int8_epilogue, self.ours_int8.median_us)
    }
    /// cuBLASLt int8 raw time / ours: our speed as a fraction of cuBLASLt's.
    pub fn int8_vs_lt_raw(&self) -> Option<f64> {
        Self::ratio(&self.lt_int8, self.ours_int8.median_us)
    }
    /// cuBLASLt fp8 time / ours fp8.
    pub fn fp8_vs_lt(&self) -> Option<f64> {
        let ours = self.ours_fp8.as_ref().ok()?.0.median_us;
        Self::ratio(&self.lt_fp8, ours)
    }
    /// cuBLASLt fp16 + bias time / ours int8.
    pub fn int8_vs_f16(&self) -> Option<f64> {
        Self::ratio(&self.lt_f16_bias, self.ours_int8.median_us)
    }
}

/// Everything a `bench-gemm` run measured.
#[derive(Clone, Debug)]
pub struct BenchReport {
    pub device: String,
    pub arch: String,
    pub sm_count: usize,
    pub driver_version: i32,
    pub activation: Activation,
    pub samples: usize,
    pub results: Vec<ShapeResult>,
}

fn fmt_t(t: &std::result::Result<Timing, String>) -> String {
    match t {
        Ok(t) => format!("{:.1} ({:.0})", t.median_us, t.tera_ops),
        Err(_) => "n/a".into(),
    }
}

fn fmt_r(r: Option<f64>) -> String {
    r.map_or("n/a".into(), |r| format!("{r:.2}x"))
}

impl BenchReport {
    /// The results as Markdown tables (times in µs, rates in TOP/s or TFLOP/s in brackets).
    pub fn table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "GPU: {} ({}, {} SMs, driver CUDA {}.{}); epilogue: per-row a_scale, per-column weight_scale, bias, activation {}; f16 out (cuBLASLt fp8: bf16 out)\n\n",
            self.device,
            self.arch,
            self.sm_count,
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.activation.name(),
        ));
        s.push_str("| M | N | K | ours int8 µs (TOP/s) | tile | LT int8 raw | LT int8 + epilogue | ours fp8 µs (TFLOP/s) | LT fp8 | LT fp16+bias | fused vs LT+epi | int8 vs LT raw | fp8 vs LT fp8 | int8 vs fp16 | int8 = LT+epi |\n");
        s.push_str(
            "|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n",
        );
        for r in &self.results {
            let fp8 = r.ours_fp8.as_ref().map(|(t, _)| *t).map_err(Clone::clone);
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.shape.m,
                r.shape.n,
                r.shape.k,
                fmt_t(&Ok(r.ours_int8)),
                r.ours_int8_config.label(),
                fmt_t(&r.lt_int8),
                fmt_t(&r.lt_int8_epilogue),
                fmt_t(&fp8),
                fmt_t(&r.lt_fp8),
                fmt_t(&r.lt_f16_bias),
                fmt_r(r.fused_speedup()),
                fmt_r(r.int8_vs_lt_raw()),
                fmt_r(r.fp8_vs_lt()),
                fmt_r(r.int8_vs_f16()),
                match r.int8_matches_lt {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                },
            ));
        }
        let errors: Vec<String> = self
            .results
            .iter()
            .flat_map(|r| {
                let fp8 = r.ours_fp8.as_ref().err();
                [
                    ("ours fp8", fp8),
                    ("cuBLASLt int8", r.lt_int8.as_ref().err()),
                    (
                        "cuBLASLt int8 + epilogue",
                        r.lt_int8_epilogue.as_ref().err(),
                    ),
                    ("cuBLASLt fp8", r.lt_fp8.as_ref().err()),
                    ("cuBLASLt fp16", r.lt_f16_bias.as_ref().err()),
                ]
                .into_iter()
                .filter_map(move |(what, e)| e.map(|e| format!("- {} {what}: {e}", r.shape)))
            })
            .collect();
        if !errors.is_empty() {
            s.push_str("\nNot measured:\n");
            for e in errors {
                s.push_str(&e);
                s.push('\n');
            }
        }
        if self.results.iter().any(|r| !r.configs.is_empty()) {
            s.push_str("\nEvery tile configuration (the heuristic's choice marked *):\n\n| M | N | K | dtype | tile | CTAs/SM | µs | T(FL)OP/s |\n|---:|---:|---:|:---|:---|---:|---:|---:|\n");
            for r in &self.results {
                for (c, per_sm, t) in &r.configs {
                    let chosen =
                        *c == r.ours_int8_config || r.ours_fp8.as_ref().is_ok_and(|(_, f)| f == c);
                    s.push_str(&format!(
                        "| {} | {} | {} | {} | {}{} | {} | {:.1} | {:.0} |\n",
                        r.shape.m,
                        r.shape.n,
                        r.shape.k,
                        c.dtype,
                        c.label(),
                        if chosen { " *" } else { "" },
                        per_sm,
                        t.median_us,
                        t.tera_ops
                    ));
                }
            }
        }
        s
    }

    /// The results as JSON.
    pub fn json(&self) -> serde_json::Value {
        let t = |r: &std::result::Result<Timing, String>| match r {
            Ok(t) => t.json(),
            Err(e) => json!({ "error": e }),
        };
        json!({
            "device": self.device,
            "arch": self.arch,
            "sm_count": self.sm_count,
            "driver_version": self.driver_version,
            "activation": self.activation.name(),
            "samples": self.samples,
            "results": self.results.iter().map(|r| json!({
                "m": r.shape.m, "n": r.shape.n, "k": r.shape.k,
                "ours_int8": r.ours_int8.json(),
                "ours_int8_tile": r.ours_int8_config.label(),
                "ours_fp8": match &r.ours_fp8 {
                    Ok((t, c)) => json!({"timing": t.json(), "tile": c.label()}),
                    Err(e) => json!({"error": e}),
                },
                "cublaslt_int8": t(&r.lt_int8),
                "cublaslt_int8_plus_epilogue": t(&r.lt_int8_epilogue),
                "epilogue_alone": r.epilogue_alone.json(),
                "cublaslt_fp8": t(&r.lt_fp8),
                "cublaslt_f16_bias": t(&r.lt_f16_bias),
                "ratios": {
                    "fused_vs_cublaslt_plus_epilogue": r.fused_speedup(),
                    "int8_vs_cublaslt_raw": r.int8_vs_lt_raw(),
                    "fp8_vs_cublaslt_fp8": r.fp8_vs_lt(),
                    "int8_vs_cublas_f16": r.int8_vs_f16(),
                },
                "int8_bit_identical_to_cublaslt_plus_epilogue": r.int8_matches_lt,
                "configs": r.configs.iter().map(|(c, per_sm, t)| json!({
                    "dtype": c.dtype.name(), "tile": c.label(), "ctas_per_sm": per_sm, "timing": t.json()
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// `bench-gemm` end to end: runs [`run`], writes `--json`, returns the table text.
pub fn run_cli(args: &BenchArgs, progress: impl FnMut(&str)) -> Result<String> {
    let report = run(args, progress)?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report.json()).map_err(|e| Error::Output {
            path: path.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))?;
    }
    Ok(report.table())
}

/// A small deterministic generator (xorshift64*) for benchmark inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn bytes(&mut self, len: usize, mut f: impl FnMut(u64) -> u8) -> Vec<u8> {
        let mut v = Vec::with_capacity(len);
        while v.len() < len {
            let r = self.next();
            for i in 0..8 {
                if v.len() < len {
                    v.push(f(r >> (8 * i)));
                }
            }
        }
        v
    }
}

/// Random int8 codes in -127..=127.
fn int8_codes(rng: &mut Rng, len: usize) -> Vec<u8> {
    rng.bytes(len, |r| (((r & 0xFFFF) % 255) as i16 - 127) as i8 as u8)
}

/// Random finite e4m3 codes of magnitude 2^-3 .. 2^4 (no NaN, no overflow in the sums).
fn e4m3_codes(rng: &mut Rng, len: usize) -> Vec<u8> {
    rng.bytes(len, |r| {
        let exp = 4 + (r as u8 % 8); // biased exponent 4..=11
        let man = (r >> 8) as u8 & 7;
        let sign = (r >> 16) as u8 & 0x80;
        sign | (exp << 3) | man
    })
}

fn f16_values(rng: &mut Rng, len: usize) -> Vec<f16> {
    (0..len)
        .map(|_| f16::from_f32(rng.unit() * 2.0 - 1.0))
        .collect()
}

/// Times `launch` (called with a rotating input-set index): warm-up, an estimate of one
/// launch, then `samples` replays of a CUDA graph holding enough launches for ~2 ms each;
/// falls back to plain launches when capture fails.
fn time_op(
    lane: &CudaLane,
    samples: usize,
    ops: f64,
    launch: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Timing> {
    let stream: &Arc<CudaStream> = lane.stream();
    let event = || {
        lane.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err("event creation"))
    };
    let (e0, e1) = (event()?, event()?);
    let elapsed_ms = |a: &CudaEvent, b: &CudaEvent| -> Result<f64> {
        a.elapsed_ms(b)
            .map(f64::from)
            .map_err(cuda_err("event timing"))
    };
    // Warm-up (module load, cuBLASLt kernel selection, clocks).
    for i in 0..3 {
        launch(i)?;
    }
    lane.synchronize()?;
    e0.record(stream).map_err(cuda_err("event record"))?;
    for i in 0..5 {
        launch(i)?;
    }
    e1.record(stream).map_err(cuda_err("event record"))?;
    let one_ms = (elapsed_ms(&e0, &e1)? / 5.0).max(1e-4);
    let per_sample = ((2.0 / one_ms).ceil() as usize).clamp(1, 400);

    let graph = capture(lane, per_sample, launch);
    let mut times = Vec::with_capacity(samples);
    match &graph {
        Some(g) => {
            g.launch().map_err(cuda_err("graph launch"))?;
            for _ in 0..samples.max(1) {
                e0.record(stream).map_err(cuda_err("event record"))?;
                g.launch().map_err(cuda_err("graph launch"))?;
                e1.record(stream).map_err(cuda_err("event record"))?;
                times.push(elapsed_ms(&e0, &e1)? / per_sample as f64);
            }
        }
        None => {
            for _ in 0..samples.max(1) {
                e0.record(stream).map_err(cuda_err("event record"))?;
                for i in 0..per_sample {
                    launch(i)?;
                }
                e1.record(stream).map_err(cuda_err("event record"))?;
                times.push(elapsed_ms(&e0, &e1)? / per_sample as f64);
            }
        }
    }
    times.sort_by(f64::total_cmp);
    let median_ms = times[times.len() / 2];
    Ok(Timing {
        median_us: median_ms * 1e3,
        min_us: times[0] * 1e3,
        max_us: times[times.len() - 1] * 1e3,
        tera_ops: ops / (median_ms * 1e-3) / 1e12,
        per_sample,
        graph: graph.is_some(),
    })
}

/// Captures `count` launches into a CUDA graph; None if the stream cannot capture them.
fn capture(
    lane: &CudaLane,
    count: usize,
    launch: &mut dyn FnMut(usize) -> Result<()>,
) -> Option<cudarc::driver::CudaGraph> {
    let stream = lane.stream();
    lane.synchronize().ok()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ok()?;
    let mut ok = true;
    for i in 0..count {
        if launch(i).is_err() {
            ok = false;
            break;
        }
    }
    // Always end the capture, so the stream leaves capture mode whatever happened.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    match (ok, graph) {
        (true, Ok(Some(g))) => Some(g),
        _ => None,
    }
}

/// Device copies of the random inputs of one shape (several sets when one fits in L2).
struct Inputs {
    a8: Vec<CudaSlice<u8>>,
    w8: Vec<CudaSlice<u8>>,
    af8: Vec<CudaSlice<u8>>,
    wf8: Vec<CudaSlice<u8>>,
    a16: Vec<CudaSlice<f16>>,
    w16: Vec<CudaSlice<f16>>,
    a_scale: CudaSlice<f32>,
    weight_scale: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    bias16: CudaSlice<f16>,
    one: CudaSlice<f32>,
}

fn make_inputs(lane: &CudaLane, s: Shape, sets: usize, rng: &mut Rng) -> Result<Inputs> {
    let mut inputs = Inputs {
        a8: Vec::new(),
        w8: Vec::new(),
        af8: Vec::new(),
        wf8: Vec::new(),
        a16: Vec::new(),
        w16: Vec::new(),
        a_scale: lane.upload(
            &(0..s.m)
                .map(|_| (0.5 + rng.unit()) / 127.0)
                .collect::<Vec<f32>>(),
        )?,
        weight_scale: lane.upload(
            &(0..s.n)
                .map(|_| (0.5 + rng.unit()) / 127.0 / (s.k as f32).sqrt())
                .collect::<Vec<f32>>(),
        )?,
        bias: lane.upload(&(0..s.n).map(|_| rng.unit() - 0.5).collect::<Vec<f32>>())?,
        bias16: lane.upload(&f16_values(rng, s.n))?,
        one: lane.upload(&[1.0f32])?,
    };
    for _ in 0..sets {
        inputs.a8.push(lane.upload(&int8_codes(rng, s.m * s.k))?);
        inputs.w8.push(lane.upload(&int8_codes(rng, s.n * s.k))?);
        inputs.af8.push(lane.upload(&e4m3_codes(rng, s.m * s.k))?);
        inputs.wf8.push(lane.upload(&e4m3_codes(rng, s.n * s.k))?);
        inputs.a16.push(lane.upload(&f16_values(rng, s.m * s.k))?);
        inputs.w16.push(lane.upload(&f16_values(rng, s.n * s.k))?);
    }
    debug_assert!(e4m3_decode(e4m3_codes(rng, 1)[0]).is_finite());
    Ok(inputs)
}

fn plan_or_err(
    blas: &std::result::Result<Blas, String>,
    kind: BlasKind,
    s: Shape,
    extra: [u64; 2],
) -> std::result::Result<BlasPlan, String> {
    let blas = blas.as_ref().map_err(Clone::clone)?;
    blas.plan(kind, s.m, s.n, s.k, extra)
        .map_err(|e| e.to_string())
}

/// Runs the benchmark on the shapes of `args`.
pub fn run(args: &BenchArgs, mut progress: impl FnMut(&str)) -> Result<BenchReport> {
    let shapes = parse_shapes(&args.shapes)?;
    let activation = parse_activation(&args.activation)?;
    let lane = CudaLane::open(args.device, &super::kernels::KernelCache::from_env())?;
    let info = lane.info().clone();
    progress(&format!(
        "{} ({}, {} SMs); kernels {:?}",
        info.name, info.arch, info.sm_count, info.module
    ));
    let blas = Blas::new(&lane).map_err(|e| e.to_string());
    if let Err(e) = &blas {
        progress(&format!("cuBLASLt baselines unavailable: {e}"));
    }
    let l2 = lane
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map(|v| v.max(0) as usize)
        .unwrap_or(50 << 20);
    let fp8_ok = info.arch.supports_fp8();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut results = Vec::new();
    for s in shapes {
        progress(&format!("{s}"));
        let set_bytes = (s.m + s.n) * s.k;
        let sets = (2 * l2).div_ceil(set_bytes).clamp(1, 4);
        let inp = make_inputs(&lane, s, sets, &mut rng)?;
        let mut out16 = lane.zeros::<u16>(s.m * s.n)?;
        let mut out_lt = lane.zeros::<u16>(s.m * s.n)?;
        let mut acc32 = lane.zeros::<i32>(s.m * s.n)?;
        let mut out_bf16 = lane.zeros::<u16>(s.m * s.n)?;
        let mut out_f16 = lane.zeros::<f16>(s.m * s.n)?;
        let ops = s.ops();

        let gemm = |dtype: QuantDtype, i: usize| {
            let (a, w) = match dtype {
                QuantDtype::Int8 => (&inp.a8[i % sets], &inp.w8[i % sets]),
                QuantDtype::Float8E4m3fn => (&inp.af8[i % sets], &inp.wf8[i % sets]),
            };
            DeviceGemm {
                dtype,
                a,
                a_scale: DeviceActScale::PerRow(&inp.a_scale),
                w,
                weight_scale: &inp.weight_scale,
                bias: Some(&inp.bias),
                activation,
                out_dtype: OutDtype::F16,
                m: s.m,
                n: s.n,
                k: s.k,
            }
        };

        // Ours, int8 (the heuristic's tile), and every tile with --all-configs.
        let int8_config = lane.choose_config_for(QuantDtype::Int8, activation, s.m, s.n, s.k)?;
        let ours_int8 = time_op(&lane, args.samples, ops, &mut |i| {
            lane.launch_scaled_mm(
                &gemm(QuantDtype::Int8, i),
                DeviceOutput::Rounded(&mut out16),
                Some(int8_config),
            )
            .map(|_| ())
        })?;
        let mut configs = Vec::new();
        if args.all_configs {
            let dtypes: &[QuantDtype] = if fp8_ok {
                &QuantDtype::ALL
            } else {
                &[QuantDtype::Int8]
            };
            for &dtype in dtypes {
                for c in lane.gemm_configs(dtype) {
                    let mut scratch = lane.zeros::<u16>(s.m * s.n)?;
                    let t = time_op(&lane, args.samples, ops, &mut |i| {
                        lane.launch_scaled_mm(
                            &gemm(dtype, i),
                            DeviceOutput::Rounded(&mut scratch),
                            Some(c),
                        )
                        .map(|_| ())
                    })?;
                    configs.push((c, lane.gemm_occupancy(&c).unwrap_or(0), t));
                }
            }
        }
        let ours_fp8 = if fp8_ok {
            let c = lane.choose_config_for(QuantDtype::Float8E4m3fn, activation, s.m, s.n, s.k)?;
            let mut scratch = lane.zeros::<u16>(s.m * s.n)?;
            time_op(&lane, args.samples, ops, &mut |i| {
                lane.launch_scaled_mm(
                    &gemm(QuantDtype::Float8E4m3fn, i),
                    DeviceOutput::Rounded(&mut scratch),
                    Some(c),
                )
                .map(|_| ())
            })
            .map(|t| (t, c))
            .map_err(|e| e.to_string())
        } else {
            Err(format!("{} has no fp8 mma (needs sm_89+)", info.arch))
        };

        // The stand-alone epilogue (on whatever the int32 buffer holds).
        let epilogue = |acc: &CudaSlice<i32>, out: &mut CudaSlice<u16>| {
            lane.launch_epilogue_i32(
                acc,
                DeviceActScale::PerRow(&inp.a_scale),
                &inp.weight_scale,
                Some(&inp.bias),
                activation,
                out,
                OutDtype::F16,
                s.m,
                s.n,
            )
        };
        let epilogue_alone = time_op(&lane, args.samples, ops, &mut |_| {
            epilogue(&acc32, &mut out_lt)
        })?;

        // cuBLASLt int8: raw, and followed by the epilogue.
        let lt_plan = plan_or_err(&blas, BlasKind::Int8, s, [0, 0]);
        let (lt_int8, lt_int8_epilogue, int8_matches_lt) = match (&blas, &lt_plan) {
            (Ok(b), Ok(p)) => {
                let raw = time_op(&lane, args.samples, ops, &mut |i| {
                    // SAFETY: buffers of the plan's types and shape.
                    unsafe { b.run(p, &inp.w8[i % sets], &inp.a8[i % sets], &mut acc32) }
                })
                .map_err(|e| e.to_string());
                let with_epi = time_op(&lane, args.samples, ops, &mut |i| {
                    // SAFETY: as above.
                    unsafe { b.run(p, &inp.w8[i % sets], &inp.a8[i % sets], &mut acc32) }?;
                    epilogue(&acc32, &mut out_lt)
                })
                .map_err(|e| e.to_string());
                // Same inputs (set 0) through both pipelines; compare bit for bit.
                let check = (|| -> Result<bool> {
                    lane.launch_scaled_mm(
                        &gemm(QuantDtype::Int8, 0),
                        DeviceOutput::Rounded(&mut out16),
                        Some(int8_config),
                    )?;
                    // SAFETY: as above.
                    unsafe { b.run(p, &inp.w8[0], &inp.a8[0], &mut acc32) }?;
                    epilogue(&acc32, &mut out_lt)?;
                    Ok(lane.download(&out16)? == lane.download(&out_lt)?)
                })();
                (raw, with_epi, check.ok())
            }
            (_, Err(e)) => (Err(e.clone()), Err(e.clone()), None),
            (Err(e), _) => (Err(e.clone()), Err(e.clone()), None),
        };

        let ptr = |x: &CudaSlice<f32>| {
            use cudarc::driver::DevicePtr;
            x.device_ptr(lane.stream()).0
        };
        let lt_fp8 = match (
            &blas,
            plan_or_err(&blas, BlasKind::Fp8, s, [ptr(&inp.one), ptr(&inp.one)]),
        ) {
            (Ok(b), Ok(p)) if fp8_ok => time_op(&lane, args.samples, ops, &mut |i| {
                // SAFETY: buffers of the plan's types and shape.
                unsafe { b.run(&p, &inp.wf8[i % sets], &inp.af8[i % sets], &mut out_bf16) }
            })
            .map_err(|e| e.to_string()),
            (_, Err(e)) => Err(e),
            _ => Err("no fp8 on this GPU or no cuBLASLt".into()),
        };
        let bias16_ptr = {
            use cudarc::driver::DevicePtr;
            inp.bias16.device_ptr(lane.stream()).0
        };
        let lt_f16_bias = match (
            &blas,
            plan_or_err(&blas, BlasKind::F16Bias, s, [bias16_ptr, 0]),
        ) {
            (Ok(b), Ok(p)) => time_op(&lane, args.samples, ops, &mut |i| {
                // SAFETY: buffers of the plan's types and shape.
                unsafe { b.run(&p, &inp.w16[i % sets], &inp.a16[i % sets], &mut out_f16) }
            })
            .map_err(|e| e.to_string()),
            (_, Err(e)) => Err(e),
            (Err(e), _) => Err(e.clone()),
        };
        lane.synchronize()?;
        results.push(ShapeResult {
            shape: s,
            ours_int8,
            ours_int8_config: int8_config,
            ours_fp8,
            lt_int8,
            lt_int8_epilogue,
            epilogue_alone,
            lt_fp8,
            lt_f16_bias,
            int8_matches_lt,
            configs,
        });
    }
    Ok(BenchReport {
        device: info.name.clone(),
        arch: info.arch.name(),
        sm_count: info.sm_count,
        driver_version: info.driver_version,
        activation,
        samples: args.samples,
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(
            parse_shapes("1,8,16; 1500,384,384").unwrap_or_default(),
            vec![
                Shape { m: 1, n: 8, k: 16 },
                Shape {
                    m: 1500,
                    n: 384,
                    k: 384
                }
            ]
        );
        assert_eq!(parse_shapes("default").map(|v| v.len()).ok(), Some(22));
        assert_eq!(parse_shapes("model-all").map(|v| v.len()).ok(), Some(72));
        assert!(parse_shapes("1,9,16").is_err());
        assert!(parse_shapes("1,8").is_err());
        assert!(parse_shapes("").is_err());
    }

    #[test]
    fn random_inputs_are_valid_codes() {
        let mut rng = Rng(1);
        assert!(int8_codes(&mut rng, 4096).iter().all(|&c| c != 0x80));
        assert!(e4m3_codes(&mut rng, 4096)
            .iter()
            .all(|&c| e4m3_decode(c).is_finite() && e4m3_decode(c) != 0.0));
    }
}
