//! The `oasr-quantize` command line: parsing, progress display and exit codes. All the work is
//! done by the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use oasr_quantize::format::ModuleKind;
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
    /// Source checkpoint directory (OASR native, Hugging Face Whisper or CTranslate2 Whisper).
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
    /// Module types to quantize: linear, pointwise_conv, conv1d, conv2d, conv, all (comma-separated).
    #[arg(long, value_name = "LIST")]
    module_types: Option<String>,
    /// Calibration manifest (JSON lines) for recipes that calibrate.
    #[arg(long, value_name = "MANIFEST")]
    calib_manifest: Option<PathBuf>,
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
    /// Show a checkpoint's schemes, quantized layers, skipped layers and provenance.
    Inspect {
        checkpoint: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the built-in recipes.
    Recipes {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Convert {
            src,
            dst,
            overwrite,
        }) => convert(src, dst, overwrite),
        Some(Command::Inspect { checkpoint, json }) => inspect(checkpoint, json),
        Some(Command::Recipes { json }) => recipes(json),
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

fn progress_bar(hidden: bool) -> impl FnMut(&Progress) + Send + 'static {
    let bar = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    move |p: &Progress| {
        let prefix = match p.stage {
            Stage::Hashing => "hashing",
            Stage::Writing => "writing",
        };
        if bar.length() != Some(p.total) {
            bar.set_length(p.total);
            bar.set_prefix(prefix);
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
    if let Some(manifest) = args.calib_manifest {
        q = q.calib_manifest(manifest);
    }
    let started = std::time::Instant::now();
    let outcome = q.on_progress(progress_bar(args.json)).run()?;
    let report = outcome
        .report
        .context("a quantization run returns a report")?;
    if args.json {
        let summary = serde_json::json!({
            "output": outcome.output,
            "recipe": report.recipe,
            "quantized_layers": report.layers.len(),
            "skipped": report.skipped,
            "worst_layer": report.worst_layer(),
            "files_read": outcome.files_read,
            "seconds": started.elapsed().as_secs_f64(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    println!(
        "wrote {} ({} quantized layers, {} skipped) in {:.2} s",
        outcome.output.display(),
        report.layers.len(),
        report.skipped.len(),
        started.elapsed().as_secs_f64()
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

fn recipes(json: bool) -> Result<()> {
    let all = Recipe::built_in();
    if json {
        let list: Vec<_> = all.iter().map(|r| serde_json::json!({"name": r.name, "summary": r.summary, "calibration": r.calibration})).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let width = all.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in &all {
        println!("{:width$}  {}", r.name, r.summary);
    }
    Ok(())
}
