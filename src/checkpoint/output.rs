//! Atomic output directories: everything is written into a temporary directory beside the
//! destination and renamed into place, so a failure never leaves a half-written checkpoint.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A temporary directory that becomes the destination on [`StagedDir::commit`] and is removed if
/// dropped uncommitted.
#[derive(Debug)]
pub struct StagedDir {
    tmp: PathBuf,
    dst: PathBuf,
    committed: bool,
}

/// An absolute, symlink-resolved form of `path`, which need not exist yet (its parent must).
fn resolve(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        return path.canonicalize().map_err(|e| Error::io(path, e));
    }
    let name = path.file_name().ok_or_else(|| Error::Output {
        path: path.into(),
        message: "the output path has no final component".into(),
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    Ok(parent
        .canonicalize()
        .map_err(|e| Error::io(parent, e))?
        .join(name))
}

impl StagedDir {
    /// Checks the destination against the inputs and creates the temporary directory.
    ///
    /// Refused: an output that is, contains or lies inside an input; an existing output unless
    /// `overwrite`.
    pub fn create(dst: &Path, overwrite: bool, inputs: &[&Path]) -> Result<Self> {
        let refuse = |message: String| {
            Err(Error::Output {
                path: dst.into(),
                message,
            })
        };
        let resolved = resolve(dst)?;
        for input in inputs {
            let input = input.canonicalize().map_err(|e| Error::io(input, e))?;
            if resolved == input {
                return refuse(format!("is the input {}", input.display()));
            }
            if resolved.starts_with(&input) {
                return refuse(format!("lies inside the input {}", input.display()));
            }
            if input.starts_with(&resolved) {
                return refuse(format!("contains the input {}", input.display()));
            }
        }
        if resolved.exists() && !overwrite {
            return refuse("already exists; pass --overwrite to replace it".into());
        }
        let parent = resolved.parent().unwrap_or(Path::new("/")).to_path_buf();
        let name = resolved
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(StagedDir {
            tmp,
            dst: resolved,
            committed: false,
        })
    }

    /// The temporary directory to write into.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// The final destination.
    pub fn destination(&self) -> &Path {
        &self.dst
    }

    /// Renames the temporary directory into place, replacing an existing destination.
    pub fn commit(mut self) -> Result<PathBuf> {
        if self.dst.exists() {
            let old = self.tmp.with_extension("old");
            std::fs::rename(&self.dst, &old).map_err(|e| Error::io(&self.dst, e))?;
            std::fs::rename(&self.tmp, &self.dst).map_err(|e| Error::io(&self.dst, e))?;
            let removed = if old.is_dir() {
                std::fs::remove_dir_all(&old)
            } else {
                std::fs::remove_file(&old)
            };
            removed.map_err(|e| Error::io(&old, e))?;
        } else {
            std::fs::rename(&self.tmp, &self.dst).map_err(|e| Error::io(&self.dst, e))?;
        }
        self.committed = true;
        Ok(self.dst.clone())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: a failure here leaves only a hidden `.partial` directory behind.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}
