//! Invalid checkpoints and configs are refused when opened, by name (the file and the key,
//! tensor or layer at fault), and never reach a panic: damaged copies of a real quantized
//! tiny.en, of its CTranslate2 source and of a Hugging Face layout of it.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oasr_quantize::checkpoint::{Checkpoint, OpenOptions};
use oasr_quantize::models::whisper::Whisper;
use oasr_quantize::verify::QuantizedModel;
use serde_json::{json, Value};

/// tiny.en quantized with `int8_w8a8_rtn`, once per test binary.
fn quantized() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap().keep();
        let dst = tmp.join("q");
        oasr_quantize::Quantizer::new(common::tiny_en(), &dst)
            .recipe("int8_w8a8_rtn")
            .run()
            .unwrap();
        dst
    })
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let to = dst.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &to);
        } else {
            std::fs::copy(&path, &to).unwrap();
        }
    }
}

/// A fresh copy of the quantized checkpoint.
fn damaged_copy(tmp: &Path) -> PathBuf {
    let dir = tmp.join("damaged");
    copy_dir(quantized(), &dir);
    dir
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    edit_json(&dir.join("oasr_config.json"), edit);
}

/// Rewrites `model.safetensors` through `edit` (name -> (dtype, shape, bytes)) and records the
/// new file's sha256 as the fingerprint, so that only the edited part is wrong.
fn edit_tensors(
    dir: &Path,
    edit: impl FnOnce(&mut BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, (d, s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &path).unwrap();
    refingerprint(dir);
}

fn refingerprint(dir: &Path) {
    let sha = oasr_quantize::sha256_file(&dir.join("model.safetensors")).unwrap();
    edit_config(dir, |c| {
        c["quantization"]["producer"]["fingerprint"] = json!(sha);
    });
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `inspect` and `verify`'s loader both refuse the checkpoint, with every needle in the error.
fn refused(dir: &Path, needles: &[&str]) -> String {
    let e = oasr_quantize::inspect::inspect(dir)
        .map(|_| ())
        .expect_err("inspect must refuse the checkpoint");
    let message = e.to_string();
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
    assert!(
        QuantizedModel::load(dir).is_err(),
        "verify's loader must refuse what inspect refuses"
    );
    message
}

#[test]
fn the_undamaged_copy_opens_in_inspect_and_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    oasr_quantize::inspect::inspect(&dir).unwrap();
    QuantizedModel::load(&dir).unwrap();
}

// ---- model_config values that reached a division, an index or a silent run ----

fn refused_model_config(key: &str, value: Value, needles: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| c["model_config"][key] = value);
    let mut all = vec!["oasr_config.json"];
    all.extend_from_slice(needles);
    refused(&dir, &all);
}

#[test]
fn zero_encoder_heads_are_refused_not_divided_by() {
    refused_model_config(
        "encoder_attention_heads",
        json!(0),
        &["model_config.encoder_attention_heads", "is 0"],
    );
}

#[test]
fn heads_that_do_not_divide_d_model_are_refused() {
    refused_model_config(
        "decoder_attention_heads",
        json!(5),
        &["model_config.decoder_attention_heads", "do not divide"],
    );
}

#[test]
fn zero_layers_are_refused() {
    refused_model_config("encoder_layers", json!(0), &["model_config.encoder_layers"]);
    refused_model_config("decoder_layers", json!(0), &["model_config.decoder_layers"]);
}

#[test]
fn a_huge_layer_count_is_refused_before_anything_is_sized_by_it() {
    refused_model_config(
        "encoder_layers",
        json!(1u64 << 60),
        &["model_config.encoder_layers", "cannot fit"],
    );
}

#[test]
fn d_model_7_is_refused() {
    // 7 is not divisible by the 6 heads; the check names the head count that cannot split it.
    refused_model_config("d_model", json!(7), &["model_config.", "d_model 7"]);
}

#[test]
fn a_d_model_the_tensors_do_not_have_is_refused_by_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| c["model_config"]["d_model"] = json!(390));
    refused(&dir, &["model.safetensors", "expected shape"]);
}

#[test]
fn zero_vocab_is_refused() {
    refused_model_config("vocab_size", json!(0), &["model_config.vocab_size", "is 0"]);
}

#[test]
fn unsupported_mel_bins_are_refused() {
    refused_model_config(
        "num_mel_bins",
        json!(0),
        &["model_config.num_mel_bins", "80 or 128"],
    );
}

#[test]
fn mel_bins_128_with_80_bin_weights_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    // The features alone first: they must match the model's bands.
    edit_config(&dir, |c| c["model_config"]["num_mel_bins"] = json!(128));
    refused(&dir, &["oasr_config.json", "features.feature_dim"]);
    // Both: the conv stem's weights are 80-band.
    edit_config(&dir, |c| c["features"]["feature_dim"] = json!(128));
    refused(
        &dir,
        &["model.safetensors", "encoder.conv1.weight", "[384, 3, 128]"],
    );
}

#[test]
fn too_few_positions_are_refused() {
    refused_model_config(
        "max_source_positions",
        json!(100),
        &["model_config.max_source_positions", "1500"],
    );
    refused_model_config(
        "max_target_positions",
        json!(1),
        &["model_config.max_target_positions"],
    );
}

#[test]
fn an_activation_the_forward_does_not_implement_is_refused() {
    refused_model_config(
        "activation_function",
        json!("relu"),
        &["model_config.activation_function", "relu"],
    );
}

#[test]
fn out_of_range_token_ids_and_alignment_heads_are_refused() {
    refused_model_config(
        "suppress_tokens",
        json!([1, 2, 60000]),
        &["model_config.suppress_tokens", "60000"],
    );
    refused_model_config(
        "begin_suppress_tokens",
        json!([51864]),
        &["model_config.begin_suppress_tokens"],
    );
    refused_model_config("eos_token_id", json!(70000), &["model_config.eos_token_id"]);
    refused_model_config(
        "alignment_heads",
        json!([[4, 0]]),
        &["model_config.alignment_heads", "[4, 0]"],
    );
    refused_model_config(
        "alignment_heads",
        json!([[0, 6]]),
        &["model_config.alignment_heads", "[0, 6]"],
    );
    refused_model_config(
        "forced_decoder_ids",
        json!([[2, 50362]]),
        &["model_config.forced_decoder_ids"],
    );
}

#[test]
fn start_and_end_ids_must_be_the_tokenizers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| {
        c["model_config"]["decoder_start_token_id"] = json!(50258);
        c["decoding"]["sos_id"] = json!(50258);
    });
    refused(
        &dir,
        &[
            "oasr_config.json",
            "model_config.decoder_start_token_id",
            "<|startoftranscript|>",
        ],
    );
}

#[test]
fn features_the_frontend_does_not_compute_are_refused() {
    for (key, value) in [
        ("sample_rate", json!(0)),
        ("sample_rate", json!(8000)),
        ("kind", json!("fbank")),
        ("frame_shift_ms", json!(20.0)),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = damaged_copy(tmp.path());
        edit_config(&dir, |c| c["features"][key] = value);
        refused(&dir, &["oasr_config.json", &format!("features.{key}")]);
    }
}

#[test]
fn decoding_ids_must_match_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| c["decoding"]["eos_id"] = json!(7));
    refused(&dir, &["oasr_config.json", "decoding.eos_id"]);
}

#[test]
fn an_unknown_architecture_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| c["architecture"] = json!("conformer"));
    refused(&dir, &["oasr_config.json", "`architecture`", "conformer"]);
}

// ---- tokenizer paths ----

#[test]
fn tokenizer_paths_outside_the_directory_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("tokenizer.json");
    std::fs::copy(common::tiny_en().join("tokenizer.json"), &outside).unwrap();
    for rel in [
        "../tokenizer.json".to_string(),
        outside.display().to_string(),
        "".to_string(),
    ] {
        let dir = damaged_copy(tmp.path());
        edit_config(&dir, |c| {
            c["tokenizer"]["files"]["tokenizer"] = json!(rel);
        });
        refused(&dir, &["oasr_config.json", "tokenizer.files.tokenizer"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // A symbolic link inside the directory that points out of it.
    let dir = damaged_copy(tmp.path());
    std::fs::remove_file(dir.join("tokenizer/tokenizer.json")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("tokenizer/tokenizer.json")).unwrap();
    refused(
        &dir,
        &["oasr_config.json", "tokenizer.files.tokenizer", "outside"],
    );
}

// ---- tensors ----

#[test]
fn a_missing_bias_or_norm_is_refused_by_tensor() {
    for name in [
        "encoder.layers.0.fc1.bias",
        "decoder.layer_norm.weight",
        "decoder.layers.3.encoder_attn_layer_norm.bias",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = damaged_copy(tmp.path());
        edit_tensors(&dir, |t| {
            t.remove(name).unwrap();
        });
        refused(&dir, &["model.safetensors", name, "missing"]);
    }
}

#[test]
fn a_wrong_dtype_or_shape_is_refused_by_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_tensors(&dir, |t| {
        let bias = t.get_mut("encoder.layers.1.fc2.bias").unwrap();
        bias.1 = vec![192, 2];
    });
    refused(
        &dir,
        &["model.safetensors", "encoder.layers.1.fc2.bias", "shape"],
    );
    let dir = tmp.path().join("dtype");
    copy_dir(quantized(), &dir);
    edit_tensors(&dir, |t| {
        let w = t.get_mut("encoder.layers.1.fc2.weight").unwrap();
        w.0 = safetensors::Dtype::U8;
    });
    refused(
        &dir,
        &["model.safetensors", "encoder.layers.1.fc2.weight", "I8"],
    );
}

#[test]
fn an_unexpected_tensor_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_tensors(&dir, |t| {
        t.insert(
            "encoder.extra.weight".into(),
            (safetensors::Dtype::F32, vec![1], f32_bytes(&[1.0])),
        );
    });
    refused(
        &dir,
        &["model.safetensors", "encoder.extra.weight", "unexpected"],
    );
}

#[test]
fn non_finite_zero_or_negative_weight_scales_are_refused() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.01] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = damaged_copy(tmp.path());
        edit_tensors(&dir, |t| {
            let s = &mut t.get_mut("decoder.layers.2.fc1.weight_scale").unwrap().2;
            s[40..44].copy_from_slice(&bad.to_le_bytes());
        });
        let e = refused(
            &dir,
            &[
                "model.safetensors",
                "decoder.layers.2.fc1.weight_scale",
                "element 10",
                "finite and positive",
            ],
        );
        assert!(e.contains(&bad.to_string()), "{e}");
    }
}

/// The copy with `encoder.layers.0.fc2` turned static (`input_scale`) with a runtime smoother
/// (`smooth_inv`), both valid; `damage` then breaks one value.
fn static_smoothed_copy(tmp: &Path, input_scale: f32, smooth_inv_0: f32) -> PathBuf {
    let dir = damaged_copy(tmp);
    let layer = "encoder.layers.0.fc2";
    edit_config(&dir, |c| {
        let q = &mut c["quantization"];
        q["schemes"]["int8_w8a8_static"] = json!({
            "weight": {"dtype": "int8", "granularity": "per_channel", "dynamic": false, "symmetric": true},
            "input": {"dtype": "int8", "granularity": "per_tensor", "dynamic": false, "symmetric": true}
        });
        q["layers"][layer]["scheme"] = json!("int8_w8a8_static");
        q["layers"][layer]["smooth"] = json!("runtime");
    });
    edit_tensors(&dir, |t| {
        t.insert(
            format!("{layer}.input_scale"),
            (safetensors::Dtype::F32, vec![1], f32_bytes(&[input_scale])),
        );
        let mut inv = vec![1.0f32; 1536];
        inv[0] = smooth_inv_0;
        t.insert(
            format!("{layer}.smooth_inv"),
            (safetensors::Dtype::F32, vec![1536], f32_bytes(&inv)),
        );
    });
    dir
}

#[test]
fn bad_input_scales_and_smoothers_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // The valid variant opens: the damage below is the only fault.
    let ok = static_smoothed_copy(&tmp.path().join("ok"), 0.05, 0.5);
    Checkpoint::open(&ok).unwrap();
    for bad in [f32::NAN, f32::INFINITY, 0.0, -1.0] {
        let t = tempfile::tempdir().unwrap();
        let dir = static_smoothed_copy(t.path(), bad, 0.5);
        refused(
            &dir,
            &["encoder.layers.0.fc2.input_scale", "finite and positive"],
        );
        let t = tempfile::tempdir().unwrap();
        let dir = static_smoothed_copy(t.path(), 0.05, bad);
        refused(
            &dir,
            &[
                "encoder.layers.0.fc2.smooth_inv",
                "element 0",
                "finite and positive",
            ],
        );
    }
}

#[test]
fn spec_layers_must_be_layers_of_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    edit_config(&dir, |c| {
        c["quantization"]["layers"]["encoder.layers.0.fc2"]["kind"] = json!("pointwise_conv");
    });
    refused(
        &dir,
        &[
            "oasr_config.json",
            "quantization.layers.encoder.layers.0.fc2.kind",
        ],
    );
}

// ---- the fingerprint ----

#[test]
fn a_flipped_tensor_byte_fails_the_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = damaged_copy(tmp.path());
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // A byte of the first tensor's data (an int8 code or a float: structurally still valid).
    let at = 8 + header + 1000;
    bytes[at] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    refused(&dir, &["model.safetensors", "fingerprint"]);
    // Opening without the check (a documented library option) sees a valid structure.
    Checkpoint::open_with(
        &dir,
        OpenOptions {
            check_fingerprint: false,
        },
    )
    .unwrap();
}

// ---- the forward on a hand-built checkpoint ----

#[test]
fn the_forward_refuses_a_hand_built_config_without_panicking() {
    let ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    for (key, value) in [
        ("encoder_attention_heads", json!(0)),
        ("decoder_attention_heads", json!(7)),
        ("encoder_layers", json!(0)),
        ("vocab_size", json!(0)),
        ("num_mel_bins", json!(128)),
    ] {
        let mut bad = ckpt.clone();
        bad.config.model_config[key] = value;
        let e = match Whisper::load(&bad) {
            Ok(_) => panic!("{key}: loaded"),
            Err(e) => e,
        };
        assert!(
            e.to_string().contains(key) || e.to_string().contains("conv1"),
            "{e}"
        );
    }
}

// ---- CTranslate2 sources ----

/// A CTranslate2 directory whose files link to the real ones, except those written after.
fn ct2_copy(tmp: &Path) -> PathBuf {
    let dir = tmp.join("ct2");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.bin", "config.json", "tokenizer.json"] {
        std::os::unix::fs::symlink(common::tiny_en().join(f), dir.join(f)).unwrap();
    }
    dir
}

fn replace_file(path: &Path, bytes: &[u8]) {
    std::fs::remove_file(path).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// model.bin with the rank-0 attribute `name` set to `value` (its one byte).
fn ct2_with_attribute(dir: &Path, name: &str, value: u8) {
    let mut bytes = std::fs::read(common::tiny_en().join("model.bin")).unwrap();
    let mut needle = name.as_bytes().to_vec();
    needle.push(0);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap();
    // name NUL, rank 0, dtype code, byte count (u32), the value.
    let value_at = at + needle.len() + 1 + 1 + 4;
    assert_eq!(bytes[at + needle.len()], 0, "rank 0");
    bytes[value_at] = value;
    replace_file(&dir.join("model.bin"), &bytes);
}

#[test]
fn ct2_architecture_switches_the_forward_does_not_implement_are_refused() {
    for (name, value) in [
        ("decoder/activation", 0u8),
        ("decoder/activation", 1),
        ("decoder/start_from_zero_embedding", 1),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ct2_copy(tmp.path());
        ct2_with_attribute(&dir, name, value);
        let e = open_err(&dir);
        assert!(e.contains("model.bin") && e.contains(name), "{e}");
        assert!(e.contains(&format!("is {value}")), "{e}");
    }
}

#[test]
fn a_ct2_config_that_is_not_an_object_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = ct2_copy(tmp.path());
    replace_file(&dir.join("config.json"), b"42");
    let e = open_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("JSON object"),
        "{e}"
    );
}

fn ct2_config_edit(edit: impl FnOnce(&mut Value)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = ct2_copy(tmp.path());
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut v);
    replace_file(&dir.join("config.json"), v.to_string().as_bytes());
    open_err(&dir)
}

/// The error of opening `dir` (which must fail).
fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn out_of_range_ct2_ids_and_heads_are_refused_by_key() {
    for (key, value, needle) in [
        ("suppress_ids", json!([1, 99999]), "99999"),
        ("suppress_ids_begin", json!([51864]), "51864"),
        ("suppress_ids", json!([1, -1]), "-1"),
        ("suppress_ids", json!("all"), "list"),
        ("alignment_heads", json!([[4, 0]]), "[4, 0]"),
        ("alignment_heads", json!([[0, 6]]), "[0, 6]"),
        ("alignment_heads", json!([[0]]), "pair"),
    ] {
        let e = ct2_config_edit(|v| v[key] = value);
        assert!(
            e.contains("config.json") && e.contains(&format!("`{key}`")) && e.contains(needle),
            "{key}: {e}"
        );
    }
}

#[test]
fn out_of_range_ct2_ids_never_reach_the_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = ct2_copy(tmp.path());
    replace_file(
        &dir.join("config.json"),
        br#"{"suppress_ids": [70000], "suppress_ids_begin": [], "lang_ids": [], "alignment_heads": []}"#,
    );
    let dst = tmp.path().join("out");
    let e = oasr_quantize::Quantizer::new(&dir, &dst)
        .recipe("int8_w8a8_rtn")
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("suppress_ids"), "{e}");
    assert!(!dst.exists());
}

// ---- Hugging Face sources ----

/// A Hugging Face layout of tiny.en's weights, once; each test links its files.
fn hf_weights() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        common::write_hf_weights(&dir);
        dir
    })
}

fn hf_config() -> Value {
    json!({
        "model_type": "whisper", "d_model": 384, "encoder_attention_heads": 6,
        "decoder_attention_heads": 6, "encoder_layers": 4, "decoder_layers": 4,
        "vocab_size": 51864, "num_mel_bins": 80, "encoder_ffn_dim": 1536,
        "decoder_ffn_dim": 1536, "max_source_positions": 1500, "max_target_positions": 448,
        "activation_function": "gelu",
        "suppress_tokens": [1, 2, 7], "begin_suppress_tokens": [220, 50256]
    })
}

fn hf_open(config: &Value) -> Result<Checkpoint, String> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(
        hf_weights().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        common::tiny_en().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    Checkpoint::open(&dir).map_err(|e| e.to_string())
}

#[test]
fn a_complete_hf_config_that_matches_the_tensors_is_accepted() {
    hf_open(&hf_config()).unwrap();
}

#[test]
fn hf_config_values_are_checked_against_the_tensors_and_the_forward() {
    for (key, value, needle) in [
        ("d_model", json!(7), "384"),
        ("num_mel_bins", json!(0), "80"),
        ("vocab_size", json!(0), "51864"),
        ("encoder_layers", json!(5), "4"),
        ("max_source_positions", json!(1400), "1500"),
        ("activation_function", json!("relu"), "relu"),
        ("encoder_attention_heads", json!(5), "do not divide"),
        ("decoder_attention_heads", json!(0), "is 0"),
        ("suppress_tokens", json!([51864]), "51864"),
        ("begin_suppress_tokens", json!(["x"]), "token id"),
    ] {
        let mut config = hf_config();
        config[key] = value;
        let e = hf_open(&config).expect_err(key);
        assert!(
            e.contains("config.json") && e.contains(&format!("`{key}`")) && e.contains(needle),
            "{key}: {e}"
        );
        assert!(
            !e.contains("model.safetensors: `"),
            "blames the weights: {e}"
        );
    }
}

#[test]
fn an_hf_config_that_is_not_an_object_is_refused() {
    let e = hf_open(&json!([1, 2])).unwrap_err();
    // Not detected as Hugging Face at all (no model_type): an unknown format, not a panic.
    assert!(e.contains("hf") || e.contains("config.json"), "{e}");
}

/// A CTranslate2 model quantized by its converter (`--quantization int8`: I8 weights with
/// `weight_scale` variables) is not a source: refused naming the variable, with what to import.
#[test]
fn a_quantized_ct2_model_is_refused_by_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ct2-int8");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::os::unix::fs::symlink(common::tiny_en().join(f), dir.join(f)).unwrap();
    }
    let weight = "encoder/layer_0/self_attention/linear_0/weight";
    let scale: Vec<u8> = [0.01f32; 48].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(
        dir.join("model.bin"),
        common::ct2_bytes(
            "WhisperSpec",
            &[
                (weight, vec![48, 16], 1, vec![3u8; 48 * 16]),
                (
                    "encoder/layer_0/self_attention/linear_0/weight_scale",
                    vec![48],
                    0,
                    scale,
                ),
            ],
            &[],
        ),
    )
    .unwrap();
    let e = open_err(&dir);
    assert!(e.contains("model.bin") && e.contains(weight), "{e}");
    assert!(
        e.contains("I8 weights are not supported") && e.contains("float16 or float32"),
        "{e}"
    );
}
