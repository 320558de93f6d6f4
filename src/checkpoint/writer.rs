//! Writing an OASR native checkpoint's files into a (staged) directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::safetensors_io::{StreamWriter, TensorPlan};
use super::tensor::Tensor;
use super::{DType, SMOOTHING_FACTORS_FILE, TOKENIZER_DIR, WEIGHTS_FILE};
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

/// The key suffix of a group's factors in [`SMOOTHING_FACTORS_FILE`]: the tensor
/// `<module>.smoothing_factors` holds the s of the group whose 1/s `<module>` absorbed.
pub const SMOOTHING_FACTORS_SUFFIX: &str = ".smoothing_factors";

/// Writes [`SMOOTHING_FACTORS_FILE`]: for each module that absorbed a group's 1/s (a norm, a V
/// projection), the group's factors s as F32 `[K]`, in name order. Nothing is written when
/// `factors` is empty.
pub fn write_smoothing_factors(dir: &Path, factors: &BTreeMap<String, Vec<f32>>) -> Result<()> {
    if factors.is_empty() {
        return Ok(());
    }
    let name = |module: &str| format!("{module}{SMOOTHING_FACTORS_SUFFIX}");
    let plan = factors
        .iter()
        .map(|(module, s)| TensorPlan {
            name: name(module),
            dtype: DType::F32,
            shape: vec![s.len()],
        })
        .collect();
    let mut writer = StreamWriter::create(&dir.join(SMOOTHING_FACTORS_FILE), plan)?;
    for (module, s) in factors {
        writer.write(&name(module), &Tensor::from_f32(vec![s.len()], s))?;
    }
    writer.finish().map(|_| ())
}

/// Reads [`SMOOTHING_FACTORS_FILE`] of a checkpoint directory: module that absorbed 1/s to the
/// group's factors s. `None` when the checkpoint has no such file.
pub fn read_smoothing_factors(dir: &Path) -> Result<Option<BTreeMap<String, Vec<f32>>>> {
    let path = dir.join(SMOOTHING_FACTORS_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let mut out = BTreeMap::new();
    for (name, t) in super::safetensors_io::read(&path)? {
        let module = name.strip_suffix(SMOOTHING_FACTORS_SUFFIX).ok_or_else(|| {
            Error::tensor(
                &path,
                &name,
                format!("expected a name ending in `{SMOOTHING_FACTORS_SUFFIX}`"),
            )
        })?;
        if t.dtype != DType::F32 || t.shape.len() != 1 {
            return Err(Error::tensor(
                &path,
                &name,
                format!("expected F32 [K], found {} {:?}", t.dtype, t.shape),
            ));
        }
        let s = t.to_f32();
        if let Some(bad) = s.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(Error::tensor(
                &path,
                &name,
                format!("a smoothing factor must be finite and positive, found {bad}"),
            ));
        }
        out.insert(module.to_string(), s);
    }
    Ok(Some(out))
}
