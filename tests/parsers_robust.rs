//! Every parser gets truncated and bit-flipped input: each must answer with an error (or a valid
//! result for a harmless flip), never a panic.

mod common;

use std::path::Path;

use oasr_quantize::checkpoint::{ct2, safetensors_io, Checkpoint, NativeConfig};
use proptest::prelude::*;

/// A complete CTranslate2 Whisper (d_model 16, 2 heads, one layer each side, 80 mel bands, 8
/// tokens) that imports without error: a damaged part of it is the only fault.
fn valid_small_ct2() -> Vec<u8> {
    let (d, ffn, vocab, mel) = (16u32, 32u32, 8u32, 80u32);
    let zeros =
        |shape: &[u32]| common::f16_bytes(&vec![0.0; shape.iter().product::<u32>() as usize]);
    let mut vars: Vec<(String, Vec<u32>, u8, Vec<u8>)> = Vec::new();
    let mut tensor = |name: String, shape: Vec<u32>| {
        let data = zeros(&shape);
        vars.push((name, shape, 4, data));
    };
    tensor("encoder/conv1/weight".into(), vec![d, mel, 3]);
    tensor("encoder/conv1/bias".into(), vec![d]);
    tensor("encoder/conv2/weight".into(), vec![d, d, 3]);
    tensor("encoder/conv2/bias".into(), vec![d]);
    tensor("encoder/position_encodings/encodings".into(), vec![1500, d]);
    tensor("decoder/position_encodings/encodings".into(), vec![8, d]);
    tensor("decoder/embeddings/weight".into(), vec![vocab, d]);
    for side in ["encoder", "decoder"] {
        tensor(format!("{side}/layer_norm/gamma"), vec![d]);
        tensor(format!("{side}/layer_norm/beta"), vec![d]);
        let p = format!("{side}/layer_0");
        let mut linear = |name: String, rows: u32, cols: u32| {
            tensor(format!("{name}/weight"), vec![rows, cols]);
            tensor(format!("{name}/bias"), vec![rows]);
        };
        linear(format!("{p}/self_attention/linear_0"), 3 * d, d);
        linear(format!("{p}/self_attention/linear_1"), d, d);
        linear(format!("{p}/ffn/linear_0"), ffn, d);
        linear(format!("{p}/ffn/linear_1"), d, ffn);
        if side == "decoder" {
            linear(format!("{p}/attention/linear_0"), d, d);
            linear(format!("{p}/attention/linear_1"), 2 * d, d);
            linear(format!("{p}/attention/linear_2"), d, d);
        }
        let mut norms = vec!["self_attention", "ffn"];
        if side == "decoder" {
            norms.push("attention");
        }
        for block in norms {
            tensor(format!("{p}/{block}/layer_norm/gamma"), vec![d]);
            tensor(format!("{p}/{block}/layer_norm/beta"), vec![d]);
        }
    }
    for (name, dtype, bytes) in [
        ("encoder/num_heads", 2u8, 2i16.to_le_bytes().to_vec()),
        ("decoder/num_heads", 2, 2i16.to_le_bytes().to_vec()),
        ("decoder/activation", 1, vec![3]),
        ("decoder/pre_norm", 1, vec![1]),
        ("decoder/scale_embeddings", 1, vec![0]),
        ("decoder/alibi", 1, vec![0]),
        ("decoder/start_from_zero_embedding", 1, vec![0]),
    ] {
        vars.push((name.to_string(), vec![], dtype, bytes));
    }
    let vars: Vec<(&str, Vec<u32>, u8, Vec<u8>)> = vars
        .iter()
        .map(|(n, s, t, b)| (n.as_str(), s.clone(), *t, b.clone()))
        .collect();
    common::ct2_bytes(
        "WhisperSpec",
        &vars,
        &[("decoder/projection/weight", "decoder/embeddings/weight")],
    )
}

/// The special tokens of [`valid_small_ct2`]'s 8-token vocabulary.
const SMALL_TOKENIZER: &[u8] = br#"{"added_tokens": [{"id": 5, "content": "<|endoftext|>"}, {"id": 6, "content": "<|startoftranscript|>"}, {"id": 7, "content": "<|notimestamps|>"}]}"#;

/// CTranslate2's `config.json` for [`valid_small_ct2`].
const SMALL_CT2_CONFIG: &[u8] =
    br#"{"suppress_ids": [1, 2], "suppress_ids_begin": [5], "lang_ids": [], "alignment_heads": [[0, 1]]}"#;

/// A directory holding the valid small CTranslate2 checkpoint, with `replace` written over it.
fn small_ct2_dir(dir: &Path, replace: &[(&str, &[u8])]) {
    write(dir, "model.bin", &valid_small_ct2());
    write(dir, "config.json", SMALL_CT2_CONFIG);
    write(dir, "tokenizer.json", SMALL_TOKENIZER);
    for (name, bytes) in replace {
        write(dir, name, bytes);
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn the_small_files_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let m = ct2::read(&write(tmp.path(), "model.bin", &common::small_ct2())).unwrap();
    assert_eq!(m.variables.len(), 4);
    assert_eq!(
        m.aliases["decoder/projection/weight"],
        "decoder/embeddings/weight"
    );
    assert_eq!(
        safetensors_io::read(&write(
            tmp.path(),
            "m.safetensors",
            &common::small_safetensors()
        ))
        .unwrap()
        .len(),
        2
    );
}

#[test]
fn the_small_checkpoint_imports() {
    // The base of the damaged-input tests below: every error they see comes from the damage.
    let tmp = tempfile::tempdir().unwrap();
    small_ct2_dir(tmp.path(), &[]);
    let ckpt = Checkpoint::open(tmp.path()).unwrap();
    assert_eq!(ckpt.config.model_config["d_model"], 16);
    assert_eq!(ckpt.config.model_config["eos_token_id"], 5);
}

#[test]
fn a_tokenizer_without_a_special_token_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    small_ct2_dir(
        tmp.path(),
        &[(
            "tokenizer.json",
            br#"{"added_tokens": [{"id": 5, "content": "<|endoftext|>"}]}"#,
        )],
    );
    let e = Checkpoint::open(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("<|startoftranscript|>"),
        "{e}"
    );
}

#[test]
fn every_truncation_of_a_ct2_file_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let full = common::small_ct2();
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
    let full = common::small_safetensors();
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
        let _ = ct2::read(&write(tmp.path(), "model.bin", &flip(&common::small_ct2(), &flips)));
    }

    #[test]
    fn bit_flipped_safetensors_files_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let _ = safetensors_io::read(&write(tmp.path(), "m.safetensors", &flip(&common::small_safetensors(), &flips)));
    }

    #[test]
    fn damaged_configs_never_panic(cut in 0usize..400, flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..3)) {
        let config = include_str!("fixtures/oasr_config_v2.json");
        let bytes = flip(config.as_bytes(), &flips);
        let bytes = &bytes[..cut.min(bytes.len())];
        let tmp = tempfile::tempdir().unwrap();
        let _ = NativeConfig::read(&write(tmp.path(), "oasr_config.json", bytes));
        // The whole native import path: the config is the first file it parses.
        let native = tmp.path().join("native");
        std::fs::create_dir_all(&native).unwrap();
        write(&native, "oasr_config.json", bytes);
        write(&native, "model.safetensors", &common::small_safetensors());
        if let Err(e) = Checkpoint::open(&native) {
            prop_assert!(e.to_string().contains("oasr_config.json") || e.to_string().contains("not a checkpoint"), "{}", e);
        }
        // The CTranslate2 import of a valid model with its config.json damaged: only the config
        // can be at fault.
        let ct2_config = flip(SMALL_CT2_CONFIG, &flips);
        let ct2_config = &ct2_config[..cut.min(ct2_config.len())];
        let ct2_dir = tmp.path().join("ct2");
        std::fs::create_dir_all(&ct2_dir).unwrap();
        small_ct2_dir(&ct2_dir, &[("config.json", ct2_config)]);
        if let Err(e) = Checkpoint::open(&ct2_dir) {
            prop_assert!(e.to_string().contains("config.json"), "{}", e);
        }
    }

    #[test]
    fn damaged_tokenizers_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..3)) {
        // A valid model and config: the tokenizer is the only thing that can be wrong, so the
        // tokenizer parser is reached; a flip either leaves a usable tokenizer or is refused
        // naming it.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        small_ct2_dir(dir, &[("tokenizer.json", &flip(SMALL_TOKENIZER, &flips))]);
        if let Err(e) = Checkpoint::open(dir) {
            let e = e.to_string();
            prop_assert!(e.contains("tokenizer.json"), "{}", e);
        }
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
