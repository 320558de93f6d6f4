//! Manifests: JSON lines `{"id", "audio", "text"?, "source"?}`, audio paths relative to an audio
//! root (default: the manifest's directory). Blank lines and `#` lines are skipped. `source`
//! names where an utterance comes from (a voice, a speaker set): reports break figures down by it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{shown, Error, Result};

/// One entry of a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Utterance {
    pub id: String,
    /// The audio file, resolved against the audio root.
    pub audio: PathBuf,
    /// The reference transcript, when the manifest has one.
    pub text: Option<String>,
    /// Where the utterance comes from (reports break figures down by it); `None` when unnamed.
    pub source: Option<String>,
    /// 1-based line in the manifest.
    pub line: usize,
}

/// A parsed manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub path: PathBuf,
    pub utterances: Vec<Utterance>,
    /// sha256 of the manifest file's bytes.
    pub sha256: String,
}

#[derive(Deserialize)]
struct Line {
    id: String,
    audio: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    source: Option<String>,
}

/// Why `path` cannot be read as an audio file, if it cannot: it is missing, a directory, or not a
/// regular file (a FIFO would block the run, a device never ends).
fn not_an_audio_file(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist".into()),
        Err(e) => Some(format!("cannot be read: {e}")),
        Ok(m) if m.is_dir() => Some("is a directory, not an audio file".into()),
        Ok(m) if !m.is_file() => Some("is not a regular file (a FIFO, socket or device)".into()),
        Ok(_) => None,
    }
}

impl Manifest {
    /// Reads and checks a manifest: every line parses, ids are unique, every audio file exists.
    pub fn read(path: &Path, audio_root: Option<&Path>) -> Result<Manifest> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = String::from_utf8(bytes.clone())
            .map_err(|_| Error::corrupt(path, "the manifest is not UTF-8"))?;
        let root = match audio_root {
            Some(r) => r.to_path_buf(),
            None => path.parent().map(Path::to_path_buf).unwrap_or_default(),
        };
        let mut seen = HashSet::new();
        let mut utterances = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let at = |message: String| Error::corrupt(path, format!("line {line}: {message}"));
            let entry: Line = serde_json::from_str(trimmed).map_err(|e| {
                at(format!(
                    "expected {{\"id\", \"audio\", \"text\"?, \"source\"?}}: {e}"
                ))
            })?;
            if entry.id.is_empty() {
                return Err(at("empty id".into()));
            }
            if !seen.insert(entry.id.clone()) {
                return Err(at(format!("duplicate id `{}`", entry.id)));
            }
            let audio = root.join(&entry.audio);
            if let Some(problem) = not_an_audio_file(&audio) {
                return Err(at(format!(
                    "utterance `{}`: audio {} {problem}",
                    entry.id,
                    shown(&audio)
                )));
            }
            utterances.push(Utterance {
                id: entry.id,
                audio,
                text: entry.text,
                source: entry.source.filter(|s| !s.is_empty()),
                line,
            });
        }
        if utterances.is_empty() {
            return Err(Error::corrupt(
                path,
                "the manifest lists no utterance (only blank and `#` lines)",
            ));
        }
        Ok(Manifest {
            path: path.into(),
            utterances,
            sha256: crate::hashing::sha256_bytes(&bytes),
        })
    }
}
