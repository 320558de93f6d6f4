//! The verify run on the real tiny.en and real speech: an int8 RTN checkpoint against its source.

mod common;

use oasr_quantize::numerics::OutDtype;
use oasr_quantize::verify::verify;
use oasr_quantize::Manifest;
use oasr_quantize::Quantizer;

#[test]
fn verify_compares_the_quantized_model_with_full_precision() {
    let tmp = tempfile::tempdir().unwrap();
    let q = tmp.path().join("q");
    Quantizer::new(common::tiny_en(), &q)
        .recipe("int8_w8a8_rtn")
        .run()
        .unwrap();
    let (_, gate) = common::manifests();
    let manifest = Manifest::read(&gate, None).unwrap();
    let report = verify(
        &q,
        &common::tiny_en(),
        &manifest,
        Some(3),
        OutDtype::F16,
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!(report.utterances, 3);
    assert_eq!(report.nonfinite, 0);
    assert!(report.wer_full_precision.is_some() && report.wer_delta.is_some());
    let [lo, hi] = report
        .wer_delta_interval
        .expect("a WER difference comes with its interval");
    assert!(lo <= hi, "{lo} > {hi}");
    let tf = &report.teacher_forced;
    assert!(tf.steps > 5, "{tf:?}");
    // Quantized numerics really ran (not a copy of the fp32 model) and stay close to it.
    assert!(
        tf.cosine_mean > 0.99 && tf.cosine_mean < 0.999_999,
        "{tf:?}"
    );
    assert!(tf.top1_agreement > 0.9, "{tf:?}");
    assert_eq!(report.transcripts[0].id, "added");

    // A full-precision checkpoint is not something to verify.
    let e = verify(
        &common::tiny_en(),
        &common::tiny_en(),
        &manifest,
        Some(1),
        OutDtype::F16,
        |_, _, _| {},
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("not a quantized checkpoint"), "{e}");
    // Without the `cuda` feature, --device cuda is refused with what to do.
    #[cfg(not(feature = "cuda"))]
    let (ok, _, err) = common::cli(&[
        "verify",
        q.to_str().unwrap(),
        "--reference",
        common::tiny_en().to_str().unwrap(),
        "--manifest",
        gate.to_str().unwrap(),
        "--device",
        "cuda",
    ]);
    #[cfg(not(feature = "cuda"))]
    assert!(
        !ok && err.contains("built without the `cuda` feature")
            && err.contains("rebuild with --features cuda"),
        "{err}"
    );
}

/// `--fp8-accumulation tensor-core` changes how the CPU sums fp8 GEMMs only: the fp8 figures
/// move a little (the model truncates where the reference sums exactly), int8's do not move.
#[test]
fn the_tensor_core_model_moves_fp8_figures_and_leaves_int8_alone() {
    use oasr_quantize::numerics::Fp8Accumulation;
    use oasr_quantize::verify::{verify_with, VerifyOptions};
    let tmp = tempfile::tempdir().unwrap();
    let (_, gate) = common::manifests();
    let manifest = Manifest::read(&gate, None).unwrap();
    for (recipe, moves) in [("fp8_w8a8_rtn", true), ("int8_w8a8_rtn", false)] {
        let q = tmp.path().join(recipe);
        Quantizer::new(common::tiny_en(), &q)
            .recipe(recipe)
            .run()
            .unwrap();
        let run = |fp8_accumulation| {
            let options = VerifyOptions {
                limit: Some(1),
                fp8_accumulation,
                ..VerifyOptions::default()
            };
            verify_with(&q, &common::tiny_en(), &manifest, &options, |_, _, _| {}).unwrap()
        };
        let (sequential, modelled) = (
            run(Fp8Accumulation::Sequential),
            run(Fp8Accumulation::TensorCore),
        );
        assert_eq!(modelled.fp8_accumulation, Fp8Accumulation::TensorCore);
        let (a, b) = (&sequential.teacher_forced, &modelled.teacher_forced);
        assert_eq!(a.steps, b.steps);
        if moves {
            assert_ne!(
                a.cosine_mean, b.cosine_mean,
                "{recipe}: the model changed nothing"
            );
            assert!(
                (a.cosine_mean - b.cosine_mean).abs() < 0.01,
                "{recipe}: {a:?} {b:?}"
            );
        } else {
            assert_eq!(a.cosine_mean, b.cosine_mean, "{recipe}");
            assert_eq!(a.kl_mean, b.kl_mean, "{recipe}");
        }
    }
}
