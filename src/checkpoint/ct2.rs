//! The CTranslate2 `model.bin` container (binary version 6), as faster-whisper ships Whisper.
//! Little-endian, no padding; the whole file must be consumed exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::mmap_file;
use super::tensor::{DType, Tensor};
use crate::error::{Error, Result};

pub const SUPPORTED_VERSION: u32 = 6;

/// A parsed `model.bin`: its variables (including rank-0 attributes) and aliases.
#[derive(Debug)]
pub struct Ct2Model {
    pub spec: String,
    pub revision: u32,
    pub variables: BTreeMap<String, Tensor>,
    /// Alias name to the variable it stands for.
    pub aliases: BTreeMap<String, String>,
}

/// Reads only the header, to detect the format without mapping the weights: `(version, spec)`.
pub fn peek_header(path: &Path) -> Result<Option<(u32, String)>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(512);
    std::fs::File::open(path)
        .and_then(|f| f.take(512).read_to_end(&mut head))
        .map_err(|e| Error::io(path, e))?;
    let mut r = Reader {
        path,
        data: &head,
        pos: 0,
    };
    let (Ok(version), Ok(spec)) = (r.u32("version"), r.string("spec name")) else {
        return Ok(None);
    };
    Ok(Some((version, spec)))
}

pub fn read(path: &Path) -> Result<Ct2Model> {
    let map = Arc::new(mmap_file(path)?);
    parse(path, map)
}

pub(crate) fn parse(path: &Path, map: Arc<Mmap>) -> Result<Ct2Model> {
    let mut r = Reader {
        path,
        data: &map[..],
        pos: 0,
    };
    let version = r.u32("binary version")?;
    if version != SUPPORTED_VERSION {
        return Err(Error::corrupt(
            path,
            format!("CTranslate2 binary version {version} is not supported (expected {SUPPORTED_VERSION})"),
        ));
    }
    let spec = r.string("spec name")?;
    let revision = r.u32("spec revision")?;
    let count = r.u32("variable count")?;
    let mut variables = BTreeMap::new();
    for index in 0..count {
        let name = r.string(&format!("name of variable {index}"))?;
        let rank = r.u8(&format!("rank of `{name}`"))?;
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            shape.push(r.u32(&format!("shape of `{name}`"))? as usize);
        }
        let code = r.u8(&format!("dtype of `{name}`"))?;
        let dtype = match code {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::BF16,
            other => {
                return Err(r.error(format!("variable `{name}` has unknown dtype code {other}")))
            }
        };
        let byte_count = r.u32(&format!("byte count of `{name}`"))? as usize;
        let expected = shape
            .iter()
            .try_fold(dtype.size(), |acc, d| acc.checked_mul(*d))
            .ok_or_else(|| {
                r.error(format!(
                    "variable `{name}` has an overflowing shape {shape:?}"
                ))
            })?;
        if byte_count != expected {
            return Err(r.error(format!(
                "variable `{name}` declares {byte_count} bytes but its shape {shape:?} of {dtype} needs {expected}"
            )));
        }
        let start = r.take(byte_count, &format!("data of `{name}`"))?;
        let tensor = Tensor::mapped(dtype, shape, map.clone(), start, byte_count);
        if variables.insert(name.clone(), tensor).is_some() {
            return Err(r.error(format!("variable `{name}` appears twice")));
        }
    }
    let alias_count = r.u32("alias count")?;
    let mut aliases = BTreeMap::new();
    for index in 0..alias_count {
        let alias = r.string(&format!("alias {index}"))?;
        let target = r.string(&format!("target of alias `{alias}`"))?;
        if !variables.contains_key(&target) {
            return Err(r.error(format!(
                "alias `{alias}` points to unknown variable `{target}`"
            )));
        }
        aliases.insert(alias, target);
    }
    if r.pos != r.data.len() {
        return Err(r.error(format!(
            "{} unexpected bytes after the aliases",
            r.data.len() - r.pos
        )));
    }
    Ok(Ct2Model {
        spec,
        revision,
        variables,
        aliases,
    })
}

/// A bounds-checked little-endian cursor whose errors name the file, the field and the offset.
struct Reader<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn error(&self, message: String) -> Error {
        Error::corrupt(
            PathBuf::from(self.path),
            format!("{message} (at byte {})", self.pos),
        )
    }

    /// Advances over `len` bytes and returns where they start.
    fn take(&mut self, len: usize, what: &str) -> Result<usize> {
        let start = self.pos;
        match start.checked_add(len) {
            Some(end) if end <= self.data.len() => {
                self.pos = end;
                Ok(start)
            }
            _ => Err(self.error(format!(
                "truncated: {what} needs {len} bytes, {} remain",
                self.data.len() - start
            ))),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        let at = self.take(1, what)?;
        Ok(self.data[at])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        let at = self.take(2, what)?;
        Ok(u16::from_le_bytes([self.data[at], self.data[at + 1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let at = self.take(4, what)?;
        let b = &self.data[at..at + 4];
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A `u16` length (counting the trailing NUL), the bytes, the NUL.
    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        if len == 0 {
            return Err(self.error(format!("{what}: string length 0 (it must count its NUL)")));
        }
        let at = self.take(len, what)?;
        let bytes = &self.data[at..at + len];
        if bytes[len - 1] != 0 {
            return Err(self.error(format!("{what}: string is not NUL-terminated")));
        }
        String::from_utf8(bytes[..len - 1].to_vec())
            .map_err(|_| self.error(format!("{what}: string is not UTF-8")))
    }
}
