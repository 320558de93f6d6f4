//! The library entry points: [`Quantizer`] (a recipe run, as the CLI and build scripts use it)
//! and [`convert`] (a full-precision export).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::algorithms::gptq::{self, GptqOptions};
use crate::algorithms::static_inputs::{self, StaticInput, StaticInputOptions};
use crate::algorithms::{self, rtn, smoothquant, WorkingTensors};
use crate::calibration::{
    self, AbsHistogram, AbsMaxObserver, BothObservers, CalibrationSet, DecoderPass, GramObserver,
    HistogramObserver, HistogramTarget, Observed, Observer, RowSampleObserver, SharedObservations,
};
use crate::checkpoint::{
    self, Checkpoint, DType, NativeConfig, StagedDir, Tensor, TensorPlan, CONFIG_FILE, REPORT_FILE,
};
use crate::error::{Error, Result};
use crate::export::ExportFormat;
use crate::format::{
    AlgorithmRecord, CalibrationRecord, LayerSpec, ModuleKind, ProducerRecord, QuantDtype,
    QuantizationSpec, SmoothFold, SourceRecord,
};
use crate::manifest::Manifest;
use crate::models::exec::FullPrecision;
use crate::models::registry::layout_of;
use crate::models::{DecodeOptions, QuantizableLayer, QuantizationLayout, SpeechModel};
use crate::recipe::{AlgorithmStep, Recipe};
use crate::report::{LayerReport, QuantizationReport};
use crate::selection;

/// A step of a run, for progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Hashing the source files for provenance.
    Hashing,
    /// Loading the source model for calibration (one unit: the model).
    Loading,
    /// Running calibration utterances through the model (one unit per utterance).
    Calibrating,
    /// The second calibration pass, through the smoothed model, for static input scales.
    CalibratingStatic,
    /// The pass through the smoothed model that records GPTQ's input second moments.
    CalibratingGptq,
    /// Writing tensors (quantizing the selected ones).
    Writing,
}

impl Stage {
    /// The stage as a word, for progress displays.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Hashing => "hashing",
            Stage::Loading => "loading",
            Stage::Calibrating => "calibrating",
            Stage::CalibratingStatic => "calibrating static scales",
            Stage::CalibratingGptq => "calibrating gptq",
            Stage::Writing => "writing",
        }
    }
}

/// A progress report: `done` of `total` units of `stage`, the last one being `item`.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    pub stage: Stage,
    pub done: u64,
    pub total: u64,
    pub item: &'a str,
}

type ProgressFn = Box<dyn FnMut(&Progress) + Send>;

/// What a finished run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The output checkpoint directory.
    pub output: PathBuf,
    /// Every input file read (for `cargo:rerun-if-changed`).
    pub files_read: Vec<PathBuf>,
    /// The report (for a quantized output); `None` for a full-precision export.
    pub report: Option<QuantizationReport>,
}

/// Quantizes a checkpoint with a recipe into an OASR native v2 checkpoint.
///
/// ```no_run
/// let outcome = oasr_quantize::Quantizer::new("whisper-tiny.en", "whisper-tiny.en-int8")
///     .recipe("int8_w8a8_rtn")
///     .ignore("decoder.layers.3.*")
///     .run()?;
/// for file in &outcome.files_read {
///     println!("cargo:rerun-if-changed={}", file.display());
/// }
/// # Ok::<(), oasr_quantize::Error>(())
/// ```
pub struct Quantizer {
    src: PathBuf,
    dst: PathBuf,
    recipe: String,
    options: Vec<String>,
    ignore: Vec<String>,
    quantize_kept: bool,
    module_types: Option<Vec<ModuleKind>>,
    calib_manifest: Option<PathBuf>,
    audio_root: Option<PathBuf>,
    calib_utterances: usize,
    decode_options: DecodeOptions,
    format: Option<ExportFormat>,
    overwrite: bool,
    progress: Option<ProgressFn>,
    shared: Option<SharedObservations>,
    memory_budget: Option<u64>,
}

impl Quantizer {
    pub fn new(src: impl Into<PathBuf>, dst: impl Into<PathBuf>) -> Self {
        Quantizer {
            src: src.into(),
            dst: dst.into(),
            recipe: "int8_w8a8_rtn".into(),
            options: Vec::new(),
            ignore: Vec::new(),
            quantize_kept: false,
            module_types: None,
            calib_manifest: None,
            audio_root: None,
            calib_utterances: calibration::DEFAULT_UTTERANCES,
            decode_options: DecodeOptions::default(),
            format: None,
            overwrite: false,
            progress: None,
            shared: None,
            memory_budget: None,
        }
    }

    /// A built-in recipe name or a path to a recipe file (default `int8_w8a8_rtn`).
    pub fn recipe(mut self, name_or_path: impl Into<String>) -> Self {
        self.recipe = name_or_path.into();
        self
    }

    /// An `algorithm.key=value` override of a recipe option.
    pub fn option(mut self, assignment: impl Into<String>) -> Self {
        self.options.push(assignment.into());
        self
    }

    /// Keeps layers matching the glob full precision (repeatable).
    pub fn ignore(mut self, glob: impl Into<String>) -> Self {
        self.ignore.push(glob.into());
        self
    }

    /// Quantizes the layers the recipe keeps full precision (its `keep_full_precision` globs),
    /// for comparison.
    pub fn quantize_kept(mut self, yes: bool) -> Self {
        self.quantize_kept = yes;
        self
    }

    /// The memory, in bytes, that GPTQ's calibration pass may fill with its Σ x xᵀ matrices
    /// (default: what the system reports available, within the process's cgroup limit, less two
    /// f32 copies of the model). The pass observes fewer utterances at once to stay inside it
    /// (the same bits), and a run where not even one fits is refused before calibration starts.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// Overrides the recipe's module types.
    pub fn module_types(mut self, kinds: Vec<ModuleKind>) -> Self {
        self.module_types = Some(kinds);
        self
    }

    /// The calibration manifest (JSON lines) for recipes that calibrate.
    pub fn calib_manifest(mut self, path: impl Into<PathBuf>) -> Self {
        self.calib_manifest = Some(path.into());
        self
    }

    /// The directory the calibration manifest's audio paths are relative to (default: the
    /// manifest's own directory).
    pub fn audio_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.audio_root = Some(dir.into());
        self
    }

    /// Writes the output in another format than OASR native v2 (`--format`): the run quantizes
    /// as usual, then exports, refusing what the format cannot express before anything is
    /// moved into place.
    pub fn format(mut self, format: Option<ExportFormat>) -> Self {
        self.format = format;
        self
    }

    /// The search calibration decodes with (the architecture's default unless given): use the
    /// options the model will serve with, so the decoder GEMMs see what they serve.
    pub fn decode_options(mut self, options: DecodeOptions) -> Self {
        self.decode_options = options;
        self
    }

    /// How many utterances calibration uses (default 128), evenly strided over the sorted ids.
    pub fn calib_utterances(mut self, count: usize) -> Self {
        self.calib_utterances = count;
        self
    }

    /// Replaces an existing output.
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// Shares the first calibration pass with other runs holding the same store: a run that
    /// finds the full-precision observations of its source on its calibration set (made by an
    /// earlier SmoothQuant run) uses them instead of running the pass again. The outputs are the
    /// same bytes either way. The gate shares one store across its entries.
    pub fn share_observations(mut self, store: SharedObservations) -> Self {
        self.shared = Some(store);
        self
    }

    /// Receives progress reports; the library itself never prints.
    pub fn on_progress(mut self, f: impl FnMut(&Progress) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The recipe with the run's overrides, checked before any work: module types, the
    /// convolution rules, options, and whether calibration audio is needed and given.
    fn resolve(&self) -> Result<(Recipe, RunPlan)> {
        let mut recipe = Recipe::load(&self.recipe)?;
        if let Some(kinds) = &self.module_types {
            recipe.module_types = kinds.clone();
        }
        let convs: Vec<&str> = recipe
            .module_types
            .iter()
            .filter(|k| k.is_spatial_conv())
            .map(|k| k.name())
            .collect();
        if !convs.is_empty() {
            if recipe.scheme.dtype() != QuantDtype::Int8 {
                let message = format!(
                    "{} selected, but convolutions are quantized int8 only and recipe `{}` is {}; \
                     drop the convolution kinds or use an int8 recipe",
                    convs.join(", "),
                    recipe.name,
                    recipe.scheme.dtype()
                );
                return Err(match self.module_types {
                    Some(_) => Error::option("--module-types", message),
                    None => Error::Recipe {
                        name: recipe.name.clone(),
                        message: format!("module_types: {message}"),
                    },
                });
            }
            // A quantized convolution always has a static input scale.
            if !recipe
                .algorithms
                .iter()
                .any(|a| a.name == "static_conv_inputs")
            {
                let at = recipe
                    .algorithms
                    .iter()
                    .position(|a| a.name == "rtn")
                    .unwrap_or(recipe.algorithms.len());
                recipe.algorithms.insert(
                    at,
                    AlgorithmStep {
                        name: "static_conv_inputs".into(),
                        options: BTreeMap::new(),
                    },
                );
            }
        }
        for option in &self.options {
            recipe.set_option(option)?;
        }
        for step in &recipe.algorithms {
            algorithms::check_implemented(&step.name, &recipe.name)?;
        }
        let calibrates = recipe.calibration
            || recipe
                .algorithms
                .iter()
                .any(|a| algorithms::calibrates(&a.name));
        match (calibrates, &self.calib_manifest) {
            (true, None) => {
                let why = if recipe.calibration || convs.is_empty() {
                    format!(
                        "recipe `{}` calibrates and needs a calibration manifest",
                        recipe.name
                    )
                } else {
                    format!(
                        "quantized convolutions ({} in --module-types) need a static input scale \
                         from calibration audio; pass a calibration manifest",
                        convs.join(", ")
                    )
                };
                return Err(Error::option("--calib-manifest", why));
            }
            (false, Some(_)) => {
                return Err(Error::option(
                    "--calib-manifest",
                    format!(
                        "recipe `{}` does not calibrate; drop the manifest",
                        recipe.name
                    ),
                ))
            }
            _ => {}
        }
        if let (false, Some(option)) = (calibrates, self.decode_options.set().first()) {
            return Err(Error::option(
                *option,
                format!(
                    "steers the search calibration decodes with, and recipe `{}` does not \
                     calibrate",
                    recipe.name
                ),
            ));
        }
        let mut plan = RunPlan::default();
        for step in &mut recipe.algorithms {
            match step.name.as_str() {
                "smoothquant" => {
                    let alpha = alpha_option(step, "alpha")?.unwrap_or(smoothquant::DEFAULT_ALPHA);
                    // Recorded as written (0.6, not 0.6000000238 from the f32).
                    let recorded = alpha.to_string().parse::<f64>().unwrap_or(f64::from(alpha));
                    step.options
                        .insert("alpha".into(), serde_json::Value::from(recorded));
                    plan.alpha = Some(alpha);
                    plan.static_alpha = alpha_option(step, "static_alpha")?;
                    plan.smoothing = smoothing_rules(step)?;
                }
                "static_inputs" | "static_conv_inputs" => {
                    let options = StaticInputOptions::parse(&step.name, &step.options)?;
                    // The record shows the effective options (the default observer included).
                    step.options = options.record(&step.name);
                    if step.name == "static_inputs" {
                        plan.static_inputs = Some(options);
                    } else {
                        plan.static_conv_inputs = Some(options);
                    }
                }
                "gptq" => plan.gptq = Some(gptq_options(step)?),
                _ => {}
            }
        }
        Ok((recipe, plan))
    }

    /// Runs the recipe and writes the output atomically: plan, calibrate, write.
    pub fn run(mut self) -> Result<Outcome> {
        let (recipe, options) = self.resolve()?;
        // Before any work, so that a bad destination is refused first.
        let staged = StagedDir::create(&self.dst, self.overwrite, &[&self.src])?;
        let plan = self.plan(recipe, options)?;
        let calibrated = self.calibrate(&plan)?;
        let Some(format) = self.format else {
            let outcome = self.write(&plan, calibrated, staged.path())?;
            return Ok(Outcome {
                output: staged.commit()?,
                ..outcome
            });
        };
        // The native checkpoint is written inside the staging directory, exported beside it,
        // and removed before the output moves into place.
        let native = staged.path().join(".oasr-native");
        std::fs::create_dir(&native).map_err(|e| Error::io(&native, e))?;
        let outcome = self.write(&plan, calibrated, &native)?;
        crate::export::export_into(&native, staged.path(), format)?;
        std::fs::rename(native.join(REPORT_FILE), staged.path().join(REPORT_FILE))
            .map_err(|e| Error::io(&native, e))?;
        std::fs::remove_dir_all(&native).map_err(|e| Error::io(&native, e))?;
        Ok(Outcome {
            output: staged.commit()?,
            ..outcome
        })
    }

    /// Opens the source and decides what the run quantizes: the layers, and those that get a
    /// static input scale.
    fn plan(&mut self, recipe: Recipe, run_plan: RunPlan) -> Result<Planned> {
        let source = Checkpoint::open(&self.src)?;
        if source.is_quantized() {
            return Err(Error::UnknownFormat { path: self.src.clone(), message: "the checkpoint is already quantized (format_version 2); quantize a full-precision one".into() });
        }
        let layout = layout_of(&source)?;
        let dtype = recipe.scheme.dtype();
        let rules = selection::RecipeRules {
            name: &recipe.name,
            module_types: &recipe.module_types,
            keep_full_precision: if self.quantize_kept {
                &[]
            } else {
                &recipe.keep_full_precision
            },
        };
        let selection = selection::select(
            &layout,
            rules,
            &self.ignore,
            dtype,
            run_plan.static_conv_inputs.is_some() && self.calib_manifest.is_some(),
        )?;
        let quantized: HashSet<String> =
            selection.selected.iter().map(|l| l.name.clone()).collect();
        // The layers that get a static input scale, with their observer options.
        let mut static_layers: BTreeMap<String, StaticInputOptions> = BTreeMap::new();
        let mut chain_consumers = HashSet::new();
        if let Some(o) = &run_plan.static_inputs {
            for consumer in static_inputs::chain_consumers(&layout, &quantized, o)? {
                chain_consumers.insert(consumer.clone());
                static_layers.insert(consumer, o.clone());
            }
        }
        if let Some(o) = &run_plan.static_conv_inputs {
            for conv in selection
                .selected
                .iter()
                .filter(|l| l.kind.is_spatial_conv())
            {
                static_layers.insert(conv.name.clone(), o.clone());
            }
        }
        let source_files = hash_files(&source, &mut self.progress)?;
        let files_read = source.files_read.clone();

        Ok(Planned {
            recipe,
            options: run_plan,
            source,
            layout,
            selection,
            quantized,
            static_layers,
            chain_consumers,
            source_files,
            files_read,
        })
    }

    /// Runs the calibration passes the recipe needs: SmoothQuant's statistics and folds from the
    /// first, the static input scales from the second (or from the first when smoothing does not
    /// change their inputs). Without a calibration manifest, nothing runs.
    fn calibrate<'p>(&mut self, plan: &'p Planned) -> Result<Calibrated<'p>> {
        let Planned {
            recipe,
            options: run_plan,
            source,
            layout,
            quantized,
            static_layers,
            chain_consumers,
            selection,
            ..
        } = plan;
        let dtype = recipe.scheme.dtype();
        let mut files_read = Vec::new();
        let mut grams = GramObserver::default();
        let mut working = WorkingTensors::new(source);
        let mut smoothing = Smoothing::default();
        let mut statics: BTreeMap<String, StaticInput> = BTreeMap::new();
        let mut declined: BTreeMap<String, StaticInput> = BTreeMap::new();
        let mut calibration_record = None;
        // GPTQ's layers, and how many utterances its pass may hold at once; decided before any
        // pass runs, so a run that cannot fit is refused at once.
        let gptq_layers: Vec<&QuantizableLayer> = match run_plan.gptq {
            Some(_) => selection
                .selected
                .iter()
                .filter(|l| !l.kind.is_spatial_conv())
                .collect(),
            None => Vec::new(),
        };
        let gram_workers = if gptq_layers.is_empty() || self.calib_manifest.is_none() {
            None
        } else {
            Some(gram_pass_workers(
                recipe,
                &gptq_layers,
                source,
                self.memory_budget,
            )?)
        };
        if let Some(manifest_path) = &self.calib_manifest {
            let manifest = Manifest::read(manifest_path, self.audio_root.as_deref())?;
            report(&mut self.progress, Stage::Loading, 0, 1, "model");
            let t = crate::models::load_with(source, &self.decode_options)?;
            report(&mut self.progress, Stage::Loading, 1, 1, "model");
            let mut set =
                CalibrationSet::select(&manifest, self.calib_utterances, t.sample_rate())?;
            set.record.decoding = t.decode_options_record();
            files_read.push(manifest_path.clone());
            files_read.extend(set.utterances.iter().map(|u| u.audio.clone()));
            // Each static layer: the smoother its input is multiplied by, the weights of its
            // input channels (so the clip search measures the error at the layer's output), and
            // its options.
            let targets_of = |working: &WorkingTensors, smooth_inv: &BTreeMap<String, Vec<f32>>| {
                let mut targets: BTreeMap<String, HistogramTarget> = BTreeMap::new();
                for layer in static_layers.keys() {
                    let name = format!("{layer}.weight");
                    let w = working.get(&name)?;
                    let cols = working.shape(&name)?.iter().skip(1).product::<usize>();
                    targets.insert(
                        layer.clone(),
                        HistogramTarget {
                            smooth_inv: smooth_inv.get(layer).cloned(),
                            channel_weights: Some(calibration::channel_weights(&w, cols)),
                            per_token: chain_consumers.contains(layer).then_some(dtype),
                        },
                    );
                }
                Ok::<_, Error>(targets)
            };
            // When smoothing changes neither a static layer's weights nor its smoother (it
            // consumes no smoothed group), its input is the same in the smoothed model as in the
            // full-precision one (the folds upstream preserve the function), so one pass
            // observes both what smoothing and what the static scales need.
            let smoothed_consumers = match run_plan.alpha {
                Some(_) => smoothquant::smoothed_consumers(layout, quantized, run_plan.smoothing),
                None => HashSet::new(),
            };
            let one_pass = run_plan.alpha.is_some()
                && static_layers
                    .keys()
                    .all(|l| !smoothed_consumers.contains(l));
            let early_targets = if one_pass {
                targets_of(&working, &BTreeMap::new())?
            } else {
                BTreeMap::new()
            };
            let mut histograms: Option<HistogramObserver> = None;
            // Pass 1 (its transcripts, so pass 2 scores them instead of decoding again).
            let mut first_pass: Option<Arc<Observed<AbsMaxObserver>>> = None;
            let mut groups = Vec::new();
            let mut samples: Option<RowSampleObserver> = None;
            let mut searched = Vec::new();
            if let Some(alpha) = run_plan.alpha {
                let pass_1 = |progress: &mut Option<ProgressFn>| {
                    calibration_pass(
                        progress,
                        Stage::Calibrating,
                        t.as_ref(),
                        &set,
                        DecoderPass::Decode,
                        || FullPrecision,
                        AbsMaxObserver::default,
                        usize::MAX,
                    )
                };
                let search_layers =
                    smoothquant::searched_inputs(layout, quantized, run_plan.smoothing);
                let pass = if !search_layers.is_empty() {
                    // The search measures each group on sampled input rows, so pass 1 keeps
                    // some (it is then this run's own, not shared with other gate entries).
                    let (pass, rows) =
                        first_pass_with(&mut self.progress, t.as_ref(), &set, || {
                            RowSampleObserver::new(
                                search_layers.iter().cloned(),
                                run_plan.smoothing.search_rows,
                            )
                        })?;
                    samples = Some(rows);
                    pass
                } else if !early_targets.is_empty() {
                    let (pass, observed) =
                        first_pass_with(&mut self.progress, t.as_ref(), &set, || {
                            HistogramObserver::new(&early_targets)
                        })?;
                    histograms = Some(observed);
                    pass
                } else if let Some(shared) = self.shared.clone() {
                    let progress = &mut self.progress;
                    let (pass, reused) = shared.get_or_run(&self.src, &set, || pass_1(progress))?;
                    if reused {
                        let total = set.utterances.len() as u64;
                        report(progress, Stage::Calibrating, total, total, "(shared)");
                    }
                    pass
                } else {
                    Arc::new(pass_1(&mut self.progress)?)
                };
                let observed = &pass.observer;
                first_pass = Some(pass.clone());
                // A group whose consumers all take a static scale migrates with its own α: a
                // per-tensor scale suffers more from outlier channels than a per-token one.
                let static_alpha = run_plan.static_alpha.unwrap_or(alpha);
                let alpha_of = |consumers: &[String]| {
                    if consumers.iter().all(|c| static_layers.contains_key(c)) {
                        static_alpha
                    } else {
                        alpha
                    }
                };
                let search = samples.as_ref().map(|rows| smoothquant::SearchInput {
                    rows,
                    dtype,
                    static_consumers: static_layers.keys().cloned().collect(),
                });
                let planned = smoothquant::plan_with(
                    layout,
                    quantized,
                    observed,
                    &working,
                    alpha_of,
                    run_plan.smoothing,
                    search.as_ref(),
                )?;
                groups = planned.groups;
                searched = planned.searched;
            }
            // Once smoothing folds, nothing runs the full-precision forward again (pass 2 runs
            // the smoothed model), so its f32 weights go before the working copy grows.
            let forward = if groups.is_empty() {
                Some(t)
            } else {
                drop(t);
                let smooth_inv = smoothquant::apply(&groups, &mut working)?;
                smoothing = Smoothing {
                    groups,
                    smooth_inv,
                    ..Smoothing::default()
                };
                None
            };
            smoothing.searched = searched;
            let late_targets = if histograms.is_none() {
                targets_of(&working, &smoothing.smooth_inv)?
            } else {
                BTreeMap::new()
            };
            // The later passes run the smoothed model, so each statistic is of the input the
            // quantized layer will see (before its runtime smoother, if any).
            let smoothed_model = match &forward {
                None if !late_targets.is_empty() || run_plan.gptq.is_some() => {
                    Some(crate::models::load_with(
                        &smoothed_checkpoint(source, &working, quantized),
                        &self.decode_options,
                    )?)
                }
                _ => None,
            };
            let late_model = forward.as_deref().or(smoothed_model.as_deref());
            let smooth_inv = &smoothing.smooth_inv;
            // A later pass runs the decoder only when it observes a layer there, and then scores
            // pass 1's transcripts (the smoothed model computes the same function).
            let decoder_for = |observes_decoder: bool| {
                if !observes_decoder {
                    DecoderPass::Skip
                } else if let Some(pass) = &first_pass {
                    DecoderPass::Tokens(&pass.tokens)
                } else {
                    DecoderPass::Decode
                }
            };
            if let (false, Some(model)) = (late_targets.is_empty(), late_model) {
                histograms = Some(
                    calibration_pass(
                        &mut self.progress,
                        Stage::CalibratingStatic,
                        model,
                        &set,
                        decoder_for(late_targets.keys().any(|l| layout.in_decode_step(l))),
                        || smoothquant::RuntimeSmoothedExec { smooth_inv },
                        || HistogramObserver::new(&late_targets),
                        usize::MAX,
                    )?
                    .observer,
                );
            }
            if let (Some(workers), Some(model)) = (gram_workers, late_model) {
                // GPTQ weighs each linear layer's rounding error by its inputs (a convolution's
                // input is not a GEMM input here; it keeps RTN).
                let layers: Vec<String> = gptq_layers.iter().map(|l| l.name.clone()).collect();
                // At most `workers` utterances in flight, as many as their Σ x xᵀ fit: the bits
                // are the same (observers merge in utterance order), only memory and speed
                // differ.
                grams = calibration_pass(
                    &mut self.progress,
                    Stage::CalibratingGptq,
                    model,
                    &set,
                    decoder_for(layers.iter().any(|l| layout.in_decode_step(l))),
                    || smoothquant::RuntimeSmoothedExec { smooth_inv },
                    || GramObserver::new(layers.iter().cloned()),
                    workers,
                )?
                .observer;
                // A runtime smoother multiplies the observed input by 1/s per channel.
                for (layer, inv) in smooth_inv {
                    grams.scale_channels(layer, inv);
                }
            }
            if let Some(observed) = histograms {
                let empty = AbsHistogram::default();
                for (layer, o) in static_layers {
                    let hist = observed.histograms.get(layer).unwrap_or(&empty);
                    let s = static_inputs::static_input(layer, hist, o, dtype)?;
                    // A consumer whose static quantize would cost too much more than its
                    // per-token one keeps the per-token input (its chain then does not arm).
                    let too_costly = matches!(
                        (s.error_vs_per_token, o.max_error_ratio),
                        (Some(r), Some(max)) if r > max
                    );
                    if too_costly {
                        declined.insert(layer.clone(), s);
                    } else {
                        statics.insert(layer.clone(), s);
                    }
                }
            }
            calibration_record = Some(set.record);
        }

        Ok(Calibrated {
            working,
            smoothing,
            grams,
            statics,
            declined,
            record: calibration_record,
            files_read,
        })
    }

    /// Quantizes every selected weight while streaming `model.safetensors` into the staging
    /// directory, then writes the config, tokenizer and report, and renames the directory into
    /// place.
    fn write(&mut self, plan: &Planned, calibrated: Calibrated<'_>, dir: &Path) -> Result<Outcome> {
        let Planned {
            recipe,
            options: run_plan,
            source,
            layout,
            selection,
            source_files,
            files_read,
            ..
        } = plan;
        let Calibrated {
            working,
            smoothing,
            mut grams,
            statics,
            declined,
            record: calibration_record,
            files_read: calibration_files,
        } = calibrated;
        let mut files_read = files_read.clone();
        files_read.extend(calibration_files);
        let dtype = recipe.scheme.dtype();
        let mut layers = BTreeMap::new();
        for layer in &selection.selected {
            let (smooth, smoothed_into) = smoothing
                .of(&layer.name)
                .map_or((SmoothFold::None, None), |g| {
                    (g.fold, g.smoothed_into.clone())
                });
            let is_static = statics.contains_key(&layer.name);
            if layer.kind.is_spatial_conv() && !is_static {
                return Err(Error::LayerRefused {
                    layer: layer.name.clone(),
                    reason: "a quantized convolution needs a static input scale, and none was \
                             calibrated"
                        .into(),
                });
            }
            layers.insert(
                layer.name.clone(),
                LayerSpec {
                    scheme: recipe.scheme.with_static_input(is_static),
                    kind: layer.kind,
                    smooth,
                    smoothed_into,
                    input_quantized_by: None,
                },
            );
        }
        let links = crate::links::arm(layout, &mut layers);

        let selected: HashMap<String, &QuantizableLayer> = selection
            .selected
            .iter()
            .map(|l| (format!("{}.weight", l.name), l))
            .collect();
        let mut plan = BTreeMap::new();
        let mut add = |name: String, dtype: DType, shape: Vec<usize>| {
            plan.insert(name.clone(), TensorPlan { name, dtype, shape });
        };
        for (name, t) in &source.tensors {
            add(name.clone(), t.dtype, t.shape.clone());
            if let Some(layer) = selected.get(name) {
                add(name.clone(), code_dtype(dtype), t.shape.clone());
                add(
                    format!("{}.weight_scale", layer.name),
                    DType::F32,
                    vec![layer.out_features],
                );
                if let Some(inv) = smoothing.smooth_inv.get(&layer.name) {
                    add(
                        format!("{}.smooth_inv", layer.name),
                        DType::F32,
                        vec![inv.len()],
                    );
                }
                if statics.contains_key(&layer.name) {
                    add(format!("{}.input_scale", layer.name), DType::F32, vec![1]);
                }
            }
        }

        let mut reports = Vec::new();
        let mut scales: HashMap<String, Vec<f32>> = HashMap::new();
        let total = plan.len() as u64;
        let mut done = 0u64;
        let progress = &mut self.progress;
        report(progress, Stage::Writing, 0, total, "");
        let fingerprint = checkpoint::write_weights(dir, plan.into_values().collect(), |entry| {
            done += 1;
            if let Some(f) = progress.as_mut() {
                f(&Progress {
                    stage: Stage::Writing,
                    done,
                    total,
                    item: &entry.name,
                });
            }
            if let Some(layer) = selected.get(&entry.name) {
                let n = layer.out_features;
                let w = working.get(&entry.name)?;
                let k = w.len() / n;
                let gram = grams.take(&layer.name);
                let (q, gptq_errors) = match (run_plan.gptq, gram) {
                    (Some(options), Some((gram, rows))) => {
                        let g = gptq::quantize_weight(
                            &layer.name,
                            &w,
                            n,
                            k,
                            dtype,
                            &gram,
                            rows,
                            options,
                        )?;
                        (g.weight, Some((g.output_error, g.rtn_output_error)))
                    }
                    _ => (rtn::quantize_weight(&w, n, k, dtype), None),
                };
                let group = smoothing.of(&layer.name);
                let (scale_min, scale_max) = min_max(&q.scales);
                let factors = group.map(|g| min_max(&g.factors));
                let absmax = group.map(|g| min_max(&g.input_absmax));
                reports.push(LayerReport {
                    name: layer.name.clone(),
                    scheme: layers[&layer.name].scheme,
                    kind: layer.kind,
                    shape: entry.shape.clone(),
                    weight_scale_min: scale_min,
                    weight_scale_max: scale_max,
                    relative_weight_error: q.relative_error,
                    smooth: group.map_or(SmoothFold::None, |g| g.fold),
                    smoothed_into: group.and_then(|g| g.smoothed_into.clone()),
                    smoothing_alpha: group.map(|g| g.alpha),
                    smoothing_factor_min: factors.map(|r| r.0),
                    smoothing_factor_max: factors.map(|r| r.1),
                    input_absmax_min: absmax.map(|r| r.0),
                    input_absmax_max: absmax.map(|r| r.1),
                    static_input: statics.get(&layer.name).cloned(),
                    static_input_declined: declined.get(&layer.name).cloned(),
                    gptq_output_error: gptq_errors.map(|e| e.0),
                    rtn_output_error: gptq_errors.map(|e| e.1),
                });
                scales.insert(layer.name.clone(), q.scales);
                return Ok(Tensor::from_bytes(
                    entry.dtype,
                    entry.shape.clone(),
                    q.codes,
                ));
            }
            if let Some(layer) = entry.name.strip_suffix(".weight_scale") {
                if let Some(s) = scales.remove(layer) {
                    return Ok(Tensor::from_f32(entry.shape.clone(), &s));
                }
            }
            if let Some(layer) = entry.name.strip_suffix(".smooth_inv") {
                if let Some(inv) = smoothing.smooth_inv.get(layer) {
                    return Ok(Tensor::from_f32(entry.shape.clone(), inv));
                }
            }
            if let Some(layer) = entry.name.strip_suffix(".input_scale") {
                if let Some(s) = statics.get(layer) {
                    return Ok(Tensor::from_f32(entry.shape.clone(), &[s.input_scale]));
                }
            }
            let source_tensor = source
                .tensors
                .get(&entry.name)
                .ok_or_else(|| Error::tensor(&self.src, &entry.name, "planned but not produced"))?;
            Ok(match working.changed(&entry.name) {
                // A folded parameter, stored back in the source's dtype.
                Some(values) => Tensor::from_f32(entry.shape.clone(), values)
                    .to_float_dtype(source_tensor.dtype),
                None => source_tensor.clone(),
            })
        })?;

        let spec = QuantizationSpec {
            schemes: layers
                .values()
                .map(|l| (l.scheme.name().to_string(), l.scheme.args()))
                .collect(),
            kv_cache: recipe.kv_cache.clone(),
            module_types: recipe.module_types.clone(),
            layers,
            links,
            producer: ProducerRecord {
                name: env!("CARGO_PKG_NAME").into(),
                version: env!("CARGO_PKG_VERSION").into(),
                recipe: recipe.name.clone(),
                algorithms: recipe
                    .algorithms
                    .iter()
                    .map(|a| AlgorithmRecord {
                        name: a.name.clone(),
                        options: a.options.clone(),
                    })
                    .collect(),
                calibration: calibration_record,
                source: SourceRecord {
                    format: source.format.name().into(),
                    files: source_files.clone(),
                },
                skipped: selection.skipped.clone(),
                fingerprint,
            },
        };
        spec.validate()?;
        // Diagnostics only (verify --per-layer): the s of every group whose 1/s was folded into
        // another module, which the checkpoint's tensors no longer show.
        checkpoint::write_smoothing_factors(dir, &smoothing.folded_factors())?;
        let mut config = source.config.clone();
        config.format_version = 2;
        config.quantization = Some(spec);
        write_config_and_tokenizer(dir, source, config)?;
        let report = QuantizationReport {
            recipe: recipe.name.clone(),
            source_format: source.format.name().into(),
            layers: reports,
            skipped: selection.skipped.clone(),
            kept_full_precision: layout.kept_full_precision.iter().cloned().collect(),
            smoothing_search: smoothing.searched.clone(),
        };
        checkpoint::write_json(&dir.join(REPORT_FILE), &report)?;
        Ok(Outcome {
            output: dir.to_path_buf(),
            files_read,
            report: Some(report),
        })
    }
}

/// Pass 1 (the full-precision model decoding, per-channel max |x| observed) with a second
/// observer beside it: the pass and what the second one observed.
fn first_pass_with<O: Observer>(
    progress: &mut Option<ProgressFn>,
    t: &dyn SpeechModel,
    set: &CalibrationSet,
    second: impl Fn() -> O + Sync,
) -> Result<(Arc<Observed<AbsMaxObserver>>, O)> {
    let both: Observed<BothObservers<AbsMaxObserver, O>> = calibration_pass(
        progress,
        Stage::Calibrating,
        t,
        set,
        DecoderPass::Decode,
        || FullPrecision,
        || BothObservers {
            first: AbsMaxObserver::default(),
            second: second(),
        },
        usize::MAX,
    )?;
    let pass = Observed {
        observer: both.observer.first,
        tokens: both.tokens,
    };
    Ok((Arc::new(pass), both.observer.second))
}

/// One calibration pass over the set with fresh observers per utterance, merged, at most
/// `in_flight` utterances at once; progress is reported as `stage`.
#[allow(clippy::too_many_arguments)] // what the pass runs and observes, by name
fn calibration_pass<O, E>(
    progress: &mut Option<ProgressFn>,
    stage: Stage,
    t: &dyn SpeechModel,
    set: &CalibrationSet,
    decoder: DecoderPass<'_>,
    exec: impl Fn() -> E + Sync,
    observer: impl Fn() -> O + Sync,
    in_flight: usize,
) -> Result<Observed<O>>
where
    O: calibration::Observer,
    E: crate::models::exec::LinearExec,
{
    let total = set.utterances.len() as u64;
    report(progress, stage, 0, total, "");
    let sink = Mutex::new(progress);
    calibration::observe_in_flight(t, set, decoder, exec, observer, in_flight, |done, _, id| {
        if let Ok(mut progress) = sink.lock() {
            report(&mut progress, stage, done as u64, total, id);
        }
    })
}

/// How many utterances GPTQ's calibration pass may observe at once (each holds the Σ x xᵀ of
/// every layer), within `budget` or else what the system has less two f32 copies of the model
/// (the pass runs the smoothed model in f32, and the source's tensors are mapped beside it).
fn gram_pass_workers(
    recipe: &Recipe,
    layers: &[&QuantizableLayer],
    source: &Checkpoint,
    budget: Option<u64>,
) -> Result<usize> {
    let per_copy = calibration::gram_bytes(layers.iter().map(|l| l.in_features));
    let model_f32: u64 = source.tensors.values().map(|t| t.numel() as u64 * 4).sum();
    let available =
        budget.or_else(|| calibration::available_memory().map(|a| a.saturating_sub(2 * model_f32)));
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    calibration::gram_workers(per_copy, rayon::current_num_threads(), available).ok_or_else(|| {
        Error::Recipe {
            name: recipe.name.clone(),
            message: format!(
                "gptq: the Σ x xᵀ of its {} layers take {:.2} GiB per copy and the pass needs \
                 three copies in three quarters of the memory, but {:.2} GiB is available for \
                 them (beside two f32 copies of the model); end the recipe in `rtn` instead, or \
                 select fewer layers (--ignore)",
                layers.len(),
                gib(per_copy),
                gib(available.unwrap_or(0)),
            ),
        }
    })
}

fn report(progress: &mut Option<ProgressFn>, stage: Stage, done: u64, total: u64, item: &str) {
    if let Some(f) = progress.as_mut() {
        f(&Progress {
            stage,
            done,
            total,
            item,
        });
    }
}

/// The smoothed full-precision model the second calibration pass runs: parameters that absorbed
/// 1/s as the checkpoint stores them (in the source dtype), the quantized layers' weights W·s in
/// f32.
fn smoothed_checkpoint(
    source: &Checkpoint,
    working: &WorkingTensors,
    quantized: &HashSet<String>,
) -> Checkpoint {
    let mut out = source.clone();
    for (name, values) in working.changed_tensors() {
        let Some(t) = source.tensors.get(name) else {
            continue;
        };
        let values = Tensor::from_f32(t.shape.clone(), values);
        let is_weight = name
            .strip_suffix(".weight")
            .is_some_and(|layer| quantized.contains(layer));
        let stored = if is_weight {
            values
        } else {
            values.to_float_dtype(t.dtype)
        };
        out.tensors.insert(name.to_string(), stored);
    }
    out
}

/// A SmoothQuant migration strength option, checked to lie in (0, 1).
fn alpha_option(step: &AlgorithmStep, key: &str) -> Result<Option<f32>> {
    let Some(v) = step.options.get(key) else {
        return Ok(None);
    };
    let option = format!("{}.{key}", step.name);
    let alpha = v
        .as_f64()
        .ok_or_else(|| Error::option(&option, format!("{v} is not a number")))?;
    if !(alpha > 0.0 && alpha < 1.0) {
        return Err(Error::option(option, format!("{alpha} is outside (0, 1)")));
    }
    Ok(Some(alpha as f32))
}

/// GPTQ's `damp` (in (0, 1]) and `act_order` (bool) options.
fn gptq_options(step: &AlgorithmStep) -> Result<GptqOptions> {
    let mut options = GptqOptions::default();
    if let Some(v) = step.options.get("damp") {
        match v.as_f64() {
            Some(d) if d > 0.0 && d <= 1.0 => options.damp = d,
            _ => {
                return Err(Error::option(
                    "gptq.damp",
                    format!("{v} is not a number in (0, 1]"),
                ))
            }
        }
    }
    if let Some(v) = step.options.get("act_order") {
        options.act_order = v
            .as_bool()
            .ok_or_else(|| Error::option("gptq.act_order", format!("{v} is not true or false")))?;
    }
    Ok(options)
}

/// SmoothQuant's `runtime` (bool) and `floor` (in [0, 1)) options.
fn smoothing_rules(step: &AlgorithmStep) -> Result<smoothquant::SmoothingRules> {
    let mut rules = smoothquant::SmoothingRules::default();
    if let Some(v) = step.options.get("runtime") {
        rules.runtime = v.as_bool().ok_or_else(|| {
            Error::option("smoothquant.runtime", format!("{v} is not true or false"))
        })?;
    }
    if let Some(v) = step.options.get("shared_folds") {
        rules.shared_folds = v.as_bool().ok_or_else(|| {
            Error::option(
                "smoothquant.shared_folds",
                format!("{v} is not true or false"),
            )
        })?;
    }
    if let Some(v) = step.options.get("search") {
        rules.search = v
            .as_str()
            .and_then(smoothquant::AlphaSearch::from_name)
            .ok_or_else(|| {
                Error::option(
                    "smoothquant.search",
                    format!("{v} is not one of \"off\", \"decline\", \"grid\""),
                )
            })?;
    }
    if let Some(v) = step.options.get("search_rows") {
        match v.as_u64() {
            Some(n) if n >= 1 => rules.search_rows = n as usize,
            _ => {
                return Err(Error::option(
                    "smoothquant.search_rows",
                    format!("{v} is not a whole number >= 1"),
                ))
            }
        }
    }
    if rules.search == smoothquant::AlphaSearch::Off && step.options.contains_key("search_rows") {
        return Err(Error::option(
            "smoothquant.search_rows",
            "applies only with smoothquant.search = \"decline\" or \"grid\"",
        ));
    }
    if let Some(v) = step.options.get("floor") {
        match v.as_f64() {
            Some(f) if (0.0..1.0).contains(&f) => rules.floor = f as f32,
            _ => {
                return Err(Error::option(
                    "smoothquant.floor",
                    format!("{v} is not a number in [0, 1)"),
                ))
            }
        }
    }
    Ok(rules)
}

/// What a run decided before calibrating: the recipe, the source and what it quantizes.
struct Planned {
    recipe: Recipe,
    options: RunPlan,
    source: Checkpoint,
    layout: QuantizationLayout,
    selection: selection::Selection,
    quantized: HashSet<String>,
    /// The layers that get a static input scale, with their observer options.
    static_layers: BTreeMap<String, StaticInputOptions>,
    /// GEMM-chain consumers among them (their error is measured against per-token input).
    chain_consumers: HashSet<String>,
    /// sha256 of every source file, by relative path.
    source_files: BTreeMap<String, String>,
    /// The source's files.
    files_read: Vec<PathBuf>,
}

/// What calibration produced: the f32 tensors the folds changed, the smoothing, and the static
/// input scales kept and declined.
struct Calibrated<'a> {
    working: WorkingTensors<'a>,
    smoothing: Smoothing,
    /// GPTQ's Σ x xᵀ per linear layer (empty unless the recipe runs `gptq`).
    grams: GramObserver,
    statics: BTreeMap<String, StaticInput>,
    declined: BTreeMap<String, StaticInput>,
    record: Option<CalibrationRecord>,
    /// The calibration manifest and the audio it selected.
    files_read: Vec<PathBuf>,
}

/// What the recipe's algorithms need, parsed and validated before any work.
#[derive(Default)]
struct RunPlan {
    /// SmoothQuant's α, when it runs.
    alpha: Option<f32>,
    /// SmoothQuant's α for groups whose consumers all take a static input scale.
    static_alpha: Option<f32>,
    smoothing: smoothquant::SmoothingRules,
    static_inputs: Option<StaticInputOptions>,
    static_conv_inputs: Option<StaticInputOptions>,
    /// GPTQ's options, when it quantizes the weights.
    gptq: Option<GptqOptions>,
}

/// The smallest and largest value.
fn min_max(v: &[f32]) -> (f32, f32) {
    v.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

fn code_dtype(dtype: QuantDtype) -> DType {
    match dtype {
        QuantDtype::Int8 => DType::I8,
        QuantDtype::Float8E4m3fn => DType::F8E4m3,
    }
}

/// The smoothing a run applied: its groups, and the runtime smoothers by consumer.
#[derive(Default)]
struct Smoothing {
    groups: Vec<smoothquant::SmoothedGroup>,
    smooth_inv: BTreeMap<String, Vec<f32>>,
    /// What `smoothquant.search` measured per group.
    searched: Vec<smoothquant::GroupSearch>,
}

impl Smoothing {
    /// The factors of every group whose 1/s went into another module (a norm's affine, a V
    /// projection's or producer's rows), by that module.
    fn folded_factors(&self) -> BTreeMap<String, Vec<f32>> {
        self.groups
            .iter()
            .filter(|g| {
                matches!(
                    g.fold,
                    SmoothFold::NormAffine | SmoothFold::VToO | SmoothFold::ProducerRows
                )
            })
            .filter_map(|g| Some((g.smoothed_into.clone()?, g.factors.clone())))
            .collect()
    }

    /// The group that smoothed a layer's input, if any.
    fn of(&self, layer: &str) -> Option<&smoothquant::SmoothedGroup> {
        self.groups
            .iter()
            .find(|g| g.consumers.iter().any(|c| c == layer))
    }
}

/// Imports any supported checkpoint into an OASR native v1 checkpoint with f32 weights.
pub fn convert(src: &Path, dst: &Path, overwrite: bool) -> Result<Outcome> {
    let staged = StagedDir::create(dst, overwrite, &[src])?;
    let source = Checkpoint::open(src)?;
    if source.is_quantized() {
        return Err(Error::UnknownFormat { path: src.into(), message: "the checkpoint is quantized (format_version 2); convert exports full precision only".into() });
    }
    let plan = source
        .tensors
        .iter()
        .map(|(name, t)| TensorPlan {
            name: name.clone(),
            dtype: if t.dtype.is_float() {
                DType::F32
            } else {
                t.dtype
            },
            shape: t.shape.clone(),
        })
        .collect();
    checkpoint::write_weights(staged.path(), plan, |entry| {
        let t = &source.tensors[&entry.name];
        Ok(if t.dtype.is_float() {
            t.to_float_dtype(DType::F32)
        } else {
            t.clone()
        })
    })?;
    let mut config = source.config.clone();
    config.format_version = 1;
    write_config_and_tokenizer(staged.path(), &source, config)?;
    let output = staged.commit()?;
    Ok(Outcome {
        output,
        files_read: source.files_read,
        report: None,
    })
}

fn write_config_and_tokenizer(
    dir: &Path,
    source: &Checkpoint,
    mut config: NativeConfig,
) -> Result<()> {
    let copied = checkpoint::copy_tokenizer(dir, &source.tokenizer_files)?;
    if let Some(tokenizer) = config.tokenizer.as_mut() {
        tokenizer.files = copied;
    }
    checkpoint::write_json(&dir.join(CONFIG_FILE), &config)
}

/// sha256 of every source file, keyed by its path relative to the source directory; the files
/// in parallel (a sharded source's shards at once).
fn hash_files(
    source: &Checkpoint,
    progress: &mut Option<ProgressFn>,
) -> Result<BTreeMap<String, String>> {
    let total = source.files_read.len() as u64;
    if let Some(f) = progress.as_mut() {
        // The bar shows from the start, before the first file (of a single-file source) is done.
        f(&Progress {
            stage: Stage::Hashing,
            done: 0,
            total,
            item: "",
        });
    }
    let done = Mutex::new((0u64, progress));
    source
        .files_read
        .par_iter()
        .map(|path| {
            let name = path
                .strip_prefix(&source.dir)
                .unwrap_or(path)
                .to_string_lossy()
                .into_owned();
            let hash = crate::hashing::sha256_file(path)?;
            let mut guard = done.lock().unwrap_or_else(|p| p.into_inner());
            let (n, progress) = &mut *guard;
            *n += 1;
            if let Some(f) = progress.as_mut() {
                f(&Progress {
                    stage: Stage::Hashing,
                    done: *n,
                    total,
                    item: &name,
                });
            }
            Ok((name, hash))
        })
        .collect()
}
