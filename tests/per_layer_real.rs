//! `verify --per-layer` on the real tiny.en and real speech: the recorded smoothing factors, the
//! frame mapping of smoothed layers inside the reference model, and the breakdown's figures.

mod common;

use oasr_quantize::checkpoint::{read_smoothing_factors, SMOOTHING_FACTORS_FILE};
use oasr_quantize::format::SmoothFold;
use oasr_quantize::report::QuantizationReport;
use oasr_quantize::verify::{verify_with, VerifyOptions};
use oasr_quantize::Manifest;
use oasr_quantize::{Error, Quantizer};

/// The first gate utterances with a `source` each, so the per-source breakdown is exercised.
fn manifest_with_sources(dir: &std::path::Path, gate: &std::path::Path, n: usize) -> Manifest {
    let text = std::fs::read_to_string(gate).unwrap();
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["source"] = serde_json::Value::from(if i == 0 { "first" } else { "rest" });
            v.to_string()
        })
        .collect();
    let path = dir.join("sources.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    Manifest::read(&path, gate.parent()).unwrap()
}

#[test]
fn per_layer_breaks_the_smoothquant_error_down_by_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let (calib, gate) = common::manifests();
    let q = tmp.path().join("sq");
    let outcome = Quantizer::new(common::tiny_en(), &q)
        .recipe("smoothquant_w8a8")
        .calib_manifest(&calib)
        .calib_utterances(4)
        .run()
        .unwrap();
    let report: QuantizationReport = outcome.report.unwrap();

    // The factors of every folded group are recorded, keyed by the module that absorbed 1/s:
    // tiny.en has 3 per encoder layer (two norms, V) and 5 per decoder layer (three norms, two V);
    // the recipe keeps the first encoder layer full precision, so nothing folds into it.
    let factors = read_smoothing_factors(&q)
        .unwrap()
        .expect("smoothing factors written");
    assert_eq!(factors.len(), 3 * 3 + 4 * 5, "{:?}", factors.keys());
    assert!(!factors.keys().any(|k| k.starts_with("encoder.layers.0.")));
    let mut far_from_one = 0;
    for layer in &report.layers {
        if !matches!(layer.smooth, SmoothFold::NormAffine | SmoothFold::VToO) {
            continue;
        }
        let s = &factors[layer.smoothed_into.as_ref().unwrap()];
        let (lo, hi) = s
            .iter()
            .fold((f32::INFINITY, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
        assert_eq!(
            (Some(lo), Some(hi)),
            (layer.smoothing_factor_min, layer.smoothing_factor_max),
            "{}",
            layer.name
        );
        // So a mapping that ignored s would be far off (the weight-only check below).
        far_from_one += usize::from(lo < 0.5 || hi > 2.0);
    }
    assert!(
        far_from_one >= 40,
        "{far_from_one} folded layers with s far from 1"
    );

    let manifest = manifest_with_sources(tmp.path(), &gate, 2);
    let options = VerifyOptions {
        limit: Some(2),
        per_layer: true,
        ..VerifyOptions::default()
    };
    let v = verify_with(&q, &common::tiny_en(), &manifest, &options, |_, _, _| {}).unwrap();
    let p = v.per_layer.as_ref().expect("per_layer section");
    // The recipe keeps the decoder's four fc2 and the first encoder layer full precision.
    assert_eq!((p.utterances, p.layers.len(), p.nonfinite), (2, 54, 0));
    let full = &p.full_model;
    assert!(full.steps > 3, "{full:?}");
    assert!(
        full.one_minus_cosine_mean > 0.0 && full.kl_mean > 0.0,
        "the fully quantized model's logit error is positive: {full:?}"
    );
    for l in &p.layers {
        let o = &l.output_error;
        assert!(
            o.relative_l2.is_finite() && o.relative_l2 > 0.0 && o.relative_l2 < 0.1,
            "{}: {o:?}",
            l.name
        );
        // The dequantized weights in f32 on the input mapped into the layer's frame reproduce the
        // reference output up to the weight rounding (0.3–1.5 % on tiny.en): the recorded factors
        // and the mapping (÷ s in, × s out of a v_to_o V projection) are right.
        assert!(
            o.weight_only_relative_l2 < 0.03 && o.weight_only_relative_l2 <= o.relative_l2,
            "{}: {o:?}",
            l.name
        );
        let worst = o.worst_row.as_ref().unwrap();
        // The overall figure is a norm-weighted mean of the rows'.
        assert!(
            worst.relative_l2 >= o.relative_l2 * 0.999 && worst.relative_l2 < 0.5,
            "{worst:?}"
        );
        assert!(worst.utterance == "added" || worst.utterance == "agent-incorrect");
        assert_eq!(l.logit_error.steps, full.steps, "{}", l.name);
        let share = l.logit_share.one_minus_cosine.unwrap();
        assert!(share.is_finite() && share >= 0.0, "{}: {share}", l.name);
        assert!(l.logit_share.kl.unwrap().is_finite());
        // One utterance per source here.
        assert_eq!(l.by_source.len(), 2, "{}", l.name);
        assert_eq!(l.by_source["first"].utterances, 1);
        assert_eq!(
            l.by_source["first"].output_error.rows + l.by_source["rest"].output_error.rows,
            o.rows
        );
    }
    // Encoder layers see the 1500 encoder frames of each utterance, cross k/v too.
    let row_count = |name: &str| {
        p.layers
            .iter()
            .find(|l| l.name == name)
            .unwrap()
            .output_error
            .rows
    };
    assert_eq!(row_count("encoder.layers.2.fc1"), 2 * 1500);
    assert_eq!(row_count("decoder.layers.1.encoder_attn.k_proj"), 2 * 1500);
    assert!(row_count("decoder.layers.1.fc1") < 100);
    assert_eq!(p.full_model_by_source.len(), 2);
    let top = p.top_by_share(3);
    assert!(top[0].logit_share.one_minus_cosine >= top[2].logit_share.one_minus_cosine);
    // Asked only: a plain verify report has no per_layer section.
    let json = serde_json::to_value(&v).unwrap();
    assert!(json.get("per_layer").is_some());

    // Without the recorded factors the breakdown is refused, naming the file and the fix.
    std::fs::remove_file(q.join(SMOOTHING_FACTORS_FILE)).unwrap();
    let e = verify_with(&q, &common::tiny_en(), &manifest, &options, |_, _, _| {})
        .err()
        .unwrap();
    assert!(matches!(e, Error::MissingDiagnostics { .. }), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains(SMOOTHING_FACTORS_FILE) && message.contains("re-quantize"),
        "{message}"
    );
    let (ok, _, err) = common::cli(&[
        "verify",
        q.to_str().unwrap(),
        "--reference",
        common::tiny_en().to_str().unwrap(),
        "--manifest",
        gate.to_str().unwrap(),
        "--limit",
        "1",
        "--per-layer",
    ]);
    assert!(
        !ok && err.contains(SMOOTHING_FACTORS_FILE) && err.contains("re-quantize"),
        "{err}"
    );

    // RTN folds nothing: no factors file, and the breakdown needs none.
    let rtn = tmp.path().join("rtn");
    Quantizer::new(common::tiny_en(), &rtn)
        .recipe("int8_w8a8_rtn")
        .run()
        .unwrap();
    assert!(!rtn.join(SMOOTHING_FACTORS_FILE).exists());
    let options = VerifyOptions {
        limit: Some(1),
        per_layer: true,
        ..VerifyOptions::default()
    };
    let v = verify_with(&rtn, &common::tiny_en(), &manifest, &options, |_, _, _| {}).unwrap();
    let p = v.per_layer.unwrap();
    assert_eq!((p.utterances, p.layers.len()), (1, 64));
    // A limit that selects nothing is refused, not reported as figures over nothing.
    let none = VerifyOptions {
        limit: Some(0),
        ..options.clone()
    };
    let e = verify_with(&rtn, &common::tiny_en(), &manifest, &none, |_, _, _| {}).unwrap_err();
    assert!(e.to_string().contains("--limit"), "{e}");
    let plain = VerifyOptions {
        per_layer: false,
        ..options
    };
    let v = verify_with(&rtn, &common::tiny_en(), &manifest, &plain, |_, _, _| {}).unwrap();
    assert!(serde_json::to_value(&v).unwrap().get("per_layer").is_none());
}
