//! Checkpoint I/O: the containers this tool reads and writes (safetensors, CTranslate2's
//! `model.bin`, the zip archives of PyTorch's `torch.save`, the OASR native config), the imported
//! form every architecture shares, and the native writer. Detecting a directory's format and
//! importing it goes through the architecture registry (`crate::models::registry`), which
//! implements [`Checkpoint::open`].

pub mod ct2;
mod native;
mod output;
pub mod safetensors_io;
mod tensor;
pub mod torch_pt;
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
    OasrNative { version: u32 },
    /// A format an architecture imports, by the name provenance records (`hf_whisper`,
    /// `ctranslate2_whisper`).
    Import(&'static str),
}

impl SourceFormat {
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::OasrNative { version: 1 } => "oasr_native_v1",
            SourceFormat::OasrNative { .. } => "oasr_native_v2",
            SourceFormat::Import(name) => name,
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
    /// Whether the checkpoint already holds quantized layers.
    pub fn is_quantized(&self) -> bool {
        self.config.quantization.is_some()
    }
}

/// The path of a tokenizer file: relative, inside the checkpoint directory (symbolic links
/// resolved), and a file.
pub(crate) fn tokenizer_file(
    dir: &Path,
    config_path: &Path,
    key: &str,
    rel: &str,
) -> Result<PathBuf> {
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

/// Maps a file read-only (the source is never modified).
pub(crate) fn mmap_file(path: &Path) -> Result<memmap2::Mmap> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only and the tool never writes its inputs; a source changed by
    // another process while we run is outside what any reader can guard against.
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}
