//! The library entry points: [`Quantizer`] (a recipe run, as the CLI and build scripts use it)
//! and [`convert`] (a full-precision export).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::algorithms::{self, rtn};
use crate::checkpoint::{
    self, Checkpoint, DType, NativeConfig, StagedDir, Tensor, TensorPlan, CONFIG_FILE, REPORT_FILE,
};
use crate::error::{Error, Result};
use crate::format::{
    AlgorithmRecord, LayerSpec, ModuleKind, ProducerRecord, QuantDtype, QuantizationSpec,
    SmoothFold, SourceRecord,
};
use crate::models::{self, QuantizableLayer, QuantizationLayout};
use crate::recipe::Recipe;
use crate::report::{LayerReport, QuantizationReport};
use crate::selection;

/// A step of a run, for progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Hashing the source files for provenance.
    Hashing,
    /// Writing tensors (quantizing the selected ones).
    Writing,
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
    module_types: Option<Vec<ModuleKind>>,
    calib_manifest: Option<PathBuf>,
    overwrite: bool,
    progress: Option<ProgressFn>,
}

impl Quantizer {
    pub fn new(src: impl Into<PathBuf>, dst: impl Into<PathBuf>) -> Self {
        Quantizer {
            src: src.into(),
            dst: dst.into(),
            recipe: "int8_w8a8_rtn".into(),
            options: Vec::new(),
            ignore: Vec::new(),
            module_types: None,
            calib_manifest: None,
            overwrite: false,
            progress: None,
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

    /// Replaces an existing output.
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// Receives progress reports; the library itself never prints.
    pub fn on_progress(mut self, f: impl FnMut(&Progress) + Send + 'static) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// Runs the recipe and writes the output atomically.
    pub fn run(mut self) -> Result<Outcome> {
        let mut recipe = Recipe::load(&self.recipe)?;
        for option in &self.options {
            recipe.set_option(option)?;
        }
        if let Some(kinds) = &self.module_types {
            recipe.module_types = kinds.clone();
        }
        if recipe.calibration && self.calib_manifest.is_none() {
            return Err(Error::option(
                "--calib-manifest",
                format!(
                    "recipe `{}` calibrates and needs a calibration manifest",
                    recipe.name
                ),
            ));
        }
        for step in &recipe.algorithms {
            algorithms::check_implemented(&step.name, &recipe.name)?;
        }
        if self.calib_manifest.is_some() && !recipe.calibration {
            return Err(Error::option(
                "--calib-manifest",
                format!(
                    "recipe `{}` does not calibrate; drop the manifest",
                    recipe.name
                ),
            ));
        }
        let staged = StagedDir::create(&self.dst, self.overwrite, &[&self.src])?;
        let source = Checkpoint::open(&self.src)?;
        if source.is_quantized() {
            return Err(Error::UnknownFormat { path: self.src.clone(), message: "the checkpoint is already quantized (format_version 2); quantize a full-precision one".into() });
        }
        let layout = layout_of(&source)?;
        let dtype = recipe.scheme.dtype();
        let selection =
            selection::select(&layout, &recipe.module_types, &self.ignore, dtype, false)?;
        let source_files = hash_files(&source, &mut self.progress)?;

        let mut layers = BTreeMap::new();
        for layer in &selection.selected {
            layers.insert(
                layer.name.clone(),
                LayerSpec {
                    scheme: recipe.scheme,
                    kind: layer.kind,
                    smooth: SmoothFold::None,
                    smoothed_into: None,
                    input_quantized_by: None,
                },
            );
        }
        let links = crate::links::arm(&layout, &mut layers);

        let selected: HashMap<String, &QuantizableLayer> = selection
            .selected
            .iter()
            .map(|l| (format!("{}.weight", l.name), l))
            .collect();
        let mut plan = BTreeMap::new();
        for (name, t) in &source.tensors {
            match selected.get(name) {
                Some(layer) => {
                    let code_dtype = if dtype == QuantDtype::Int8 {
                        DType::I8
                    } else {
                        DType::F8E4m3
                    };
                    plan.insert(
                        name.clone(),
                        TensorPlan {
                            name: name.clone(),
                            dtype: code_dtype,
                            shape: t.shape.clone(),
                        },
                    );
                    let scale = format!("{}.weight_scale", layer.name);
                    plan.insert(
                        scale.clone(),
                        TensorPlan {
                            name: scale,
                            dtype: DType::F32,
                            shape: vec![layer.out_features],
                        },
                    );
                }
                None => {
                    plan.insert(
                        name.clone(),
                        TensorPlan {
                            name: name.clone(),
                            dtype: t.dtype,
                            shape: t.shape.clone(),
                        },
                    );
                }
            }
        }

        let mut reports = Vec::new();
        let mut scales: HashMap<String, Vec<f32>> = HashMap::new();
        let total = plan.len() as u64;
        let mut done = 0u64;
        let progress = &mut self.progress;
        let fingerprint =
            checkpoint::write_weights(staged.path(), plan.into_values().collect(), |entry| {
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
                    let t = &source.tensors[&entry.name];
                    let n = layer.out_features;
                    let k = t.numel() / n;
                    let q = rtn::quantize_weight(&t.to_f32(), n, k, dtype);
                    reports.push(LayerReport {
                        name: layer.name.clone(),
                        scheme: recipe.scheme,
                        kind: layer.kind,
                        shape: t.shape.clone(),
                        weight_scale_min: q.scales.iter().copied().fold(f32::INFINITY, f32::min),
                        weight_scale_max: q
                            .scales
                            .iter()
                            .copied()
                            .fold(f32::NEG_INFINITY, f32::max),
                        relative_weight_error: q.relative_error,
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
                source.tensors.get(&entry.name).cloned().ok_or_else(|| {
                    Error::tensor(&self.src, &entry.name, "planned but not produced")
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
                calibration: None,
                source: SourceRecord {
                    format: source.format.name().into(),
                    files: source_files,
                },
                skipped: selection.skipped.clone(),
                fingerprint,
            },
        };
        spec.validate()?;
        let mut config = source.config.clone();
        config.format_version = 2;
        config.quantization = Some(spec);
        write_config_and_tokenizer(staged.path(), &source, config)?;
        let report = QuantizationReport {
            recipe: recipe.name.clone(),
            source_format: source.format.name().into(),
            layers: reports,
            skipped: selection.skipped,
            kept_full_precision: layout.kept_full_precision.iter().cloned().collect(),
        };
        checkpoint::write_json(&staged.path().join(REPORT_FILE), &report)?;
        let output = staged.commit()?;
        Ok(Outcome {
            output,
            files_read: source.files_read,
            report: Some(report),
        })
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

/// The architecture's quantization layout.
pub fn layout_of(source: &Checkpoint) -> Result<QuantizationLayout> {
    match source.config.architecture.as_str() {
        models::whisper::ARCHITECTURE => {
            let config: models::whisper::WhisperConfig =
                serde_json::from_value(source.config.model_config.clone()).map_err(|e| {
                    Error::corrupt(
                        source.dir.join(CONFIG_FILE),
                        format!("invalid Whisper model_config: {e}"),
                    )
                })?;
            Ok(models::whisper::quantization_layout(&config))
        }
        other => Err(Error::NotImplemented {
            what: format!("architecture `{other}`"),
            detail: "this version quantizes Whisper".into(),
        }),
    }
}

/// sha256 of every source file, keyed by its path relative to the source directory.
fn hash_files(
    source: &Checkpoint,
    progress: &mut Option<ProgressFn>,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let total = source.files_read.len() as u64;
    for (i, path) in source.files_read.iter().enumerate() {
        let name = path
            .strip_prefix(&source.dir)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        if let Some(f) = progress.as_mut() {
            f(&Progress {
                stage: Stage::Hashing,
                done: i as u64,
                total,
                item: &name,
            });
        }
        out.insert(name, sha256_file(path)?);
    }
    Ok(out)
}

/// The sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(crate::checkpoint::safetensors_io::hex(&hasher.finalize()))
}
