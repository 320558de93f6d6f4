//! The Conformer's fp32 forward against ESPnet (the independent implementation) on the same
//! weights and the same real audio: tests/fixtures/wenet/make_espnet_reference.py built a small
//! non-causal model (d 64, 2 blocks, BatchNorm convolution module, a 1 + 1 bitransformer, 40
//! units) with ESPnet 202511, wrote it as a WeNet directory, and saved its encoder output, CTC
//! log-posteriors, greedy hypotheses and both decoders' scores on two real clips. The features
//! are torchaudio's Kaldi fbank of the clips (the frontend is checked in frontend_fbank.rs).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::models::conformer::{
    ctc_greedy, ctc_prefix_beam_search, Conformer, ConformerAsr,
};
use oasr_quantize::models::exec::FullPrecision;
use oasr_quantize::models::SpeechModel;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wenet")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Tolerances: f32 against f32 with different summation orders, through 2 Conformer blocks
/// (measured: encoder 4.0e-6, CTC log-probabilities 1.9e-6, decoder log-probabilities 9.5e-7,
/// candidate scores 3.3e-6).
const ENCODER_TOL: f32 = 2e-5;
const LOG_PROB_TOL: f32 = 2e-5;
const SCORE_TOL: f64 = 1e-4;

#[test]
fn the_forward_matches_espnet_on_real_speech() {
    let dir = fixtures().join("espnet");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let ckpt = Checkpoint::open(&dir.join("wenet-small")).unwrap();
    let model = Conformer::load(&ckpt).unwrap();
    let normalize = ckpt
        .config
        .features
        .as_ref()
        .unwrap()
        .normalize
        .clone()
        .unwrap();
    let stat = |k: &str| -> Vec<f32> {
        normalize[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect()
    };
    let (mean, istd) = (stat("mean"), stat("istd"));
    let sos = ckpt.config.decoding.sos_id.unwrap();
    let eos = ckpt.config.decoding.eos_id.unwrap();
    let asr = ConformerAsr::new(&ckpt).unwrap();
    let mut worst = (0f32, 0f32, 0f32, 0f64);
    for (stem, r) in reference["clips"].as_object().unwrap() {
        let mut feats = common::read_f32(&fixtures().join(format!("{stem}.fbank-torchaudio.f32")));
        let frames = feats.len() / 80;
        for row in feats.chunks_exact_mut(80) {
            for ((v, m), s) in row.iter_mut().zip(&mean).zip(&istd) {
                *v = (*v - m) * s;
            }
        }
        let enc = model.encode(&mut FullPrecision, &feats, frames).unwrap();
        let got: Vec<f32> = enc.flatten_all().unwrap().to_vec1().unwrap();
        let want = common::read_f32(&dir.join(format!("{stem}.encoder.f32")));
        let shape: Vec<usize> = serde_json::from_value(r["encoder"].clone()).unwrap();
        assert_eq!(enc.dims(), shape.as_slice(), "{stem}");
        worst.0 = worst.0.max(max_abs_diff(&got, &want));

        let logp = model.ctc_log_probs(&mut FullPrecision, &enc).unwrap();
        let flat: Vec<f32> = logp.iter().flatten().copied().collect();
        worst.1 = worst.1.max(max_abs_diff(
            &flat,
            &common::read_f32(&dir.join(format!("{stem}.ctc.f32"))),
        ));
        let greedy: Vec<u32> = serde_json::from_value(r["ctc_greedy"].clone()).unwrap();
        assert_eq!(ctc_greedy(&logp, 0), greedy, "{stem}");

        for (i, cand) in r["candidates"].as_array().unwrap().iter().enumerate() {
            let tokens: Vec<u32> = serde_json::from_value(cand["tokens"].clone()).unwrap();
            for (side, key) in [(0usize, "left"), (1, "right")] {
                let seq: Vec<u32> = if side == 0 {
                    tokens.clone()
                } else {
                    tokens.iter().rev().copied().collect()
                };
                let lp = model
                    .decoder_log_probs(&mut FullPrecision, side, &enc, sos, &seq)
                    .unwrap();
                if i == 0 {
                    let flat: Vec<f32> = lp.iter().flatten().copied().collect();
                    let want = common::read_f32(&dir.join(format!("{stem}.decoder{side}.f32")));
                    worst.2 = worst.2.max(max_abs_diff(&flat, &want));
                }
                let score: f64 = seq
                    .iter()
                    .enumerate()
                    .map(|(j, &w)| f64::from(lp[j][w as usize]))
                    .sum::<f64>()
                    + f64::from(lp[seq.len()][eos as usize]);
                worst.3 = worst.3.max((score - cand[key].as_f64().unwrap()).abs());
            }
            // The scores verify compares are the same decoder scores, and a CTC log-likelihood
            // over every alignment, which the beam's pruned score of the candidate cannot exceed.
            let scores: BTreeMap<&str, f64> = asr
                .hypothesis_scores(&mut FullPrecision, &enc, &tokens)
                .unwrap()
                .into_iter()
                .collect();
            for key in ["left", "right"] {
                let got = scores[format!("{key}_decoder").as_str()];
                worst.3 = worst.3.max((got - cand[key].as_f64().unwrap()).abs());
            }
            let beam = ctc_prefix_beam_search(&logp, 10, 0);
            if let Some((_, pruned)) = beam.iter().find(|(t, _)| t == &tokens) {
                assert!(
                    scores["ctc"] >= pruned - 1e-9,
                    "{stem}: {} < {pruned}",
                    scores["ctc"]
                );
            }
            let rescored = 0.5 * scores["ctc"] + scores["left_decoder"];
            assert!((scores["rescored"] - rescored).abs() < 1e-9);
        }
    }
    eprintln!(
        "max |diff|: encoder {:.2e}, CTC log-probs {:.2e}, decoder log-probs {:.2e}, scores {:.2e}",
        worst.0, worst.1, worst.2, worst.3
    );
    assert!(worst.0 < ENCODER_TOL, "encoder {}", worst.0);
    assert!(worst.1 < LOG_PROB_TOL, "ctc {}", worst.1);
    assert!(worst.2 < LOG_PROB_TOL, "decoder {}", worst.2);
    assert!(worst.3 < SCORE_TOL, "scores {}", worst.3);
}
