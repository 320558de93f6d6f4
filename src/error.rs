//! The library's error type. Every variant names what is at fault: a file, a tensor, a layer, an
//! option or a recipe, so the CLI can print it as is.

use std::path::{Path, PathBuf};

/// A path as error messages show it: in full up to [`SHOWN_PATH_CHARS`] characters, otherwise
/// its start and end around an ellipsis (a pathological path must not flood the terminal).
pub fn shown(path: &Path) -> String {
    let text = path.display().to_string();
    let chars = text.chars().count();
    if chars <= SHOWN_PATH_CHARS {
        return text;
    }
    let keep = SHOWN_PATH_CHARS / 2;
    let head: String = text.chars().take(keep).collect();
    let tail: String = text.chars().skip(chars - keep).collect();
    format!("{head}…({} characters)…{tail}", chars - 2 * keep)
}

/// The longest path an error message shows in full.
pub const SHOWN_PATH_CHARS: usize = 256;

/// Everything that can go wrong in the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The causes below are part of the message, not a `source()`: a printer that walks the
    // chain would show them twice.
    #[error("{}: {error}", shown(path))]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A file that exists but cannot be what it claims to be: truncated, corrupt, or inconsistent.
    #[error("{}: {message}", shown(path))]
    Corrupt { path: PathBuf, message: String },
    /// A config value that is missing, of the wrong type, out of range or inconsistent with the
    /// rest of the config or with the tensors; `key` is its name in `path` (dotted for nested
    /// keys, e.g. `model_config.d_model`).
    #[error("{}: `{key}`: {message}", shown(path))]
    ConfigKey {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{}: not a checkpoint this tool can read: {message}", shown(path))]
    UnknownFormat { path: PathBuf, message: String },
    #[error("{}: ambiguous checkpoint: it matches {}; keep only one format's files in the directory", shown(path), candidates.join(" and "))]
    AmbiguousFormat {
        path: PathBuf,
        candidates: Vec<String>,
    },
    /// A tensor that is missing, or has the wrong dtype or shape.
    #[error("{}: tensor `{name}`: {message}", shown(path))]
    Tensor {
        path: PathBuf,
        name: String,
        message: String,
    },
    #[error("option `{option}`: {message}")]
    InvalidOption { option: String, message: String },
    #[error("layer `{layer}`: {reason}")]
    LayerRefused { layer: String, reason: String },
    #[error("scheme `{name}`: {message}")]
    Scheme { name: String, message: String },
    #[error("recipe `{name}`: {message}")]
    Recipe { name: String, message: String },
    /// A known feature this version does not implement; refused by name rather than faked.
    #[error("{what} is not implemented in this version of oasr-quantize: {detail}")]
    NotImplemented { what: String, detail: String },
    /// A failure while regenerating or verifying one entry of a gate file.
    #[error("gate entry `{entry}`: {error}")]
    GateEntry { entry: String, error: Box<Error> },
    /// One of several checkpoints a run handled together failed.
    #[error("checkpoint {}: {error}", shown(path))]
    Checkpoint { path: PathBuf, error: Box<Error> },
    /// A failure while processing one utterance of a manifest.
    #[error("utterance `{id}`: {error}")]
    Utterance { id: String, error: Box<Error> },
    /// A failure inside a model's forward pass.
    #[error("{what}: {message}")]
    Model { what: String, message: String },
    /// A diagnostic file an operation needs and the checkpoint does not carry (e.g. the
    /// smoothing factors `verify --per-layer` reads); `message` says how to get it.
    #[error("{}: {message}", shown(path))]
    MissingDiagnostics { path: PathBuf, message: String },
    #[error("output {}: {message}", shown(path))]
    Output { path: PathBuf, message: String },
    /// A checkpoint an export format cannot express; `message` names what and what to do.
    #[error("{}: cannot export to {format}: {message}", shown(path))]
    Export {
        path: PathBuf,
        format: &'static str,
        message: String,
    },
    /// The CUDA runtime (feature `cuda`) could not do `what`: no driver, no GPU, no NVRTC, a
    /// failed compilation, launch or copy. `message` says why and what to do.
    #[error("CUDA {what}: {message}")]
    Cuda { what: String, message: String },
    /// Operands a GPU kernel refuses: a shape outside the kernel contract (M >= 1, K % 16 == 0,
    /// N % 8 == 0), or slices whose lengths do not match the shape.
    #[error("{op}: {message}")]
    ShapeRefused { op: String, message: String },
    /// An audio file whose sample rate is not the model's. Audio is never resampled.
    #[error("{}: sample rate is {found} Hz but the model expects {expected} Hz (oasr-quantize does not resample; convert the file first, e.g. `sox IN -r {expected} OUT`)", shown(path))]
    SampleRate {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error: source,
        }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn tensor(
        path: impl Into<PathBuf>,
        name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::Tensor {
            path: path.into(),
            name: name.into(),
            message: message.into(),
        }
    }

    pub(crate) fn config_key(
        path: impl Into<PathBuf>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Error::ConfigKey {
            path: path.into(),
            key: key.into(),
            message: message.into(),
        }
    }

    pub(crate) fn option(option: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidOption {
            option: option.into(),
            message: message.into(),
        }
    }
}
