//! PyTorch checkpoints (WeNet's `final.pt`): the zip archive `torch.save` writes (PyTorch 1.6
//! and later), read without executing any of its pickle.
//!
//! The archive holds `<name>/data.pkl`, a pickle of the state dict whose tensors refer by
//! persistent id to storages `<name>/data/<key>` (raw little-endian bytes), and a few small
//! records (`byteorder`, `version`, ...). [`read`] parses the zip directory (module `zip`), runs
//! the pickle on a restricted machine (module `unpickle`) that knows only the opcodes and globals
//! a state dict needs, and builds each tensor as a view into the memory-mapped file (a copy only
//! for a non-contiguous view). The format and what is refused: docs/format.md, "PyTorch
//! checkpoints".

mod unpickle;
mod zip;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use memmap2::Mmap;

use super::mmap_file;
use super::tensor::Tensor;
use crate::error::{Error, Result};
use unpickle::{Callable, Storage, StorageType, TensorCall, Value};
use zip::{Archive, Entry, ZipError};

/// The globals a checkpoint's pickle may name; any other is refused.
pub const ALLOWED_GLOBALS: [&str; 13] = [
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter",
    "torch.FloatStorage",
    "torch.HalfStorage",
    "torch.BFloat16Storage",
    "torch.DoubleStorage",
    "torch.LongStorage",
    "torch.IntStorage",
    "torch.ShortStorage",
    "torch.CharStorage",
    "torch.ByteStorage",
    "torch.BoolStorage",
];

/// The message for a file in the serialization format of PyTorch before 1.6.
const LEGACY: &str = "the legacy PyTorch serialization format (torch < 1.6); re-save it with \
                      torch.save in a current PyTorch";

/// The magic number that starts a legacy checkpoint, as the bytes of its pickled LONG1.
const LEGACY_MAGIC: [u8; 12] = [
    0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19,
];

/// Reads the state dict of a checkpoint written by `torch.save(state_dict, path)`: every tensor
/// by its key. Contiguous tensors are views into the memory-mapped file; a non-contiguous view is
/// copied into a contiguous tensor. Nothing in the file is executed: a pickle that names any
/// global outside [`ALLOWED_GLOBALS`], or builds anything but the state dict, is refused.
pub fn read(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let map = Arc::new(mmap_file(path)?);
    let bytes: &[u8] = &map;
    if !bytes.starts_with(b"PK\x03\x04") && !bytes.starts_with(b"PK\x05\x06") {
        return Err(unknown(path, not_a_zip(bytes)));
    }
    let archive = zip::parse(bytes).map_err(|e| match e {
        ZipError::Corrupt(m) => Error::corrupt(path, format!("zip archive: {m}")),
        ZipError::Refused(m) => unknown(path, m),
    })?;
    let first = archive.entries.first().ok_or_else(|| {
        unknown(
            path,
            "an empty zip archive, not a checkpoint written by torch.save",
        )
    })?;
    // Like torch's reader: the folder of the first entry holds the records.
    let Some((prefix, _)) = first.name.split_once('/') else {
        return Err(unknown(
            path,
            format!(
                "the zip entry `{}` is not in a folder; torch.save puts every record in one \
                 (`<name>/data.pkl`)",
                shown_text(&first.name)
            ),
        ));
    };
    let record = |name: &str| archive.get(&format!("{prefix}/{name}"));
    let code = format!("{prefix}/code/");
    if record("constants.pkl").is_some()
        || archive.entries.iter().any(|e| e.name.starts_with(&code))
    {
        return Err(unknown(
            path,
            "a TorchScript module (torch.jit.save, e.g. WeNet's `final.zip`), not a state dict \
             saved by torch.save; use the training checkpoint (`final.pt`)",
        ));
    }
    let pickle = record("data.pkl").ok_or_else(|| {
        unknown(
            path,
            format!(
                "no `{}/data.pkl` in the zip archive: not a checkpoint written by torch.save",
                shown_text(prefix)
            ),
        )
    })?;
    if let Some(order) = record("byteorder") {
        match entry_bytes(path, bytes, order)? {
            b"little" => {}
            b"big" => {
                return Err(unknown(
                    path,
                    "big-endian tensor data (`byteorder` is `big`); this reader reads \
                     little-endian checkpoints: load it and save it again on a little-endian \
                     machine",
                ))
            }
            other => {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "`{}` is `{}`, not `little` or `big`",
                        shown_text(&order.name),
                        shown_text(&String::from_utf8_lossy(other))
                    ),
                ))
            }
        }
    }
    let root = unpickle::load(entry_bytes(path, bytes, pickle)?).map_err(|e| {
        let message = format!("{}: byte {}: {}", shown_text(&pickle.name), e.at, e.message);
        if e.refused {
            unknown(path, message)
        } else {
            Error::corrupt(path, message)
        }
    })?;
    let Value::Dict(dict) = root else {
        return Err(unknown(
            path,
            format!("the pickle holds {}, not a state dict", root.describe()),
        ));
    };
    let mut builder = Builder {
        path,
        map: &map,
        archive: &archive,
        prefix,
        storages: HashMap::new(),
        built: HashMap::new(),
        copied: 0,
    };
    let mut out = BTreeMap::new();
    for (key, value) in &dict.items {
        let Value::Str(key) = key else {
            return Err(unknown(
                path,
                format!("a state dict key is {}, not a string", key.describe()),
            ));
        };
        let tensor = match value {
            Value::Tensor(call) => builder.tensor(key, call)?,
            Value::Dict(_) => {
                return Err(Error::tensor(
                    path,
                    shown_text(key),
                    format!(
                        "is {}, not a tensor: the file is not a flat state dict (a training \
                         checkpoint such as `{{\"model\": state_dict, ...}}`?); save the state \
                         dict itself",
                        value.describe()
                    ),
                ))
            }
            other => {
                return Err(Error::tensor(
                    path,
                    shown_text(key),
                    format!(
                        "is {}, not a tensor; a state dict holds only tensors",
                        other.describe()
                    ),
                ))
            }
        };
        out.insert(key.to_string(), tensor);
    }
    Ok(out)
}

fn unknown(path: &Path, message: impl Into<String>) -> Error {
    Error::UnknownFormat {
        path: path.into(),
        message: message.into(),
    }
}

/// Why a file that does not start like a zip archive is not read.
fn not_a_zip(bytes: &[u8]) -> String {
    // A legacy checkpoint is a pickle stream (PROTO, perhaps FRAME) that starts with a magic
    // number; the oldest ones are tar archives.
    let mut rest = bytes;
    if rest.first() == Some(&0x80) {
        rest = rest.get(2..).unwrap_or(&[]);
        if rest.first() == Some(&0x95) {
            rest = rest.get(9..).unwrap_or(&[]);
        }
    }
    if rest.starts_with(&LEGACY_MAGIC) || bytes.get(257..262) == Some(b"ustar") {
        LEGACY.to_string()
    } else if bytes.first() == Some(&0x80) {
        "a bare pickle, not the zip archive torch.save writes; this reader loads no pickle outside \
         a checkpoint archive"
            .to_string()
    } else {
        "not a PyTorch checkpoint: not the zip archive torch.save writes".to_string()
    }
}

/// The bytes of a zip entry (their range was checked when the archive was parsed).
fn entry_bytes<'a>(path: &Path, bytes: &'a [u8], entry: &Entry) -> Result<&'a [u8]> {
    entry
        .start
        .checked_add(entry.len)
        .and_then(|end| bytes.get(entry.start..end))
        .ok_or_else(|| {
            Error::corrupt(
                path,
                format!("entry `{}` is out of bounds", shown_text(&entry.name)),
            )
        })
}

/// Text from the file as messages show it: at most 200 characters, control characters replaced,
/// so a hostile key or name cannot flood or drive the terminal.
pub(crate) fn shown_text(text: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = text
        .chars()
        .take(MAX)
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    if text.chars().nth(MAX).is_some() {
        out.push('…');
    }
    out
}

/// Builds the tensors of a state dict from the pickle's tensor calls.
struct Builder<'a> {
    path: &'a Path,
    map: &'a Arc<Mmap>,
    archive: &'a Archive,
    prefix: &'a str,
    /// Each storage key's type and element count, as first seen: a second tensor of the same
    /// storage must agree.
    storages: HashMap<Rc<str>, (StorageType, u64)>,
    /// Tensors already built, by call (a tensor pickled once and referenced twice).
    built: HashMap<*const TensorCall, Tensor>,
    /// Bytes copied for non-contiguous views so far.
    copied: usize,
}

impl Builder<'_> {
    fn error(&self, key: &str, message: impl Into<String>) -> Error {
        Error::tensor(self.path, shown_text(key), message)
    }

    fn tensor(&mut self, key: &str, call: &Rc<TensorCall>) -> Result<Tensor> {
        if let Some(t) = self.built.get(&Rc::as_ptr(call)) {
            return Ok(t.clone());
        }
        let args = &call.args.items;
        let tensor = match call.callable {
            Callable::RebuildTensorV2 => self.rebuild(key, args)?,
            Callable::RebuildParameter => match args.as_slice() {
                [Value::Tensor(data), Value::Bool(_), hooks]
                    if data.callable == Callable::RebuildTensorV2 =>
                {
                    self.no_hooks(key, hooks)?;
                    self.tensor(key, data)?
                }
                _ => {
                    return Err(self.error(
                        key,
                        format!(
                            "an nn.Parameter rebuilt from ({}), not (tensor, requires_grad, \
                             backward_hooks)",
                            described(args)
                        ),
                    ))
                }
            },
            Callable::OrderedDict => {
                return Err(self.error(key, "is an OrderedDict call, not a tensor"))
            }
        };
        self.built.insert(Rc::as_ptr(call), tensor.clone());
        Ok(tensor)
    }

    fn no_hooks(&self, key: &str, hooks: &Value) -> Result<()> {
        match hooks {
            Value::Dict(d) if d.items.is_empty() => Ok(()),
            other => Err(self.error(
                key,
                format!(
                    "its backward hooks are {}; a saved tensor has none (an empty OrderedDict)",
                    other.describe()
                ),
            )),
        }
    }

    /// `_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[,
    /// metadata])`.
    fn rebuild(&mut self, key: &str, args: &[Value]) -> Result<Tensor> {
        let (storage, offset, size, stride, requires_grad, hooks, metadata) = match args {
            [s, o, size, stride, r, h] => (s, o, size, stride, r, h, None),
            [s, o, size, stride, r, h, m] => (s, o, size, stride, r, h, Some(m)),
            _ => {
                return Err(self.error(
                    key,
                    format!(
                        "_rebuild_tensor_v2 with {} arguments ({}); torch.save passes 6 or 7",
                        args.len(),
                        described(args)
                    ),
                ))
            }
        };
        let Value::Storage(storage) = storage else {
            return Err(self.error(
                key,
                format!("its storage is {}, not a storage", storage.describe()),
            ));
        };
        let offset = match offset {
            Value::Int(o) if *o >= 0 => *o as u64,
            other => {
                return Err(self.error(
                    key,
                    format!(
                        "its storage offset is {}, not a non-negative int",
                        other.describe()
                    ),
                ))
            }
        };
        let size = self.dims(key, "size", size)?;
        let stride = self.dims(key, "stride", stride)?;
        if size.len() != stride.len() {
            return Err(self.error(
                key,
                format!(
                    "its size {} and stride {} have different lengths",
                    dims(&size),
                    dims(&stride)
                ),
            ));
        }
        if !matches!(requires_grad, Value::Bool(_)) {
            return Err(self.error(
                key,
                format!(
                    "its requires_grad is {}, not a bool",
                    requires_grad.describe()
                ),
            ));
        }
        self.no_hooks(key, hooks)?;
        match metadata {
            None | Some(Value::None) => {}
            Some(Value::Dict(d)) if d.items.is_empty() => {}
            Some(other) => {
                return Err(self.error(
                    key,
                    format!(
                        "it carries tensor metadata ({}), which this reader does not apply",
                        other.describe()
                    ),
                ))
            }
        }
        self.view(key, storage, offset, &size, &stride)
    }

    fn dims(&self, key: &str, what: &str, v: &Value) -> Result<Vec<u64>> {
        let bad = || {
            self.error(
                key,
                format!(
                    "its {what} is {}, not a tuple of non-negative ints",
                    v.describe()
                ),
            )
        };
        let Value::Tuple(t) = v else {
            return Err(bad());
        };
        t.items
            .iter()
            .map(|d| match d {
                Value::Int(i) if *i >= 0 => Ok(*i as u64),
                _ => Err(bad()),
            })
            .collect()
    }

    /// The tensor of `size` and `stride` at element `offset` of `storage`, every bound checked
    /// before a byte is read.
    fn view(
        &mut self,
        key: &str,
        storage: &Storage,
        offset: u64,
        size: &[u64],
        stride: &[u64],
    ) -> Result<Tensor> {
        let ty = storage.ty;
        let dtype = ty.dtype;
        let name = format!("{}/data/{}", self.prefix, storage.key);
        let shown = shown_text(&storage.key);
        if let Some(&(seen, numel)) = self.storages.get(&storage.key) {
            if (seen, numel) != (ty, storage.numel) {
                return Err(self.error(
                    key,
                    format!(
                        "storage `{shown}` is a {} of {} elements here and a {} of {numel} for \
                         another tensor",
                        ty.name, storage.numel, seen.name
                    ),
                ));
            }
        } else {
            self.storages
                .insert(storage.key.clone(), (ty, storage.numel));
        }
        let entry = self.archive.get(&name).ok_or_else(|| {
            self.error(
                key,
                format!("its storage `data/{shown}` is not in the archive"),
            )
        })?;
        let esize = dtype.size() as u64;
        let nbytes = storage.numel.checked_mul(esize);
        if nbytes != Some(entry.len as u64) {
            return Err(self.error(
                key,
                format!(
                    "storage `data/{shown}` holds {} bytes, but the pickle says {} elements of \
                     {dtype}",
                    entry.len, storage.numel
                ),
            ));
        }
        let overflow = || self.error(key, format!("its size {} overflows", dims(size)));
        let numel = size
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(overflow)?;
        let shape = size
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| overflow()))
            .collect::<Result<Vec<usize>>>()?;
        if numel == 0 {
            return Ok(Tensor::from_bytes(dtype, shape, Vec::new()));
        }
        // The last element the view reaches must be inside the storage.
        let last = size.iter().zip(stride).try_fold(offset, |at, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|x| at.checked_add(x))
        });
        if last.is_none_or(|last| last >= storage.numel) {
            return Err(self.error(
                key,
                format!(
                    "its view (offset {offset}, size {}, stride {}) reaches past \
                     the end of storage `{shown}` ({} elements)",
                    dims(size),
                    dims(stride),
                    storage.numel
                ),
            ));
        }
        // The storage's byte length fits in memory, so every offset into it does too.
        let esize = dtype.size();
        let numel = usize::try_from(numel).map_err(|_| overflow())?;
        let offset = offset as usize;
        let data = entry_bytes(self.path, &self.map[..], entry)?;
        let mut expected = 1u64;
        let mut contiguous = true;
        for (&d, &s) in size.iter().zip(stride).rev() {
            if d != 1 && s != expected {
                contiguous = false;
            }
            expected = expected.saturating_mul(d);
        }
        if contiguous {
            return Ok(Tensor::mapped(
                dtype,
                shape,
                self.map.clone(),
                entry.start + offset * esize,
                numel * esize,
            ));
        }
        // A non-contiguous view (a transpose, a strided slice, an expand) becomes a contiguous
        // copy. Overlapping views could ask for far more than the file holds: the copies may
        // not total more than the file's size.
        let bytes = numel.saturating_mul(esize);
        if self.copied.saturating_add(bytes) > self.map.len() {
            return Err(self.error(
                key,
                format!(
                    "a non-contiguous view of {bytes} bytes; the copies of the checkpoint's \
                     non-contiguous views would exceed the file's own size ({} bytes)",
                    self.map.len()
                ),
            ));
        }
        self.copied += bytes;
        // A dimension of size 1 is never stepped: its stride plays no part.
        let stride: Vec<usize> = size
            .iter()
            .zip(stride)
            .map(|(&d, &s)| if d == 1 { 0 } else { s as usize })
            .collect();
        let mut out = Vec::with_capacity(bytes);
        let mut index = vec![0usize; shape.len()];
        let mut at = offset;
        for _ in 0..numel {
            let element = data
                .get(at * esize..(at + 1) * esize)
                .ok_or_else(|| self.error(key, "its view reaches past its storage"))?;
            out.extend_from_slice(element);
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                at += stride[d];
                if index[d] < shape[d] {
                    break;
                }
                at -= stride[d] * shape[d];
                index[d] = 0;
            }
        }
        Ok(Tensor::from_bytes(dtype, shape, out))
    }
}

/// At most this many items of a tuple are shown in a message.
const SHOWN_ITEMS: usize = 8;

/// A list of values as messages show it.
fn described(values: &[Value]) -> String {
    let mut parts: Vec<String> = values
        .iter()
        .take(SHOWN_ITEMS)
        .map(Value::describe)
        .collect();
    if values.len() > SHOWN_ITEMS {
        parts.push(format!("… {} more", values.len() - SHOWN_ITEMS));
    }
    parts.join(", ")
}

/// A size or stride as messages show it: `[3, 4]`.
fn dims(values: &[u64]) -> String {
    let mut parts: Vec<String> = values
        .iter()
        .take(SHOWN_ITEMS)
        .map(u64::to_string)
        .collect();
    if values.len() > SHOWN_ITEMS {
        parts.push(format!("… {} more", values.len() - SHOWN_ITEMS));
    }
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented list is the one the unpickler applies: each global on it loads, and every
    /// storage type the unpickler knows is on it.
    #[test]
    fn the_allowed_globals_are_the_ones_the_unpickler_accepts() {
        for global in ALLOWED_GLOBALS {
            let (module, name) = global.rsplit_once('.').unwrap();
            let pickle = format!("\u{80}\u{2}c{module}\n{name}\n.");
            let pickle: Vec<u8> = pickle.chars().map(|c| c as u8).collect();
            assert!(unpickle::load(&pickle).is_ok(), "{global}");
        }
        for t in unpickle::STORAGE_TYPES {
            assert!(ALLOWED_GLOBALS.contains(&format!("torch.{}", t.name).as_str()));
        }
        let e = unpickle::load(b"\x80\x02ctorch\nload\n.").unwrap_err();
        assert!(
            e.message.contains("`torch.load` is not a tensor"),
            "{}",
            e.message
        );
    }

    #[test]
    fn messages_show_hostile_text_short_and_inert() {
        assert_eq!(shown_text("a\x1b[31mb\n"), "a\u{fffd}[31mb\u{fffd}");
        let long = "x".repeat(1000);
        assert_eq!(shown_text(&long).chars().count(), 201);
    }
}
