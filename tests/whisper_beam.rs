//! `--beam-size`: Whisper's beam search, checked against OpenAI Whisper's own decoder
//! (openai-whisper's `whisper.decode`) on the same full-precision tiny.en and the same real and
//! synthetic clips (tests/fixtures/whisper_beam/openai_whisper.json, written by
//! tests/whisper_beam/make_fixture.py with openai-whisper 20250625 and torch on the CPU).
//!
//! Without fallback, greedy and beam search of 2 and 5 hypotheses must give openai-whisper's
//! tokens. The clips were chosen where a beam of 5 decodes differently from greedy (one of them
//! loops under greedy), so a beam search that did nothing, or ranked differently, fails here.

mod common;

use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::frontend::read_audio;
use oasr_quantize::models::exec::FullPrecision;
use oasr_quantize::models::{load_with, DecodeOptions, SpeechModel};
use serde_json::Value;

#[test]
fn beam_search_decodes_as_openai_whisper_does() {
    let fixture = common::fixture_json("whisper_beam/openai_whisper.json");
    let clips = fixture["clips"].as_array().unwrap();
    let ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    let audio: Vec<Vec<f32>> = clips.iter().map(common::clip_samples).collect();
    let mut differ_from_greedy = 0;
    for beam in [1usize, 2, 5] {
        let options = DecodeOptions {
            no_fallback: true,
            beam_size: Some(beam),
            ..DecodeOptions::default()
        };
        let model = load_with(&ckpt, &options).unwrap();
        assert_eq!(
            model.decode_options_record().get("beam_size"),
            (beam > 1).then(|| Value::from(beam)).as_ref()
        );
        for (clip, samples) in clips.iter().zip(&audio) {
            let mut exec = FullPrecision;
            let encoded = model.encode(&mut exec, samples).unwrap();
            let decoded = model
                .decode(&mut exec, &encoded, samples.len(), true)
                .unwrap();
            let expected = common::token_ids(&clip["tokens"][beam.to_string()]);
            assert_eq!(
                decoded.tokens, expected,
                "{} with a beam of {beam}",
                clip["path"]
            );
            // The kept rows chose the kept tokens, then end-of-text unless the limit came first.
            assert_eq!(
                decoded.scores.len(),
                decoded.tokens.len() + usize::from(!decoded.hit_limit)
            );
            assert_eq!(
                decoded.hit_limit,
                decoded.tokens.len() >= clip["limit"].as_u64().unwrap() as usize
            );
            if beam == 5 && clip["tokens"]["5"] != clip["tokens"]["1"] {
                differ_from_greedy += 1;
            }
        }
    }
    assert!(
        differ_from_greedy >= 5,
        "a beam of 5 changes only {differ_from_greedy} transcripts"
    );
}

/// A decoding step of several hypotheses at once gives each the logits it gets decoded alone,
/// bit for bit, and refuses hypotheses at different positions.
#[test]
fn a_step_of_several_hypotheses_is_each_alone() {
    use oasr_quantize::models::whisper::{forward::logits_rows, WhisperAsr};
    let asr = WhisperAsr::new(&Checkpoint::open(&common::tiny_en()).unwrap()).unwrap();
    let path = common::cache_dir().join("crossdomain/wav16k/jfk-ask-not.wav");
    let samples = read_audio(&path, 16000).unwrap();
    let mut exec = FullPrecision;
    let encoded = asr.encode(&mut exec, &samples).unwrap();
    let mut state = asr.model.start_decoder(&mut exec, &encoded).unwrap();
    asr.model
        .decode(&mut exec, &mut state, &asr.rules.prompt)
        .unwrap();
    // Two steps, so that the hypotheses' own self-attention caches differ.
    let firsts = [400u32, 1870, 843, 50];
    let seconds = [11u32, 262, 1675, 13];
    let mut alone = Vec::new();
    for (a, b) in firsts.iter().zip(&seconds) {
        let mut s = state.clone();
        asr.model.decode(&mut exec, &mut s, &[*a]).unwrap();
        alone.push(logits_rows(&asr.model.decode(&mut exec, &mut s, &[*b]).unwrap()).unwrap());
    }
    let mut states = vec![state.clone(); firsts.len()];
    asr.model
        .decode_step(&mut exec, &mut states, &firsts)
        .unwrap();
    let together = logits_rows(
        &asr.model
            .decode_step(&mut exec, &mut states, &seconds)
            .unwrap(),
    )
    .unwrap();
    for (i, row) in together.iter().enumerate() {
        assert!(
            row.iter()
                .zip(&alone[i][0])
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "hypothesis {i}"
        );
    }
    assert_ne!(together[0], together[1]);
    // Hypotheses at different positions are refused.
    let mut mixed = vec![state.clone(), states[0].clone()];
    let e = asr
        .model
        .decode_step(&mut exec, &mut mixed, &[11, 11])
        .unwrap_err()
        .to_string();
    assert!(e.contains("different positions"), "{e}");
}

/// Calibration with a beam observes the kept transcript's rows alone, as after a fallback: the
/// hypotheses the search discarded are not the audio's transcript. (Greedy's single attempt
/// computes exactly those rows.)
#[test]
fn calibration_with_a_beam_observes_the_kept_transcript() {
    use oasr_quantize::calibration::{observe_with, AbsMaxObserver, CalibrationSet, DecoderPass};
    use oasr_quantize::manifest::Manifest;
    use oasr_quantize::models::whisper::WhisperAsr;
    let (calib, _) = common::manifests();
    let ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    let set = CalibrationSet::select(&Manifest::read(&calib, None).unwrap(), 3, 16000).unwrap();
    for beam in [1, 3] {
        let options = DecodeOptions {
            beam_size: Some(beam),
            ..DecodeOptions::default()
        };
        let t = WhisperAsr::with_options(&ckpt, &options).unwrap();
        let observed = observe_with(
            &t,
            &set,
            DecoderPass::Decode,
            || FullPrecision,
            AbsMaxObserver::default,
            |_, _, _| {},
        )
        .unwrap();
        let rows: usize = observed
            .tokens
            .iter()
            .map(|tokens| t.rules.prompt.len() + tokens.len())
            .sum();
        assert_eq!(
            observed.observer.rows["decoder.layers.0.fc1"], rows,
            "beam {beam}"
        );
    }
}
