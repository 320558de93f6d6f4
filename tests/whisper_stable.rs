//! Whisper's outputs stay byte-identical across refactors of the crate (the model seam, the
//! registry): the real tiny.en quantized with the calibration-free recipes and converted to
//! native v1 must give exactly the files recorded here.
//!
//! Only computations that are the same bits on every x86-64 CPU are pinned: weight-only RTN
//! (per-channel absmax, IEEE division and rounding) and the f16 → f32 conversion. Calibrated
//! recipes depend on the forward's float sums, whose order the GEMM library picks by CPU
//! (AVX2 or AVX-512), so they are checked for determinism on one machine instead
//! (`whisper_real.rs`). A change that alters these files on purpose (a new config field, another
//! rounding) updates the hashes here and says so in CHANGELOG.md.

mod common;

use oasr_quantize::{convert, Quantizer};

/// (file, sha256) of each output, as written by this version.
const INT8_RTN: &[(&str, &str)] = &[
    (
        "model.safetensors",
        "e735573bd2551fdb06fbf86b45fa7c57fe6b9be145c7120332ef2366b133b5fd",
    ),
    (
        "oasr_config.json",
        "3405327d6548f2ad3cd5c0198a7234d098d89c85396d9893d29311d7c2ea4a05",
    ),
    (
        "quantization_report.json",
        "8ba8a51367947fc6f7013e8c8fceb006b03aadc4010785c4580d73e4ddd9b414",
    ),
];
const FP8_RTN: &[(&str, &str)] = &[
    (
        "model.safetensors",
        "134bd57945391c5411700695a9cf5699458dfee0ce00fec26085519300785987",
    ),
    (
        "oasr_config.json",
        "50ea6dc40555d09ed2a5557f5cb9a799e7c32b9eb434e2bf831c16d118998122",
    ),
    (
        "quantization_report.json",
        "d46343317a9798190337f011f43a15a09434637997168d75d5fbd072a0f02dc1",
    ),
];
const NATIVE_V1: &[(&str, &str)] = &[
    (
        "model.safetensors",
        "9f4afcda9599fc64615d796099c34686c8ffadff4bfa9ccaecc34fe616e8cefa",
    ),
    (
        "oasr_config.json",
        "6ba94094c5a256e9a51137e1fe8372ab41bff5ce47cdf2302dd65d95f30ec9b0",
    ),
];
/// The tokenizer is copied as it is in the source.
const TOKENIZER: (&str, &str) = (
    "tokenizer/tokenizer.json",
    "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
);

fn assert_files(dir: &std::path::Path, expected: &[(&str, &str)]) {
    let got = common::tree_hashes(dir);
    for (file, sha) in expected.iter().chain([&TOKENIZER]) {
        assert_eq!(
            got.get(*file).map(String::as_str),
            Some(*sha),
            "{}: {file} is not the recorded output",
            dir.display()
        );
    }
}

#[test]
fn rtn_and_convert_outputs_of_tiny_en_are_the_recorded_bytes() {
    let src = common::tiny_en();
    let tmp = tempfile::tempdir().unwrap();
    for (recipe, expected) in [("int8_w8a8_rtn", INT8_RTN), ("fp8_w8a8_rtn", FP8_RTN)] {
        let dst = tmp.path().join(recipe);
        Quantizer::new(&src, &dst).recipe(recipe).run().unwrap();
        assert_files(&dst, expected);
    }
    let dst = tmp.path().join("native-v1");
    convert(&src, &dst, false).unwrap();
    assert_files(&dst, NATIVE_V1);
}
