//! `--padding`: how Whisper pads a clip shorter than 30 s, checked against Hugging Face
//! transformers on the same full-precision tiny.en and the same real and synthetic clips
//! (tests/fixtures/whisper_padding/transformers.json, written by
//! tests/whisper_padding/make_fixture.py with transformers 5.17 and torch 2.11 on the CPU).
//!
//! Greedy decoding without fallback must give transformers' tokens under each padding:
//! `transcribe` (openai-whisper's transcribe(), the default) against transformers fed that
//! log-mel, `feature-extractor` against transformers' own WhisperFeatureExtractor. On three of the
//! clips the two paddings decode differently (one of them loops to the token limit under
//! `transcribe`), so an option that did nothing would fail here.

mod common;

use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::models::exec::FullPrecision;
use oasr_quantize::models::{load_with, DecodeOptions, LogMelPadding};
use serde_json::Value;

#[test]
fn each_padding_decodes_as_transformers_does() {
    let fixture = common::fixture_json("whisper_padding/transformers.json");
    let clips = fixture["clips"].as_array().unwrap();
    let ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    let mut differ = 0;
    for padding in [LogMelPadding::Transcribe, LogMelPadding::FeatureExtractor] {
        let options = DecodeOptions {
            no_fallback: true,
            padding: Some(padding),
            ..DecodeOptions::default()
        };
        let model = load_with(&ckpt, &options).unwrap();
        assert_eq!(
            model.decode_options_record().get("padding"),
            Some(&Value::from(padding.name()))
        );
        for clip in clips {
            let samples = common::clip_samples(clip);
            let mut exec = FullPrecision;
            let encoded = model.encode(&mut exec, &samples).unwrap();
            let decoded = model
                .decode(&mut exec, &encoded, samples.len(), false)
                .unwrap();
            let expected = common::token_ids(&clip["tokens"][padding.name()]);
            assert_eq!(
                decoded.tokens,
                expected,
                "{} with padding {}",
                clip["path"],
                padding.name()
            );
            if padding == LogMelPadding::Transcribe
                && clip["tokens"]["transcribe"] != clip["tokens"]["feature-extractor"]
            {
                differ += 1;
            }
        }
    }
    assert!(
        differ >= 3,
        "the paddings decode {differ} clips differently"
    );
}
