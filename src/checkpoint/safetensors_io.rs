//! safetensors: read through a memory map, write as a stream (header first, then one tensor at a
//! time) so a whole second copy of the model is never held in memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::mmap_file;
use super::tensor::{DType, Tensor};
use crate::error::{Error, Result};

/// Reads every tensor of a safetensors file as views into one memory map.
pub fn read(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let map = Arc::new(mmap_file(path)?);
    let st = safetensors::SafeTensors::deserialize(&map[..])
        .map_err(|e| Error::corrupt(path, format!("not a valid safetensors file: {e}")))?;
    let base = map.as_ptr() as usize;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        let dtype = DType::from_safetensors(view.dtype()).ok_or_else(|| {
            Error::tensor(path, &name, format!("unsupported dtype {:?}", view.dtype()))
        })?;
        let data = view.data();
        let start = data.as_ptr() as usize - base;
        let tensor = Tensor::mapped(dtype, view.shape().to_vec(), map.clone(), start, data.len());
        tensors.insert(name, tensor);
    }
    Ok(tensors)
}

/// The name, dtype and shape of a tensor that will be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorPlan {
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Writes a safetensors file tensor by tensor, in the order of the plan, hashing as it goes.
pub struct StreamWriter {
    path: PathBuf,
    out: BufWriter<File>,
    plan: Vec<TensorPlan>,
    next: usize,
    hasher: Sha256,
}

impl StreamWriter {
    /// Creates the file and writes the header. Tensors must then come in plan order.
    pub fn create(path: &Path, plan: Vec<TensorPlan>) -> Result<Self> {
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        for t in &plan {
            let end = offset + t.byte_len();
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": t.dtype.safetensors_name(), "shape": t.shape, "data_offsets": [offset, end]}),
            );
            offset = end;
        }
        let mut json = serde_json::to_vec(&header).map_err(|e| Error::Output {
            path: path.into(),
            message: format!("cannot encode the safetensors header: {e}"),
        })?;
        // Pad with spaces so the data starts 8-byte aligned (allowed by the format).
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut writer = StreamWriter {
            path: path.into(),
            out: BufWriter::with_capacity(1 << 20, file),
            plan,
            next: 0,
            hasher: Sha256::new(),
        };
        writer.put(&(json.len() as u64).to_le_bytes())?;
        writer.put(&json)?;
        Ok(writer)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Writes the next tensor of the plan; its name, dtype and shape must match.
    pub fn write(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let expected = self.plan.get(self.next).cloned();
        match expected {
            Some(p) if p.name == name && p.dtype == tensor.dtype && p.shape == tensor.shape => {
                self.next += 1;
                self.put(tensor.bytes())
            }
            _ => Err(Error::tensor(
                &self.path,
                name,
                format!(
                    "written out of plan: expected {:?}, got {} {:?}",
                    expected.map(|p| (p.name, p.dtype, p.shape)),
                    tensor.dtype,
                    tensor.shape
                ),
            )),
        }
    }

    /// Flushes to disk and returns the sha256 of the file.
    pub fn finish(self) -> Result<String> {
        if self.next != self.plan.len() {
            return Err(Error::Output {
                path: self.path.clone(),
                message: format!(
                    "only {} of {} tensors were written",
                    self.next,
                    self.plan.len()
                ),
            });
        }
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))?;
        Ok(crate::hashing::hex(&self.hasher.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype round-trips through the writer and the reader, under its safetensors name.
    #[test]
    fn every_dtype_is_written_and_read_back() {
        let dtypes = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::I8,
            DType::F8E4m3,
            DType::I16,
            DType::I32,
            DType::U8,
            DType::F64,
            DType::I64,
            DType::Bool,
        ];
        let tensors: Vec<(String, Tensor)> = dtypes
            .iter()
            .map(|&dtype| {
                let bytes: Vec<u8> = (0..3 * dtype.size())
                    .map(|i| {
                        if dtype == DType::Bool {
                            (i % 2) as u8
                        } else {
                            i as u8
                        }
                    })
                    .collect();
                (
                    format!("t_{dtype}"),
                    Tensor::from_bytes(dtype, vec![3], bytes),
                )
            })
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.safetensors");
        let plan = tensors
            .iter()
            .map(|(name, t)| TensorPlan {
                name: name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect();
        let mut writer = StreamWriter::create(&path, plan).unwrap();
        for (name, t) in &tensors {
            writer.write(name, t).unwrap();
        }
        writer.finish().unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), tensors.len());
        for (name, t) in &tensors {
            let b = &back[name];
            assert_eq!(
                (b.dtype, &b.shape, b.bytes()),
                (t.dtype, &t.shape, t.bytes()),
                "{name}"
            );
        }
        assert_eq!(
            [DType::F64, DType::I64, DType::Bool].map(DType::safetensors_name),
            ["F64", "I64", "BOOL"]
        );
    }

    #[test]
    fn f64_converts_like_the_other_float_dtypes() {
        let values = [1.0f64 / 3.0, -2.5, 1e-300];
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::from_bytes(DType::F64, vec![3], bytes);
        assert!(DType::F64.is_float() && !DType::I64.is_float() && !DType::Bool.is_float());
        assert_eq!(t.to_f32(), vec![(1.0f64 / 3.0) as f32, -2.5, 0.0]);
        // 1e-300 rounds to 0 in f32, but the tensor is not all zero.
        assert!(!t.is_all_zero());
        let back = t.to_float_dtype(DType::F32).to_float_dtype(DType::F64);
        assert_eq!(back.dtype, DType::F64);
        assert_eq!(back.to_f32(), t.to_f32());
    }
}
