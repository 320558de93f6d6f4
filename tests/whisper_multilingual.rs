//! Multilingual Whisper decoding: language detection, `--language` and `--task`, on a seeded
//! random-weight multilingual checkpoint (`parity-multilingual` of tests/common/family.rs) and
//! the real multilingual vocabulary; checked against Hugging Face transformers on the same
//! weights and audio (the fixture of tests/whisper_multilingual/make_fixture.py). Random weights
//! are evidence of the decoding logic, not of accuracy.

mod common;

use std::path::{Path, PathBuf};

use common::family;
use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::frontend::Padding;
use oasr_quantize::manifest::Manifest;
use oasr_quantize::models::exec::FullPrecision;
use oasr_quantize::models::whisper::{Fallback, WhisperAsr};
use oasr_quantize::models::{DecodeOptions, SpeechModel, Task};
use serde_json::Value;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/whisper_multilingual/transformers.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn parity_checkpoint(dir: &Path) -> PathBuf {
    let src = dir.join("parity");
    family::write(&src, &family::PARITY, safetensors::Dtype::F32, 1, 0x5eed);
    src
}

/// The fixture's utterances, found in the fetched manifests.
fn audio(id: &str) -> PathBuf {
    let cache = common::cache_dir();
    for manifest in ["asterisk/gate.jsonl", "crossdomain/gate.jsonl"] {
        let m = Manifest::read(&cache.join(manifest), None).unwrap();
        if let Some(u) = m.utterances.iter().find(|u| u.id == id) {
            return u.audio.clone();
        }
    }
    panic!("utterance {id} is in no fetched gate manifest");
}

fn asr(src: &Path, options: &DecodeOptions) -> WhisperAsr {
    WhisperAsr::with_options(&Checkpoint::open(src).unwrap(), options).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Greedy decoding (transformers' `generate` has no temperature fallback) from the features
/// transformers' `WhisperFeatureExtractor` computes (the audio padded to 30 s first).
fn greedy_from_hf_features(
    asr: &mut WhisperAsr,
    samples: &[f32],
) -> oasr_quantize::models::Decoding {
    asr.fallback = Fallback::greedy_only();
    let mel = asr.frontend.log_mel_with(samples, Padding::PadOrTrimAudio);
    let encoded = asr
        .model
        .encode(&mut FullPrecision, &mel.data, mel.n_mels, mel.frames)
        .unwrap();
    asr.decode(&mut FullPrecision, &encoded, samples.len(), false)
        .unwrap()
}

/// The first `n` tokens of ours against transformers' (which stop at `max_new_tokens`).
fn assert_same_prefix(ours: &[u32], theirs: &[u32], what: &str) {
    let n = theirs.len().min(ours.len());
    assert!(
        n >= theirs.len().min(10),
        "{what}: too few tokens to compare ({n})"
    );
    assert_eq!(&ours[..n], &theirs[..n], "{what}");
}

#[test]
fn language_detection_and_the_multilingual_prompt_match_transformers() {
    let fx = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let src = parity_checkpoint(tmp.path());
    let eot = fx["end_of_text"].as_u64().unwrap() as u32;
    for u in fx["utterances"].as_array().unwrap() {
        let id = u["id"].as_str().unwrap();
        let samples = oasr_quantize::frontend::read_audio(&audio(id), 16000).unwrap();
        assert_eq!(samples.len() as u64, u["samples"].as_u64().unwrap(), "{id}");

        // Detected: the language token leads our tokens; the text tokens follow the prompt.
        let mut detect = asr(&src, &DecodeOptions::default());
        let d = greedy_from_hf_features(&mut detect, &samples);
        let language = u["detected_language"].as_u64().unwrap() as u32;
        assert_eq!(d.tokens[0], language, "{id}: detected language");
        // transformers 5 returns the generated tokens without its prompt: ours is checked
        // against OpenAI's token ids (start of transcript 50258, <|de|> 50261, <|translate|>
        // 50358, <|transcribe|> 50359, <|notimestamps|> 50363), and against transformers' own
        // where a version returns it.
        let prompt = detect.rules.with_language(language).unwrap().prompt;
        assert_eq!(prompt, [50258, language, 50359, 50363], "{id}");
        if !u["detected"]["prompt"].is_null() {
            assert_eq!(prompt, ids(&u["detected"]["prompt"]), "{id}");
        }
        let mut ours = d.tokens[1..].to_vec();
        ours.push(eot);
        assert_same_prefix(&ours, &ids(&u["detected"]["tokens"]), id);

        // Given: German, translated.
        let options = DecodeOptions {
            language: Some("de".into()),
            task: Some(Task::Translate),
            ..DecodeOptions::default()
        };
        let mut german = asr(&src, &options);
        assert_eq!(german.rules.prompt, [50258, 50261, 50358, 50363], "{id}");
        if !u["german_translate"]["prompt"].is_null() {
            assert_eq!(
                german.rules.prompt,
                ids(&u["german_translate"]["prompt"]),
                "{id}"
            );
        }
        let g = greedy_from_hf_features(&mut german, &samples);
        assert_eq!(g.language.as_deref(), Some("de"));
        let mut ours = g.tokens.clone();
        ours.push(eot);
        assert_same_prefix(&ours, &ids(&u["german_translate"]["tokens"]), id);
    }
}

/// What the seam carries for a detected language: the token leads the hypothesis and its row
/// the scores, and scoring the hypothesis replays the decoding's rows.
#[test]
fn a_detected_language_is_scored_with_its_row() {
    let tmp = tempfile::tempdir().unwrap();
    let src = parity_checkpoint(tmp.path());
    let samples = oasr_quantize::frontend::read_audio(&audio("praatio-bobby"), 16000).unwrap();
    let model = asr(&src, &DecodeOptions::default());
    let d = model
        .transcribe(&mut FullPrecision, &samples, true)
        .unwrap();
    let code = d.language.clone().expect("a detected language");
    assert!(model.rules.with_language(d.tokens[0]).unwrap().language() == Some(code.as_str()));
    assert_eq!(d.scores.len(), d.tokens.len() + usize::from(!d.hit_limit));
    let encoded = model.encode(&mut FullPrecision, &samples).unwrap();
    let scored = model
        .score(&mut FullPrecision, &encoded, &d.tokens)
        .unwrap();
    assert_eq!(scored.len(), d.tokens.len() + 1);
    for (step, (a, b)) in d.scores.iter().zip(&scored).enumerate() {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "step {step}: {worst}");
    }
    // A hypothesis without its language token is refused, not scored with another prompt.
    let e = model
        .score(&mut FullPrecision, &encoded, &d.tokens[1..])
        .unwrap_err();
    assert!(e.to_string().contains("language token"), "{e}");
    // The text drops the language token.
    assert_eq!(
        model.text(&d.tokens).unwrap(),
        model.text(&d.tokens[1..]).unwrap()
    );
}

#[test]
fn language_and_task_are_checked_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let src = parity_checkpoint(tmp.path());
    let ckpt = Checkpoint::open(&src).unwrap();
    let refused = |options: DecodeOptions| {
        WhisperAsr::with_options(&ckpt, &options)
            .err()
            .unwrap()
            .to_string()
    };
    let e = refused(DecodeOptions {
        language: Some("xx".into()),
        ..DecodeOptions::default()
    });
    assert!(
        e.contains("--language") && e.contains("\"xx\"") && e.contains("de, "),
        "{e}"
    );
    let translate = asr(
        &src,
        &DecodeOptions {
            task: Some(Task::Translate),
            ..DecodeOptions::default()
        },
    );
    assert!(translate.rules.detect_language);
    assert_eq!(translate.rules.prompt[2], 50358, "<|translate|>");
    // Whisper has a beam search but no CTC branch.
    let e = refused(DecodeOptions {
        ctc_weight: Some(0.5),
        ..DecodeOptions::default()
    });
    assert!(e.contains("--ctc-weight"), "{e}");
    let e = refused(DecodeOptions {
        beam_size: Some(0),
        ..DecodeOptions::default()
    });
    assert!(e.contains("--beam-size"), "{e}");
    let beam = asr(
        &src,
        &DecodeOptions {
            beam_size: Some(4),
            ..DecodeOptions::default()
        },
    );
    assert_eq!(beam.fallback.beam_size, 4);

    // An English-only model: `--language en` is its own prompt; anything else is refused.
    let en = Checkpoint::open(&common::tiny_en()).unwrap();
    let plain = WhisperAsr::new(&en).unwrap();
    let english = WhisperAsr::with_options(
        &en,
        &DecodeOptions {
            language: Some("en".into()),
            ..DecodeOptions::default()
        },
    )
    .unwrap();
    assert_eq!(plain.rules.prompt, english.rules.prompt);
    assert!(!plain.rules.detect_language);
    for (options, flag) in [
        (
            DecodeOptions {
                language: Some("de".into()),
                ..DecodeOptions::default()
            },
            "--language",
        ),
        (
            DecodeOptions {
                task: Some(Task::Translate),
                ..DecodeOptions::default()
            },
            "--task",
        ),
    ] {
        let e = WhisperAsr::with_options(&en, &options)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(flag) && e.contains("English-only"), "{e}");
    }
}

/// The CLI: `transcribe --language` reports the language per utterance; a bad task is refused
/// before any work.
#[test]
fn transcribe_takes_language_and_task() {
    let tmp = tempfile::tempdir().unwrap();
    let src = parity_checkpoint(tmp.path());
    let manifest = tmp.path().join("m.jsonl");
    std::fs::write(
        &manifest,
        format!(
            "{{\"id\": \"bobby\", \"audio\": {:?}}}\n",
            audio("praatio-bobby").display().to_string()
        ),
    )
    .unwrap();
    let json = tmp.path().join("t.json");
    let src_s = src.to_str().unwrap();
    let (ok, _, err) = common::cli(&[
        "transcribe",
        src_s,
        "--manifest",
        manifest.to_str().unwrap(),
        "--language",
        "fr",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["utterances"][0]["language"], "fr");
    let (ok, _, err) = common::cli(&[
        "transcribe",
        src_s,
        "--manifest",
        manifest.to_str().unwrap(),
        "--task",
        "summarize",
    ]);
    assert!(!ok && err.contains("summarize"), "{err}");
}
