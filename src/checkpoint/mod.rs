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

impl Checkpoint {
    /// Detects the format of `dir` and imports it. The source is only read, never modified.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        match detect(dir)? {
            SourceFormat::OasrNative { .. } => open_native(dir),
            SourceFormat::HfWhisper => whisper::import_hf(dir),
            SourceFormat::Ct2Whisper => whisper::import_ct2(dir),
        }
    }

    /// Whether the checkpoint already holds quantized layers.
    pub fn is_quantized(&self) -> bool {
        self.config.quantization.is_some()
    }
}

fn open_native(dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join(CONFIG_FILE);
    let weights_path = dir.join(WEIGHTS_FILE);
    let config = NativeConfig::read(&config_path)?;
    let tensors = safetensors_io::read(&weights_path)?;
    let mut files_read = vec![config_path.clone(), weights_path];
    let mut tokenizer_files = BTreeMap::new();
    if let Some(tokenizer) = &config.tokenizer {
        for (key, rel) in &tokenizer.files {
            let path = dir.join(rel);
            if !path.is_file() {
                return Err(Error::corrupt(
                    &config_path,
                    format!("tokenizer file `{rel}` ({key}) does not exist"),
                ));
            }
            files_read.push(path.clone());
            tokenizer_files.insert(key.clone(), path);
        }
    }
    if config.architecture == crate::models::whisper::ARCHITECTURE && config.quantization.is_none()
    {
        let whisper: crate::models::whisper::WhisperConfig =
            serde_json::from_value(config.model_config.clone()).map_err(|e| {
                Error::corrupt(&config_path, format!("invalid Whisper model_config: {e}"))
            })?;
        whisper::validate(&dir.join(WEIGHTS_FILE), &whisper, &tensors)?;
    }
    if let Some(spec) = &config.quantization {
        validate_quantized(&dir.join(WEIGHTS_FILE), spec, &tensors)?;
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

/// Checks the tensors of every quantized layer against the contract of docs/format.md.
fn validate_quantized(
    path: &Path,
    spec: &crate::format::QuantizationSpec,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<()> {
    use crate::format::{QuantDtype, SmoothFold};
    for (layer, l) in &spec.layers {
        let get = |key: &str| {
            let name = format!("{layer}.{key}");
            tensors
                .get(&name)
                .map(|t| (name.clone(), t))
                .ok_or_else(|| Error::tensor(path, &name, "missing for a quantized layer"))
        };
        let (name, weight) = get("weight")?;
        let code = match l.scheme.dtype() {
            QuantDtype::Int8 => DType::I8,
            QuantDtype::Float8E4m3fn => DType::F8E4m3,
        };
        if weight.dtype != code || weight.shape.len() < 2 {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "expected a {code} weight of rank 2 or more, found {} {:?}",
                    weight.dtype, weight.shape
                ),
            ));
        }
        let n = weight.shape[0];
        let k = weight.shape[weight.shape.len() - 1];
        let expect = |key: &str, shape: Vec<usize>, present: bool| -> Result<()> {
            let name = format!("{layer}.{key}");
            match (tensors.get(&name), present) {
                (Some(t), true) if t.dtype == DType::F32 && t.shape == shape => Ok(()),
                (Some(t), true) => Err(Error::tensor(
                    path,
                    name,
                    format!("expected F32 {shape:?}, found {} {:?}", t.dtype, t.shape),
                )),
                (None, true) => Err(Error::tensor(path, name, "missing for a quantized layer")),
                (Some(_), false) => Err(Error::tensor(
                    path,
                    name,
                    "present but the spec does not call for it",
                )),
                (None, false) => Ok(()),
            }
        };
        expect("weight_scale", vec![n], true)?;
        expect("input_scale", vec![1], l.scheme.is_static())?;
        if let Some(t) = tensors.get(&format!("{layer}.input_scale")) {
            // The static quantize divides by it.
            if let Some(bad) = t
                .to_f32()
                .into_iter()
                .find(|v| !(v.is_finite() && *v > 0.0))
            {
                return Err(Error::tensor(
                    path,
                    format!("{layer}.input_scale"),
                    format!("{bad} is not a finite positive scale"),
                ));
            }
        }
        expect("smooth_inv", vec![k], l.smooth == SmoothFold::Runtime)?;
    }
    Ok(())
}

/// Maps a file read-only (the source is never modified).
pub(crate) fn mmap_file(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and the tool never writes its inputs; a source changed by
    // another process while we run is outside what any reader can guard against.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}
