//! Golden vectors for the numerics reference. Every expected value here is written out
//! literally: derived by hand from the format definitions (noted beside them), or, for the GEMM
//! tables, produced by an independent Python emulation of the documented operation order
//! (every step rounded to f32) and cross-checked against exact math.

use oasr_quantize::numerics::*;
use proptest::prelude::*;

const I8: QuantDtype = QuantDtype::Int8;
const F8: QuantDtype = QuantDtype::Float8E4m3fn;

fn i8s(v: &[i8]) -> Vec<u8> {
    v.iter().map(|&x| x as u8).collect()
}

fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
}

// ---------------------------------------------------------------------------------------------
// Rounding and encoding

#[test]
fn int8_rounding_ties_and_clamps() {
    let cases: [(f32, u8); 16] = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0), // rounds to -0.0, which is code 0
        (-1.5, 0xFE),
        (-2.5, 0xFE),
        (126.5, 126),
        (127.4, 127),
        (127.5, 127), // rounds to 128, clamped
        (200.0, 127),
        (-200.0, 0x81), // -127, never -128
        (-127.5, 0x81),
        (f32::INFINITY, 127),
        (f32::NEG_INFINITY, 0x81),
        (f32::NAN, 0),
        (0.49999997, 0),
    ];
    for (v, code) in cases {
        assert_eq!(encode(I8, v), code, "encode({v})");
    }
    assert_eq!(round_half_even(2.5), 2.0);
    assert_eq!(round_half_even(-1.5), -2.0);
    assert!(same_bits(round_half_even(-0.5), -0.0));
}

/// Positive e4m3fn values of codes 0x00..=0x7E: subnormals m · 2^-9 for exponent field 0,
/// otherwise 2^(e - 7) · (1 + m / 8). Code 0x7F is NaN.
#[rustfmt::skip]
const E4M3_POSITIVE: [f32; 127] = [
    0.0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875, // 0x00
    0.015625, 0.017578125, 0.01953125, 0.021484375, 0.0234375, 0.025390625, 0.02734375, 0.029296875, // 0x08
    0.03125, 0.03515625, 0.0390625, 0.04296875, 0.046875, 0.05078125, 0.0546875, 0.05859375, // 0x10
    0.0625, 0.0703125, 0.078125, 0.0859375, 0.09375, 0.1015625, 0.109375, 0.1171875, // 0x18
    0.125, 0.140625, 0.15625, 0.171875, 0.1875, 0.203125, 0.21875, 0.234375, // 0x20
    0.25, 0.28125, 0.3125, 0.34375, 0.375, 0.40625, 0.4375, 0.46875, // 0x28
    0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375, // 0x30
    1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, // 0x38
    2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, // 0x40
    4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 7.5, // 0x48
    8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, // 0x50
    16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0, // 0x58
    32.0, 36.0, 40.0, 44.0, 48.0, 52.0, 56.0, 60.0, // 0x60
    64.0, 72.0, 80.0, 88.0, 96.0, 104.0, 112.0, 120.0, // 0x68
    128.0, 144.0, 160.0, 176.0, 192.0, 208.0, 224.0, 240.0, // 0x70
    256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0, // 0x78
];

#[test]
fn e4m3_decodes_all_256_codes() {
    for c in 0..=255u8 {
        let got = e4m3_decode(c);
        assert!(same_bits(got, decode(F8, c)));
        let mag = c & 0x7F;
        if mag == 0x7F {
            assert!(got.is_nan(), "{c:#04x}");
            continue;
        }
        let want = if c & 0x80 != 0 {
            -E4M3_POSITIVE[usize::from(mag)]
        } else {
            E4M3_POSITIVE[usize::from(mag)]
        };
        assert!(same_bits(got, want), "{c:#04x}: {got} != {want}");
        // Every non-NaN code round-trips, -0.0 (0x80) included.
        assert_eq!(e4m3_encode(got), c, "{c:#04x}");
        assert_eq!(encode(F8, got), c, "{c:#04x}");
    }
    assert_eq!(e4m3_encode(-0.0), 0x80);
    assert_eq!(e4m3_encode(0.0), 0x00);
}

#[test]
fn e4m3_rounds_to_nearest_even() {
    let cases: [(f32, u8); 19] = [
        (0.0009765625, 0x00),  // 2^-10: half the smallest subnormal, tie to 0
        (0.0009766, 0x01),     // just above the tie
        (0.0029296875, 0x02),  // 3 · 2^-10: tie between m = 1 and m = 2
        (0.0048828125, 0x02),  // 5 · 2^-10: tie between m = 2 and m = 3
        (0.0146484375, 0x08),  // 15 · 2^-10: tie between subnormal 7 and 2^-6 (0x08)
        (0.00048828125, 0x00), // 2^-11
        (1.0625, 0x38),        // tie between 1.0 and 1.125
        (1.1875, 0x3A),        // tie between 1.125 and 1.25
        (17.0, 0x58),          // tie between 16 and 18
        (19.0, 0x5A),          // tie between 18 and 20
        (100.0, 0x6C),         // tie between 96 and 104
        (200.0, 0x74),         // tie between 192 and 208
        (424.0, 0x7D),         // nearer 416
        (432.0, 0x7E),         // tie between 416 (m = 5) and 448 (m = 6, even)
        (-1.0625, 0xB8),
        (-17.0, 0xD8),
        (0.3, 0x2A),           // 0.3 -> 0.3125 (0.28125 is farther)
        (-0.0009765625, 0x80), // ties to -0
        (1e-30, 0x00),
    ];
    for (v, code) in cases {
        assert_eq!(e4m3_encode(v), code, "e4m3_encode({v})");
    }
}

#[test]
fn e4m3_saturates_and_never_emits_nan() {
    let cases: [(f32, u8); 11] = [
        (448.0, 0x7E),
        (448.00003, 0x7E),
        (464.0, 0x7E), // the tie with the NaN pattern's 480
        (480.0, 0x7E),
        (1e9, 0x7E),
        (f32::MAX, 0x7E),
        (f32::INFINITY, 0x7E),
        (f32::NEG_INFINITY, 0xFE),
        (-500.0, 0xFE),
        (-448.0, 0xFE),
        (f32::NAN, 0x00),
    ];
    for (v, code) in cases {
        assert_eq!(e4m3_encode(v), code, "e4m3_encode({v})");
        assert_eq!(encode(F8, v), code, "encode({v})");
    }
    assert_eq!(e4m3_encode(-f32::NAN), 0x00);
    for c in 0..=255u8 {
        let v = e4m3_decode(c);
        for x in [v * 1.01, v * 0.99, v * 3.0, v + 0.001] {
            assert_ne!(e4m3_encode(x) & 0x7F, 0x7F, "{x}");
        }
    }
}

#[test]
fn qmax_and_names() {
    assert_eq!(I8.qmax(), 127.0);
    assert_eq!(F8.qmax(), 448.0);
    assert_eq!(I8.name(), "int8");
    assert_eq!(F8.name(), "float8_e4m3fn");
    assert_eq!(serde_json::to_string(&F8).unwrap(), "\"float8_e4m3fn\"");
    assert_eq!(serde_json::from_str::<QuantDtype>("\"int8\"").unwrap(), I8);
    assert_eq!(
        serde_json::to_string(&Activation::Gelu).unwrap(),
        "\"gelu\""
    );
    assert_eq!(
        serde_json::to_string(&Activation::None).unwrap(),
        "\"none\""
    );
    assert_eq!(
        serde_json::from_str::<OutDtype>("\"bf16\"").unwrap(),
        OutDtype::Bf16
    );
    assert_eq!(serde_json::to_string(&OutDtype::F16).unwrap(), "\"f16\"");
}

// ---------------------------------------------------------------------------------------------
// Quantization

#[test]
fn amax_floor_gives_finite_scales() {
    let x = [0.0f32, 0.0, 0.0, 1e-12, -1e-12, 1e-12];
    let q = quantize_per_token(&x, 2, 3, None, I8);
    assert_eq!(q.codes, [0; 6]);
    assert!(same_bits(q.scales[0], 1e-8 / 127.0));
    assert!(same_bits(q.scales[1], 1e-8 / 127.0));
    let q = quantize_per_token(&x, 2, 3, None, F8);
    // 1e-12 · (448 / 1e-8) = 0.0448 is a normal e4m3 value: 0.04296875 = 2^-5 · 1.375 (0x13).
    assert_eq!(q.codes, [0x00, 0x00, 0x00, 0x13, 0x93, 0x13]);
    assert!(same_bits(q.scales[0], 1e-8 / 448.0));
    assert!(same_bits(q.scales[1], 1e-8 / 448.0));
    assert_eq!(AMAX_FLOOR, 1e-8);
}

#[test]
fn smoother_is_applied_before_amax() {
    // x' = [1 · 4, 10 · 0.1] = [4, 1]: amax 4, not 10.
    let q = quantize_per_token(&[1.0, 10.0], 1, 2, Some(&[4.0, 0.1]), I8);
    assert_eq!(q.codes, [127, 32]); // 4 · 31.75 = 127, 1 · 31.75 -> 32
    assert!(same_bits(q.scales[0], 4.0 / 127.0));
}

#[test]
fn per_token_literal_matrix() {
    #[rustfmt::skip]
    let x = [
        1.0f32, -2.0, 0.5, 4.0,
        3.0, -1.0, 0.1, 0.0,
        0.0, 0.0, 0.0, 0.0,
    ];
    // int8: row 0 mult 31.75 -> 31.75, -63.5, 15.875, 127 -> 32, -64 (tie to even), 16, 127;
    // row 1 mult 127/3 -> 127, -42.33, 4.23, 0; row 2 is all zero.
    let q = quantize_per_token(&x, 3, 4, None, I8);
    assert_eq!(q.codes, [32, 0xC0, 16, 127, 127, 0xD6, 4, 0, 0, 0, 0, 0]);
    let want = [4.0f32 / 127.0, 3.0 / 127.0, 1e-8 / 127.0];
    assert!(q.scales.iter().zip(want).all(|(&a, b)| same_bits(a, b)));
    assert_eq!((q.dtype, q.rows, q.cols), (I8, 3, 4));
    // fp8: row 0 mult 112 -> 112 (0x6E), -224 (0xF6), 56 (0x66), 448 (0x7E);
    // row 1 mult 448/3 -> 448 (0x7E), -149.3 -> -144 (0xF1), 14.93 -> 15 (0x57), 0.
    let q = quantize_per_token(&x, 3, 4, None, F8);
    assert_eq!(
        q.codes,
        [0x6E, 0xF6, 0x66, 0x7E, 0x7E, 0xF1, 0x57, 0x00, 0, 0, 0, 0]
    );
    let want = [4.0f32 / 448.0, 3.0 / 448.0, 1e-8 / 448.0];
    assert!(q.scales.iter().zip(want).all(|(&a, b)| same_bits(a, b)));
}

#[test]
fn static_quantize_with_and_without_smoother() {
    #[rustfmt::skip]
    let x = [
        1.0f32, -2.5, 0.3, 100.0,
        0.25, -0.75, 7.0, -300.0,
    ];
    // mult = 1 / 0.5 = 2: [2, -5, 0.6, 200], [0.5, -1.5, 14, -600].
    let q = quantize_static(&x, 2, 4, None, 0.5, I8);
    assert_eq!(q, [2, 0xFB, 1, 127, 0, 0xFE, 14, 0x81]);
    // e4m3: 0.6 -> 0.625 (0x32), 200 ties to 192 (0x74), -1.5 = 0xBC, 14 = 0x56.
    let q = quantize_static(&x, 2, 4, None, 0.5, F8);
    assert_eq!(q, [0x40, 0xCA, 0x32, 0x74, 0x30, 0xBC, 0x56, 0xFE]);
    // mult_j = smooth_inv_j · 2 = [4, 2, 20, 1]: [4, -5, 6, 100], [1, -1.5, 140, -300].
    let s = [2.0f32, 1.0, 10.0, 0.5];
    let q = quantize_static(&x, 2, 4, Some(&s), 0.5, I8);
    assert_eq!(q, [4, 0xFB, 6, 100, 1, 0xFE, 127, 0x81]);
    // e4m3: 6 = 0x4C, 100 ties to 96 (0x6C), 140 -> 144 (0x71), -300 -> -288 (0xF9).
    let q = quantize_static(&x, 2, 4, Some(&s), 0.5, F8);
    assert_eq!(q, [0x48, 0xCA, 0x4C, 0x6C, 0x38, 0xBC, 0x71, 0xF9]);
    assert_eq!(static_multipliers(2, Some(&[3.0, 0.5]), 0.25), [12.0, 2.0]);
}

#[test]
fn weights_use_the_per_token_rule_per_channel() {
    let w = [0.5f32, -1.0, 0.0, 0.0];
    let q = quantize_weight_per_channel(&w, 2, 2, I8);
    assert_eq!(q.codes, [64, 0x81, 0, 0]); // 63.5 ties to 64
    assert!(same_bits(q.scales[0], 1.0 / 127.0));
    assert!(same_bits(q.scales[1], 1e-8 / 127.0));
    assert_eq!(q, quantize_per_token(&w, 2, 2, None, I8));
}

#[test]
fn dequantize_is_decode_times_row_scale() {
    let q = QuantizedRows {
        dtype: I8,
        rows: 2,
        cols: 2,
        codes: vec![2, 0xFE, 0x81, 0],
        scales: vec![0.5, 2.0],
    };
    assert_eq!(dequantize_rows(&q), [1.0, -1.0, -254.0, 0.0]);
    let q = QuantizedRows {
        dtype: F8,
        rows: 1,
        cols: 3,
        codes: vec![0x38, 0xC0, 0x01],
        scales: vec![0.25],
    };
    assert_eq!(dequantize_rows(&q), [0.25, -0.5, 0.00048828125]);
}

// ---------------------------------------------------------------------------------------------
// Scaled GEMM: literal examples

type GemmCase = (bool, bool, Activation, OutDtype, [u16; 6]);

/// a = [[1, 2, -3, 4], [-127, 0, 5, 1]], w = [[1, 1, 1, 1], [2, -1, 0, 3], [-1, -2, -3, -4]]:
/// acc = [[4, 12, -12], [-121, -251, 108]]; weight_scale [0.5, 0.25, 2]; a_scale per row
/// [1, 0.125] or per tensor 0.125; bias [1, -2, 0.5]. Pre-activation values, e.g. per row, no
/// bias: [2, 3, -24, -7.5625, -7.84375, 27]. GELU of v ≤ -5.55 is -0.0 by the contract.
#[rustfmt::skip]
const INT8_CASES: [GemmCase; 32] = [
    (true, false, Activation::None, OutDtype::F16, [0x4000, 0x4200, 0xCE00, 0xC790, 0xC7D8, 0x4EC0]),
    (true, false, Activation::None, OutDtype::Bf16, [0x4000, 0x4040, 0xC1C0, 0xC0F2, 0xC0FB, 0x41D8]),
    (true, false, Activation::Relu, OutDtype::F16, [0x4000, 0x4200, 0x0000, 0x0000, 0x0000, 0x4EC0]),
    (true, false, Activation::Relu, OutDtype::Bf16, [0x4000, 0x4040, 0x0000, 0x0000, 0x0000, 0x41D8]),
    (true, false, Activation::Swish, OutDtype::F16, [0x3F0C, 0x41B7, 0x8000, 0x9C06, 0x9A4C, 0x4EC0]),
    (true, false, Activation::Swish, OutDtype::Bf16, [0x3FE1, 0x4037, 0xB079, 0xBB81, 0xBB4A, 0x41D8]),
    (true, false, Activation::Gelu, OutDtype::F16, [0x3FD1, 0x41FE, 0x8000, 0x8000, 0x8000, 0x4EC0]),
    (true, false, Activation::Gelu, OutDtype::Bf16, [0x3FFA, 0x4040, 0x8000, 0x8000, 0x8000, 0x41D8]),
    (true, true, Activation::None, OutDtype::F16, [0x4200, 0x3C00, 0xCDE0, 0xC690, 0xC8EC, 0x4EE0]),
    (true, true, Activation::None, OutDtype::Bf16, [0x4040, 0x3F80, 0xC1BC, 0xC0D2, 0xC11E, 0x41DC]),
    (true, true, Activation::Relu, OutDtype::F16, [0x4200, 0x3C00, 0x0000, 0x0000, 0x0000, 0x4EE0]),
    (true, true, Activation::Relu, OutDtype::Bf16, [0x4040, 0x3F80, 0x0000, 0x0000, 0x0000, 0x41DC]),
    (true, true, Activation::Swish, OutDtype::F16, [0x41B7, 0x39D9, 0x8000, 0xA0BD, 0x9048, 0x4EE0]),
    (true, true, Activation::Swish, OutDtype::Bf16, [0x4037, 0x3F3B, 0xB0C9, 0xBC18, 0xBA09, 0x41DC]),
    (true, true, Activation::Gelu, OutDtype::F16, [0x41FE, 0x3ABB, 0x8000, 0x8000, 0x8000, 0x4EE0]),
    (true, true, Activation::Gelu, OutDtype::Bf16, [0x4040, 0x3F57, 0x8000, 0x8000, 0x8000, 0x41DC]),
    (false, false, Activation::None, OutDtype::F16, [0x3400, 0x3600, 0xC200, 0xC790, 0xC7D8, 0x4EC0]),
    (false, false, Activation::None, OutDtype::Bf16, [0x3E80, 0x3EC0, 0xC040, 0xC0F2, 0xC0FB, 0x41D8]),
    (false, false, Activation::Relu, OutDtype::F16, [0x3400, 0x3600, 0x0000, 0x0000, 0x0000, 0x4EC0]),
    (false, false, Activation::Relu, OutDtype::Bf16, [0x3E80, 0x3EC0, 0x0000, 0x0000, 0x0000, 0x41D8]),
    (false, false, Activation::Swish, OutDtype::F16, [0x307F, 0x331D, 0xB08E, 0x9C06, 0x9A4C, 0x4EC0]),
    (false, false, Activation::Swish, OutDtype::Bf16, [0x3E10, 0x3E64, 0xBE12, 0xBB81, 0xBB4A, 0x41D8]),
    (false, false, Activation::Gelu, OutDtype::F16, [0x30CA, 0x33C1, 0x9C26, 0x8000, 0x8000, 0x4EC0]),
    (false, false, Activation::Gelu, OutDtype::Bf16, [0x3E19, 0x3E78, 0xBB85, 0x8000, 0x8000, 0x41D8]),
    (false, true, Activation::None, OutDtype::F16, [0x3D00, 0xBE80, 0xC100, 0xC690, 0xC8EC, 0x4EE0]),
    (false, true, Activation::None, OutDtype::Bf16, [0x3FA0, 0xBFD0, 0xC020, 0xC0D2, 0xC11E, 0x41DC]),
    (false, true, Activation::Relu, OutDtype::F16, [0x3D00, 0x0000, 0x0000, 0x0000, 0x0000, 0x4EE0]),
    (false, true, Activation::Relu, OutDtype::Bf16, [0x3FA0, 0x0000, 0x0000, 0x0000, 0x0000, 0x41DC]),
    (false, true, Activation::Swish, OutDtype::F16, [0x3BC6, 0xB447, 0xB212, 0xA0BD, 0x9048, 0x4EE0]),
    (false, true, Activation::Swish, OutDtype::Bf16, [0x3F79, 0xBE89, 0xBE42, 0xBC18, 0xBA09, 0x41DC]),
    (false, true, Activation::Gelu, OutDtype::F16, [0x3C79, 0xAD6B, 0xA3F3, 0x8000, 0x8000, 0x4EE0]),
    (false, true, Activation::Gelu, OutDtype::Bf16, [0x3F8F, 0xBDAD, 0xBC7E, 0x8000, 0x8000, 0x41DC]),
];

#[test]
fn int8_scaled_mm_literal() {
    let a = i8s(&[1, 2, -3, 4, -127, 0, 5, 1]);
    let w = i8s(&[1, 1, 1, 1, 2, -1, 0, 3, -1, -2, -3, -4]);
    let ws = [0.5f32, 0.25, 2.0];
    let bias = [1.0f32, -2.0, 0.5];
    for (per_row, with_bias, activation, out, want) in INT8_CASES {
        let a_scale = if per_row {
            ActScale::PerRow(&[1.0, 0.125])
        } else {
            ActScale::PerTensor(0.125)
        };
        let epi = GemmEpilogue {
            bias: with_bias.then_some(&bias[..]),
            activation,
            out,
        };
        let got = scaled_mm(I8, &a, a_scale, &w, &ws, 2, 3, 4, &epi);
        assert_eq!(
            got, want,
            "per_row {per_row} bias {with_bias} {activation:?} {out:?}"
        );
    }
}

type Fp8Case = (bool, bool, Activation, OutDtype, [u16; 4]);

/// a = [[1, 2, -1, 0.5], [448, -448, 2^-9, 0]] (codes 38 40 B8 30 / 7E FE 01 00),
/// w = [[1, 1, 1, 1], [2^-9, 448, 3, 4]] (codes 38 38 38 38 / 01 7E 44 48).
/// Sequential f32 sums: [[2.5, 895.001953125], [2^-9, -200703.125]] (the exact last one,
/// -200703.119140625, is not an f32: 0.875 - 200704 + 3 · 2^-9 rounds at the last add).
/// weight_scale [1, 0.25]; a_scale per row [0.5, 2^-10] or per tensor 0.5; bias [-1, 0.5].
/// Per row, no bias: [1.25, 111.875244140625, 2^-19, -48.999786376953125].
#[rustfmt::skip]
const FP8_CASES: [Fp8Case; 32] = [
    (true, false, Activation::None, OutDtype::F16, [0x3D00, 0x56FE, 0x0020, 0xD220]),
    (true, false, Activation::None, OutDtype::Bf16, [0x3FA0, 0x42E0, 0x3600, 0xC244]),
    (true, false, Activation::Relu, OutDtype::F16, [0x3D00, 0x56FE, 0x0020, 0x0000]),
    (true, false, Activation::Relu, OutDtype::Bf16, [0x3FA0, 0x42E0, 0x3600, 0x0000]),
    (true, false, Activation::Swish, OutDtype::F16, [0x3BC6, 0x56FE, 0x0010, 0x8000]),
    (true, false, Activation::Swish, OutDtype::Bf16, [0x3F79, 0x42E0, 0x3580, 0x9EF3]),
    (true, false, Activation::Gelu, OutDtype::F16, [0x3C79, 0x56FE, 0x0010, 0x8000]),
    (true, false, Activation::Gelu, OutDtype::Bf16, [0x3F8F, 0x42E0, 0x3580, 0x8000]),
    (true, true, Activation::None, OutDtype::F16, [0x3400, 0x5706, 0xBC00, 0xD210]),
    (true, true, Activation::None, OutDtype::Bf16, [0x3E80, 0x42E1, 0xBF80, 0xC242]),
    (true, true, Activation::Relu, OutDtype::F16, [0x3400, 0x5706, 0x0000, 0x0000]),
    (true, true, Activation::Relu, OutDtype::Bf16, [0x3E80, 0x42E1, 0x0000, 0x0000]),
    (true, true, Activation::Swish, OutDtype::F16, [0x307F, 0x5706, 0xB44E, 0x8000]),
    (true, true, Activation::Swish, OutDtype::Bf16, [0x3E10, 0x42E1, 0xBE8A, 0x9F46]),
    (true, true, Activation::Gelu, OutDtype::F16, [0x30CA, 0x5706, 0xB114, 0x8000]),
    (true, true, Activation::Gelu, OutDtype::Bf16, [0x3E19, 0x42E1, 0xBE22, 0x8000]),
    (false, false, Activation::None, OutDtype::F16, [0x3D00, 0x56FE, 0x1400, 0xF620]),
    (false, false, Activation::None, OutDtype::Bf16, [0x3FA0, 0x42E0, 0x3A80, 0xC6C4]),
    (false, false, Activation::Relu, OutDtype::F16, [0x3D00, 0x56FE, 0x1400, 0x0000]),
    (false, false, Activation::Relu, OutDtype::Bf16, [0x3FA0, 0x42E0, 0x3A80, 0x0000]),
    (false, false, Activation::Swish, OutDtype::F16, [0x3BC6, 0x56FE, 0x1000, 0x8000]),
    (false, false, Activation::Swish, OutDtype::Bf16, [0x3F79, 0x42E0, 0x3A00, 0x8000]),
    (false, false, Activation::Gelu, OutDtype::F16, [0x3C79, 0x56FE, 0x1001, 0x8000]),
    (false, false, Activation::Gelu, OutDtype::Bf16, [0x3F8F, 0x42E0, 0x3A00, 0x8000]),
    (false, true, Activation::None, OutDtype::F16, [0x3400, 0x5706, 0xBBFE, 0xF620]),
    (false, true, Activation::None, OutDtype::Bf16, [0x3E80, 0x42E1, 0xBF80, 0xC6C4]),
    (false, true, Activation::Relu, OutDtype::F16, [0x3400, 0x5706, 0x0000, 0x0000]),
    (false, true, Activation::Relu, OutDtype::Bf16, [0x3E80, 0x42E1, 0x0000, 0x0000]),
    (false, true, Activation::Swish, OutDtype::F16, [0x307F, 0x5706, 0xB44D, 0x8000]),
    (false, true, Activation::Swish, OutDtype::Bf16, [0x3E10, 0x42E1, 0xBE8A, 0x8000]),
    (false, true, Activation::Gelu, OutDtype::F16, [0x30CA, 0x5706, 0xB114, 0x8000]),
    (false, true, Activation::Gelu, OutDtype::Bf16, [0x3E19, 0x42E1, 0xBE23, 0x8000]),
];

#[test]
fn fp8_scaled_mm_literal() {
    let a = [0x38, 0x40, 0xB8, 0x30, 0x7E, 0xFE, 0x01, 0x00];
    let w = [0x38, 0x38, 0x38, 0x38, 0x01, 0x7E, 0x44, 0x48];
    let ws = [1.0f32, 0.25];
    let bias = [-1.0f32, 0.5];
    for (per_row, with_bias, activation, out, want) in FP8_CASES {
        let a_scale = if per_row {
            ActScale::PerRow(&[0.5, 0.0009765625])
        } else {
            ActScale::PerTensor(0.5)
        };
        let epi = GemmEpilogue {
            bias: with_bias.then_some(&bias[..]),
            activation,
            out,
        };
        let got = scaled_mm(F8, &a, a_scale, &w, &ws, 2, 2, 4, &epi);
        assert_eq!(
            got, want,
            "per_row {per_row} bias {with_bias} {activation:?} {out:?}"
        );
    }
}

#[test]
fn fp8_accumulates_sequentially_from_positive_zero() {
    let epi = |out| GemmEpilogue {
        bias: None,
        activation: Activation::None,
        out,
    };
    let one = ActScale::PerTensor(1.0);
    // 448² - 448² + 2^-18 = 2^-18 (f16 subnormal 64 · 2^-24, bf16 0x3680) ...
    let (a, w) = ([0x7E, 0x7E, 0x01], [0x7E, 0xFE, 0x01]);
    assert_eq!(
        scaled_mm(F8, &a, one, &w, &[1.0], 1, 1, 3, &epi(OutDtype::F16)),
        [0x0040]
    );
    assert_eq!(
        scaled_mm(F8, &a, one, &w, &[1.0], 1, 1, 3, &epi(OutDtype::Bf16)),
        [0x3680]
    );
    // ... but 2^-18 + 448² - 448² = 0: the tiny term is absorbed first.
    let (a, w) = ([0x01, 0x7E, 0x7E], [0x01, 0x7E, 0xFE]);
    assert_eq!(
        scaled_mm(F8, &a, one, &w, &[1.0], 1, 1, 3, &epi(OutDtype::F16)),
        [0x0000]
    );
    // +0.0 + (-0.0) = +0.0: the sum starts from +0.0, not from the first product.
    let got = scaled_mm(
        F8,
        &[0x80],
        one,
        &[0x38],
        &[1.0],
        1,
        1,
        1,
        &epi(OutDtype::F16),
    );
    assert_eq!(got, [0x0000]);
    // K = 0: acc = +0.0, the output is the epilogue of zero.
    let epi_b = GemmEpilogue {
        bias: Some(&[1.5]),
        activation: Activation::None,
        out: OutDtype::F16,
    };
    for dtype in QuantDtype::ALL {
        assert_eq!(
            scaled_mm(dtype, &[], one, &[], &[2.0], 1, 1, 0, &epi_b),
            [0x3E00]
        );
    }
}

#[test]
fn scaled_mm_quant_literal() {
    // int8 case, per row, no bias, no activation: y = [2, 3, -24, -7.5625, -7.84375, 27] (exact
    // in f16). Consumer: smooth_inv [1, 2, 0.5], input_scale 0.25 -> mult [4, 8, 2].
    let a = i8s(&[1, 2, -3, 4, -127, 0, 5, 1]);
    let w = i8s(&[1, 1, 1, 1, 2, -1, 0, 3, -1, -2, -3, -4]);
    let epi = GemmEpilogue {
        bias: None,
        activation: Activation::None,
        out: OutDtype::F16,
    };
    let a_scale = ActScale::PerRow(&[1.0, 0.125]);
    let args = (&a, a_scale, &w, &[0.5f32, 0.25, 2.0]);
    let q = scaled_mm_quant(
        I8,
        args.0,
        args.1,
        args.2,
        args.3,
        2,
        3,
        4,
        &epi,
        Some(&[1.0, 2.0, 0.5]),
        0.25,
        I8,
    );
    // [8, 24, -48, -30.25, -62.75, 54] -> [8, 24, -48, -30, -63, 54]
    assert_eq!(q, i8s(&[8, 24, -48, -30, -63, 54]));
    // e4m3, no smoother, mult 4: [8, 12, -96, -30.25, -31.375, 108] ->
    // [8 (0x50), 12 (0x54), -96 (0xEC), -30 (0xDF), -32 (0xE0), 112 (0x6E): 108 ties to even 112]
    let q = scaled_mm_quant(
        I8, args.0, args.1, args.2, args.3, 2, 3, 4, &epi, None, 0.25, F8,
    );
    assert_eq!(q, [0x50, 0x54, 0xEC, 0xDF, 0xE0, 0x6E]);
}

// ---------------------------------------------------------------------------------------------
// Scaled GEMM: properties against naive loops

/// The epilogue written out in the contract's order, independently of the library.
fn naive_epilogue(
    acc: f32,
    ws: f32,
    a_s: f32,
    bias: Option<f32>,
    act: Activation,
    out: OutDtype,
) -> u16 {
    let v = ws * acc;
    let v = a_s * v;
    let v = match bias {
        Some(b) => v + b,
        None => v,
    };
    round_to_out(out, activate(act, v))
}

#[allow(clippy::too_many_arguments)]
fn naive_mm(
    dtype: QuantDtype,
    a: &[u8],
    a_s: &[f32],
    w: &[u8],
    ws: &[f32],
    m: usize,
    n: usize,
    k: usize,
    epi: &GemmEpilogue,
) -> Vec<u16> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let acc = match dtype {
                QuantDtype::Int8 => {
                    let mut acc = 0i64;
                    for kk in 0..k {
                        acc += i64::from(a[i * k + kk] as i8) * i64::from(w[j * k + kk] as i8);
                    }
                    acc as f32
                }
                QuantDtype::Float8E4m3fn => {
                    let mut acc = 0.0f32;
                    for kk in 0..k {
                        acc += e4m3_decode(a[i * k + kk]) * e4m3_decode(w[j * k + kk]);
                    }
                    acc
                }
            };
            out.push(naive_epilogue(
                acc,
                ws[j],
                a_s[i],
                epi.bias.map(|b| b[j]),
                epi.activation,
                epi.out,
            ));
        }
    }
    out
}

#[derive(Debug, Clone)]
struct GemmInput {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<u8>,
    w: Vec<u8>,
    a_scale: Vec<f32>,
    weight_scale: Vec<f32>,
    bias: Option<Vec<f32>>,
    activation: Activation,
    out: OutDtype,
}

impl GemmInput {
    fn epi(&self) -> GemmEpilogue<'_> {
        GemmEpilogue {
            bias: self.bias.as_deref(),
            activation: self.activation,
            out: self.out,
        }
    }
}

fn any_code(dtype: QuantDtype) -> BoxedStrategy<u8> {
    match dtype {
        QuantDtype::Int8 => any::<u8>().boxed(),
        // Any finite e4m3 code (the quantizers never write the NaN codes).
        QuantDtype::Float8E4m3fn => any::<u8>()
            .prop_filter("finite", |c| c & 0x7F != 0x7F)
            .boxed(),
    }
}

fn gemm_input(dtype: QuantDtype) -> impl Strategy<Value = GemmInput> {
    let k = prop_oneof![1usize..=40, (1usize..=6).prop_map(|x| x * 16)];
    let act = prop_oneof![
        Just(Activation::None),
        Just(Activation::Relu),
        Just(Activation::Swish),
        Just(Activation::Gelu)
    ];
    let out = prop_oneof![Just(OutDtype::F16), Just(OutDtype::Bf16)];
    (
        prop_oneof![Just(1usize), 1usize..=9],
        1usize..=12,
        k,
        act,
        out,
        any::<bool>(),
    )
        .prop_flat_map(move |(m, n, k, activation, out, with_bias)| {
            (
                proptest::collection::vec(any_code(dtype), m * k),
                proptest::collection::vec(any_code(dtype), n * k),
                proptest::collection::vec(1e-4f32..1.0, m),
                proptest::collection::vec(1e-4f32..1.0, n),
                proptest::collection::vec(-10f32..10.0, n),
            )
                .prop_map(move |(a, w, a_scale, weight_scale, bias)| GemmInput {
                    bias: with_bias.then_some(bias),
                    m,
                    n,
                    k,
                    a,
                    w,
                    a_scale,
                    weight_scale,
                    activation,
                    out,
                })
        })
}

fn dtype_strategy() -> impl Strategy<Value = QuantDtype> {
    prop_oneof![Just(I8), Just(F8)]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn int8_scaled_mm_matches_i64_triple_loop(g in gemm_input(I8)) {
        let got = scaled_mm(I8, &g.a, ActScale::PerRow(&g.a_scale), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi());
        prop_assert_eq!(got, naive_mm(I8, &g.a, &g.a_scale, &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi()));
        let per_tensor = vec![g.a_scale[0]; g.m];
        let got = scaled_mm(I8, &g.a, ActScale::PerTensor(g.a_scale[0]), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi());
        prop_assert_eq!(got, naive_mm(I8, &g.a, &per_tensor, &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi()));
    }

    #[test]
    fn fp8_scaled_mm_matches_sequential_loop(g in gemm_input(F8)) {
        let got = scaled_mm(F8, &g.a, ActScale::PerRow(&g.a_scale), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi());
        prop_assert_eq!(got, naive_mm(F8, &g.a, &g.a_scale, &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi()));
    }

    #[test]
    fn rows_do_not_depend_on_the_batch(g in dtype_strategy().prop_flat_map(|d| (Just(d), gemm_input(d)))) {
        let (dtype, g) = g;
        let all = scaled_mm(dtype, &g.a, ActScale::PerRow(&g.a_scale), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi());
        for i in 0..g.m {
            let row = scaled_mm(dtype, &g.a[i * g.k..(i + 1) * g.k], ActScale::PerRow(&g.a_scale[i..=i]), &g.w, &g.weight_scale, 1, g.n, g.k, &g.epi());
            prop_assert_eq!(&row[..], &all[i * g.n..(i + 1) * g.n]);
        }
    }

    #[test]
    fn fused_chain_equals_unfused_pair(
        g in dtype_strategy().prop_flat_map(|d| (Just(d), gemm_input(d))),
        out8 in dtype_strategy(),
        input_scale in 1e-3f32..10.0,
        smooth in proptest::collection::vec(0.05f32..20.0, 12),
        with_smooth in any::<bool>(),
    ) {
        let (dtype, g) = g;
        let smooth = with_smooth.then(|| &smooth[..g.n]);
        let y = scaled_mm(dtype, &g.a, ActScale::PerRow(&g.a_scale), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi());
        let y: Vec<f32> = y.iter().map(|&b| match g.out {
            OutDtype::F16 => f16_bits_to_f32(b),
            OutDtype::Bf16 => bf16_bits_to_f32(b),
        }).collect();
        let unfused = quantize_static(&y, g.m, g.n, smooth, input_scale, out8);
        let fused = scaled_mm_quant(dtype, &g.a, ActScale::PerRow(&g.a_scale), &g.w, &g.weight_scale, g.m, g.n, g.k, &g.epi(), smooth, input_scale, out8);
        prop_assert_eq!(fused, unfused);
    }

    #[test]
    fn quantize_dequantize_error_is_bounded(
        rows in proptest::collection::vec(proptest::collection::vec(-1e3f32..1e3, 7), 1..5),
        dtype in dtype_strategy(),
    ) {
        let x: Vec<f32> = rows.concat();
        let q = quantize_per_token(&x, rows.len(), 7, None, dtype);
        let back = dequantize_rows(&q);
        for (r, row) in rows.iter().enumerate() {
            let amax = row.iter().fold(AMAX_FLOOR, |m, v| m.max(v.abs()));
            for (j, &v) in row.iter().enumerate() {
                let err = (back[r * 7 + j] - v).abs();
                // int8: half a step of amax / 127; e4m3: 2^-4 relative, or half a subnormal step.
                let bound = match dtype {
                    QuantDtype::Int8 => 0.5 * amax / 127.0 * 1.0001,
                    QuantDtype::Float8E4m3fn => (v.abs() / 16.0).max(amax / 448.0 * 2f32.powi(-10)) * 1.0001,
                };
                prop_assert!(err <= bound, "{} -> {} (bound {})", v, back[r * 7 + j], bound);
            }
        }
    }
}

#[test]
fn tiled_shapes_match_naive() {
    // n > 256 crosses an fp8 column tile; m = 5 leaves a partial row block.
    let (m, n, k) = (5, 300, 33);
    let code = |i: usize, dtype: QuantDtype| -> u8 {
        let c = (i.wrapping_mul(2654435761) >> 7) as u8;
        if dtype == F8 && c & 0x7F == 0x7F {
            0x3F
        } else {
            c
        }
    };
    let a_s: Vec<f32> = (0..m).map(|i| 0.01 + i as f32 * 0.003).collect();
    let ws: Vec<f32> = (0..n).map(|j| 0.02 + (j % 17) as f32 * 0.001).collect();
    let bias: Vec<f32> = (0..n).map(|j| (j % 5) as f32 - 2.0).collect();
    for dtype in QuantDtype::ALL {
        let a: Vec<u8> = (0..m * k).map(|i| code(i, dtype)).collect();
        let w: Vec<u8> = (0..n * k).map(|i| code(i + 7777, dtype)).collect();
        let epi = GemmEpilogue {
            bias: Some(&bias),
            activation: Activation::Gelu,
            out: OutDtype::Bf16,
        };
        let got = scaled_mm(dtype, &a, ActScale::PerRow(&a_s), &w, &ws, m, n, k, &epi);
        assert_eq!(
            got,
            naive_mm(dtype, &a, &a_s, &w, &ws, m, n, k, &epi),
            "{dtype}"
        );
    }
}

#[test]
#[should_panic(expected = "a has 3 codes, expected m * k = 2 * 2")]
fn scaled_mm_checks_shapes() {
    let epi = GemmEpilogue {
        bias: None,
        activation: Activation::None,
        out: OutDtype::F16,
    };
    scaled_mm(
        I8,
        &[0; 3],
        ActScale::PerTensor(1.0),
        &[0; 2],
        &[1.0],
        2,
        1,
        2,
        &epi,
    );
}

#[test]
#[should_panic(expected = "bias has 1 entries, expected n = 2")]
fn scaled_mm_checks_bias() {
    let epi = GemmEpilogue {
        bias: Some(&[0.0]),
        activation: Activation::None,
        out: OutDtype::F16,
    };
    scaled_mm(
        I8,
        &[0; 2],
        ActScale::PerTensor(1.0),
        &[0; 4],
        &[1.0, 1.0],
        1,
        2,
        2,
        &epi,
    );
}

// ---------------------------------------------------------------------------------------------
// exp, erf and the activations against f64 references

/// erf in f64 from the series erf(x) = 2/√π · e^(-x²) · Σ 2^n x^(2n+1) / (1·3·…·(2n+1)),
/// whose terms are all positive (no cancellation); erf(x) = ±1 to f64 precision past 6.
fn erf64(x: f64) -> f64 {
    let a = x.abs();
    if a == 0.0 {
        return x;
    }
    if a > 6.0 {
        return x.signum();
    }
    let (mut term, mut sum, mut n) = (a, a, 0.0);
    while term > sum * 1e-18 {
        n += 1.0;
        term *= 2.0 * a * a / (2.0 * n + 1.0);
        sum += term;
    }
    (2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum).copysign(x)
}

/// One ulp of the f32 nearest to `v` (the subnormal step below the normal range).
fn ulp(v: f64) -> f64 {
    let a = (v as f32).abs();
    if a < f32::MIN_POSITIVE {
        return f64::from(f32::from_bits(1));
    }
    f64::from(f32::from_bits(a.to_bits() & 0x7F80_0000)) * 2f64.powi(-23)
}

/// About `count` f32 values evenly spread over [lo, hi].
fn grid(lo: f32, hi: f32, count: usize) -> impl Iterator<Item = f32> {
    (0..=count).map(move |i| lo + (hi - lo) * (i as f32 / count as f32))
}

#[test]
fn exp_is_within_1_ulp() {
    let mut worst = 0.0f64;
    for x in grid(-87.33, 88.72, 400_000).chain(grid(-1.0, 1.0, 100_000)) {
        let want = f64::from(x).exp();
        worst = worst.max((f64::from(exp_f32(x)) - want).abs() / ulp(want));
    }
    assert!(worst <= 1.0, "exp max error {worst} ulp");
    // Subnormal results: within one subnormal step.
    for x in grid(-103.97, -87.34, 50_000) {
        let err = (f64::from(exp_f32(x)) - f64::from(x).exp()).abs();
        assert!(err <= f64::from(f32::from_bits(1)), "exp({x})");
    }
}

#[test]
fn exp_limits_and_monotonicity() {
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(-0.0), 1.0);
    assert!(same_bits(exp_f32(-200.0), 0.0));
    assert!(same_bits(exp_f32(-104.0), 0.0));
    assert!(same_bits(exp_f32(f32::NEG_INFINITY), 0.0));
    assert_eq!(exp_f32(100.0), f32::INFINITY);
    assert_eq!(exp_f32(88.72284), f32::INFINITY); // first f32 above ln(f32::MAX)
    assert!(exp_f32(88.72283).is_finite());
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert!(exp_f32(f32::NAN).is_nan());
    let mut prev = 0.0f32;
    for x in grid(-104.0, 89.0, 1_000_000) {
        let v = exp_f32(x);
        assert!(v >= prev, "exp not monotone at {x}");
        prev = v;
    }
}

#[test]
fn erf_is_within_bounds() {
    let mut worst_abs = 0.0f64;
    let mut worst_series_ulp = 0.0f64;
    for x in grid(-6.0, 6.0, 600_000) {
        let want = erf64(f64::from(x));
        let got = f64::from(erf_f32(x));
        worst_abs = worst_abs.max((got - want).abs());
        if x.abs() < ERF_SERIES_MAX && x != 0.0 {
            worst_series_ulp = worst_series_ulp.max((got - want).abs() / ulp(want));
        }
    }
    assert!(worst_abs <= 3.5e-7, "erf max abs error {worst_abs}");
    assert!(
        worst_series_ulp <= 3.0,
        "erf max error below 0.5: {worst_series_ulp} ulp"
    );
    assert!(same_bits(erf_f32(0.0), 0.0));
    assert!(same_bits(erf_f32(-0.0), -0.0));
    assert_eq!(erf_f32(3.92), 1.0);
    assert_eq!(erf_f32(-10.0), -1.0);
    assert_eq!(erf_f32(f32::INFINITY), 1.0);
    assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
    assert!(erf_f32(f32::NAN).is_nan());
    for x in grid(0.0, 6.0, 10_000) {
        assert!(same_bits(erf_f32(-x), -erf_f32(x)), "erf is odd at {x}");
    }
}

#[test]
fn gelu_and_swish_are_within_bounds() {
    let (mut worst_gelu, mut worst_swish) = (0.0f64, 0.0f64);
    for x in grid(-20.0, 20.0, 800_000) {
        let xd = f64::from(x);
        let g = 0.5 * xd * (1.0 + erf64(xd / std::f64::consts::SQRT_2));
        worst_gelu = worst_gelu.max((f64::from(gelu(x)) - g).abs() / xd.abs().max(1e-30));
        let s = xd / (1.0 + (-xd).exp());
        worst_swish = worst_swish.max((f64::from(swish(x)) - s).abs() / ulp(s));
    }
    assert!(worst_gelu <= 2e-7, "gelu max error {worst_gelu} · |x|");
    assert!(worst_swish <= 3.0, "swish max error {worst_swish} ulp");
    // Past the overflow of exp(-v), swish is -0.0 where the true value is below 1e-36.
    assert!(same_bits(swish(-100.0), -0.0));
    assert!(same_bits(swish(-89.0), -0.0));
    assert_eq!(swish(100.0), 100.0);
    assert!(swish(f32::NAN).is_nan());
    // erf(v / √2) rounds to -1 for v ≤ -5.55, so GELU is -0.0 there.
    assert!(same_bits(gelu(-20.0), -0.0));
    assert!(same_bits(gelu(-6.0), -0.0));
    assert!(gelu(-5.0) < 0.0);
    assert_eq!(gelu(20.0), 20.0);
    assert!(same_bits(gelu(0.0), 0.0));
    assert!(gelu(f32::NAN).is_nan());
    assert!(same_bits(activate(Activation::Relu, -0.0), 0.0));
    assert!(same_bits(activate(Activation::Relu, f32::NAN), 0.0));
    assert!(same_bits(activate(Activation::None, -0.0), -0.0));
}

#[test]
fn out_conversions() {
    assert_eq!(f16_bits_to_f32(0x3C00), 1.0);
    assert_eq!(f16_bits_to_f32(0x0001), 5.9604645e-8);
    assert_eq!(bf16_bits_to_f32(0x3F80), 1.0);
    assert_eq!(bf16_bits_to_f32(0xC2F7), -123.5);
    assert_eq!(round_to_out(OutDtype::F16, 1.0 + 2f32.powi(-11)), 0x3C00); // tie to even
    assert_eq!(
        round_to_out(OutDtype::F16, 1.0 + 3.0 * 2f32.powi(-11)),
        0x3C02
    );
    assert_eq!(round_to_out(OutDtype::F16, 1e5), 0x7C00); // overflow to +inf
    assert_eq!(round_to_out(OutDtype::F16, 2f32.powi(-25)), 0x0000); // tie to even subnormal 0
    assert_eq!(round_to_out(OutDtype::F16, 3.0 * 2f32.powi(-25)), 0x0002);
    assert_eq!(round_to_out(OutDtype::Bf16, 1.0 + 2f32.powi(-8)), 0x3F80);
    assert_eq!(round_to_out(OutDtype::Bf16, -0.0), 0x8000);
    assert_eq!(round_to_out(OutDtype::F16, f32::NAN), 0x7E00);
    assert_eq!(round_to_out(OutDtype::Bf16, f32::NAN), 0x7FC0);
}
