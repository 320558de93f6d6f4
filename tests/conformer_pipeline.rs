//! The Conformer through the whole pipeline, on the ESPnet-built small model
//! (tests/fixtures/wenet/espnet/wenet-small, seeded random weights) and two real clips:
//! transcribe, every recipe (calibrated on the clips), verify, and the smoothed full-precision
//! model computing the same function. Random weights: evidence of structure and numerics, never
//! of accuracy.

mod common;

use std::path::{Path, PathBuf};

use oasr_quantize::algorithms::smoothquant::RuntimeSmoothedExec;
use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::models::conformer::ctc_greedy;
use oasr_quantize::models::conformer::ConformerAsr;
use oasr_quantize::models::exec::FullPrecision;
use oasr_quantize::models::{DecodeOptions, SpeechModel};
use oasr_quantize::numerics::OutDtype;
use oasr_quantize::transcribe::transcribe_manifest_with;
use oasr_quantize::verify::verify;
use oasr_quantize::{Manifest, Quantizer};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wenet")
}

fn model() -> PathBuf {
    fixtures().join("espnet/wenet-small")
}

/// The two fixture clips as a manifest (the texts are their transcripts; the random model does
/// not produce them).
fn manifest(dir: &Path) -> PathBuf {
    let path = dir.join("clips.jsonl");
    let clips = fixtures();
    std::fs::write(
        &path,
        format!(
            "{{\"id\": \"bobby\", \"audio\": \"{}\", \"text\": \"Bobby ripped the ledger\"}}\n\
             {{\"id\": \"goforward\", \"audio\": \"{}\", \"text\": \"go forward ten meters\"}}\n",
            clips.join("praatio-bobby.wav").display(),
            clips.join("pocketsphinx-goforward.wav").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn transcribe_runs_the_search_and_the_rescoring() {
    let tmp = tempfile::tempdir().unwrap();
    let m = Manifest::read(&manifest(tmp.path()), None).unwrap();
    let report =
        oasr_quantize::transcribe::transcribe_manifest(&model(), &m, None, |_, _, _| {}).unwrap();
    assert_eq!(report.utterances.len(), 2);
    // The rescored hypothesis is one of the beam's candidates: non-empty on real speech here.
    assert!(report.utterances.iter().all(|u| u.tokens > 0));

    // A beam of one keeps the best path's prefix only: rescoring has nothing to choose, so the
    // transcript is the CTC greedy one.
    let one = DecodeOptions {
        beam_size: Some(1),
        ..DecodeOptions::default()
    };
    let narrow = transcribe_manifest_with(&model(), &m, None, &one, |_, _, _| {}).unwrap();
    let asr = ConformerAsr::new(&Checkpoint::open(&model()).unwrap()).unwrap();
    for (u, got) in m.utterances.iter().zip(&narrow.utterances) {
        let samples = asr.read(u).unwrap();
        let enc = asr.encode(&mut FullPrecision, &samples).unwrap();
        let logp = asr.model.ctc_log_probs(&mut FullPrecision, &enc).unwrap();
        assert_eq!(got.hypothesis, asr.text(&ctc_greedy(&logp, 0)).unwrap());
    }

    // Options out of range, and Whisper's search, refuse them by name.
    let refused = |options: DecodeOptions, ckpt: &Path| {
        transcribe_manifest_with(ckpt, &m, None, &options, |_, _, _| {})
            .unwrap_err()
            .to_string()
    };
    let e = refused(
        DecodeOptions {
            reverse_weight: Some(1.5),
            ..DecodeOptions::default()
        },
        &model(),
    );
    assert!(
        e.contains("--reverse-weight") && e.contains("[0, 1]"),
        "{e}"
    );
}

#[test]
fn every_recipe_quantizes_and_verifies_the_conformer() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest_path = manifest(tmp.path());
    let m = Manifest::read(&manifest_path, None).unwrap();
    for recipe in [
        "int8_w8a8_rtn",
        "fp8_w8a8_rtn",
        "smoothquant_w8a8",
        "smoothquant_fp8_w8a8",
        "smoothquant_w8a8_fused",
        "smoothquant_fp8_w8a8_fused",
    ] {
        let dst = tmp.path().join(recipe);
        let mut q = Quantizer::new(model(), &dst).recipe(recipe);
        if !recipe.ends_with("rtn") {
            q = q.calib_manifest(&manifest_path);
        }
        q.run().unwrap();
        let ckpt = Checkpoint::open(&dst).unwrap();
        let spec = ckpt.config.quantization.as_ref().unwrap();
        // 2 blocks x 8 + 2 decoders x 1 block x 10.
        assert_eq!(spec.layers.len(), 2 * 8 + 2 * 10, "{recipe}");
        let report = verify(&dst, &model(), &m, None, OutDtype::F16, |_, _, _| {}).unwrap();
        assert_eq!(report.nonfinite, 0, "{recipe}");
        // The rescoring of the full-precision hypothesis, by both models.
        let names: Vec<&str> = report
            .hypothesis_scores
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            names,
            ["ctc", "left_decoder", "rescored", "right_decoder"],
            "{recipe}"
        );
        for (name, s) in &report.hypothesis_scores {
            assert_eq!(s.utterances, 2, "{recipe} {name}");
            assert!(
                s.full_precision_mean < 0.0,
                "{recipe} {name}: a log-probability"
            );
            assert!(
                s.abs_diff_max.is_finite() && s.abs_diff_max > 0.0,
                "{recipe} {name}: {}",
                s.abs_diff_max
            );
            assert!(s.abs_diff_mean <= s.abs_diff_max);
        }
        if !recipe.ends_with("rtn") {
            // Calibration records the search it decoded with (WeNet's defaults here).
            let record = spec.producer.calibration.clone().unwrap();
            assert_eq!(record.decoding["ctc_weight"], 0.5, "{recipe}");
            assert_eq!(record.decoding["beam_size"], 10, "{recipe}");
        }
        assert!(report.teacher_forced.steps > 0);
        assert!(
            report.teacher_forced.cosine_mean > 0.9,
            "{recipe}: CTC log-posterior cosine {}",
            report.teacher_forced.cosine_mean
        );
        if recipe.contains("fused") {
            // The armed links compute exactly what the unfused pairs do, on a real clip.
            let dtype = spec.layers.values().next().unwrap().scheme.dtype();
            common::links::check_links_are_bit_identical(&dst, spec, dtype, &m.utterances[0]);
            assert!(!spec.links.gemm_chains.is_empty() && !spec.links.fused_norms.is_empty());
            // Both feed-forward chains of each block (swish) and the decoders' (ReLU) may arm.
            let acts: Vec<_> = spec
                .links
                .gemm_chains
                .iter()
                .map(|c| c.activation)
                .collect();
            assert!(
                acts.iter()
                    .all(|a| a.name() == "swish" || a.name() == "relu"),
                "{acts:?}"
            );
        }
    }
}

#[test]
fn the_smoothed_full_precision_conformer_computes_the_same_function() {
    assert_smoothed_model_is_the_same_function(&model());
}

#[test]
fn the_smoothed_standard_conformer_computes_the_same_function() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("standard");
    common::wenet::write_dir(&dir, &common::wenet::Geometry::standard(), false, |_| {});
    assert_smoothed_model_is_the_same_function(&dir);
}

/// SmoothQuant's folds and runtime smoothers (calibrated on the two clips) leave the model's
/// function unchanged: the CTC log-posteriors, the chosen hypothesis and both decoders' scores.
fn assert_smoothed_model_is_the_same_function(dir: &Path) {
    use oasr_quantize::algorithms::{smoothquant, WorkingTensors};
    use oasr_quantize::calibration::{self, AbsMaxObserver, CalibrationSet};
    use oasr_quantize::checkpoint::Tensor;
    let tmp = tempfile::tempdir().unwrap();
    let m = Manifest::read(&manifest(tmp.path()), None).unwrap();
    let source = Checkpoint::open(dir).unwrap();
    let t = ConformerAsr::new(&source).unwrap();
    let set = CalibrationSet::select(&m, 2, 16000).unwrap();
    let observed: AbsMaxObserver =
        calibration::observe(&t, &set, || FullPrecision, |_, _, _| {}).unwrap();
    let layout = oasr_quantize::layout_of(&source).unwrap();
    // Every quantizable GEMM input was observed, both decoders' included.
    for l in layout
        .layers
        .iter()
        .filter(|l| !l.name.contains("embed.convs"))
    {
        assert!(
            observed.absmax.contains_key(&l.name),
            "{} not observed",
            l.name
        );
    }
    let quantized: std::collections::HashSet<String> = layout
        .layers
        .iter()
        .filter(|l| !l.name.contains("embed.convs"))
        .map(|l| l.name.clone())
        .collect();
    let mut working = WorkingTensors::new(&source);
    let groups = smoothquant::plan(&layout, &quantized, &observed, &working, 0.5).unwrap();
    // Every group of the layout: folds into norms, V rows (fused and not), producer rows across
    // ReLU, and runtime smoothers.
    assert_eq!(groups.len(), layout.smooth_groups.len());
    let inv = smoothquant::apply(&groups, &mut working).unwrap();
    let mut smoothed = source.clone();
    for (name, values) in working.changed_tensors() {
        let shape = source.tensors[name].shape.clone();
        smoothed
            .tensors
            .insert(name.to_string(), Tensor::from_f32(shape, values));
    }
    let ts = ConformerAsr::new(&smoothed).unwrap();
    for u in &m.utterances {
        let samples = t.read(u).unwrap();
        let a = t.transcribe(&mut FullPrecision, &samples, true).unwrap();
        let mut exec = RuntimeSmoothedExec { smooth_inv: &inv };
        let b = ts.transcribe(&mut exec, &samples, true).unwrap();
        let worst = a
            .scores
            .iter()
            .flatten()
            .zip(b.scores.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "{}: {worst}", u.id);
        assert_eq!(a.tokens, b.tokens, "{}", u.id);
        // The decoders too: the rescoring scores of the chosen hypothesis.
        let (ea, eb) = (
            t.encode(&mut FullPrecision, &samples).unwrap(),
            ts.encode(&mut exec, &samples).unwrap(),
        );
        for side in 0..2 {
            let la = t
                .model
                .decoder_log_probs(&mut FullPrecision, side, &ea, t.sos, &a.tokens)
                .unwrap();
            let lb = ts
                .model
                .decoder_log_probs(&mut exec, side, &eb, ts.sos, &a.tokens)
                .unwrap();
            let worst = la
                .iter()
                .flatten()
                .zip(lb.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-3, "{} decoder {side}: {worst}", u.id);
        }
    }
}

#[test]
fn a_conformer_spec_that_disagrees_with_the_layout_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest_path = manifest(tmp.path());
    let dst = tmp.path().join("fused");
    Quantizer::new(model(), &dst)
        .recipe("smoothquant_w8a8_fused")
        .calib_manifest(&manifest_path)
        .run()
        .unwrap();
    let config = dst.join("oasr_config.json");
    let original = std::fs::read_to_string(&config).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
        f(&mut v);
        std::fs::write(&config, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        Checkpoint::open(&dst).unwrap_err().to_string()
    };
    // A chain recorded with another activation than the forward applies (GELU is the default).
    let e = edit(&|v| {
        let chains = v["quantization"]["links"]["gemm_chains"]
            .as_array_mut()
            .unwrap();
        assert!(!chains.is_empty());
        chains[0].as_object_mut().unwrap().remove("activation");
    });
    assert!(
        e.contains("gemm_chains") && e.contains("`gelu`") && e.contains("U2++ Conformer"),
        "{e}"
    );
    // A layer the layout does not quantize.
    let e = edit(&|v| {
        let layers = v["quantization"]["layers"].as_object_mut().unwrap();
        let mut any = layers.values().next().unwrap().clone();
        any["input_quantized_by"] = serde_json::Value::Null;
        any["smoothed_into"] = serde_json::Value::Null;
        any["smooth"] = "none".into();
        layers.insert("encoder.embed.out".into(), any);
    });
    assert!(
        e.contains("quantization.layers.encoder.embed.out")
            && e.contains("not a quantizable layer"),
        "{e}"
    );
    std::fs::write(&config, &original).unwrap();
    Checkpoint::open(&dst).unwrap();
}
