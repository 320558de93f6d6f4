//! The scaled GEMM of a W8A8 layer, with its fused epilogue, and the quantizing variant that a
//! GEMM-chain producer runs.

use rayon::prelude::*;

use super::activation::{activate, Activation};
use super::e4m3::e4m3_decode_table;
use super::kernels::{
    dot_i8_block_kernel, dot_i8_kernel, fp8_tile_kernel, Fp8Panel, I8_BLOCK, N_TILE,
};
use super::quantize::{encode, static_multipliers, QuantDtype};
use super::rounding::{out_bits_to_f32, round_to_out, OutDtype};

/// The activation scale of a GEMM: one per row (per-token dynamic quantization) or one for the
/// whole input (a static `input_scale`).
#[derive(Clone, Copy, Debug)]
pub enum ActScale<'a> {
    PerRow(&'a [f32]),
    PerTensor(f32),
}

impl ActScale<'_> {
    #[inline]
    fn get(&self, row: usize) -> f32 {
        match self {
            ActScale::PerRow(s) => s[row],
            ActScale::PerTensor(s) => *s,
        }
    }
}

/// How an fp8 GEMM sums its products (int8 sums are exact either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fp8Accumulation {
    /// The reference: each accumulator an f32 sum from +0.0 over k = 0..K-1 of the exact
    /// products, in that order.
    #[default]
    Sequential,
    /// A model of Hopper's fp8 tensor cores as the default wgmma kernels run them
    /// ([`super::tensor_core`]), so that a CPU figure predicts the GPU's.
    TensorCore,
}

/// What the GEMM does after the accumulation: bias, activation, output dtype.
#[derive(Clone, Copy, Debug)]
pub struct GemmEpilogue<'a> {
    pub bias: Option<&'a [f32]>,
    pub activation: Activation,
    pub out: OutDtype,
}

/// The largest K for which an int8 dot product cannot overflow the i32 accumulator, even with
/// the unused code -128 on both sides: K · 128² ≤ i32::MAX.
pub const INT8_MAX_K: usize = (i32::MAX as usize) / (128 * 128);

/// The epilogue on one accumulator, before the output rounding:
/// `act(a_scale * (weight_scale * acc) + bias)`, in exactly that order.
#[inline]
pub fn epilogue_value(
    acc: f32,
    weight_scale: f32,
    a_scale: f32,
    bias: Option<f32>,
    activation: Activation,
) -> f32 {
    let v = weight_scale * acc;
    let v = a_scale * v;
    let v = match bias {
        Some(b) => v + b,
        None => v,
    };
    activate(activation, v)
}

/// Rows of A per task: a W row is reused from L1 across them.
const ROW_BLOCK: usize = 4;

#[allow(clippy::too_many_arguments)]
fn check_shapes(
    a: &[u8],
    a_scale: &ActScale,
    w: &[u8],
    weight_scale: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
) {
    assert_eq!(
        Some(a.len()),
        m.checked_mul(k),
        "a has {} codes, expected m * k = {m} * {k}",
        a.len()
    );
    assert_eq!(
        Some(w.len()),
        n.checked_mul(k),
        "w has {} codes, expected n * k = {n} * {k}",
        w.len()
    );
    assert_eq!(
        weight_scale.len(),
        n,
        "weight_scale has {} entries, expected n = {n}",
        weight_scale.len()
    );
    if let ActScale::PerRow(s) = a_scale {
        assert_eq!(
            s.len(),
            m,
            "a_scale has {} entries, expected m = {m}",
            s.len()
        );
    }
    if let Some(b) = epi.bias {
        assert_eq!(b.len(), n, "bias has {} entries, expected n = {n}", b.len());
    }
}

/// The shared GEMM driver: computes every accumulator in the order of the contract, applies the
/// epilogue, and hands each value to `finish(column, value)`.
#[allow(clippy::too_many_arguments)]
fn gemm_map<T, F>(
    dtype: QuantDtype,
    a: &[u8],
    a_scale: ActScale,
    w: &[u8],
    weight_scale: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
    accumulation: Fp8Accumulation,
    finish: F,
) -> Vec<T>
where
    T: Copy + Default + Send,
    F: Fn(usize, f32) -> T + Sync,
{
    check_shapes(a, &a_scale, w, weight_scale, m, n, k, epi);
    let mut out = vec![T::default(); m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let value = |i: usize, j: usize, acc: f32| {
        let v = epilogue_value(
            acc,
            weight_scale[j],
            a_scale.get(i),
            epi.bias.map(|b| b[j]),
            epi.activation,
        );
        finish(j, v)
    };
    // One task of row blocks inside one of several utterances run one per thread.
    let min_blocks_per_task = crate::parallel::min_task_len(m.div_ceil(ROW_BLOCK));
    match dtype {
        QuantDtype::Int8 => {
            assert!(
                k <= INT8_MAX_K,
                "k = {k} exceeds {INT8_MAX_K}, the int32 accumulator's exact range"
            );
            let dot = dot_i8_kernel();
            let block = dot_i8_block_kernel();
            out.par_chunks_mut(ROW_BLOCK * n)
                .with_min_len(min_blocks_per_task)
                .enumerate()
                .for_each(|(blk, out_rows)| {
                    let i0 = blk * ROW_BLOCK;
                    let rows = out_rows.len() / n;
                    let mut j0 = 0;
                    if let (Some(block), I8_BLOCK) = (block, rows) {
                        let a_row = |r: usize| &a[(i0 + r) * k..(i0 + r + 1) * k];
                        let a_rows = [a_row(0), a_row(1), a_row(2), a_row(3)];
                        while j0 + I8_BLOCK <= n {
                            let w_row = |c: usize| &w[(j0 + c) * k..(j0 + c + 1) * k];
                            let acc = block(&a_rows, &[w_row(0), w_row(1), w_row(2), w_row(3)]);
                            for (r, acc_r) in acc.iter().enumerate() {
                                for (c, &v) in acc_r.iter().enumerate() {
                                    out_rows[r * n + j0 + c] = value(i0 + r, j0 + c, v as f32);
                                }
                            }
                            j0 += I8_BLOCK;
                        }
                    }
                    for j in j0..n {
                        let w_row = &w[j * k..(j + 1) * k];
                        for r in 0..rows {
                            let i = i0 + r;
                            let acc = dot(&a[i * k..(i + 1) * k], w_row);
                            // `as` from i32 to f32 rounds to nearest even (__int2float_rn).
                            out_rows[r * n + j] = value(i, j, acc as f32);
                        }
                    }
                });
        }
        QuantDtype::Float8E4m3fn if accumulation == Fp8Accumulation::TensorCore => {
            super::tensor_core::fill(a, w, n, k, &mut out, value);
        }
        QuantDtype::Float8E4m3fn => {
            let lut = e4m3_decode_table();
            // W decoded and transposed to [K, N], so that the strictly sequential sum over k
            // of each output still vectorises across neighbouring outputs.
            let mut wt = vec![0f32; k * n];
            for j in 0..n {
                for (kk, &c) in w[j * k..(j + 1) * k].iter().enumerate() {
                    wt[kk * n + j] = lut[usize::from(c)];
                }
            }
            let tile = fp8_tile_kernel();
            out.par_chunks_mut(ROW_BLOCK * n)
                .with_min_len(min_blocks_per_task)
                .enumerate()
                .for_each(|(blk, out_rows)| {
                    let i0 = blk * ROW_BLOCK;
                    let rows = out_rows.len() / n;
                    let panel = Fp8Panel {
                        lut: &lut,
                        a_rows: &a[i0 * k..(i0 + rows) * k],
                        k,
                        wt: &wt,
                        n,
                    };
                    let mut acc = vec![0f32; rows * N_TILE];
                    for j0 in (0..n).step_by(N_TILE) {
                        let nt = N_TILE.min(n - j0);
                        // Each sum starts from +0.0 and adds a(k) * w(k) for k = 0, 1, ...;
                        // every product of two e4m3 values is exact in f32.
                        acc.fill(0.0);
                        tile(&panel, j0, nt, &mut acc);
                        for (r, acc_r) in acc.chunks_exact(N_TILE).enumerate() {
                            for (jj, &s) in acc_r[..nt].iter().enumerate() {
                                out_rows[r * n + j0 + jj] = value(i0 + r, j0 + jj, s);
                            }
                        }
                    }
                });
        }
    }
    out
}

/// The scaled GEMM of a quantized layer.
///
/// `out[m, n] = act(a_scale[m] * (weight_scale[n] * acc[m, n]) + bias[n])`, rounded once to
/// `epi.out` (bits of f16 / bf16). `a` is `[M, K]` codes, `w` is `[N, K]` codes (the weight keeps
/// its `[N, K]` layout), both of `dtype`.
///
/// int8: `acc` is the exact i32 sum of i8·i8, converted to f32 nearest-even (K ≤
/// [`INT8_MAX_K`]). fp8: `acc` is an f32 sum from +0.0 over k = 0..K-1 of the exact products,
/// in that order. Each row depends only on its own inputs: rows are bitwise equal whatever the
/// batch.
#[allow(clippy::too_many_arguments)]
pub fn scaled_mm(
    dtype: QuantDtype,
    a: &[u8],
    a_scale: ActScale,
    w: &[u8],
    weight_scale: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
) -> Vec<u16> {
    scaled_mm_accumulating(
        dtype,
        a,
        a_scale,
        w,
        weight_scale,
        m,
        n,
        k,
        epi,
        Fp8Accumulation::Sequential,
    )
}

/// [`scaled_mm`] with fp8's accumulation chosen: [`Fp8Accumulation::TensorCore`] models the GPU
/// (verify's `--fp8-accumulation tensor-core`); the epilogue is the same.
#[allow(clippy::too_many_arguments)]
pub fn scaled_mm_accumulating(
    dtype: QuantDtype,
    a: &[u8],
    a_scale: ActScale,
    w: &[u8],
    weight_scale: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
    accumulation: Fp8Accumulation,
) -> Vec<u16> {
    let out = epi.out;
    gemm_map(
        dtype,
        a,
        a_scale,
        w,
        weight_scale,
        m,
        n,
        k,
        epi,
        accumulation,
        |_, v| round_to_out(out, v),
    )
}

/// The quantizing epilogue of a GEMM-chain producer: [`scaled_mm`]'s rounded output `y`,
/// widened back to f32, then `encode(out_dtype8, y * (consumer_smooth_inv[n] * (1 /
/// consumer_input_scale)))` — exactly [`quantize_static`](super::quantize_static) on the rounded
/// output, so the fused chain is bit-identical to the unfused pair. Returns `[M, N]` codes.
#[allow(clippy::too_many_arguments)]
pub fn scaled_mm_quant(
    dtype: QuantDtype,
    a: &[u8],
    a_scale: ActScale,
    w: &[u8],
    weight_scale: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
    consumer_smooth_inv: Option<&[f32]>,
    consumer_input_scale: f32,
    out_dtype8: QuantDtype,
) -> Vec<u8> {
    let mult = static_multipliers(n, consumer_smooth_inv, consumer_input_scale);
    let out = epi.out;
    let sequential = Fp8Accumulation::Sequential;
    gemm_map(
        dtype,
        a,
        a_scale,
        w,
        weight_scale,
        m,
        n,
        k,
        epi,
        sequential,
        |j, v| {
            let y = out_bits_to_f32(out, round_to_out(out, v));
            encode(out_dtype8, y * mult[j])
        },
    )
}
