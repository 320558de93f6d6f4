//! The executor seam every architecture's forward runs its quantizable GEMMs through: a
//! [`LinearExec`] decides how a [`Linear`] is computed (full precision, observed by calibration,
//! or with the quantized numerics of a verify run), so the rest of a forward never changes.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::gemv;

use crate::parallel::{inner_parallelism, min_task_len};

use crate::error::{Error, Result};
use crate::numerics::Activation;

/// Maps a candle error into the crate's error, naming what was being computed.
pub(crate) fn ce(what: &str) -> impl Fn(candle_core::Error) -> Error + '_ {
    move |e| Error::Model {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// A GEMM layer: `y = x · Wᵀ + b`. Convolutions are stored here flattened to `[out, k · in]`,
/// matching im2col patches ordered (tap, channel).
#[derive(Debug, Clone)]
pub struct Linear {
    pub name: String,
    /// `[out, in]` (convolutions: `[out, k · in]`).
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

/// The deepest K one f32 GEMM call sums over. The gemm crate splits a deeper K into blocks sized
/// from the CPU's L1 cache (512 on a 32 KiB 8-way L1, 768 on a 48 KiB 12-way one for K 1536),
/// which changes the order of the sum from one machine to another; up to 512 it sums in one
/// block everywhere. So every f32 GEMM of a forward sums K in chunks of 512, each from zero,
/// added in order: the figures of a gate are then the same on every x86-64 machine.
pub(crate) const GEMM_DEPTH: usize = 512;

/// `dst[m, n] = scale · Σ_k lhs[m, k] · rhs[k, n]` on strided f32 views (row stride, column
/// stride). K is summed in chunks of [`GEMM_DEPTH`], each added to `dst` in order, so the sum is
/// the same on every machine; `parallelism` splits rows and columns only.
///
/// # Safety
/// Every element addressed by the shapes and strides must lie inside the pointed-to buffers, and
/// `dst` must not overlap the operands.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn strided_gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    lhs: *const f32,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const f32,
    rhs_rs: usize,
    rhs_cs: usize,
    scale: f32,
    parallelism: gemm::Parallelism,
) {
    chunked_gemm(
        (m, n, k),
        GEMM_DEPTH,
        dst,
        dst_rs,
        (lhs, lhs_rs, lhs_cs),
        (rhs, rhs_rs, rhs_cs),
        false,
        scale,
        parallelism,
    );
}

/// `dst[m, n] = (dst if accumulate, else 0) + scale · Σ_k lhs[m, k] · rhs[k, n]` on row-major
/// strided views (row stride, column stride), with K summed in chunks of at most `chunk`, each
/// added to `dst` in order. The gemm crate blocks a deeper K by the CPU's cache, which would
/// change the order of the sum from one machine to another; up to a small enough chunk it sums
/// in one block everywhere. Without `accumulate` and with K = 0, `dst` is written with zeros.
///
/// # Safety
/// Every element addressed by the shapes and strides must lie inside the pointed-to buffers, and
/// `dst` must not overlap the operands.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn chunked_gemm<T: Copy + From<u8> + 'static>(
    (m, n, k): (usize, usize, usize),
    chunk: usize,
    dst: *mut T,
    dst_rs: usize,
    (lhs, lhs_rs, lhs_cs): (*const T, usize, usize),
    (rhs, rhs_rs, rhs_cs): (*const T, usize, usize),
    accumulate: bool,
    scale: T,
    parallelism: gemm::Parallelism,
) {
    // Overwriting with K = 0 still makes one call, which writes the zeros.
    let calls = if accumulate { k } else { k.max(1) };
    for k0 in (0..calls).step_by(chunk) {
        let read_dst = accumulate || k0 > 0;
        gemm::gemm(
            m,
            n,
            chunk.min(k - k0),
            dst,
            1,
            dst_rs as isize,
            read_dst,
            lhs.add(k0 * lhs_cs),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.add(k0 * rhs_rs),
            rhs_cs as isize,
            rhs_rs as isize,
            T::from(u8::from(read_dst)),
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `x · w_t` for `x` `[.., k]` and `w_t` `[k, n]` (any 2-D strides, such as the transposed view
/// of a `[n, k]` weight), both f32 on the CPU: K summed in chunks of [`GEMM_DEPTH`] by
/// [`strided_gemm`]; up to [`gemv::MAX_ROWS`] rows with a weight stored as `[n, k]`, in the
/// fixed order of [`gemv`] instead.
pub(crate) fn matmul(x: &Tensor, w_t: &Tensor, what: &str) -> Result<Tensor> {
    if let Some(y) = few_rows(x, w_t, what)? {
        return Ok(y);
    }
    let (k, n) = w_t.dims2().map_err(ce(what))?;
    let mut dims = x.dims().to_vec();
    match dims.last_mut() {
        Some(last) if *last == k => *last = n,
        _ => {
            return Err(Error::Model {
                what: what.to_string(),
                message: format!(
                    "input {:?} does not end in the weight's depth {k}",
                    x.dims()
                ),
            })
        }
    }
    let x = x.contiguous().map_err(ce(what))?;
    let rows = x.elem_count() / k.max(1);
    let (x_storage, x_layout) = x.storage_and_layout();
    let (w_storage, w_layout) = w_t.storage_and_layout();
    let (
        Storage::Cpu(CpuStorage::F32(xs)),
        Some((x_start, x_end)),
        Storage::Cpu(CpuStorage::F32(ws)),
    ) = (&*x_storage, x_layout.contiguous_offsets(), &*w_storage)
    else {
        return Err(Error::Model {
            what: what.to_string(),
            message: "the f32 forward runs on f32 CPU tensors".into(),
        });
    };
    let (xs, (w_rs, w_cs)) = (
        &xs[x_start..x_end],
        (w_layout.stride()[0], w_layout.stride()[1]),
    );
    let w_last = w_layout.start_offset() + (k.max(1) - 1) * w_rs + (n.max(1) - 1) * w_cs;
    if k * n > 0 && w_last >= ws.len() {
        return Err(Error::Model {
            what: what.to_string(),
            message: "the weight view lies outside its storage".into(),
        });
    }
    let parallelism = if inner_parallelism() {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    let mut y = vec![0f32; rows * n];
    // SAFETY: x is [rows, k] contiguous; w_t's element (c, j) is at start + c·w_rs + j·w_cs,
    // checked above to lie in its storage; y is [rows, n] row-major.
    unsafe {
        strided_gemm(
            rows,
            n,
            k,
            y.as_mut_ptr(),
            n,
            xs.as_ptr(),
            k,
            1,
            ws.as_ptr().add(w_layout.start_offset()),
            w_rs,
            w_cs,
            1.0,
            parallelism,
        )
    };
    Tensor::from_vec(y, dims, &Device::Cpu).map_err(ce(what))
}

/// [`gemv::product`] when `x` has at most [`gemv::MAX_ROWS`] rows of f32 and `w_t` is the
/// transposed view of a contiguous f32 `[n, k]` weight on the CPU; `None` otherwise.
fn few_rows(x: &Tensor, w_t: &Tensor, what: &str) -> Result<Option<Tensor>> {
    let (Ok((k, n)), Ok(w), DType::F32) = (w_t.dims2(), w_t.t(), x.dtype()) else {
        return Ok(None);
    };
    let rows = x.elem_count() / k.max(1);
    if rows == 0 || rows > gemv::MAX_ROWS || x.dim(candle_core::D::Minus1).ok() != Some(k) {
        return Ok(None);
    }
    let (storage, layout) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(data)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let xs = to_vec(x, what)?;
    let y = gemv::product(&xs, rows, k, &data[start..end], n);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Tensor::from_vec(y, dims, &Device::Cpu)
        .map(Some)
        .map_err(ce(what))
}

impl Linear {
    /// The full-precision product.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w_t = self.weight.t().map_err(ce(&self.name))?;
        let y = matmul(x, &w_t, &self.name)?;
        match &self.bias {
            Some(b) => add(&y, b, &self.name),
            None => Ok(y),
        }
    }
}

/// How a forward runs its quantizable GEMMs.
pub trait LinearExec {
    /// `x` is `[rows, in]`; returns `[rows, out]`.
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor>;

    /// The layer followed by `activation` (an FFN's first projection). An executor whose GEMM
    /// applies the activation in its epilogue (a GEMM-chain producer) overrides this.
    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        activate(self.linear(layer, x)?, activation, &layer.name)
    }
}

/// Plain fp32.
#[derive(Debug, Default, Clone, Copy)]
pub struct FullPrecision;

impl LinearExec for FullPrecision {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        layer.forward(x)
    }
}

/// The tensor's values, row-major.
pub(crate) fn to_vec(x: &Tensor, what: &str) -> Result<Vec<f32>> {
    x.flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce(what))
}

/// `a + b` for f32 CPU tensors, where `b`'s shape is `a`'s or a suffix of it (a bias over rows,
/// positions over a batch). Candle hands an elementwise op of 64 Ki elements or more to one
/// process-wide pool behind one lock, which serialised the threads that each run an utterance
/// (calibration, verify) on every residual and bias add: at 16 threads that lock, not the work,
/// set the pace (BENCHMARKS.md). The sums are the same bits: one f32 addition per element.
pub(crate) fn add(a: &Tensor, b: &Tensor, what: &str) -> Result<Tensor> {
    let (dims, b_dims) = (a.dims(), b.dims());
    if b_dims.len() > dims.len() || dims[dims.len() - b_dims.len()..] != *b_dims {
        return Err(Error::Model {
            what: what.to_string(),
            message: format!("cannot add {b_dims:?} to {dims:?}"),
        });
    }
    // `b` read in place: a residual is as large as `a`, and a copy of it raised the peak.
    let b = b.contiguous().map_err(ce(what))?;
    let (storage, layout) = b.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Err(Error::Model {
            what: what.to_string(),
            message: "the forward adds f32 CPU tensors".into(),
        });
    };
    with_each_copy(a, &values[start..end], what, |s, r| *s += r)
}

/// `x` with each column multiplied by its factor (`factors` as long as `x`'s last dimension):
/// a runtime smoother, off candle's locked pool like [`add`].
pub(crate) fn scale_columns(x: &Tensor, factors: &[f32], what: &str) -> Result<Tensor> {
    if x.dims().last() != Some(&factors.len()) {
        return Err(Error::Model {
            what: what.to_string(),
            message: format!("{} factors for an input {:?}", factors.len(), x.dims()),
        });
    }
    with_each_copy(x, factors, what, |v, f| *v *= f)
}

/// `a`'s values combined by `op` with `rhs`, which repeats over them (`a.elem_count()` is a
/// multiple of its length, checked by the callers through the shapes).
fn with_each_copy(
    a: &Tensor,
    rhs: &[f32],
    what: &str,
    op: impl Fn(&mut f32, f32) + Sync,
) -> Result<Tensor> {
    use rayon::prelude::*;
    let shape = a.shape().clone();
    let mut out = to_vec(a, what)?;
    if !rhs.is_empty() {
        // Whole copies of `rhs`, about 16 Ki elements a task where the forward may split its work.
        let chunk = rhs.len() * (16 * 1024 / rhs.len()).max(1);
        let tasks = out.len().div_ceil(chunk);
        out.par_chunks_mut(chunk)
            .with_min_len(min_task_len(tasks))
            .for_each(|part| {
                for row in part.chunks_mut(rhs.len()) {
                    row.iter_mut().zip(rhs).for_each(|(v, &r)| op(v, r));
                }
            });
    }
    Tensor::from_vec(out, shape, &Device::Cpu).map_err(ce(what))
}

/// `activation` of every element with the reference numerics (`crate::numerics`), so the
/// forward, the verify run and the kernels' epilogues compute the same bits. GELU runs
/// vectorised (libm's scalar `erff` made GELU a tenth of Whisper's forward).
pub(crate) fn activate(x: Tensor, activation: Activation, what: &str) -> Result<Tensor> {
    if activation == Activation::None {
        return Ok(x);
    }
    let shape = x.shape().clone();
    let mut values = to_vec(&x, what)?;
    match activation {
        Activation::Gelu => crate::numerics::gelu_in_place(&mut values),
        other => values
            .iter_mut()
            .for_each(|v| *v = crate::numerics::activate(other, *v)),
    }
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(ce(what))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::parallel::one_utterance;

    /// Seeded values in [-0.5, 0.5).
    pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    /// One utterance per thread keeps the GEMM on the calling thread; split across the pool or
    /// not, and with the weight as the transposed view of `[n, k]` or as `[k, n]`, the product
    /// is the same bits (the splits cut rows and columns, never a sum).
    #[test]
    fn matmul_is_the_same_bits_split_or_on_one_thread() {
        let (m, k, n) = (300, 1100, 200);
        let x = Tensor::from_vec(values(m * k, 3), (m, k), &Device::Cpu).unwrap();
        let w = Tensor::from_vec(values(n * k, 4), (n, k), &Device::Cpu).unwrap();
        let w_t = w.t().unwrap();
        let bits = |y: Tensor| -> Vec<u32> {
            let v = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|f| f.to_bits()).collect()
        };
        let split = bits(matmul(&x, &w_t, "test").unwrap());
        let alone = bits(one_utterance(usize::MAX, || matmul(&x, &w_t, "test")).unwrap());
        let contiguous = bits(matmul(&x, &w_t.contiguous().unwrap(), "test").unwrap());
        assert!(inner_parallelism(), "the scope must end with its closure");
        assert_eq!(split, alone);
        assert_eq!(split, contiguous);
    }

    /// The project's add gives candle's bits for the forward's three shapes (a residual, a bias
    /// over rows, positions under a batch), split across the pool or on one thread, as does the
    /// column scaling of a runtime smoother; shapes that do not broadcast are refused.
    #[test]
    fn add_and_scale_columns_are_candles_bits_without_its_pool() {
        let tensor = |shape: &[usize], seed| {
            let n = shape.iter().product();
            Tensor::from_vec(values(n, seed), shape, &Device::Cpu).unwrap()
        };
        let bits = |y: Tensor| -> Vec<u32> {
            let v = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|f| f.to_bits()).collect()
        };
        for (a, b) in [
            (vec![1500, 384], vec![1500, 384]),
            (vec![1500, 1536], vec![1536]),
            (vec![2, 700, 384], vec![700, 384]),
            (vec![3, 5], vec![5]),
        ] {
            let (a, b) = (tensor(&a, 5), tensor(&b, 6));
            let candle = bits(a.broadcast_add(&b).unwrap());
            let ours = add(&a, &b, "test").unwrap();
            assert_eq!(ours.dims(), a.dims());
            assert_eq!(bits(ours), candle);
            let alone = one_utterance(usize::MAX, || add(&a, &b, "test")).unwrap();
            assert_eq!(bits(alone), candle);
        }
        // The runtime smoother's column scaling, against candle's broadcast_mul.
        let (x, f) = (tensor(&[1500, 1536], 7), values(1536, 8));
        let candle = bits(
            x.broadcast_mul(&Tensor::from_slice(&f, 1536, &Device::Cpu).unwrap())
                .unwrap(),
        );
        assert_eq!(bits(scale_columns(&x, &f, "test").unwrap()), candle);
        let err = scale_columns(&x, &f[..3], "fc2").unwrap_err();
        assert!(err.to_string().contains("3 factors"), "{err}");
        let err = add(&tensor(&[4, 6], 1), &tensor(&[4], 2), "encoder").unwrap_err();
        assert!(
            err.to_string().contains("cannot add [4] to [4, 6]"),
            "{err}"
        );
    }

    /// Depths below, at and across the chunk size, with a ragged last chunk: every chunk is
    /// summed once (an off-by-one at a boundary would drop or repeat a column).
    #[test]
    fn chunked_matmul_sums_every_column_once() {
        for k in [1, 7, GEMM_DEPTH, GEMM_DEPTH + 1, 1153, 1536] {
            let (m, n) = (5, 9);
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let x = Tensor::from_vec(a.clone(), (m, k), &Device::Cpu).unwrap();
            let w_t = Tensor::from_vec(b.clone(), (k, n), &Device::Cpu).unwrap();
            let y = matmul(&x, &w_t, "test").unwrap().to_vec2::<f32>().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|c| f64::from(a[i * k + c]) * f64::from(b[c * n + j]))
                        .sum();
                    let got = f64::from(y[i][j]);
                    assert!(
                        (got - exact).abs() < 1e-4 * (k as f64).sqrt(),
                        "k {k} ({i}, {j}): {got} vs {exact}"
                    );
                }
            }
        }
    }
}
