//! Writing an OASR native checkpoint's files into a (staged) directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::safetensors_io::{StreamWriter, TensorPlan};
use super::tensor::Tensor;
use super::{TOKENIZER_DIR, WEIGHTS_FILE};
use crate::error::{Error, Result};

/// Streams `model.safetensors`: the plan fixes names, dtypes and shapes up front, and `produce`
/// makes each tensor only when it is written. Returns the file's sha256.
pub fn write_weights(
    dir: &Path,
    plan: Vec<TensorPlan>,
    mut produce: impl FnMut(&TensorPlan) -> Result<Tensor>,
) -> Result<String> {
    let mut writer = StreamWriter::create(&dir.join(WEIGHTS_FILE), plan.clone())?;
    for entry in &plan {
        let tensor = produce(entry)?;
        writer.write(&entry.name, &tensor)?;
    }
    writer.finish()
}

/// Copies the tokenizer assets into `tokenizer/` and returns key to relative path.
pub fn copy_tokenizer(
    dir: &Path,
    files: &BTreeMap<String, PathBuf>,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if files.is_empty() {
        return Ok(out);
    }
    let target = dir.join(TOKENIZER_DIR);
    std::fs::create_dir_all(&target).map_err(|e| Error::io(&target, e))?;
    for (key, source) in files {
        let name = source
            .file_name()
            .ok_or_else(|| Error::corrupt(source, "tokenizer asset has no file name"))?;
        let dest = target.join(name);
        std::fs::copy(source, &dest).map_err(|e| Error::io(source, e))?;
        out.insert(
            key.clone(),
            format!("{TOKENIZER_DIR}/{}", name.to_string_lossy()),
        );
    }
    Ok(out)
}

/// Writes pretty JSON (indent 2, trailing newline).
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| Error::Output {
        path: path.into(),
        message: e.to_string(),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}
