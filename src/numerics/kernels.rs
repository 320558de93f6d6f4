//! The hot inner loops of the CPU GEMM, and their run-time dispatch to wider vector units.
//!
//! Every variant runs the same operations in the same order for each output element: integer
//! sums are exact, and the f32 kernel does one IEEE multiply and one IEEE add per step (Rust
//! never contracts them into FMA). So the variants differ in speed only, never in bits.

/// Output columns per fp8 tile: `ROW_BLOCK * N_TILE` f32 accumulators stay in L1.
pub(super) const N_TILE: usize = 256;

/// Exact dot product of two int8 code rows.
pub(super) type DotI8 = fn(&[u8], &[u8]) -> i32;

/// A block of A rows against the transposed, decoded fp8 weight `wt` (`[K, N]`).
pub(super) struct Fp8Panel<'a> {
    pub lut: &'a [f32; 256],
    /// `rows * k` codes of consecutive A rows.
    pub a_rows: &'a [u8],
    pub k: usize,
    pub wt: &'a [f32],
    pub n: usize,
}

/// `acc[r * N_TILE + jj] += decode(a[r, kk]) * wt[kk, j0 + jj]` for kk = 0, 1, ..., K - 1 in
/// that order, for every row r of the panel and jj < nt.
pub(super) type Fp8Tile = fn(&Fp8Panel, usize, usize, &mut [f32]);

#[inline(always)]
fn dot_i8_zip(a: &[u8], w: &[u8]) -> i32 {
    a.iter()
        .zip(w)
        .map(|(&x, &y)| i32::from(x as i8) * i32::from(y as i8))
        .sum()
}

/// 32 independent lanes: what the baseline (SSE2) target vectorises best.
#[inline(always)]
fn dot_i8_lanes(a: &[u8], w: &[u8]) -> i32 {
    const L: usize = 32;
    let mut lanes = [0i32; L];
    let (ac, wc) = (a.chunks_exact(L), w.chunks_exact(L));
    let tail = dot_i8_zip(ac.remainder(), wc.remainder());
    for (x, y) in ac.zip(wc) {
        for l in 0..L {
            lanes[l] += i32::from(x[l] as i8) * i32::from(y[l] as i8);
        }
    }
    lanes.iter().sum::<i32>() + tail
}

#[inline(always)]
fn fp8_tile_body(p: &Fp8Panel, j0: usize, nt: usize, acc: &mut [f32]) {
    if p.k == 0 {
        return;
    }
    for kk in 0..p.k {
        let w_seg = &p.wt[kk * p.n + j0..kk * p.n + j0 + nt];
        for (a_row, acc_r) in p.a_rows.chunks_exact(p.k).zip(acc.chunks_exact_mut(N_TILE)) {
            let av = p.lut[usize::from(a_row[kk])];
            for (s, &wv) in acc_r[..nt].iter_mut().zip(w_seg) {
                *s += av * wv;
            }
        }
    }
}

fn dot_i8_portable(a: &[u8], w: &[u8]) -> i32 {
    dot_i8_lanes(a, w)
}

fn fp8_tile_portable(p: &Fp8Panel, j0: usize, nt: usize, acc: &mut [f32]) {
    fp8_tile_body(p, j0, nt, acc)
}

/// Rows and columns of the register-blocked int8 kernel.
pub(super) const I8_BLOCK: usize = 4;

/// The exact i32 dot products of four A rows with four W rows (all of one length):
/// `out[r][c] = Σ_k a[r][k] · w[c][k]`.
pub(super) type DotI8Block =
    fn(&[&[u8]; I8_BLOCK], &[&[u8]; I8_BLOCK]) -> [[i32; I8_BLOCK]; I8_BLOCK];

/// A slice operation that works in place.
pub(super) type InPlace = fn(&mut [f32]);

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::numerics::activation::{gelu_body, softmax_body};

    /// 32 codes per step, sign-extended to i16 and multiplied pairwise into i32 lanes
    /// (`vpmaddwd`: |2 · 128 · 128| fits), sixteen accumulators kept in registers, so each
    /// loaded row serves four products. Integer sums, so the result is exact in any order.
    #[target_feature(enable = "avx512bw")]
    pub(super) unsafe fn dot_i8_block_avx512(
        a: &[&[u8]; I8_BLOCK],
        w: &[&[u8]; I8_BLOCK],
    ) -> [[i32; I8_BLOCK]; I8_BLOCK] {
        use std::arch::x86_64::*;
        const STEP: usize = 32;
        let k = a[0].len();
        debug_assert!(a.iter().chain(w).all(|r| r.len() == k));
        let mut acc = [[_mm512_setzero_si512(); I8_BLOCK]; I8_BLOCK];
        let body = k - k % STEP;
        let mut off = 0;
        while off < body {
            // SAFETY: off + 32 <= k = the length of every row, so each 32-byte load is in bounds.
            let load = |row: &[u8]| unsafe {
                _mm512_cvtepi8_epi16(_mm256_loadu_si256(row.as_ptr().add(off).cast()))
            };
            let av = [load(a[0]), load(a[1]), load(a[2]), load(a[3])];
            let wv = [load(w[0]), load(w[1]), load(w[2]), load(w[3])];
            for r in 0..I8_BLOCK {
                for c in 0..I8_BLOCK {
                    acc[r][c] = _mm512_add_epi32(acc[r][c], _mm512_madd_epi16(av[r], wv[c]));
                }
            }
            off += STEP;
        }
        let mut out = [[0i32; I8_BLOCK]; I8_BLOCK];
        for r in 0..I8_BLOCK {
            for c in 0..I8_BLOCK {
                out[r][c] =
                    _mm512_reduce_add_epi32(acc[r][c]) + dot_i8_zip(&a[r][body..], &w[c][body..]);
            }
        }
        out
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn gelu_avx2(xs: &mut [f32]) {
        gelu_body(xs)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu_avx512(xs: &mut [f32]) {
        gelu_body(xs)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn softmax_avx2(row: &mut [f32]) {
        softmax_body(row)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_avx512(row: &mut [f32]) {
        softmax_body(row)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_i8_avx2(a: &[u8], w: &[u8]) -> i32 {
        dot_i8_zip(a, w)
    }

    #[target_feature(enable = "avx512bw")]
    pub(super) unsafe fn dot_i8_avx512(a: &[u8], w: &[u8]) -> i32 {
        dot_i8_zip(a, w)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn fp8_tile_avx2(p: &Fp8Panel, j0: usize, nt: usize, acc: &mut [f32]) {
        fp8_tile_body(p, j0, nt, acc)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fp8_tile_avx512(p: &Fp8Panel, j0: usize, nt: usize, acc: &mut [f32]) {
        fp8_tile_body(p, j0, nt, acc)
    }
}

/// The fastest int8 dot product this CPU runs.
pub(super) fn dot_i8_kernel() -> DotI8 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU was just checked to support AVX-512BW.
            return |a, w| unsafe { x86::dot_i8_avx512(a, w) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU was just checked to support AVX2.
            return |a, w| unsafe { x86::dot_i8_avx2(a, w) };
        }
    }
    dot_i8_portable
}

/// The fastest fp8 tile kernel this CPU runs.
pub(super) fn fp8_tile_kernel() -> Fp8Tile {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU was just checked to support AVX-512F.
            return |p, j0, nt, acc| unsafe { x86::fp8_tile_avx512(p, j0, nt, acc) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU was just checked to support AVX2.
            return |p, j0, nt, acc| unsafe { x86::fp8_tile_avx2(p, j0, nt, acc) };
        }
    }
    fp8_tile_portable
}

/// The register-blocked int8 kernel, where this CPU has one (AVX-512BW).
pub(super) fn dot_i8_block_kernel() -> Option<DotI8Block> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU was just checked to support AVX-512BW.
            return Some(|a, w| unsafe { x86::dot_i8_block_avx512(a, w) });
        }
    }
    None
}

/// The fastest GELU-in-place this CPU runs.
pub(super) fn gelu_kernel() -> InPlace {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU was just checked to support AVX-512F.
            return |xs| unsafe { x86::gelu_avx512(xs) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU was just checked to support AVX2.
            return |xs| unsafe { x86::gelu_avx2(xs) };
        }
    }
    crate::numerics::activation::gelu_body
}

/// The fastest row softmax this CPU runs.
pub(super) fn softmax_kernel() -> InPlace {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU was just checked to support AVX-512F.
            return |row| unsafe { x86::softmax_avx512(row) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU was just checked to support AVX2.
            return |row| unsafe { x86::softmax_avx2(row) };
        }
    }
    crate::numerics::activation::softmax_body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatched kernels against the portable ones, on odd lengths and extreme codes.
    #[test]
    fn dispatched_kernels_match_portable() {
        let code = |i: usize| (i.wrapping_mul(2_654_435_761) >> 9) as u8;
        let dot = dot_i8_kernel();
        for k in [0, 1, 31, 32, 33, 100, 1000] {
            let a: Vec<u8> = (0..k).map(code).collect();
            let w: Vec<u8> = (0..k).map(|i| code(i + 99)).collect();
            let want: i64 = a
                .iter()
                .zip(&w)
                .map(|(&x, &y)| i64::from(x as i8) * i64::from(y as i8))
                .sum();
            assert_eq!(i64::from(dot(&a, &w)), want, "k = {k}");
            assert_eq!(i64::from(dot_i8_portable(&a, &w)), want, "k = {k}");
            assert_eq!(dot_i8_zip(&a, &w), dot_i8_portable(&a, &w));
        }
        let ones = vec![0x80u8; 1000];
        assert_eq!(dot(&ones, &ones), 1000 * 128 * 128);

        let lut = super::super::e4m3::e4m3_decode_table();
        let (rows, k, n) = (3, 37, 300);
        let a: Vec<u8> = (0..rows * k).map(|i| code(i) & 0x77).collect();
        let wt: Vec<f32> = (0..k * n)
            .map(|i| lut[usize::from(code(i + 5) & 0xF6)])
            .collect();
        let p = Fp8Panel {
            lut: &lut,
            a_rows: &a,
            k,
            wt: &wt,
            n,
        };
        let (mut got, mut want) = (vec![0f32; rows * N_TILE], vec![0f32; rows * N_TILE]);
        fp8_tile_kernel()(&p, 40, 200, &mut got);
        fp8_tile_portable(&p, 40, 200, &mut want);
        assert!(got
            .iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    /// The blocked int8 kernel gives the exact sums, tails and extreme codes included.
    #[test]
    fn blocked_int8_matches_exact_sums() {
        let Some(block) = dot_i8_block_kernel() else {
            eprintln!("SKIPPED: no AVX-512BW on this CPU");
            return;
        };
        let code = |i: usize| (i.wrapping_mul(2_654_435_761) >> 7) as u8;
        for k in [0, 1, 31, 32, 33, 64, 100, 384, 1536] {
            let rows: Vec<Vec<u8>> = (0..8)
                .map(|r| (0..k).map(|i| code(i * 8 + r)).collect())
                .collect();
            let a = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            let w = [&rows[4][..], &rows[5][..], &rows[6][..], &rows[7][..]];
            let got = block(&a, &w);
            for r in 0..I8_BLOCK {
                for c in 0..I8_BLOCK {
                    assert_eq!(got[r][c], dot_i8_zip(a[r], w[c]), "k = {k}, ({r}, {c})");
                }
            }
        }
        let min = vec![0x80u8; 4096];
        let got = block(&[&min[..]; 4], &[&min[..]; 4]);
        assert!(got.iter().flatten().all(|&v| v == 4096 * 128 * 128));
    }

    /// The vectorised GELU gives the scalar [`gelu`] bits element for element (NaN, infinities,
    /// subnormals and both erf branches included), and the softmax the portable bits.
    #[test]
    fn vector_activations_match_scalar() {
        use crate::numerics::activation::{gelu, softmax_body};
        let mut xs: Vec<f32> = (0..20_000)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)))
            .collect();
        xs.extend((-2000..2000).map(|i| i as f32 * 0.005));
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
        ]);
        let mut got = xs.clone();
        gelu_kernel()(&mut got);
        for (x, g) in xs.iter().zip(&got) {
            let want = gelu(*x);
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "gelu({x:e}): {g:e} != {want:e}"
            );
        }
        for len in [1, 15, 16, 17, 100, 1500] {
            let row: Vec<f32> = (0..len)
                .map(|i| ((i * 37) % 101) as f32 * 0.3 - 12.0)
                .collect();
            let (mut got, mut want) = (row.clone(), row.clone());
            softmax_kernel()(&mut got);
            softmax_body(&mut want);
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            let sum: f32 = got.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "len {len}: sum {sum}");
        }
    }
}
