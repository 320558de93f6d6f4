//! Every parser gets truncated and bit-flipped input: each must answer with an error (or a valid
//! result for a harmless flip), never a panic.

mod common;

use std::path::Path;

use oasr_quantize::checkpoint::{ct2, safetensors_io, Checkpoint, NativeConfig};
use proptest::prelude::*;

fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect()
}

/// A small but complete CTranslate2 file: a fused q;k;v, an attribute and the alias.
fn small_ct2() -> Vec<u8> {
    let qkv: Vec<f32> = (0..3 * 16 * 16)
        .map(|i| (i % 7) as f32 * 0.25 - 0.5)
        .collect();
    common::ct2_bytes(
        "WhisperSpec",
        &[
            (
                "decoder/embeddings/weight",
                vec![8, 16],
                4,
                f16_bytes(&[0.5; 128]),
            ),
            ("decoder/num_heads", vec![], 2, 2i16.to_le_bytes().to_vec()),
            (
                "encoder/layer_0/self_attention/linear_0/weight",
                vec![48, 16],
                4,
                f16_bytes(&qkv),
            ),
            (
                "encoder/layer_0/self_attention/linear_0/bias",
                vec![48],
                0,
                [0f32; 48].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        ],
        &[("decoder/projection/weight", "decoder/embeddings/weight")],
    )
}

fn small_safetensors() -> Vec<u8> {
    let data: Vec<u8> = (0..64u8).collect();
    let views = vec![
        (
            "a.weight".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F16, vec![4, 8], &data)
                .unwrap(),
        ),
        (
            "b.bias".to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::I8, vec![16], &data[..16])
                .unwrap(),
        ),
    ];
    safetensors::serialize(views, &None).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn the_small_files_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let m = ct2::read(&write(tmp.path(), "model.bin", &small_ct2())).unwrap();
    assert_eq!(m.variables.len(), 4);
    assert_eq!(
        m.aliases["decoder/projection/weight"],
        "decoder/embeddings/weight"
    );
    assert_eq!(
        safetensors_io::read(&write(tmp.path(), "m.safetensors", &small_safetensors()))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn every_truncation_of_a_ct2_file_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let full = small_ct2();
    for len in 0..full.len() {
        let path = write(tmp.path(), "model.bin", &full[..len]);
        let e = ct2::read(&path).expect_err("a truncated file must not parse");
        assert!(e.to_string().contains("model.bin"), "{e}");
    }
    let mut longer = full.clone();
    longer.push(0);
    let e = ct2::read(&write(tmp.path(), "model.bin", &longer)).unwrap_err();
    assert!(e.to_string().contains("unexpected bytes"), "{e}");
}

#[test]
fn every_truncation_of_a_safetensors_file_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let full = small_safetensors();
    for len in 0..full.len() {
        assert!(
            safetensors_io::read(&write(tmp.path(), "m.safetensors", &full[..len])).is_err(),
            "length {len}"
        );
    }
}

fn flip(bytes: &[u8], flips: &[(usize, u8)]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for (at, bit) in flips {
        let i = at % b.len();
        b[i] ^= 1 << (bit % 8);
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bit_flipped_ct2_files_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let _ = ct2::read(&write(tmp.path(), "model.bin", &flip(&small_ct2(), &flips)));
    }

    #[test]
    fn bit_flipped_safetensors_files_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let _ = safetensors_io::read(&write(tmp.path(), "m.safetensors", &flip(&small_safetensors(), &flips)));
    }

    #[test]
    fn damaged_configs_never_panic(cut in 0usize..400, flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..3)) {
        let config = include_str!("fixtures/oasr_config_v2.json");
        let bytes = flip(config.as_bytes(), &flips);
        let bytes = &bytes[..cut.min(bytes.len())];
        let tmp = tempfile::tempdir().unwrap();
        let _ = NativeConfig::read(&write(tmp.path(), "oasr_config.json", bytes));
        // The whole import path, for each format's config file.
        for name in ["oasr_config.json", "config.json"] {
            let dir = tmp.path().join(name.replace('.', "_"));
            std::fs::create_dir_all(&dir).unwrap();
            write(&dir, name, bytes);
            write(&dir, "model.safetensors", &small_safetensors());
            write(&dir, "model.bin", &small_ct2());
            let _ = Checkpoint::open(&dir);
        }
    }

    #[test]
    fn damaged_tokenizers_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..3)) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "model.bin", &small_ct2());
        write(dir, "config.json", b"{}");
        write(dir, "tokenizer.json", &flip(br#"{"added_tokens": [{"id": 1, "content": "<|endoftext|>"}]}"#, &flips));
        prop_assert!(Checkpoint::open(dir).is_err());
    }
}

#[test]
fn the_v2_fixture_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let config = NativeConfig::read(&write(
        tmp.path(),
        "oasr_config.json",
        include_bytes!("fixtures/oasr_config_v2.json"),
    ))
    .unwrap();
    assert_eq!(config.format_version, 2);
    assert_eq!(config.quantization.unwrap().layers.len(), 2);
}
