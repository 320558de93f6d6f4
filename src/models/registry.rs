//! The architecture registry: which architectures this version knows, the source formats each
//! imports (detected by positive markers only), how a native checkpoint of each is checked, and
//! its quantization layout. Adding an architecture is one folder under `models/` plus a line in
//! [`ARCHITECTURES`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::speech::{DecodeOptions, SpeechModel};
use super::{conformer, whisper, QuantizationLayout};
use crate::checkpoint::{
    tokenizer_file, Checkpoint, NativeConfig, OpenOptions, SourceFormat, Tensor, CONFIG_FILE,
    WEIGHTS_FILE,
};
use crate::error::{Error, Result};

/// A source format an architecture imports.
pub struct SourceKind {
    /// The name provenance records (`hf_whisper`).
    pub name: &'static str,
    /// What the format's directory holds, for the error when no format matches.
    pub described: &'static str,
    /// Whether `dir` holds this format, by positive markers only (a file, a key, a header).
    pub detect: fn(&Path) -> Result<bool>,
    /// Imports the directory into OASR names and config, with every check of docs/format.md.
    pub import: fn(&Path) -> Result<Checkpoint>,
}

/// What the generic part of opening a native checkpoint found, for the architecture's checks.
pub struct NativeParts<'a> {
    pub config_path: &'a Path,
    pub weights_path: &'a Path,
    pub config: &'a NativeConfig,
    /// Tokenizer asset key to its file (paths already checked to lie inside the checkpoint).
    pub tokenizer_files: &'a BTreeMap<String, PathBuf>,
}

/// How an architecture is laid out in Hugging Face transformers, for exports to the formats
/// built on it (compressed-tensors).
pub struct HfLayout {
    /// The Hugging Face name of an OASR module or tensor.
    pub name: fn(&str) -> String,
    /// An OASR tensor in transformers' layout, when that differs (a convolution's axes).
    pub relayout: fn(&str, &Tensor) -> Option<Tensor>,
    /// Linear layers (Hugging Face names) that transformers ties to another tensor instead of
    /// storing: full precision in every export.
    pub tied_linears: &'static [&'static str],
    /// Groups of layers (OASR names) that a server fuses into one GEMM, which must share one
    /// scheme and one static input scale.
    pub fused_groups: fn(&Checkpoint) -> Result<Vec<Vec<String>>>,
    /// `config.json` without `quantization_config`, given the dtype of the unquantized
    /// tensors, and every other file transformers reads (name, bytes).
    pub files: fn(&Checkpoint, &str) -> Result<HfFiles>,
}

/// What an export writes besides the weights.
pub struct HfFiles {
    /// `config.json`, without `quantization_config`.
    pub config: serde_json::Value,
    /// Every other file (generation and preprocessor configs, the tokenizer): name, bytes.
    pub files: Vec<(String, Vec<u8>)>,
}

/// One architecture.
pub struct Architecture {
    /// The registry key in `oasr_config.json` (`architecture`).
    pub name: &'static str,
    pub sources: &'static [SourceKind],
    /// Checks a native checkpoint's `model_config`, tokenizer and quantization spec, reads its
    /// tensors and checks them against both (docs/format.md, "What opening a checkpoint checks").
    pub open_native: fn(&NativeParts<'_>) -> Result<BTreeMap<String, Tensor>>,
    /// The quantization layout of a (checked) config: which GEMMs exist, where smoothing folds,
    /// which links may arm.
    pub layout: fn(&Path, &NativeConfig) -> Result<QuantizationLayout>,
    /// The runnable model of a full-precision checkpoint, searching with the given options
    /// (refusing by name those its search does not have).
    pub load: fn(&Checkpoint, &DecodeOptions) -> Result<Box<dyn SpeechModel>>,
    /// Its Hugging Face layout, when transformers has the architecture (exports refuse the
    /// others by name).
    pub hf: Option<&'static HfLayout>,
}

/// Every architecture this version reads.
pub static ARCHITECTURES: &[&Architecture] = &[&whisper::ARCHITECTURE, &conformer::ARCHITECTURE];

/// The architecture registered as `name`; `config_path` is blamed when there is none.
pub fn architecture(config_path: &Path, name: &str) -> Result<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.name == name)
        .ok_or_else(|| {
            let known: Vec<String> = ARCHITECTURES
                .iter()
                .map(|a| format!("{:?}", a.name))
                .collect();
            Error::config_key(
                config_path,
                "architecture",
                format!(
                    "is {name:?}; this version reads {} checkpoints only",
                    known.join(", ")
                ),
            )
        })
}

/// The imported source formats of every architecture, with the architecture.
fn source_kinds() -> impl Iterator<Item = &'static SourceKind> {
    ARCHITECTURES.iter().flat_map(|a| a.sources.iter())
}

fn source_kind(name: &str) -> Option<&'static SourceKind> {
    source_kinds().find(|k| k.name == name)
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Detects the format of a directory by positive markers only.
pub fn detect(dir: &Path) -> Result<SourceFormat> {
    if !dir.is_dir() {
        let message = if dir.exists() {
            "expected a checkpoint directory, found a file"
        } else {
            "does not exist"
        };
        return Err(Error::UnknownFormat {
            path: dir.into(),
            message: message.into(),
        });
    }
    let mut found: Vec<SourceFormat> = Vec::new();
    if dir.join(CONFIG_FILE).is_file() {
        let version = read_json(&dir.join(CONFIG_FILE))
            .and_then(|v| v.get("format_version")?.as_u64())
            .ok_or_else(|| {
                Error::corrupt(
                    dir.join(CONFIG_FILE),
                    "invalid JSON or no integer `format_version`",
                )
            })?;
        found.push(SourceFormat::OasrNative {
            version: version as u32,
        });
    }
    for kind in source_kinds() {
        if (kind.detect)(dir)? {
            found.push(SourceFormat::Import(kind.name));
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => {
            let mut described = vec!["oasr_config.json (OASR native)".to_string()];
            described.extend(source_kinds().map(|k| k.described.to_string()));
            let last = described.pop().unwrap_or_default();
            Err(Error::UnknownFormat {
                path: dir.into(),
                message: format!("no {}, or {last}", described.join(", ")),
            })
        }
        many => Err(Error::AmbiguousFormat {
            path: dir.into(),
            candidates: many.iter().map(|f| f.name().to_string()).collect(),
        }),
    }
}

impl Checkpoint {
    /// Detects the format of `dir` and imports it, with every check of docs/format.md (the
    /// fingerprint included). The source is only read, never modified.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        Checkpoint::open_with(dir, OpenOptions::default())
    }

    /// [`Checkpoint::open`] with options.
    pub fn open_with(dir: &Path, options: OpenOptions) -> Result<Checkpoint> {
        match detect(dir)? {
            SourceFormat::OasrNative { .. } => open_native(dir, options),
            SourceFormat::Import(name) => match source_kind(name) {
                Some(kind) => (kind.import)(dir),
                None => Err(Error::UnknownFormat {
                    path: dir.into(),
                    message: format!("no importer is registered for `{name}`"),
                }),
            },
        }
    }
}

fn open_native(dir: &Path, options: OpenOptions) -> Result<Checkpoint> {
    let config_path = dir.join(CONFIG_FILE);
    let weights_path = dir.join(WEIGHTS_FILE);
    let config = NativeConfig::read(&config_path)?;
    let arch = architecture(&config_path, &config.architecture)?;
    let mut files_read = vec![config_path.clone(), weights_path.clone()];
    let mut tokenizer_files = BTreeMap::new();
    if let Some(tokenizer) = &config.tokenizer {
        for (key, rel) in &tokenizer.files {
            let path = tokenizer_file(dir, &config_path, key, rel)?;
            files_read.push(path.clone());
            tokenizer_files.insert(key.clone(), path);
        }
    }
    let tensors = (arch.open_native)(&NativeParts {
        config_path: &config_path,
        weights_path: &weights_path,
        config: &config,
        tokenizer_files: &tokenizer_files,
    })?;
    if let (Some(spec), true) = (&config.quantization, options.check_fingerprint) {
        let actual = crate::hashing::sha256_file(&weights_path)?;
        if actual != spec.producer.fingerprint {
            return Err(Error::corrupt(
                &weights_path,
                format!(
                    "sha256 {actual} differs from the fingerprint {} that {CONFIG_FILE} records \
                     (quantization.producer.fingerprint): the file changed after it was written",
                    spec.producer.fingerprint
                ),
            ));
        }
    }
    Ok(Checkpoint {
        dir: dir.into(),
        format: SourceFormat::OasrNative {
            version: config.format_version,
        },
        config,
        tensors,
        tokenizer_files,
        files_read,
    })
}

/// The quantization layout of an opened checkpoint's architecture.
pub fn layout_of(source: &Checkpoint) -> Result<QuantizationLayout> {
    let config_path = source.dir.join(CONFIG_FILE);
    let arch = architecture(&config_path, &source.config.architecture)?;
    (arch.layout)(&config_path, &source.config)
}

/// The runnable model of a full-precision checkpoint (any supported format), with the
/// architecture's default search. A quantized checkpoint runs only in `verify`, which replaces
/// its quantized layers.
pub fn load(ckpt: &Checkpoint) -> Result<Box<dyn SpeechModel>> {
    load_with(ckpt, &DecodeOptions::default())
}

/// [`load`] with search options.
pub fn load_with(ckpt: &Checkpoint, options: &DecodeOptions) -> Result<Box<dyn SpeechModel>> {
    if ckpt.is_quantized() {
        return Err(Error::UnknownFormat {
            path: ckpt.dir.clone(),
            message: "a quantized checkpoint runs only in `oasr-quantize verify`; transcribe \
                      takes full precision"
                .into(),
        });
    }
    let arch = architecture(&ckpt.dir.join(CONFIG_FILE), &ckpt.config.architecture)?;
    (arch.load)(ckpt, options)
}
