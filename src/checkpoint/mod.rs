//! Checkpoint I/O: format detection by positive markers, the importers, and the native writer.

pub mod ct2;
mod native;
mod output;
pub mod safetensors_io;
mod tensor;
mod whisper;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use native::{
    DecodingSpec, FeatureSpec, NativeConfig, TokenizerSpec, CONFIG_FILE, REPORT_FILE,
    SMOOTHING_FACTORS_FILE, TOKENIZER_DIR, WEIGHTS_FILE,
};
pub use output::{StagedDir, MARKER_FILE};
pub use safetensors_io::TensorPlan;
pub use tensor::{DType, Tensor};
pub use writer::{
    copy_tokenizer, read_smoothing_factors, write_json, write_smoothing_factors, write_weights,
    SMOOTHING_FACTORS_SUFFIX,
};

use crate::error::{Error, Result};

/// The source formats this tool reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// OASR native, format version 1 (full precision) or 2 (quantized).
    OasrNative {
        version: u32,
    },
    HfWhisper,
    Ct2Whisper,
}

impl SourceFormat {
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::OasrNative { version: 1 } => "oasr_native_v1",
            SourceFormat::OasrNative { .. } => "oasr_native_v2",
            SourceFormat::HfWhisper => "hf_whisper",
            SourceFormat::Ct2Whisper => "ctranslate2_whisper",
        }
    }
}

/// A checkpoint imported into OASR names and config, whatever its source format.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub format: SourceFormat,
    /// The config in OASR form (format version 1 unless the source is a quantized native one).
    pub config: NativeConfig,
    /// Tensors under OASR module paths; views into the memory-mapped source where possible.
    pub tensors: BTreeMap<String, Tensor>,
    /// Tokenizer asset key to the source file to copy.
    pub tokenizer_files: BTreeMap<String, PathBuf>,
    /// Every file read, for provenance and `cargo:rerun-if-changed`.
    pub files_read: Vec<PathBuf>,
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
    let hf_config = dir.join("config.json");
    if dir.join("model.safetensors").is_file()
        && read_json(&hf_config).and_then(|v| v.get("model_type")?.as_str().map(|s| s == "whisper"))
            == Some(true)
    {
        found.push(SourceFormat::HfWhisper);
    }
    let bin = dir.join("model.bin");
    if bin.is_file() && hf_config.is_file() {
        // CTranslate2's header names its model spec (`WhisperSpec`); the version is checked on import.
        if let Some((_, spec)) = ct2::peek_header(&bin)? {
            if spec.ends_with("Spec") {
                found.push(SourceFormat::Ct2Whisper);
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(Error::UnknownFormat {
            path: dir.into(),
            message:
                "no oasr_config.json (OASR native), config.json with model_type \"whisper\" + \
                      model.safetensors (Hugging Face Whisper), or model.bin + config.json \
                      (CTranslate2 Whisper)"
                    .into(),
        }),
        many => Err(Error::AmbiguousFormat {
            path: dir.into(),
            candidates: many.iter().map(|f| f.name().to_string()).collect(),
        }),
    }
}

/// How [`Checkpoint::open_with`] opens a checkpoint. [`Checkpoint::open`] uses the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Recompute the sha256 of a quantized (format version 2) checkpoint's `model.safetensors`
    /// and refuse the checkpoint when it differs from `quantization.producer.fingerprint`
    /// (default: true). Hashing reads the whole file once (tiny.en: 59 MB, about 0.04 s); a
    /// caller that has just written or checked the file may skip it.
    pub check_fingerprint: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            check_fingerprint: true,
        }
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
            SourceFormat::HfWhisper => whisper::import_hf(dir),
            SourceFormat::Ct2Whisper => whisper::import_ct2(dir),
        }
    }

    /// Whether the checkpoint already holds quantized layers.
    pub fn is_quantized(&self) -> bool {
        self.config.quantization.is_some()
    }
}

/// The path of a tokenizer file: relative, inside the checkpoint directory (symbolic links
/// resolved), and a file.
fn tokenizer_file(dir: &Path, config_path: &Path, key: &str, rel: &str) -> Result<PathBuf> {
    use std::path::Component;
    let field = format!("tokenizer.files.{key}");
    let relative = Path::new(rel);
    if rel.is_empty()
        || relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(Error::config_key(
            config_path,
            field,
            format!("`{rel}` is not a relative path inside the checkpoint directory"),
        ));
    }
    let path = dir.join(relative);
    if !path.is_file() {
        return Err(Error::config_key(
            config_path,
            field,
            format!("tokenizer file `{rel}` does not exist"),
        ));
    }
    let real_dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
    let real = path.canonicalize().map_err(|e| Error::io(&path, e))?;
    if !real.starts_with(&real_dir) {
        return Err(Error::config_key(
            config_path,
            field,
            format!(
                "`{rel}` resolves to {}, outside the checkpoint directory",
                crate::error::shown(&real)
            ),
        ));
    }
    Ok(path)
}

fn open_native(dir: &Path, options: OpenOptions) -> Result<Checkpoint> {
    let config_path = dir.join(CONFIG_FILE);
    let weights_path = dir.join(WEIGHTS_FILE);
    let config = NativeConfig::read(&config_path)?;
    if config.architecture != crate::models::whisper::ARCHITECTURE {
        return Err(Error::config_key(
            &config_path,
            "architecture",
            format!(
                "is {:?}; this version reads \"whisper\" checkpoints only",
                config.architecture
            ),
        ));
    }
    let model = whisper::native_model_config(&config_path, &config)?;
    let mut files_read = vec![config_path.clone(), weights_path.clone()];
    let mut tokenizer_files = BTreeMap::new();
    if let Some(tokenizer) = &config.tokenizer {
        for (key, rel) in &tokenizer.files {
            let path = tokenizer_file(dir, &config_path, key, rel)?;
            files_read.push(path.clone());
            tokenizer_files.insert(key.clone(), path);
        }
    }
    whisper::check_native_tokenizer(&config_path, &config, &model, &tokenizer_files)?;
    let tensors = safetensors_io::read(&weights_path)?;
    // Bounds the geometry before anything is sized by it: each layer holds several tensors.
    if model.encoder_layers.saturating_add(model.decoder_layers) > tensors.len() {
        return Err(Error::config_key(
            &config_path,
            "model_config.encoder_layers",
            format!(
                "{} encoder and {} decoder layers cannot fit in the {} tensors of {WEIGHTS_FILE}",
                model.encoder_layers,
                model.decoder_layers,
                tensors.len()
            ),
        ));
    }
    if let Some(spec) = &config.quantization {
        whisper::validate_spec(&config_path, &model, spec)?;
    }
    whisper::validate(
        &weights_path,
        &model,
        &tensors,
        config.quantization.as_ref(),
    )?;
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

/// Maps a file read-only (the source is never modified).
pub(crate) fn mmap_file(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and the tool never writes its inputs; a source changed by
    // another process while we run is outside what any reader can guard against.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}
