//! Tensors as the checkpoint layer sees them: a dtype, a shape and bytes that are either a range
//! of a memory-mapped source file or owned.

use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use memmap2::Mmap;
use rayon::prelude::*;

/// Element types that appear in the checkpoints we read and write.
///
/// `F64`, `I64` and `Bool` are what PyTorch checkpoints hold besides the rest (a `float64`
/// buffer, BatchNorm's `int64` `num_batches_tracked`, a `bool` mask); safetensors names them
/// `F64`, `I64` and `BOOL`, so they are read and written like any other dtype. `F64` is a float
/// dtype ([`DType::is_float`]): it converts to f32 by rounding to nearest like the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I8,
    F8E4m3,
    I16,
    I32,
    U8,
    F64,
    I64,
    /// One byte per element, 0 or 1 (PyTorch's and safetensors' layout).
    Bool,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::F8E4m3 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The full-precision float dtypes (not the fp8 code dtype), which [`Tensor::to_f32`] and
    /// [`Tensor::to_float_dtype`] convert.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The safetensors name of the dtype.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I8 => "I8",
            DType::F8E4m3 => "F8_E4M3",
            DType::I16 => "I16",
            DType::I32 => "I32",
            DType::U8 => "U8",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::Bool => "BOOL",
        }
    }

    pub(crate) fn from_safetensors(dtype: safetensors::Dtype) -> Option<Self> {
        use safetensors::Dtype as S;
        Some(match dtype {
            S::F32 => DType::F32,
            S::F16 => DType::F16,
            S::BF16 => DType::BF16,
            S::I8 => DType::I8,
            S::F8_E4M3 => DType::F8E4m3,
            S::I16 => DType::I16,
            S::I32 => DType::I32,
            S::U8 => DType::U8,
            S::F64 => DType::F64,
            S::I64 => DType::I64,
            S::BOOL => DType::Bool,
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// Where a tensor's bytes live.
#[derive(Clone, Debug)]
enum Bytes {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
    /// All zero, from a zeroed allocation: the OS provides its pages on first write, so a tensor
    /// that is only shaped, never written, costs no resident memory (nor does its f32 copy).
    Zeros(Arc<Vec<u8>>),
}

/// A little-endian tensor.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    bytes: Bytes,
}

impl Tensor {
    /// A view of `len` bytes at `start` of a mapped file. The caller has checked the range.
    pub(crate) fn mapped(
        dtype: DType,
        shape: Vec<usize>,
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    ) -> Self {
        debug_assert!(start + len <= map.len());
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Mapped { map, start, len },
        }
    }

    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        debug_assert_eq!(bytes.len(), shape.iter().product::<usize>() * dtype.size());
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Owned(Arc::new(bytes)),
        }
    }

    /// Zeros of `dtype` and `shape` that take no resident memory until written (see
    /// `Bytes::Zeros`): a placeholder whose values are never read.
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Self {
        let len = shape.iter().product::<usize>() * dtype.size();
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Zeros(Arc::new(vec![0; len])),
        }
    }

    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_bytes(DType::F32, shape, bytes)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(v) | Bytes::Zeros(v) => v,
        }
    }

    /// Rows `[first, first + count)` of the leading dimension, without copying.
    pub fn slice_rows(&self, first: usize, count: usize) -> Tensor {
        let row_bytes = self.shape[1..].iter().product::<usize>() * self.dtype.size();
        let mut shape = self.shape.clone();
        shape[0] = count;
        let bytes = match &self.bytes {
            Bytes::Mapped { map, start, .. } => Bytes::Mapped {
                map: map.clone(),
                start: start + first * row_bytes,
                len: count * row_bytes,
            },
            Bytes::Owned(v) => Bytes::Owned(Arc::new(
                v[first * row_bytes..(first + count) * row_bytes].to_vec(),
            )),
            Bytes::Zeros(_) => Bytes::Zeros(Arc::new(vec![0; count * row_bytes])),
        };
        Tensor {
            dtype: self.dtype,
            shape,
            bytes,
        }
    }

    /// The values as f32. Only float dtypes convert; the caller checks `dtype.is_float()`.
    pub fn to_f32(&self) -> Vec<f32> {
        if matches!(self.bytes, Bytes::Zeros(_)) && self.dtype.is_float() {
            return vec![0.0; self.numel()];
        }
        let b = self.bytes();
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => halves_to_f32(b, f16::from_le_bytes),
            DType::BF16 => halves_to_f32(b, bf16::from_le_bytes),
            DType::F64 => self.to_f64_values().into_iter().map(|v| v as f32).collect(),
            other => panic!("to_f32 on a {other} tensor"),
        }
    }

    /// The tensor converted to another float dtype (round to nearest even when narrowing).
    pub fn to_float_dtype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype {
            return self.clone();
        }
        let values = self.to_f32();
        let bytes: Vec<u8> = match dtype {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::F64 => values
                .iter()
                .flat_map(|v| f64::from(*v).to_le_bytes())
                .collect(),
            other => panic!("to_float_dtype({other})"),
        };
        Tensor::from_bytes(dtype, self.shape.clone(), bytes)
    }

    /// The values of an `F64` tensor (no rounding; the caller checks the dtype).
    fn to_f64_values(&self) -> Vec<f64> {
        self.bytes()
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()
    }

    /// A 3-D tensor with its last two axes swapped: [a, b, c] -> [a, c, b].
    pub fn swap_last_two(&self) -> Tensor {
        let [a, b, c] = [self.shape[0], self.shape[1], self.shape[2]];
        let e = self.dtype.size();
        let src = self.bytes();
        let mut out = vec![0u8; src.len()];
        for i in 0..a {
            for j in 0..b {
                for k in 0..c {
                    let from = ((i * b + j) * c + k) * e;
                    let to = ((i * c + k) * b + j) * e;
                    out[to..to + e].copy_from_slice(&src[from..from + e]);
                }
            }
        }
        Tensor::from_bytes(self.dtype, vec![a, c, b], out)
    }

    /// True when every byte is zero (used to check CTranslate2's zero k bias).
    pub fn is_all_zero(&self) -> bool {
        match self.dtype {
            // -0.0 is zero too.
            DType::F32 | DType::F16 | DType::BF16 => self.to_f32().iter().all(|v| *v == 0.0),
            // Compared in f64: a tiny value must not round to zero on the way.
            DType::F64 => self.to_f64_values().iter().all(|v| *v == 0.0),
            _ => self.bytes().iter().all(|b| *b == 0),
        }
    }
}

/// Little-endian 16-bit floats to f32 (exact), in parallel blocks through `half`'s slice
/// conversion (F16C where the CPU has it): a value at a time, with its feature check and call,
/// was a fifth of quantizing a large fp16 checkpoint. The bytes need not be aligned.
// `from_le` is generic (not a `fn` pointer) so that it inlines: called through a pointer, the
// byte-to-half step was a call per value.
fn halves_to_f32<H>(bytes: &[u8], from_le: impl Fn([u8; 2]) -> H + Sync) -> Vec<f32>
where
    H: Copy + Default + Send + Sync,
    [H]: HalfFloatSliceExt,
{
    const BLOCK: usize = 4096;
    let mut out = vec![0f32; bytes.len() / 2];
    out.par_chunks_mut(BLOCK)
        .zip(bytes.par_chunks(2 * BLOCK))
        .for_each(|(out, bytes)| {
            let mut halves = [H::default(); BLOCK];
            let halves = &mut halves[..out.len()];
            for (h, c) in halves.iter_mut().zip(bytes.chunks_exact(2)) {
                *h = from_le([c[0], c[1]]);
            }
            halves.convert_to_f32_slice(out);
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_read_as_zeros_in_every_view() {
        let t = Tensor::zeros(DType::F32, vec![3, 4]);
        assert_eq!(t.numel(), 12);
        assert_eq!(t.bytes().len(), 48);
        assert!(t.bytes().iter().all(|&b| b == 0));
        assert_eq!(t.to_f32(), vec![0.0; 12]);
        let rows = t.slice_rows(1, 2);
        assert_eq!(rows.shape, vec![2, 4]);
        assert_eq!(rows.to_f32(), vec![0.0; 8]);
        let half = Tensor::zeros(DType::F16, vec![5]);
        assert_eq!(half.bytes().len(), 10);
        assert_eq!(half.to_f32(), vec![0.0; 5]);
        assert_eq!(half.to_float_dtype(DType::F32).to_f32(), vec![0.0; 5]);
    }
}
