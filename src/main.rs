//! The `oasr-quantize` command line: parsing, progress display and exit codes. All the work is
//! done by the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use oasr_quantize::export::ExportFormat;
use oasr_quantize::format::ModuleKind;
use oasr_quantize::models::DecodeOptions;
use oasr_quantize::Manifest;
use oasr_quantize::{Progress, Quantizer, Recipe, Stage};

/// Turns full-precision ASR checkpoints into serving-ready W8A8 checkpoints for OASR.
///
/// Quantize:  oasr-quantize SRC DST --recipe int8_w8a8_rtn
#[derive(Parser)]
#[command(
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    quantize: QuantizeArgs,
}

#[derive(Args)]
struct QuantizeArgs {
    /// Source checkpoint directory (OASR native, Hugging Face Whisper, CTranslate2 Whisper or a
    /// WeNet U2++ Conformer model directory).
    #[arg(required = true)]
    src: Option<PathBuf>,
    /// Output directory (written atomically).
    #[arg(required = true)]
    dst: Option<PathBuf>,
    /// Built-in recipe name (see `oasr-quantize recipes`) or path to a recipe TOML file.
    #[arg(long, default_value = "int8_w8a8_rtn")]
    recipe: String,
    /// Override a recipe option: ALGORITHM.KEY=VALUE (repeatable).
    #[arg(long = "option", value_name = "ALGORITHM.KEY=VALUE")]
    options: Vec<String>,
    /// Keep layers matching this glob full precision (repeatable).
    #[arg(long, value_name = "GLOB")]
    ignore: Vec<String>,
    /// Also quantize the layers the recipe keeps full precision (`keep_full_precision` in
    /// `oasr-quantize recipes`), for comparison.
    #[arg(long)]
    quantize_kept: bool,
    /// GiB that GPTQ's calibration pass may fill with its Σ x xᵀ matrices (default: the memory
    /// available, less two f32 copies of the model); fewer utterances run at once to fit, with
    /// the same result.
    #[arg(long, value_name = "GIB")]
    gptq_memory: Option<f64>,
    /// Module types to quantize: linear, pointwise_conv, conv1d, conv2d, conv, all (comma-separated).
    #[arg(long, value_name = "LIST")]
    module_types: Option<String>,
    /// Calibration manifest (JSON lines) for recipes that calibrate.
    #[arg(long, value_name = "MANIFEST")]
    calib_manifest: Option<PathBuf>,
    /// Directory the calibration manifest's audio paths are relative to (default: its own).
    #[arg(long, value_name = "DIR")]
    audio_root: Option<PathBuf>,
    /// Calibration utterances, evenly strided over the manifest sorted by id.
    #[arg(long, default_value_t = oasr_quantize::calibration::DEFAULT_UTTERANCES)]
    calib_utterances: usize,
    #[command(flatten)]
    search: SearchArgs,
    /// Output format: oasr (OASR native v2) or compressed-tensors (the Hugging Face layout
    /// that transformers and vLLM load; what it cannot express is refused).
    #[arg(long, default_value = "oasr", value_name = "FORMAT")]
    format: String,
    /// SmoothQuant migration strength (shorthand for --option smoothquant.alpha=A).
    #[arg(long)]
    alpha: Option<f32>,
    /// Replace an existing output.
    #[arg(long)]
    overwrite: bool,
    /// Print a machine-readable summary on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Import any supported checkpoint into an OASR native v1 (full precision, f32) checkpoint.
    Convert {
        src: PathBuf,
        dst: PathBuf,
        /// Replace an existing output.
        #[arg(long)]
        overwrite: bool,
    },
    /// Export a checkpoint to a format other tools load: compressed-tensors (the Hugging Face
    /// layout with a `quantization_config`; a full-precision source exports as plain Hugging
    /// Face). Refuses by name what the format cannot express.
    Export {
        src: PathBuf,
        dst: PathBuf,
        #[arg(long, default_value = "compressed-tensors", value_name = "FORMAT")]
        format: String,
        /// Replace an existing output.
        #[arg(long)]
        overwrite: bool,
        /// Print a machine-readable summary on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a checkpoint's schemes, quantized layers, skipped layers and provenance.
    Inspect {
        checkpoint: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Transcribe a manifest with a full-precision checkpoint; reports WER when it has `text`.
    Transcribe {
        checkpoint: PathBuf,
        #[command(flatten)]
        run: ManifestRun,
        #[command(flatten)]
        search: SearchArgs,
    },
    /// Run a quantized checkpoint against its full-precision reference on a manifest: WER of both,
    /// logit cosine and top-1 agreement (free-running and teacher-forced), non-finite values.
    Verify {
        quantized: PathBuf,
        /// The full-precision checkpoint it was made from.
        #[arg(long)]
        reference: PathBuf,
        #[command(flatten)]
        run: ManifestRun,
        /// The dtype the quantized GEMMs round to.
        #[arg(long, value_enum, default_value_t = ServedDtype::F16)]
        served_dtype: ServedDtype,
        #[command(flatten)]
        lane: LaneArgs,
        /// Also break the error down per quantized layer: each layer's output error on the
        /// reference input, and its share of the logit error (one teacher-forced pass per layer
        /// and utterance, on the CPU). Adds `per_layer` to the JSON report.
        #[arg(long)]
        per_layer: bool,
        #[command(flatten)]
        search: SearchArgs,
    },
    /// Regenerate every gated checkpoint of a gate file and verify it on the gate manifest; fails
    /// when a WER exceeds its recorded reference plus the tolerance.
    Gate {
        /// The gate file, e.g. calib/gate.toml.
        config: PathBuf,
        /// Which profile of the gate file to run (e.g. `full`, or `ci` for the CI subset).
        #[arg(long, default_value = "full")]
        profile: String,
        /// Run only this entry (repeatable).
        #[arg(long, value_name = "ENTRY")]
        only: Vec<String>,
        /// Record the measured WERs as this profile's references in the gate file. Never
        /// automatic: a reference moves only when someone asks.
        #[arg(long)]
        record: bool,
        /// Keep the regenerated checkpoints in DIR (default: a temporary directory, removed).
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
        /// Write the full report as JSON to this file.
        #[arg(long, value_name = "OUT")]
        json: Option<PathBuf>,
        /// The dtype the quantized GEMMs round to.
        #[arg(long, value_enum, default_value_t = ServedDtype::F16)]
        served_dtype: ServedDtype,
        /// Where the quantized GEMMs run. cuda: the GPU lane, and every set is verified on the
        /// CPU reference too: int8 must match it bit for bit, fp8 may fall at most the gate
        /// file's `gpu_cosine_tolerance` (default 0.0005) below its teacher-forced cosine mean.
        #[arg(long, value_enum, default_value_t = VerifyDevice::Cpu)]
        device: VerifyDevice,
    },
    /// List the built-in recipes.
    Recipes {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Time our int8/fp8 scaled_mm against cuBLASLt on this machine's GPU (feature `cuda`).
    #[cfg(feature = "cuda")]
    BenchGemm(oasr_quantize::runtime::bench::BenchArgs),
}

/// A run over a manifest, shared by `transcribe` and `verify`.
/// The model's search: attention rescoring of a CTC model (Whisper refuses it by name), and
/// Whisper's language and task (the CTC model refuses them).
#[derive(Args, Clone)]
struct SearchArgs {
    /// Attention rescoring: the weight of a candidate's CTC score (default 0.5, WeNet's runtime).
    #[arg(long, value_name = "W")]
    ctc_weight: Option<f64>,
    /// Attention rescoring: the right-to-left decoder's weight in [0, 1] (default 0).
    #[arg(long, value_name = "W")]
    reverse_weight: Option<f64>,
    /// CTC prefix beam search: candidates kept for rescoring (default 10). Whisper: hypotheses
    /// of the beam search at temperature 0 (default 1, greedy; openai-whisper's command line and
    /// faster-whisper use 5).
    #[arg(long, value_name = "N")]
    beam_size: Option<usize>,
    /// Whisper: the spoken language, as its code (`en`, `de`, ...); default: detected per
    /// utterance on a multilingual model. An English-only model takes `en` only.
    #[arg(long, value_name = "CODE")]
    language: Option<String>,
    /// Whisper: `transcribe` (default) or `translate` into English (multilingual models).
    #[arg(long, value_name = "TASK")]
    task: Option<oasr_quantize::models::Task>,
    /// Whisper: decode greedily once, without the temperature fallback (as transformers'
    /// `generate` and CTranslate2 do by default); the token limit stays.
    #[arg(long)]
    no_fallback: bool,
    /// Whisper: how a clip shorter than 30 s is padded to the encoder's window: `transcribe`
    /// (default; openai-whisper's transcribe(), faster-whisper, CTranslate2: the log-mel
    /// zero-padded) or `feature-extractor` (Hugging Face's WhisperFeatureExtractor, as
    /// transformers and vLLM serve: the audio zero-padded). Calibrate and verify as you serve.
    #[arg(long, value_name = "PADDING")]
    padding: Option<oasr_quantize::models::LogMelPadding>,
}

impl From<SearchArgs> for DecodeOptions {
    fn from(a: SearchArgs) -> Self {
        DecodeOptions {
            ctc_weight: a.ctc_weight,
            reverse_weight: a.reverse_weight,
            beam_size: a.beam_size,
            language: a.language,
            task: a.task,
            no_fallback: a.no_fallback,
            padding: a.padding,
        }
    }
}

#[derive(Args)]
struct ManifestRun {
    /// JSON lines manifest: {"id", "audio", "text"?}.
    #[arg(long)]
    manifest: PathBuf,
    /// Directory the manifest's audio paths are relative to (default: the manifest's).
    #[arg(long)]
    audio_root: Option<PathBuf>,
    /// Write the full report as JSON to this file.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Run only the first N utterances.
    #[arg(long)]
    limit: Option<usize>,
}

impl ManifestRun {
    /// Reads the manifest and makes a progress bar over the utterances that will run.
    fn start(&self, prefix: &'static str) -> Result<(Manifest, ProgressBar)> {
        let manifest = Manifest::read(&self.manifest, self.audio_root.as_deref())?;
        let bar = utterance_bar(
            self.limit
                .unwrap_or(usize::MAX)
                .min(manifest.utterances.len()),
        );
        bar.set_prefix(prefix);
        Ok((manifest, bar))
    }

    fn write_json(&self, report: &impl serde::Serialize) -> Result<()> {
        if let Some(path) = &self.json {
            oasr_quantize::checkpoint::write_json(path, report)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ServedDtype {
    F16,
    Bf16,
}

impl From<ServedDtype> for oasr_quantize::numerics::OutDtype {
    fn from(d: ServedDtype) -> Self {
        match d {
            ServedDtype::F16 => Self::F16,
            ServedDtype::Bf16 => Self::Bf16,
        }
    }
}

/// Where a verify run's quantized GEMMs run, and how the CPU sums fp8.
#[derive(Clone, Copy, clap::Args)]
struct LaneArgs {
    /// Where the quantized GEMMs and quantize steps run (cpu: the reference numerics; cuda:
    /// GPU 0, int8 bit-identical to cpu).
    #[arg(long, value_enum, default_value_t = VerifyDevice::Cpu)]
    device: VerifyDevice,
    /// How the CPU sums fp8 GEMMs: `sequential` (the reference: exact products summed in f32,
    /// in K order) or `tensor-core` (a model of Hopper's fp8 tensor cores as the default wgmma
    /// kernels run them, which gives their bits; slower).
    #[arg(long, value_enum, default_value_t = Fp8AccumulationArg::Sequential)]
    fp8_accumulation: Fp8AccumulationArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Fp8AccumulationArg {
    Sequential,
    TensorCore,
}

impl From<Fp8AccumulationArg> for oasr_quantize::numerics::Fp8Accumulation {
    fn from(a: Fp8AccumulationArg) -> Self {
        match a {
            Fp8AccumulationArg::Sequential => Self::Sequential,
            Fp8AccumulationArg::TensorCore => Self::TensorCore,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum VerifyDevice {
    Cpu,
    /// GPU 0 (needs a build with `--features cuda`).
    Cuda,
}

impl From<VerifyDevice> for oasr_quantize::verify::VerifyDevice {
    fn from(d: VerifyDevice) -> Self {
        match d {
            VerifyDevice::Cpu => Self::Cpu,
            VerifyDevice::Cuda => Self::Cuda,
        }
    }
}

/// Rust starts programs with SIGPIPE ignored, so a write to a closed pipe (`oasr-quantize
/// recipes | head -1`) fails and `println!` panics. Like other command-line tools, end quietly
/// instead: the default disposition ends the process on SIGPIPE, with no message.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in `main`, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The forward allocates and frees activations of megabytes per layer (an encoder layer's fc1
/// output is 9 MB on tiny.en). glibc's default may give each back to the kernel when it is
/// freed, and the next one is faulted in again page by page (4.8 million faults, a sixth of a
/// 128-utterance calibration's wall time, measured on 2 cores). So keep freed memory in the heap
/// (map separately only above 32 MiB, glibc's largest threshold, and never trim); the peak RSS
/// stays where it was, since the heap is reused up to the same peak. A user's own
/// `GLIBC_TUNABLES` for malloc wins.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        // SAFETY: called first thing in `main`, before any other thread allocates; both are
        // documented mallopt parameters with values in their ranges.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

fn main() -> ExitCode {
    restore_sigpipe();
    keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Convert {
            src,
            dst,
            overwrite,
        }) => convert(src, dst, overwrite),
        Some(Command::Export {
            src,
            dst,
            format,
            overwrite,
            json,
        }) => export(src, dst, &format, overwrite, json),
        Some(Command::Inspect { checkpoint, json }) => inspect(checkpoint, json),
        Some(Command::Recipes { json }) => recipes(json),
        Some(Command::Verify {
            quantized,
            reference,
            run,
            served_dtype,
            lane,
            per_layer,
            search,
        }) => verify(
            quantized,
            reference,
            run,
            served_dtype,
            lane,
            per_layer,
            search,
        ),
        Some(Command::Gate {
            config,
            profile,
            only,
            record,
            keep,
            json,
            served_dtype,
            device,
        }) => gate(GateArgs {
            config,
            profile,
            only,
            record,
            keep,
            json,
            served: served_dtype.into(),
            device: device.into(),
        }),
        #[cfg(feature = "cuda")]
        Some(Command::BenchGemm(args)) => {
            oasr_quantize::runtime::bench::run_cli(&args, |line| eprintln!("{line}"))
                .map(|table| print!("{table}"))
                .map_err(Into::into)
        }
        Some(Command::Transcribe {
            checkpoint,
            run,
            search,
        }) => transcribe(checkpoint, run, search),
        None => quantize(cli.quantize),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// When each stage of a run began and ended (its first and last progress report), in seconds
/// from the start, in the order the stages ran.
type StageTimes = std::sync::Arc<std::sync::Mutex<Vec<(Stage, f64, f64)>>>;

fn progress_bar(hidden: bool, times: StageTimes) -> impl FnMut(&Progress) + Send + 'static {
    let bar = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    let started = std::time::Instant::now();
    let mut stage = None;
    move |p: &Progress| {
        let now = started.elapsed().as_secs_f64();
        if let Ok(mut times) = times.lock() {
            match times.last_mut() {
                Some((s, _, end)) if *s == p.stage => *end = now,
                _ => times.push((p.stage, now, now)),
            }
        }
        if stage != Some(p.stage) {
            stage = Some(p.stage);
            // Every stage shows an ETA (hashing a multi-gigabyte source and writing hundreds of
            // layers take seconds); utterances also show their rate.
            let (prefix, template) = match p.stage {
                Stage::Hashing => (
                    "hashing",
                    "{prefix:>12} [{bar:30}] {pos}/{len} ETA {eta} {wide_msg}",
                ),
                Stage::Loading => ("loading", "{prefix:>12} {spinner} {elapsed} {wide_msg}"),
                Stage::Calibrating => (
                    "calibrating",
                    "{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
                ),
                Stage::CalibratingStatic => (
                    "static calib",
                    "{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
                ),
                Stage::CalibratingGptq => (
                    "gptq calib",
                    "{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
                ),
                Stage::Writing => (
                    "writing",
                    "{prefix:>12} [{bar:30}] {pos}/{len} ETA {eta} {wide_msg}",
                ),
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(prefix);
            bar.reset();
            bar.set_length(p.total);
        }
        bar.set_position(p.done);
        bar.set_message(p.item.to_string());
        if p.stage == Stage::Writing && p.done == p.total {
            bar.finish_and_clear();
        }
    }
}

fn quantize(args: QuantizeArgs) -> Result<()> {
    let (Some(src), Some(dst)) = (args.src, args.dst) else {
        anyhow::bail!("SRC and DST are required");
    };
    let mut q = Quantizer::new(&src, &dst)
        .recipe(&args.recipe)
        .decode_options(args.search.into())
        .format(match args.format.as_str() {
            "oasr" => None,
            other => Some(ExportFormat::parse(other)?),
        })
        .quantize_kept(args.quantize_kept)
        .overwrite(args.overwrite);
    for option in args.options {
        q = q.option(option);
    }
    for glob in args.ignore {
        q = q.ignore(glob);
    }
    if let Some(list) = &args.module_types {
        q = q.module_types(ModuleKind::parse_list(list)?);
    }
    if let Some(gib) = args.gptq_memory {
        anyhow::ensure!(
            gib.is_finite() && gib > 0.0,
            "--gptq-memory: {gib} is not a positive number of GiB"
        );
        q = q.memory_budget((gib * (1u64 << 30) as f64) as u64);
    }
    if let Some(manifest) = args.calib_manifest {
        q = q
            .calib_manifest(manifest)
            .calib_utterances(args.calib_utterances);
    }
    if let Some(root) = args.audio_root {
        q = q.audio_root(root);
    }
    if let Some(alpha) = args.alpha {
        q = q.option(format!("smoothquant.alpha={alpha}"));
    }
    let started = std::time::Instant::now();
    let times = StageTimes::default();
    let outcome = q
        .on_progress(progress_bar(args.json, times.clone()))
        .run()?;
    let seconds = started.elapsed().as_secs_f64();
    let report = outcome
        .report
        .context("a quantization run returns a report")?;
    // Each stage from its first to its last report; what lies between (deriving the scales,
    // renaming into place) is the rest of `seconds`.
    let stages: Vec<(&str, f64, f64)> = times
        .lock()
        .map(|t| t.iter().map(|(s, a, b)| (s.name(), *a, b - a)).collect())
        .unwrap_or_default();
    if args.json {
        let summary = serde_json::json!({
            "output": outcome.output,
            "recipe": report.recipe,
            "quantized_layers": report.layers.len(),
            "skipped": report.skipped,
            "worst_layer": report.worst_layer(),
            "files_read": outcome.files_read,
            "seconds": seconds,
            "stages": stages
                .iter()
                .map(|(stage, started, s)| {
                    serde_json::json!({"stage": stage, "started": started, "seconds": s})
                })
                .collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    let breakdown: Vec<String> = stages
        .iter()
        .map(|(stage, _, s)| format!("{stage} {s:.2} s"))
        .collect();
    println!(
        "wrote {} ({} quantized layers, {} skipped) in {seconds:.2} s ({})",
        outcome.output.display(),
        report.layers.len(),
        report.skipped.len(),
        breakdown.join(", ")
    );
    for (layer, reason) in &report.skipped {
        println!("  kept full precision: {layer}: {reason}");
    }
    if let Some(worst) = report.worst_layer() {
        println!(
            "  largest relative weight error: {:.5} ({})",
            worst.relative_weight_error, worst.name
        );
    }
    Ok(())
}

fn convert(src: PathBuf, dst: PathBuf, overwrite: bool) -> Result<()> {
    let outcome = oasr_quantize::convert(&src, &dst, overwrite)?;
    println!("wrote {} (OASR native v1, f32)", outcome.output.display());
    Ok(())
}

fn export(src: PathBuf, dst: PathBuf, format: &str, overwrite: bool, json: bool) -> Result<()> {
    let r = oasr_quantize::export::export(&src, &dst, ExportFormat::parse(format)?, overwrite)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "wrote {} ({}): {} quantized layers in {} config groups, {} tensors, {:.1} MB, {:.2} s",
        r.output,
        r.format.name(),
        r.quantized_layers,
        r.config_groups,
        r.tensors,
        r.weight_bytes as f64 / 1e6,
        r.seconds
    );
    if !r.ignored.is_empty() {
        println!("  ignore (full precision): {}", r.ignored.join(", "));
    }
    if r.links_left_out > 0 {
        println!(
            "  {} OASR server links (fused norms, GEMM chains) left out: compressed-tensors has no field for them (reading the export back arms them again)",
            r.links_left_out
        );
    }
    Ok(())
}

fn inspect(path: PathBuf, json: bool) -> Result<()> {
    let s = oasr_quantize::inspect::inspect(&path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("{}", s.path);
    println!(
        "  format:        {} (format_version {})",
        s.source_format, s.format_version
    );
    println!("  architecture:  {}", s.architecture);
    println!(
        "  tensors:       {} ({} parameters)",
        s.tensors, s.parameters
    );
    if s.schemes.is_empty() {
        println!("  quantization:  none (full precision)");
        return Ok(());
    }
    println!("  schemes:       {}", s.schemes.join(", "));
    println!(
        "  kv cache:      {}",
        s.kv_cache.as_deref().unwrap_or("not quantized")
    );
    println!("  quantized:     {} layers", s.quantized_layers);
    for (kind, count) in &s.layers_by_kind_and_scheme {
        println!("    {count:>4}  {kind}");
    }
    println!(
        "  links:         {} fused norms, {} GEMM chains",
        s.fused_norms, s.gemm_chains
    );
    println!("  skipped:       {}", s.skipped.len());
    for (layer, reason) in &s.skipped {
        println!("    {layer}: {reason}");
    }
    if let Some(p) = &s.producer {
        println!(
            "  producer:      {} {} recipe {}",
            p.name, p.version, p.recipe
        );
        println!(
            "  algorithms:    {}",
            p.algorithms
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("  source:        {}", p.source.format);
        for (file, sha) in &p.source.files {
            println!("    {sha}  {file}");
        }
        println!("  fingerprint:   {}", p.fingerprint);
    }
    Ok(())
}

fn utterance_bar(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
}

fn transcribe(checkpoint: PathBuf, run: ManifestRun, search: SearchArgs) -> Result<()> {
    let (manifest, bar) = run.start("transcribing")?;
    let report = oasr_quantize::transcribe::transcribe_manifest_with(
        &checkpoint,
        &manifest,
        run.limit,
        &search.into(),
        |done, _, id| {
            bar.set_position(done as u64);
            bar.set_message(id.to_string());
        },
    )?;
    bar.finish_and_clear();
    for u in &report.utterances {
        match &u.reference {
            Some(r) if u.word_errors.is_some_and(|e| e.errors > 0) => {
                println!("{}\t{}\t(ref: {r})", u.id, u.hypothesis)
            }
            _ => println!("{}\t{}", u.id, u.hypothesis),
        }
    }
    if let Some(wer) = report.wer {
        println!(
            "WER {:.2}% ({} errors / {} words) over {} utterances",
            wer * 100.0,
            report.word_errors.errors,
            report.word_errors.words,
            report.utterances.len()
        );
    }
    if report.word_errors_by_source.len() > 1 {
        for (source, e) in &report.word_errors_by_source {
            println!(
                "  {source}: WER {:.2}% ({} / {} words)",
                e.rate() * 100.0,
                e.errors,
                e.words
            );
        }
    }
    println!(
        "decoding fallback on {} utterances; {} stopped at the token limit",
        report.fallbacks, report.hit_token_limit
    );
    println!(
        "{:.2} utterances/s ({:.1} s)",
        report.utterances_per_second, report.seconds
    );
    run.write_json(&report)
}

fn verify(
    quantized: PathBuf,
    reference: PathBuf,
    run: ManifestRun,
    served: ServedDtype,
    lane: LaneArgs,
    per_layer: bool,
    search: SearchArgs,
) -> Result<()> {
    let (manifest, bar) = run.start("verifying")?;
    let options = oasr_quantize::verify::VerifyOptions {
        limit: run.limit,
        served: served.into(),
        device: lane.device.into(),
        per_layer,
        decode: search.into(),
        fp8_accumulation: lane.fp8_accumulation.into(),
    };
    let report = oasr_quantize::verify::verify_with(
        &quantized,
        &reference,
        &manifest,
        &options,
        |done, _, id| {
            bar.set_position(done as u64);
            bar.set_message(id.to_string());
        },
    )?;
    bar.finish_and_clear();
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}%", v * 100.0));
    println!("utterances:        {}", report.utterances);
    println!("quantized GEMMs on {}", report.device);
    if report.fp8_accumulation == oasr_quantize::numerics::Fp8Accumulation::TensorCore {
        println!("fp8 GEMMs on the CPU summed as Hopper's tensor cores sum them (the model)");
    }
    let interval = report
        .wer_delta_interval
        .map_or(String::new(), |[low, high]| {
            format!(
                " (95 % bootstrap interval {:+.2} to {:+.2} points)",
                low * 100.0,
                high * 100.0
            )
        });
    println!(
        "WER full precision {}  quantized {}  delta {}{interval}",
        pct(report.wer_full_precision),
        pct(report.wer_quantized),
        pct(report.wer_delta)
    );
    for (name, a) in [
        ("free-running", &report.free_running),
        ("teacher-forced", &report.teacher_forced),
    ] {
        println!(
            "{name:>15}: logit cosine mean {:.6} min {:.6}, centred {:.6} min {:.6}, KL mean {:.2e} max {:.2e}, top-1 agreement {:.2}% over {} steps",
            a.cosine_mean,
            a.cosine_min,
            a.centered_cosine_mean,
            a.centered_cosine_min,
            a.kl_mean,
            a.kl_max,
            a.top1_agreement * 100.0,
            a.steps
        );
    }
    for (name, s) in &report.hypothesis_scores {
        println!(
            "{name:>15}: score of the full-precision hypothesis, |quantized - fp| mean {:.4} max {:.4} nats ({:.3}% of the fp mean {:.2}) over {} utterances",
            s.abs_diff_mean,
            s.abs_diff_max,
            s.relative_diff_mean * 100.0,
            s.full_precision_mean,
            s.utterances
        );
    }
    println!("non-finite values: {}", report.nonfinite);
    if report.by_source.len() > 1 {
        println!(
            "{:<24} {:>5} {:>8} {:>8} {:>10} {:>10} {:>10} {:>9}",
            "source", "utts", "WER fp", "WER q", "tf cos", "tf min", "centred", "KL mean"
        );
        for (source, f) in &report.by_source {
            let tf = &f.teacher_forced;
            println!(
                "{source:<24} {:>5} {:>8} {:>8} {:>10.6} {:>10.6} {:>10.6} {:>9.2e}",
                f.utterances,
                pct(f.wer_full_precision),
                pct(f.wer_quantized),
                tf.cosine_mean,
                tf.cosine_min,
                tf.centered_cosine_mean,
                tf.kl_mean
            );
        }
    }
    println!(
        "{:.2} utterances/s (both models, {:.1} s)",
        report.utterances_per_second, report.seconds
    );
    if let Some(layers) = &report.per_layer {
        print_per_layer(layers);
    }
    run.write_json(&report)
}

/// The layers with the largest share of the logit error, as a short table.
fn print_per_layer(p: &oasr_quantize::verify::per_layer::PerLayerReport) {
    const TOP: usize = 10;
    let full = &p.full_model;
    println!(
        "per layer: {} quantized layers, teacher-forced over {} steps; fully quantized: 1-cos {:.3e}, KL {:.3e}",
        p.layers.len(),
        full.steps,
        full.one_minus_cosine_mean,
        full.kl_mean
    );
    let share = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let width = p
        .layers
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    // With `--device cuda`: each layer's GPU output error, and its distance from the CPU's.
    let gpu = p.layers.iter().any(|l| l.output_error.gpu.is_some());
    let gpu_header = if gpu {
        format!("  {:>10} {:>10}", "gpu rel L2", "gpu-cpu")
    } else {
        String::new()
    };
    println!(
        "  {:<width$}  {:>9} {:>9}  {:>10} {:>10}{gpu_header}  worst row (utterance:row)",
        "layer", "share cos", "share KL", "out rel L2", "worst row"
    );
    for l in p.top_by_share(TOP) {
        let o = &l.output_error;
        let (worst, at) = o.worst_row.as_ref().map_or((0.0, "-".to_string()), |w| {
            (w.relative_l2, format!("{}:{}", w.utterance, w.row))
        });
        let gpu_columns = o.gpu.as_ref().map_or(String::new(), |g| {
            format!("  {:>10.3e} {:>10.3e}", g.relative_l2, g.relative_l2_to_cpu)
        });
        println!(
            "  {:<width$}  {:>9} {:>9}  {:>10.3e} {:>10.3e}{gpu_columns}  {at}",
            l.name,
            share(l.logit_share.one_minus_cosine),
            share(l.logit_share.kl),
            o.relative_l2,
            worst
        );
    }
    let farthest = p
        .layers
        .iter()
        .filter_map(|l| l.output_error.gpu.as_ref().map(|g| (l, g)))
        .max_by(|a, b| a.1.relative_l2_to_cpu.total_cmp(&b.1.relative_l2_to_cpu));
    if let Some((l, g)) = farthest {
        println!(
            "  GPU vs CPU: the largest difference is {} ({:.3e} of its output; GPU error {:.3e}, CPU {:.3e})",
            l.name, g.relative_l2_to_cpu, g.relative_l2, l.output_error.relative_l2
        );
    }
    if p.layers.len() > TOP {
        println!(
            "  ({} more in the JSON report's per_layer; shares need not sum to 1)",
            p.layers.len() - TOP
        );
    }
    if p.nonfinite > 0 {
        println!("  non-finite values in the per-layer runs: {}", p.nonfinite);
    }
}

fn recipes(json: bool) -> Result<()> {
    let all = Recipe::built_in();
    if json {
        let list: Vec<_> = all.iter().map(|r| serde_json::json!({"name": r.name, "summary": r.summary, "calibration": r.calibration, "keep_full_precision": r.keep_full_precision})).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let width = all.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in &all {
        println!("{:width$}  {}", r.name, r.summary);
        if !r.keep_full_precision.is_empty() {
            println!(
                "{:width$}  keeps full precision: {}",
                "",
                r.keep_full_precision.join(", ")
            );
        }
    }
    Ok(())
}

struct GateArgs {
    config: PathBuf,
    profile: String,
    only: Vec<String>,
    record: bool,
    keep: Option<PathBuf>,
    json: Option<PathBuf>,
    served: oasr_quantize::numerics::OutDtype,
    device: oasr_quantize::verify::VerifyDevice,
}

fn gate(args: GateArgs) -> Result<()> {
    use oasr_quantize::gate::{self, GateConfig, GateOptions, GateProgress};
    use oasr_quantize::verify::VerifyDevice;
    if args.record && args.device != VerifyDevice::Cpu {
        anyhow::bail!(
            "--record with --device cuda: references are recorded from the CPU reference \
             numerics; run `gate --record` without --device"
        );
    }
    let config = GateConfig::load(&args.config)?;
    let work_dir = args
        .keep
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("oasr-gate-{}", std::process::id())));
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let shown = bar.clone();
    let progress = std::sync::Arc::new(move |p: &GateProgress| {
        let prefix = format!("{} {}", p.entry, p.stage);
        if shown.prefix() != prefix {
            shown.reset();
            shown.set_prefix(prefix);
        }
        shown.set_length(p.total);
        shown.set_position(p.done);
    });
    let options = GateOptions {
        profile: args.profile.clone(),
        only: args.only.clone(),
        work_dir: work_dir.clone(),
        served: args.served,
        device: args.device,
    };
    let result = gate::run_gate(&config, &options, progress);
    bar.finish_and_clear();
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    let report = result?;
    let sizes: Vec<String> = report
        .gate_utterances
        .iter()
        .map(|(set, n)| format!("{set} {n}"))
        .collect();
    println!(
        "gate {} (profile {}): utterances {}, tolerance {:.2} WER points",
        config.path.display(),
        report.profile,
        sizes.join(", "),
        report.tolerance
    );
    println!(
        "{:<24} {:<13} {:>7} {:>7} {:>7} {:>7}  {:>9} {:>9} {:>9} {:>7}  result",
        "entry",
        "set",
        "WER fp",
        "WER q",
        "ref",
        "q - fp",
        "cos mean",
        "cos min",
        "centred",
        "top-1"
    );
    for r in &report.results {
        let reference = r
            .reference_wer
            .map_or("-".to_string(), |v| format!("{v:.2}"));
        let tf = &r.verify.teacher_forced;
        println!(
            "{:<24} {:<13} {:>7.2} {:>7.2} {:>7} {:>+7.2}  {:>9.6} {:>9.6} {:>9.6} {:>6.2}%  {}",
            r.name,
            r.set,
            r.wer_full_precision,
            r.wer_quantized,
            reference,
            r.wer_quantized - r.wer_full_precision,
            tf.cosine_mean,
            tf.cosine_min,
            tf.centered_cosine_mean,
            r.verify.free_running.top1_agreement * 100.0,
            if r.passed() { "pass" } else { "FAIL" }
        );
        if let Some(cpu) = &r.cpu_reference {
            println!(
                "{:<24} cpu reference: cos mean {:.6} (min {:.6}), centred {:.6}, WER q {:.2}; \
                 gpu - cpu {:+.6}{}",
                "",
                cpu.cosine_mean,
                cpu.cosine_min,
                cpu.centered_cosine_mean,
                cpu.wer_quantized,
                cpu.cosine_mean_difference,
                if cpu.identical { ", identical" } else { "" }
            );
        }
        for f in &r.failures {
            println!("{:<24} {f}", "");
        }
    }
    for skipped in &report.skipped {
        println!("{:<24} SKIPPED: {}", skipped.name, skipped.reason);
    }
    println!(
        "(cosine and top-1 are teacher-forced and free-running, respectively; WER in percent)"
    );
    if let Some(path) = &args.json {
        oasr_quantize::checkpoint::write_json(path, &report)?;
    }
    if args.record {
        gate::record(&config, &report.profile, &report.results)?;
        println!(
            "recorded {} reference(s) for profile `{}` in {}",
            report.results.len(),
            report.profile,
            config.path.display()
        );
        return Ok(());
    }
    let failed = report.results.iter().filter(|r| !r.passed()).count();
    if failed > 0 {
        anyhow::bail!(
            "gate failed: {failed} of {} results (entry x set)",
            report.results.len()
        );
    }
    Ok(())
}
