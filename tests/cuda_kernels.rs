//! GPU kernels against the CPU reference (`oasr_quantize::numerics`), on the GPU present.
//!
//! - int8 `scaled_mm` / `scaled_mm_quant`: bit-identical for every epilogue variant and for
//!   random shapes (M = 1, 7, 129, 1500, ...), with every tile configuration;
//! - fp8 `scaled_mm`: within the documented bound of the reference, and bitwise
//!   batch-invariant (row r alone equals row r inside any batch, whatever the tile);
//! - quantize kernels: bit-identical.
//!
//! Without a GPU each test prints `SKIPPED` and passes; `OASR_REQUIRE_GPU=1` makes that a
//! failure. Run: `cargo test --release --features cuda --test cuda_kernels`.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::{lane, visible, Rng};
use oasr_quantize::numerics::{
    self, e4m3_decode, out_bits_to_f32, ActScale, Activation, GemmEpilogue, OutDtype, QuantDtype,
};
use oasr_quantize::runtime::{CudaLane, GemmConfig, GemmKind, GemmPath, KernelCache};
use oasr_quantize::Error;

const ACTS: [Activation; 4] = [
    Activation::None,
    Activation::Relu,
    Activation::Swish,
    Activation::Gelu,
];
const OUTS: [OutDtype; 2] = [OutDtype::F16, OutDtype::Bf16];

/// Panics with the first differences when `got != want`.
fn assert_bits_eq<T: PartialEq + std::fmt::LowerHex + Copy>(
    what: &str,
    got: &[T],
    want: &[T],
    cols: usize,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    if !bad.is_empty() {
        let show: Vec<String> = bad
            .iter()
            .take(8)
            .map(|&i| {
                format!(
                    "[{}, {}] gpu {:#x} cpu {:#x}",
                    i / cols,
                    i % cols,
                    got[i],
                    want[i]
                )
            })
            .collect();
        panic!(
            "{what}: {} of {} values differ; first: {}",
            bad.len(),
            got.len(),
            show.join("; ")
        );
    }
}

/// An activation row with the awkward values the kernels must treat like the reference.
fn activations(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..rows * cols).map(|_| rng.normal(3.0)).collect();
    for r in 0..rows {
        let row = &mut x[r * cols..(r + 1) * cols];
        match r % 9 {
            1 => row.iter_mut().for_each(|v| *v = 0.0), // all zero: AMAX_FLOOR
            2 => row.iter_mut().for_each(|v| *v *= 1e-30), // below the floor
            3 => row[cols / 2] = f32::NAN,
            4 => row[0] = -0.0,
            5 => row.iter_mut().for_each(|v| *v *= 1e4),
            6 => row[cols - 1] = f32::INFINITY,
            7 => row[cols / 3] = -1e38,
            _ => {}
        }
    }
    x
}

#[test]
fn quantize_per_token_is_bit_identical() {
    let Some(lane) = lane("quantize_per_token_is_bit_identical") else {
        return;
    };
    let mut rng = Rng::new(1);
    for &(rows, cols) in &[
        (1, 16),
        (7, 384),
        (129, 1536),
        (1500, 512),
        (3, 5),
        (2, 3000),
    ] {
        let x = activations(&mut rng, rows, cols);
        let smooth: Vec<f32> = (0..cols).map(|_| rng.range(0.05, 20.0)).collect();
        for dtype in QuantDtype::ALL {
            for s in [None, Some(&smooth[..])] {
                let want = numerics::quantize_per_token(&x, rows, cols, s, dtype);
                let got = lane
                    .quantize_per_token(&x, rows, cols, s, dtype)
                    .unwrap_or_else(|e| panic!("{e}"));
                let what = format!(
                    "quantize_per_token {rows}x{cols} {dtype} smooth={}",
                    s.is_some()
                );
                assert_bits_eq(&what, &got.codes, &want.codes, cols);
                let gs: Vec<u32> = got.scales.iter().map(|v| v.to_bits()).collect();
                let ws: Vec<u32> = want.scales.iter().map(|v| v.to_bits()).collect();
                assert_bits_eq(&format!("{what} scales"), &gs, &ws, 1);
            }
        }
    }
}

#[test]
fn quantize_static_is_bit_identical() {
    let Some(lane) = lane("quantize_static_is_bit_identical") else {
        return;
    };
    let mut rng = Rng::new(2);
    for &(rows, cols) in &[(1, 16), (7, 384), (129, 1536), (1500, 512)] {
        let x = activations(&mut rng, rows, cols);
        let smooth: Vec<f32> = (0..cols).map(|_| rng.range(0.05, 20.0)).collect();
        for dtype in QuantDtype::ALL {
            for input_scale in [0.013f32, 0.7, 3.0e-5] {
                for s in [None, Some(&smooth[..])] {
                    let want = numerics::quantize_static(&x, rows, cols, s, input_scale, dtype);
                    let got = lane
                        .quantize_static(&x, rows, cols, s, input_scale, dtype)
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_bits_eq(
                        &format!(
                            "quantize_static {rows}x{cols} {dtype} scale {input_scale} smooth={}",
                            s.is_some()
                        ),
                        &got,
                        &want,
                        cols,
                    );
                }
            }
        }
    }
}

/// The operands of one GEMM test case.
struct Case {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<u8>,
    w: Vec<u8>,
    a_scale: Vec<f32>,
    weight_scale: Vec<f32>,
    bias: Vec<f32>,
}

/// The static consumer input scale of the chain tests.
const CHAIN_SCALE: f32 = 0.02;

/// What a chain producer's quantizing epilogue must write for its f16 output `y` `[m, n]`: the
/// consumer's `quantize_static` of the widened values.
fn chain_codes(y: &[u16], m: usize, n: usize, smooth: &[f32], out8: QuantDtype) -> Vec<u8> {
    let yf: Vec<f32> = y
        .iter()
        .map(|&b| out_bits_to_f32(OutDtype::F16, b))
        .collect();
    numerics::quantize_static(&yf, m, n, Some(smooth), CHAIN_SCALE, out8)
}

impl Case {
    /// Scales chosen so that the epilogue sees values from tiny to beyond f16's range, with a
    /// NaN and infinite bias column and a zero-scale row, so activations and rounding meet their
    /// edge cases. int8: row 4 of A and rows 9 and 10 of W are all +127 / +127 / -127, so that
    /// their outputs have accumulators of +-127² K (beyond 2^22 from K = 261, beyond 2^24, where
    /// the conversion to f32 rounds, from K = 1041).
    fn new(rng: &mut Rng, dtype: QuantDtype, m: usize, n: usize, k: usize) -> Case {
        let (mut a, mut w) = match dtype {
            QuantDtype::Int8 => (rng.int8(m * k), rng.int8(n * k)),
            QuantDtype::Float8E4m3fn => (rng.e4m3(m * k, 10), rng.e4m3(n * k, 10)),
        };
        if dtype == QuantDtype::Int8 {
            if m > 4 {
                a[4 * k..5 * k].fill(127);
            }
            if n > 10 {
                w[9 * k..10 * k].fill(127);
                w[10 * k..11 * k].fill(-127i8 as u8);
            }
        }
        let norm = match dtype {
            QuantDtype::Int8 => 1.0 / (127.0 * 127.0 * (k as f32).sqrt()),
            QuantDtype::Float8E4m3fn => 1.0 / (8.0 * (k as f32).sqrt()),
        };
        let mut a_scale: Vec<f32> = (0..m).map(|_| rng.range(0.5, 2.0)).collect();
        let mut weight_scale: Vec<f32> = (0..n).map(|_| rng.range(0.2, 30.0) * norm).collect();
        let mut bias: Vec<f32> = (0..n).map(|_| rng.normal(2.0)).collect();
        let int8 = dtype == QuantDtype::Int8;
        if m > 3 {
            a_scale[1] = 0.0;
            // int8: overflows f16 and drives swish / gelu far into their tails; fp8 stays in
            // range so that its bound is checked on finite values.
            a_scale[2] = if int8 { 1e5 } else { 30.0 };
        }
        if n > 8 {
            bias[3] = f32::NAN;
            bias[5] = f32::INFINITY;
            weight_scale[6] = 1e-30;
            if int8 {
                weight_scale[7] *= 400.0;
            }
        }
        Case {
            m,
            n,
            k,
            a,
            w,
            a_scale,
            weight_scale,
            bias,
        }
    }

    fn ascale(&self, per_row: bool) -> ActScale<'_> {
        if per_row {
            ActScale::PerRow(&self.a_scale)
        } else {
            ActScale::PerTensor(self.a_scale[0])
        }
    }

    fn epi(&self, bias: bool, activation: Activation, out: OutDtype) -> GemmEpilogue<'_> {
        GemmEpilogue {
            bias: bias.then_some(&self.bias[..]),
            activation,
            out,
        }
    }

    fn gpu(
        &self,
        lane: &CudaLane,
        cfg: Option<GemmConfig>,
        dtype: QuantDtype,
        per_row: bool,
        epi: &GemmEpilogue,
    ) -> Vec<u16> {
        lane.scaled_mm_with(
            cfg,
            dtype,
            &self.a,
            self.ascale(per_row),
            &self.w,
            &self.weight_scale,
            self.m,
            self.n,
            self.k,
            epi,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The GPU's `scaled_mm_quant` of this case: a chain producer's output quantized for a
    /// static consumer (`smooth`, input scale [`CHAIN_SCALE`]) into `out8` codes.
    fn gpu_quant(
        &self,
        lane: &CudaLane,
        dtype: QuantDtype,
        per_row: bool,
        epi: &GemmEpilogue,
        smooth: &[f32],
        out8: QuantDtype,
    ) -> Vec<u8> {
        lane.scaled_mm_quant(
            dtype,
            &self.a,
            self.ascale(per_row),
            &self.w,
            &self.weight_scale,
            self.m,
            self.n,
            self.k,
            epi,
            Some(smooth),
            CHAIN_SCALE,
            out8,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// This fp8 case summed by the CPU's model of the tensor cores
    /// (`Fp8Accumulation::TensorCore`), with the reference's epilogue.
    fn tensor_core_model(&self, per_row: bool, epi: &GemmEpilogue) -> Vec<u16> {
        self.cpu_summed(
            QuantDtype::Float8E4m3fn,
            per_row,
            epi,
            numerics::Fp8Accumulation::TensorCore,
        )
    }

    fn cpu(&self, dtype: QuantDtype, per_row: bool, epi: &GemmEpilogue) -> Vec<u16> {
        self.cpu_summed(dtype, per_row, epi, numerics::Fp8Accumulation::Sequential)
    }

    /// The CPU reference's `scaled_mm` of this case, fp8 summed as `accumulation` says.
    fn cpu_summed(
        &self,
        dtype: QuantDtype,
        per_row: bool,
        epi: &GemmEpilogue,
        accumulation: numerics::Fp8Accumulation,
    ) -> Vec<u16> {
        numerics::scaled_mm_accumulating(
            dtype,
            &self.a,
            self.ascale(per_row),
            &self.w,
            &self.weight_scale,
            self.m,
            self.n,
            self.k,
            epi,
            accumulation,
        )
    }
}

#[test]
fn int8_scaled_mm_every_epilogue_is_bit_identical() {
    let Some(lane) = lane("int8_scaled_mm_every_epilogue_is_bit_identical") else {
        return;
    };
    let mut rng = Rng::new(3);
    let c = Case::new(&mut rng, QuantDtype::Int8, 129, 200, 400);
    // Every tile: each configuration has its own copy of both epilogues (TMA store for none and
    // ReLU, scratch for swish and GELU).
    let configs = lane.gemm_configs(QuantDtype::Int8);
    let mut variants = 0;
    for act in ACTS {
        for out in OUTS {
            for bias in [false, true] {
                for per_row in [true, false] {
                    let epi = c.epi(bias, act, out);
                    let want = c.cpu(QuantDtype::Int8, per_row, &epi);
                    for cfg in &configs {
                        let what = format!(
                            "int8 129x200x400 {act:?} {out:?} bias={bias} per_row={per_row} \
                             tile {}",
                            cfg.label()
                        );
                        assert_bits_eq(
                            &what,
                            &c.gpu(lane, Some(*cfg), QuantDtype::Int8, per_row, &epi),
                            &want,
                            c.n,
                        );
                    }
                    variants += 1;
                }
            }
        }
    }
    visible(&format!(
        "int8 scaled_mm: {variants} epilogue variants bit-identical on each of {} tiles",
        configs.len()
    ));
}

#[test]
fn int8_scaled_mm_random_shapes_every_tile_is_bit_identical() {
    let Some(lane) = lane("int8_scaled_mm_random_shapes_every_tile_is_bit_identical") else {
        return;
    };
    let mut rng = Rng::new(4);
    let configs = lane.gemm_configs(QuantDtype::Int8);
    let shapes = [
        (1, 8, 16),
        (1, 384, 1536),
        (7, 24, 48),
        (7, 1032, 400),
        (129, 136, 2064),
        (129, 384, 384),
        (1500, 384, 1536),
        (1500, 1536, 384),
        (300, 2048, 512),
    ];
    let mut checked = 0;
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let c = Case::new(&mut rng, QuantDtype::Int8, m, n, k);
        let act = ACTS[i % 4];
        let out = OUTS[i % 2];
        let epi = c.epi(i % 3 != 0, act, out);
        let per_row = i % 5 != 1;
        let want = c.cpu(QuantDtype::Int8, per_row, &epi);
        // The heuristic's tile, then every tile on the smaller shapes.
        let mut cfgs: Vec<Option<GemmConfig>> = vec![None];
        if m * n * k <= 129 * 384 * 2064 {
            cfgs.extend(configs.iter().map(|c| Some(*c)));
        }
        for cfg in cfgs {
            let what = format!(
                "int8 {m}x{n}x{k} {act:?} {out:?} tile {:?}",
                cfg.map(|c| c.label())
            );
            assert_bits_eq(
                &what,
                &c.gpu(lane, cfg, QuantDtype::Int8, per_row, &epi),
                &want,
                n,
            );
            checked += 1;
        }
    }
    visible(&format!(
        "int8 scaled_mm: {checked} shape/tile runs bit-identical"
    ));
}

#[test]
fn int8_scaled_mm_quant_is_bit_identical() {
    let Some(lane) = lane("int8_scaled_mm_quant_is_bit_identical") else {
        return;
    };
    let mut rng = Rng::new(5);
    let mut checked = 0;
    for &(m, n, k) in &[
        (1, 64, 64),
        (7, 200, 400),
        (129, 384, 1536),
        (1500, 512, 384),
    ] {
        let c = Case::new(&mut rng, QuantDtype::Int8, m, n, k);
        let smooth: Vec<f32> = (0..n).map(|_| rng.range(0.1, 10.0)).collect();
        for (i, act) in ACTS.into_iter().enumerate() {
            for out8 in QuantDtype::ALL {
                for s in [None, Some(&smooth[..])] {
                    let out = OUTS[(i + checked) % 2];
                    let epi = c.epi(i % 2 == 0, act, out);
                    let input_scale = 0.05;
                    let want = numerics::scaled_mm_quant(
                        QuantDtype::Int8,
                        &c.a,
                        c.ascale(true),
                        &c.w,
                        &c.weight_scale,
                        m,
                        n,
                        k,
                        &epi,
                        s,
                        input_scale,
                        out8,
                    );
                    let got = lane
                        .scaled_mm_quant(
                            QuantDtype::Int8,
                            &c.a,
                            c.ascale(true),
                            &c.w,
                            &c.weight_scale,
                            m,
                            n,
                            k,
                            &epi,
                            s,
                            input_scale,
                            out8,
                        )
                        .unwrap_or_else(|e| panic!("{e}"));
                    let what = format!(
                        "int8 scaled_mm_quant {m}x{n}x{k} {act:?} {out:?} -> {out8} smooth={}",
                        s.is_some()
                    );
                    assert_bits_eq(&what, &got, &want, n);
                    checked += 1;
                }
            }
        }
    }
    visible(&format!(
        "int8 scaled_mm_quant: {checked} variants bit-identical"
    ));
}

/// The documented fp8 bound (docs/cuda.md): with S = Σ_k |a_k w_k| (decoded codes),
/// |acc_gpu − acc_ref| ≤ (⌈K/32⌉ · 2^-13 + K · 2^-24) · S; the output then differs by at most
/// L · |a_scale · weight_scale| · that + one unit in the last place of the output dtype
/// (L = 1.13 bounds the slope of every activation).
fn fp8_bound(
    c: &Case,
    r: usize,
    j: usize,
    per_row: bool,
    out: OutDtype,
    want: f32,
    got: f32,
) -> f64 {
    let s: f64 = (0..c.k)
        .map(|kk| {
            (f64::from(e4m3_decode(c.a[r * c.k + kk])) * f64::from(e4m3_decode(c.w[j * c.k + kk])))
                .abs()
        })
        .sum();
    let k = c.k as f64;
    let acc = ((k / 32.0).ceil() * 2f64.powi(-13) + k * 2f64.powi(-24)) * s;
    let a_s = if per_row { c.a_scale[r] } else { c.a_scale[0] };
    let scale = f64::from(a_s).abs() * f64::from(c.weight_scale[j]).abs();
    let mag = f64::from(want.abs().max(got.abs()));
    let ulp = match out {
        OutDtype::F16 => (mag * 2f64.powi(-10)).max(2f64.powi(-24)),
        OutDtype::Bf16 => (mag * 2f64.powi(-7)).max(2f64.powi(-133)),
    };
    1.13 * scale * acc * (1.0 + 1e-6) + ulp
}

/// Max over a result of |gpu − cpu| / bound; panics past 1.
fn check_fp8(what: &str, c: &Case, per_row: bool, out: OutDtype, got: &[u16], want: &[u16]) -> f64 {
    let mut worst = 0.0f64;
    let mut exact = 0usize;
    for r in 0..c.m {
        for j in 0..c.n {
            let (g, w) = (got[r * c.n + j], want[r * c.n + j]);
            if g == w {
                exact += 1;
                continue;
            }
            let (gf, wf) = (out_bits_to_f32(out, g), out_bits_to_f32(out, w));
            assert!(
                !gf.is_nan() && !wf.is_nan(),
                "{what}: [{r}, {j}] NaN mismatch gpu {g:#x} cpu {w:#x}"
            );
            assert!(
                gf.is_finite() && wf.is_finite(),
                "{what}: [{r}, {j}] infinity mismatch gpu {gf} cpu {wf}"
            );
            let bound = fp8_bound(c, r, j, per_row, out, wf, gf);
            let ratio = f64::from((gf - wf).abs()) / bound;
            assert!(
                ratio <= 1.0,
                "{what}: [{r}, {j}] gpu {gf} cpu {wf} differ by {} > bound {bound}",
                (gf - wf).abs()
            );
            worst = worst.max(ratio);
        }
    }
    visible(&format!(
        "fp8 {what}: {:.2}% bit-identical to the CPU reference, worst difference {worst:.3} of the bound",
        100.0 * exact as f64 / (c.m * c.n) as f64
    ));
    worst
}

#[test]
fn fp8_scaled_mm_is_within_the_bound_and_batch_invariant() {
    let Some(lane) = lane("fp8_scaled_mm_is_within_the_bound_and_batch_invariant") else {
        return;
    };
    if !lane.info().arch.supports_fp8() {
        visible(&format!(
            "SKIPPED fp8 test: {} has no fp8 mma",
            lane.info().arch
        ));
        return;
    }
    let dt = QuantDtype::Float8E4m3fn;
    let mut rng = Rng::new(6);
    let configs = lane.gemm_configs(dt);
    // Bound, every epilogue variant.
    let c = Case::new(&mut rng, dt, 129, 200, 400);
    for act in ACTS {
        for out in OUTS {
            for (bias, per_row) in [(true, true), (false, false)] {
                let epi = c.epi(bias, act, out);
                let got = c.gpu(lane, None, dt, per_row, &epi);
                let want = c.cpu(dt, per_row, &epi);
                check_fp8(
                    &format!("129x200x400 {act:?} {out:?} bias={bias}"),
                    &c,
                    per_row,
                    out,
                    &got,
                    &want,
                );
            }
        }
    }
    // Bound on larger K, and batch invariance: every row of every batch and tile equals the
    // same row computed alone (M = 1).
    // GELU goes through the scratch epilogue, no activation through the TMA-store epilogue.
    let cases = [
        (7, 136, 2064, Activation::Gelu, OutDtype::Bf16),
        (129, 384, 1536, Activation::Gelu, OutDtype::Bf16),
        (1500, 512, 384, Activation::Gelu, OutDtype::Bf16),
        (129, 384, 1536, Activation::None, OutDtype::F16),
        (1500, 520, 384, Activation::None, OutDtype::Bf16),
    ];
    for (m, n, k, act, out) in cases {
        let c = Case::new(&mut rng, dt, m, n, k);
        let epi = c.epi(true, act, out);
        let batch = c.gpu(lane, None, dt, true, &epi);
        check_fp8(
            &format!("{m}x{n}x{k} {act:?} {out:?}"),
            &c,
            true,
            out,
            &batch,
            &c.cpu(dt, true, &epi),
        );
        let rows: Vec<usize> = [0, 1, m / 2, m - 1]
            .into_iter()
            .filter(|&r| r < m)
            .collect();
        for cfg in std::iter::once(None).chain(configs.iter().map(|c| Some(*c))) {
            let tiled = c.gpu(lane, cfg, dt, true, &epi);
            assert_eq!(
                tiled,
                batch,
                "fp8 {m}x{n}x{k}: tile {:?} changed the result",
                cfg.map(|c| c.label())
            );
            for &r in &rows {
                let one = lane
                    .scaled_mm_with(
                        cfg,
                        dt,
                        &c.a[r * k..(r + 1) * k],
                        ActScale::PerRow(&c.a_scale[r..r + 1]),
                        &c.w,
                        &c.weight_scale,
                        1,
                        n,
                        k,
                        &epi,
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    one,
                    batch[r * n..(r + 1) * n],
                    "fp8 {m}x{n}x{k}: row {r} alone differs from row {r} in the batch (tile {:?})",
                    cfg.map(|c| c.label())
                );
            }
        }
    }
    visible("fp8 scaled_mm: batch-invariant over M = 1, 7, 129, 1500 and every tile");
}

#[test]
fn fp8_scaled_mm_quant_equals_quantizing_the_gpu_scaled_mm() {
    let Some(lane) = lane("fp8_scaled_mm_quant_equals_quantizing_the_gpu_scaled_mm") else {
        return;
    };
    if !lane.info().arch.supports_fp8() {
        return;
    }
    let dt = QuantDtype::Float8E4m3fn;
    let mut rng = Rng::new(7);
    for &(m, n, k) in &[(1, 64, 64), (129, 384, 1536)] {
        let c = Case::new(&mut rng, dt, m, n, k);
        let smooth: Vec<f32> = (0..n).map(|_| rng.range(0.1, 10.0)).collect();
        for out8 in QuantDtype::ALL {
            let epi = c.epi(true, Activation::Swish, OutDtype::F16);
            let want = chain_codes(&c.gpu(lane, None, dt, true, &epi), m, n, &smooth, out8);
            let got = c.gpu_quant(lane, dt, true, &epi, &smooth, out8);
            assert_bits_eq(
                &format!("fp8 scaled_mm_quant {m}x{n}x{k} -> {out8}"),
                &got,
                &want,
                n,
            );
        }
    }
}

/// The wgmma kernels are persistent: each CTA loops over several output tiles, the producer
/// running ahead into the next tile while the consumers finish the last one, and the mbarrier
/// ring carries its phase from tile to tile. A shape with many more tiles than CTA slots, ragged
/// in M, N (not a multiple of any tile width) and K (not a multiple of the 128-byte stage), run
/// with every configuration: int8 bit-identical, fp8 within the bound and the same bits for
/// every configuration and for a row computed alone.
#[test]
fn many_tiles_per_cta_ragged_every_config() {
    let Some(lane) = lane("many_tiles_per_cta_ragged_every_config") else {
        return;
    };
    let info = lane.info();
    let wgmma_expected = info.arch.supports_wgmma() && info.gemm_path != GemmPath::Mma;
    for dtype in QuantDtype::ALL {
        if dtype == QuantDtype::Float8E4m3fn && !info.arch.supports_fp8() {
            continue;
        }
        let configs = lane.gemm_configs(dtype);
        assert_eq!(
            configs.iter().any(|c| c.kind == GemmKind::Wgmma),
            wgmma_expected,
            "{dtype}: wgmma configurations on {} with path {:?}",
            info.arch,
            info.gemm_path
        );
        let chosen = lane
            .choose_config(dtype, 4100, 1032, 400)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut rng = Rng::new(9 + dtype as u64);
        let (m, n, k) = (4100, 1032, 400);
        let c = Case::new(&mut rng, dtype, m, n, k);
        let epi = c.epi(true, Activation::Swish, OutDtype::Bf16);
        let want = c.cpu(dtype, true, &epi);
        let first = c.gpu(lane, None, dtype, true, &epi);
        for cfg in std::iter::once(None).chain(configs.iter().map(|c| Some(*c))) {
            let what = format!("{dtype} {m}x{n}x{k} tile {:?}", cfg.map(|c| c.label()));
            let got = if cfg.is_none() {
                first.clone()
            } else {
                c.gpu(lane, cfg, dtype, true, &epi)
            };
            match dtype {
                QuantDtype::Int8 => assert_bits_eq(&what, &got, &want, n),
                QuantDtype::Float8E4m3fn => {
                    assert_eq!(got, first, "{what}: differs from the chosen tile's result");
                }
            }
        }
        if dtype == QuantDtype::Float8E4m3fn {
            check_fp8(
                &format!("{m}x{n}x{k} Swish Bf16 (many tiles per CTA)"),
                &c,
                true,
                OutDtype::Bf16,
                &first,
                &want,
            );
            for r in [0, 1, 2047, m - 1] {
                let one = lane
                    .scaled_mm(
                        dtype,
                        &c.a[r * k..(r + 1) * k],
                        ActScale::PerRow(&c.a_scale[r..r + 1]),
                        &c.w,
                        &c.weight_scale,
                        1,
                        n,
                        k,
                        &epi,
                    )
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    one,
                    first[r * n..(r + 1) * n],
                    "fp8 {m}x{n}x{k}: row {r} alone differs from row {r} in the batch"
                );
            }
        }
        visible(&format!(
            "{dtype} {m}x{n}x{k}: {} configurations agree (chosen {})",
            configs.len(),
            chosen.label()
        ));
    }
}

/// `Fp8Accumulation::TensorCore` (verify's `--fp8-accumulation tensor-core`) is the default
/// wgmma kernels' arithmetic: the model gives the GPU's f16 bits on every output, with the
/// epilogues the recipes use (per-token and static per-tensor scales, bias, the GELU of a GEMM
/// chain's producer) and through the producer's quantizing epilogue (the consumer's codes), on
/// random shapes and on Whisper tiny's fc1 / fc2 shapes.
#[test]
fn fp8_tensor_core_model_predicts_the_wgmma_kernels() {
    let Some(lane) = lane("fp8_tensor_core_model_predicts_the_wgmma_kernels") else {
        return;
    };
    let info = lane.info();
    let promote_changed = std::env::var("OASR_NVRTC_OPTIONS").is_ok_and(|o| o.contains("PROMOTE"));
    if !info.arch.supports_wgmma() || info.gemm_path == GemmPath::Mma || promote_changed {
        visible("SKIPPED: the model is of the default wgmma kernels (sm_90a, promotion every 128)");
        return;
    }
    let dt = QuantDtype::Float8E4m3fn;
    let mut rng = Rng::new(19);
    let shapes = [
        (1500, 384, 384),
        (129, 384, 1536),
        (33, 200, 400),
        (1500, 1536, 384),
        (1500, 384, 1536),
    ];
    // (per-token scale, bias, activation, sparse A)
    let cases = [
        (true, false, Activation::None, false),
        (false, true, Activation::None, false),
        (true, true, Activation::Gelu, false),
        (false, true, Activation::Gelu, false),
        (false, true, Activation::None, true),
    ];
    for (m, n, k) in shapes {
        let mut c = Case::new(&mut rng, dt, m, n, k);
        let smooth: Vec<f32> = (0..n).map(|_| rng.range(0.1, 10.0)).collect();
        // Then A as a static scale quantizes silence: half zeros, the rest subnormal or barely
        // normal, so that subnormal products often set a block's alignment.
        let sparse: Vec<u8> = rng
            .e4m3(m * k, 2)
            .into_iter()
            .map(|code| if rng.below(2) == 0 { 0 } else { code })
            .collect();
        for (per_row, bias, act, silent) in cases {
            if silent {
                c.a.clone_from(&sparse);
            }
            let what = format!(
                "fp8 {m}x{n}x{k} ({}, bias {bias}, {}{})",
                if per_row { "per token" } else { "per tensor" },
                act.name(),
                if silent { ", sparse A" } else { "" }
            );
            let epi = c.epi(bias, act, OutDtype::F16);
            let gpu = c.gpu(lane, None, dt, per_row, &epi);
            let reference = c.cpu(dt, per_row, &epi);
            let model = c.tensor_core_model(per_row, &epi);
            let differ = |x: &[u16]| gpu.iter().zip(x).filter(|(g, x)| g != x).count();
            let (off_reference, off_model) = (differ(&reference), differ(&model));
            visible(&format!(
                "{what}: the GPU differs from the reference on {off_reference} of {} outputs, \
                 from the model on {off_model}",
                gpu.len()
            ));
            assert!(
                off_reference > 0,
                "{what}: no output to tell the sums apart"
            );
            // The model is the kernels' arithmetic (docs/numerics.md): every output, bit for bit.
            assert_bits_eq(&what, &gpu, &model, n);
            if act == Activation::Gelu {
                // A chain producer: its epilogue writes the consumer's static fp8 codes.
                let want = chain_codes(&model, m, n, &smooth, dt);
                let got = c.gpu_quant(lane, dt, per_row, &epi, &smooth, dt);
                assert_bits_eq(&format!("{what} -> fp8 codes"), &got, &want, n);
            }
        }
    }
}

#[test]
fn contract_violations_are_refused_not_run() {
    let Some(lane) = lane("contract_violations_are_refused_not_run") else {
        return;
    };
    let epi = GemmEpilogue {
        bias: None,
        activation: Activation::None,
        out: OutDtype::F16,
    };
    let run = |m: usize, n: usize, k: usize, a_len: usize, w_len: usize, s_len: usize| {
        lane.scaled_mm(
            QuantDtype::Int8,
            &vec![1u8; a_len],
            ActScale::PerTensor(1.0),
            &vec![1u8; w_len],
            &vec![1.0; s_len],
            m,
            n,
            k,
            &epi,
        )
    };
    for (m, n, k, a, w, s) in [
        (0, 8, 16, 0, 128, 8),    // M = 0
        (2, 12, 16, 32, 192, 12), // N % 8
        (2, 8, 20, 40, 160, 8),   // K % 16
        (2, 8, 16, 31, 128, 8),   // a too short
        (2, 8, 16, 32, 129, 8),   // w too long
        (2, 8, 16, 32, 128, 7),   // weight_scale
    ] {
        match run(m, n, k, a, w, s) {
            Err(Error::ShapeRefused { .. }) => {}
            other => panic!("{m}x{n}x{k} ({a}, {w}, {s}): expected a refusal, got {other:?}"),
        }
    }
    assert!(matches!(
        lane.quantize_static(&[1.0; 4], 2, 2, None, 0.0, QuantDtype::Int8),
        Err(Error::ShapeRefused { .. })
    ));
    assert!(matches!(
        lane.quantize_per_token(&[1.0; 4], 2, 3, None, QuantDtype::Int8),
        Err(Error::ShapeRefused { .. })
    ));
}

#[test]
fn cublaslt_int32_plus_epilogue_kernel_is_bit_identical() {
    let Some(lane) = lane("cublaslt_int32_plus_epilogue_kernel_is_bit_identical") else {
        return;
    };
    use oasr_quantize::runtime::blas::{Blas, BlasKind};
    use oasr_quantize::runtime::DeviceActScale;
    let blas = match Blas::new(lane) {
        Ok(b) => b,
        Err(e) => {
            visible(&format!("SKIPPED cuBLASLt cross-check: {e}"));
            return;
        }
    };
    let mut rng = Rng::new(8);
    for &(m, n, k) in &[(7, 64, 64), (1500, 384, 1536)] {
        let c = Case::new(&mut rng, QuantDtype::Int8, m, n, k);
        let run = || -> oasr_quantize::Result<Vec<u16>> {
            let a = lane.upload(&c.a)?;
            let w = lane.upload(&c.w)?;
            let s = lane.upload(&c.a_scale)?;
            let ws = lane.upload(&c.weight_scale)?;
            let b = lane.upload(&c.bias)?;
            let mut acc = lane.zeros::<i32>(m * n)?;
            let mut out = lane.zeros::<u16>(m * n)?;
            let plan = blas.plan(BlasKind::Int8, m, n, k, [0, 0])?;
            // SAFETY: i8 [N, K], i8 [M, K] and i32 [M, N] buffers, as planned.
            unsafe { blas.run(&plan, &w, &a, &mut acc) }?;
            lane.launch_epilogue_i32(
                &acc,
                DeviceActScale::PerRow(&s),
                &ws,
                Some(&b),
                Activation::Gelu,
                &mut out,
                OutDtype::Bf16,
                m,
                n,
            )?;
            lane.download(&out)
        };
        let got = run().unwrap_or_else(|e| panic!("{e}"));
        let epi = c.epi(true, Activation::Gelu, OutDtype::Bf16);
        assert_bits_eq(
            &format!("cuBLASLt + epilogue {m}x{n}x{k}"),
            &got,
            &c.cpu(QuantDtype::Int8, true, &epi),
            n,
        );
    }
}

/// On a machine without a driver or GPU the lane is an error, never a panic (this runs
/// everywhere; on a GPU machine it checks that a missing cache directory is no error either).
#[test]
fn opening_the_lane_never_panics() {
    let cache = KernelCache::from_env();
    match std::panic::catch_unwind(|| CudaLane::open(0, &cache)) {
        Ok(Ok(_)) => {}
        Ok(Err(Error::Cuda { what, message })) => {
            assert!(!message.is_empty(), "{what}: empty message");
            visible(&format!(
                "no CUDA lane here (as expected without a GPU): CUDA {what}: {message}"
            ));
        }
        Ok(Err(e)) => panic!("unexpected error kind: {e}"),
        Err(_) => panic!("CudaLane::open panicked"),
    }
}
