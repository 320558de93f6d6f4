//! The fuzz harness: every parser gets mutated copies of a valid input and must answer each with
//! a result or an error that names the file, never a panic (proptest reports a panic as a
//! failure, with the shrunk input).
//!
//! Targets: the CTranslate2 `model.bin` reader, the safetensors reader, the PyTorch `final.pt`
//! reader (the whole file, and its pickle alone inside a sound archive), `oasr_config.json` (the
//! native config and its quantization spec), a whole v2 checkpoint opened and inspected with a
//! mutated `oasr_config.json` or `tokenizer.json`, a Hugging Face / CTranslate2 `config.json` in
//! the import path, manifests, recipe TOML, gate files, and the audio containers (WAV, FLAC, Ogg Vorbis).
//!
//! Mutations: bit flips, bytes set to boundary values, truncation, insertion, deletion and
//! duplication of a span, and for the text formats a number or string token replaced by a
//! hostile one (0, -1, 1e400, 2^64, NaN, null, a 10 000-character string, ...).
//!
//! Cases per target: `OASR_FUZZ_CASES` (default 64, what CI runs); seed: `OASR_FUZZ_SEED`
//! (default fixed, so a run is reproducible). The long run is documented in docs/robustness.md:
//! `OASR_FUZZ_CASES=10000 cargo test --release --test fuzz`.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oasr_quantize::checkpoint::{ct2, safetensors_io, torch_pt, Checkpoint, NativeConfig};
use oasr_quantize::frontend::decode_audio;
use oasr_quantize::models::whisper::decoding::WhisperTokenizer;
use oasr_quantize::verify::QuantizedModel;
use oasr_quantize::Manifest;
use oasr_quantize::{Quantizer, Recipe};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    let env = |key: &str, default: u64| {
        std::env::var(key)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Config {
        cases: env("OASR_FUZZ_CASES", 64) as u32,
        rng_seed: RngSeed::Fixed(env("OASR_FUZZ_SEED", 0x0a5e_f022)),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

/// One edit of a byte string; positions are taken modulo the length.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    /// Replaces the n-th number or string token of a text format.
    Token(usize, usize),
}

/// What a text token may be replaced with.
fn hostile_tokens() -> Vec<String> {
    [
        "0",
        "-1",
        "1e400",
        "-0.0",
        "4294967296",
        "18446744073709551616",
        "NaN",
        "null",
        "true",
        "[]",
        "{}",
        "\"\"",
        "\"../../etc/passwd\"",
        "\"\\u0000\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(std::iter::once(format!("\"{}\"", "x".repeat(10_000))))
    .collect()
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let boundary = prop::sample::select(vec![0u8, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'\n']);
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        (any::<usize>(), boundary).prop_map(|(a, b)| Mutation::Set(a, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(a, b)| Mutation::Insert(a, b)),
        (any::<usize>(), 1usize..64).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), 1usize..64).prop_map(|(a, n)| Mutation::Duplicate(a, n)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Token(a, b)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..5)
}

/// Byte ranges of the number and string tokens of a text (JSON, TOML, JSON lines).
fn tokens(text: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let start = i;
        if text[i] == b'"' || text[i] == b'\'' {
            let quote = text[i];
            i += 1;
            while i < text.len() && text[i] != quote {
                i += if text[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(text.len());
            out.push((start, i));
        } else if text[i].is_ascii_digit() || text[i] == b'-' {
            while i < text.len() && (text[i].is_ascii_alphanumeric() || b"-+.".contains(&text[i])) {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

fn mutate(seed: &[u8], edits: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    let hostile = hostile_tokens();
    for edit in edits {
        let len = b.len().max(1);
        match edit {
            Mutation::Flip(at, bit) if !b.is_empty() => b[at % len] ^= 1 << (bit % 8),
            Mutation::Set(at, v) if !b.is_empty() => b[at % len] = *v,
            Mutation::Truncate(at) => b.truncate(at % len),
            Mutation::Insert(at, bytes) => {
                let at = at % (b.len() + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Delete(at, n) if !b.is_empty() => {
                let at = at % len;
                let end = (at + n).min(b.len());
                b.drain(at..end);
            }
            Mutation::Duplicate(at, n) if !b.is_empty() => {
                let at = at % len;
                let end = (at + n).min(b.len());
                let span: Vec<u8> = b[at..end].to_vec();
                b.splice(end..end, span);
            }
            Mutation::Token(which, with) => {
                let spans = tokens(&b);
                if !spans.is_empty() {
                    let (s, e) = spans[which % spans.len()];
                    let with = hostile[with % hostile.len()].as_bytes().to_vec();
                    b.splice(s..e, with);
                }
            }
            _ => {}
        }
    }
    b
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// An error message must name the file it is about (by its file name).
fn names(e: &oasr_quantize::Error, file: &str) -> bool {
    e.to_string().contains(file)
}

/// Where a quantized checkpoint keeps its tokenizer.
const TOKENIZER: &str = "tokenizer/tokenizer.json";

/// The PyTorch checkpoints written by torch.save that seed the `final.pt` targets: a state dict
/// of every dtype and view kind, and a module's state dict saved from the GPU.
fn torch_seeds() -> [&'static [u8]; 2] {
    [
        include_bytes!("fixtures/torch/plain.pt"),
        include_bytes!("fixtures/torch/module.pt"),
    ]
}

/// The real tiny.en quantized once (RTN int8) per test process: the seed of the v2 targets.
fn quantized() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("q");
        Quantizer::new(common::tiny_en(), &dst)
            .recipe("int8_w8a8_rtn")
            .run()
            .unwrap();
        (tmp, dst)
    })
    .1
}

/// A copy of the quantized checkpoint (files hard-linked) with the file at relative path `name`
/// replaced by `bytes`.
fn damaged_checkpoint(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    fn link_tree(from: &Path, to: &Path) {
        std::fs::create_dir(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                link_tree(&entry.path(), &target);
            } else {
                std::fs::hard_link(entry.path(), &target).unwrap();
            }
        }
    }
    let out = dir.join("ckpt");
    link_tree(quantized(), &out);
    // Replace, not write through the link: the seed checkpoint is shared by every case.
    std::fs::remove_file(out.join(name)).unwrap();
    write(&out, name, bytes);
    out
}

/// A 0.25 s tone as WAV, and through sox (installed by CI) as FLAC and Ogg Vorbis.
fn audio_seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let wav = tmp.path().join("a.wav");
        common::write_wav(&wav, 16_000, 4000, |i| ((i % 40) * 400) as i16 - 8000);
        let mut seeds = vec![("wav".to_string(), std::fs::read(&wav).unwrap())];
        for ext in ["flac", "ogg"] {
            let out = tmp.path().join(format!("a.{ext}"));
            let status = std::process::Command::new("sox")
                .arg(&wav)
                .arg(&out)
                .status()
                .expect("sox (CI installs it) makes the FLAC and Ogg seeds");
            assert!(status.success(), "sox could not write {ext}");
            seeds.push((ext.to_string(), std::fs::read(&out).unwrap()));
        }
        seeds
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ctranslate2_model_bin(edits in mutations()) {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "model.bin", &mutate(&common::small_ct2(), &edits));
        if let Err(e) = ct2::read(&path) {
            prop_assert!(names(&e, "model.bin"), "{e}");
        }
    }

    #[test]
    fn safetensors(edits in mutations()) {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "m.safetensors", &mutate(&common::small_safetensors(), &edits));
        if let Err(e) = safetensors_io::read(&path) {
            prop_assert!(names(&e, "m.safetensors"), "{e}");
        }
    }

    #[test]
    fn torch_final_pt(edits in mutations(), which in 0usize..2) {
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "final.pt", &mutate(torch_seeds()[which], &edits));
        if let Err(e) = torch_pt::read(&path) {
            prop_assert!(names(&e, "final.pt"), "{e}");
        }
    }

    #[test]
    fn torch_final_pt_pickle(edits in mutations(), which in 0usize..2) {
        // Only `data.pkl` is mutated and the archive is rebuilt around it, so every case reaches
        // the unpickler and the tensor checks (an edit of the whole file mostly breaks the zip).
        let mut entries = common::zip_entries(torch_seeds()[which]);
        let pickle = entries.iter_mut().find(|(name, _)| name.ends_with("/data.pkl")).unwrap();
        pickle.1 = mutate(&pickle.1, &edits);
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "final.pt", &common::zip_stored(&entries, false));
        if let Err(e) = torch_pt::read(&path) {
            prop_assert!(names(&e, "final.pt"), "{e}");
        }
    }

    #[test]
    fn oasr_config_and_spec(edits in mutations()) {
        let seed = include_bytes!("fixtures/oasr_config_v2.json");
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "oasr_config.json", &mutate(seed, &edits));
        if let Err(e) = NativeConfig::read(&path) {
            prop_assert!(names(&e, "oasr_config.json"), "{e}");
        }
    }

    #[test]
    fn v2_checkpoint_with_a_damaged_config(edits in mutations()) {
        let seed = std::fs::read(quantized().join("oasr_config.json")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = damaged_checkpoint(tmp.path(), "oasr_config.json", &mutate(&seed, &edits));
        // What opens (and so what `inspect` vouches for) is what `verify` can load.
        let opened = Checkpoint::open(&dir).is_ok();
        prop_assert_eq!(opened, oasr_quantize::inspect::inspect(&dir).is_ok());
        if opened {
            let loaded = QuantizedModel::load(&dir);
            prop_assert!(loaded.is_ok(), "opens but verify cannot load it: {:?}", loaded.err());
        }
    }

    #[test]
    fn v2_checkpoint_with_a_damaged_tokenizer(edits in mutations()) {
        let seed = std::fs::read(quantized().join(TOKENIZER)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = damaged_checkpoint(tmp.path(), TOKENIZER, &mutate(&seed, &edits));
        // A tokenizer that loads may still disagree with the config (an id moved): no claim.
        if let Err(e) = WhisperTokenizer::from_file(&dir.join(TOKENIZER)) {
            prop_assert!(names(&e, "tokenizer.json"), "{e}");
        }
        // A checkpoint that opens has a tokenizer `transcribe` and `verify` can load.
        if Checkpoint::open(&dir).is_ok() {
            prop_assert!(WhisperTokenizer::from_file(&dir.join(TOKENIZER)).is_ok());
        }
    }

    #[test]
    fn source_config_json(edits in mutations(), hf in any::<bool>()) {
        // The import path of each source format's config.json (the tensors are small or absent,
        // so the import fails after the config is read; it must not panic on the way).
        let seed = if hf {
            br#"{"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6, "decoder_attention_heads": 6, "num_mel_bins": 80, "vocab_size": 51864, "max_source_positions": 1500, "max_target_positions": 448, "activation_function": "gelu", "suppress_tokens": [1, 2], "alignment_heads": [[2, 2]], "decoder_start_token_id": 50257}"#.to_vec()
        } else {
            std::fs::read(common::tiny_en().join("config.json")).unwrap()
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(dir, "config.json", &mutate(&seed, &edits));
        if hf {
            write(dir, "model.safetensors", &common::small_safetensors());
        } else {
            write(dir, "model.bin", &common::small_ct2());
        }
        prop_assert!(Checkpoint::open(dir).is_err());
    }

    #[test]
    fn manifests(edits in mutations()) {
        let seed = b"# calibration\n{\"id\": \"a\", \"audio\": \"a.wav\", \"text\": \"one\", \"source\": \"x\"}\n\n{\"id\": \"b\", \"audio\": \"sub/b.wav\"}\n";
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        write(tmp.path(), "a.wav", b"RIFF");
        write(tmp.path(), "sub/b.wav", b"RIFF");
        let path = write(tmp.path(), "m.jsonl", &mutate(seed, &edits));
        if let Err(e) = Manifest::read(&path, None) {
            prop_assert!(names(&e, "m.jsonl"), "{e}");
        }
    }

    #[test]
    fn recipe_toml(edits in mutations(), which in 0usize..6) {
        let seeds = [
            include_str!("../recipes/int8_w8a8_rtn.toml"),
            include_str!("../recipes/fp8_w8a8_rtn.toml"),
            include_str!("../recipes/smoothquant_w8a8.toml"),
            include_str!("../recipes/smoothquant_fp8_w8a8.toml"),
            include_str!("../recipes/smoothquant_w8a8_fused.toml"),
            include_str!("../recipes/smoothquant_fp8_w8a8_fused.toml"),
        ];
        let text = String::from_utf8_lossy(&mutate(seeds[which].as_bytes(), &edits)).into_owned();
        if let Err(e) = Recipe::parse("fuzzed.toml", &text) {
            prop_assert!(names(&e, "fuzzed.toml"), "{e}");
        }
    }

    #[test]
    fn recipe_options(value in any::<String>(), key in 0usize..10, which in 0usize..6) {
        // `--option ALGORITHM.KEY=VALUE` with any value, on every built-in recipe.
        let keys = [
            "smoothquant.alpha", "smoothquant.floor", "smoothquant.runtime",
            "static_inputs.observer", "static_inputs.percentile", "static_inputs.headroom",
            "static_inputs.exclude", "rtn.bits", "smoothquant.search", "smoothquant.search_rows",
        ];
        let mut recipe = Recipe::built_in().swap_remove(which);
        if let Err(e) = recipe.set_option(&format!("{}={value}", keys[key])) {
            prop_assert!(e.to_string().contains("--option"), "{e}");
        }
    }

    #[test]
    fn gate_toml(edits in mutations()) {
        let seed = include_bytes!("../calib/gate.toml");
        let tmp = tempfile::tempdir().unwrap();
        let path = write(tmp.path(), "gate.toml", &mutate(seed, &edits));
        if let Err(e) = oasr_quantize::gate::GateConfig::load(&path) {
            prop_assert!(names(&e, "gate.toml"), "{e}");
        }
    }

    #[test]
    fn audio_containers(edits in mutations(), which in 0usize..3) {
        let (ext, seed) = &audio_seeds()[which];
        let tmp = tempfile::tempdir().unwrap();
        let name = format!("clip.{ext}");
        let path = write(tmp.path(), &name, &mutate(seed, &edits));
        if let Err(e) = decode_audio(&path) {
            prop_assert!(names(&e, &name), "{e}");
        }
    }
}

#[test]
fn the_torch_seeds_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in torch_seeds() {
        assert!(torch_pt::read(&write(tmp.path(), "final.pt", seed)).is_ok());
        let rezipped = common::zip_stored(&common::zip_entries(seed), false);
        assert!(torch_pt::read(&write(tmp.path(), "final.pt", &rezipped)).is_ok());
    }
}

#[test]
fn the_seeds_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(ct2::read(&write(tmp.path(), "model.bin", &common::small_ct2())).is_ok());
    assert!(safetensors_io::read(&write(
        tmp.path(),
        "m.safetensors",
        &common::small_safetensors()
    ))
    .is_ok());
    Checkpoint::open(quantized()).unwrap();
    for (ext, seed) in audio_seeds() {
        let path = write(tmp.path(), &format!("clip.{ext}"), seed);
        let audio = decode_audio(&path).unwrap();
        assert_eq!(audio.sample_rate, 16_000, "{ext}");
    }
    // The mutator reaches the text tokens it is meant to replace.
    let t = tokens(br#"{"a": 12, "b": "x\"y", c = 'z'}"#);
    assert_eq!(t.len(), 5, "{t:?}");
}
