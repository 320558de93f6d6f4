//! Calibration and SmoothQuant on the real Whisper tiny.en with real speech (release mode: each
//! utterance is a full fp32 forward and greedy decoding).

mod common;

use std::collections::{BTreeMap, HashSet};

use oasr_quantize::algorithms::{smoothquant, WorkingTensors};
use oasr_quantize::calibration::{self, AbsMaxObserver, CalibrationSet};
use oasr_quantize::checkpoint::{Checkpoint, DType, Tensor};
use oasr_quantize::format::SmoothFold;
use oasr_quantize::models::exec::{FullPrecision, LinearExec};
use oasr_quantize::models::whisper::teacher_forced;
use oasr_quantize::models::whisper::WhisperAsr;
use oasr_quantize::models::{DecodeOptions, SpeechModel};
use oasr_quantize::transcribe::{transcribe_manifest, transcribe_manifest_with};
use oasr_quantize::Manifest;
use oasr_quantize::{Error, Quantizer};

#[test]
fn tiny_en_transcribes_real_speech_sensibly() {
    let (_, gate) = common::manifests();
    let manifest = Manifest::read(&gate, None).unwrap();
    let report =
        transcribe_manifest(&common::tiny_en(), &manifest, Some(12), |_, _, _| {}).unwrap();
    assert_eq!(report.utterances.len(), 12);
    let wer = report.wer.unwrap();
    assert!(
        wer < 0.15,
        "fp32 WER {wer} on the first 12 gate utterances; transcripts: {:#?}",
        report.utterances
    );
    let first = &report.utterances[0];
    assert_eq!(
        (first.id.as_str(), first.hypothesis.as_str()),
        ("added", "Added.")
    );
}

/// praatio's "damon" (cross-domain gate) is a real utterance whose greedy decoding fails
/// Whisper's checks at full precision: the default search retries at rising temperatures, and
/// `--no-fallback` keeps the one greedy decoding, as transformers' `generate` does.
#[test]
fn no_fallback_keeps_the_one_greedy_decoding() {
    let gate = common::cache_dir().join("crossdomain").join("gate.jsonl");
    let mut manifest = Manifest::read(&gate, None).unwrap();
    manifest.utterances.retain(|u| u.id == "praatio-damon");
    assert_eq!(
        manifest.utterances.len(),
        1,
        "praatio-damon in {}",
        gate.display()
    );
    let run = |no_fallback: bool| {
        let options = DecodeOptions {
            no_fallback,
            ..DecodeOptions::default()
        };
        let report =
            transcribe_manifest_with(&common::tiny_en(), &manifest, None, &options, |_, _, _| {})
                .unwrap();
        report.utterances[0].clone()
    };
    let (retried, greedy) = (run(false), run(true));
    assert!(retried.attempts > 1, "{retried:?}");
    assert!(retried.temperature > 0.0, "{retried:?}");
    assert_eq!(
        (greedy.attempts, greedy.temperature),
        (1, 0.0),
        "{greedy:?}"
    );
    assert_ne!(greedy.hypothesis, retried.hypothesis);
}

/// A calibrating run reports its stages in order, each from its start (`done` 0) to its end
/// (`done == total`): what the CLI's bars and its per-stage seconds are built from.
#[test]
fn a_calibrating_run_reports_each_stage_from_start_to_end() {
    use oasr_quantize::Stage;
    let tmp = tempfile::tempdir().unwrap();
    let (calib, _) = common::manifests();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    Quantizer::new(common::tiny_en(), tmp.path().join("q"))
        .recipe("smoothquant_w8a8")
        .calib_manifest(&calib)
        .calib_utterances(2)
        .on_progress(move |p| sink.lock().unwrap().push((p.stage, p.done, p.total)))
        .run()
        .unwrap();
    let seen = seen.lock().unwrap();
    let mut stages: Vec<Stage> = Vec::new();
    for (stage, done, total) in seen.iter() {
        if stages.last() != Some(stage) {
            assert_eq!(*done, 0, "{stage:?} starts at 0: {seen:?}");
            stages.push(*stage);
        }
        assert!(done <= total, "{seen:?}");
    }
    assert_eq!(
        stages,
        [
            Stage::Hashing,
            Stage::Loading,
            Stage::Calibrating,
            Stage::Writing
        ]
    );
    for stage in stages {
        let last = seen.iter().rev().find(|(s, ..)| *s == stage).unwrap();
        assert_eq!(last.1, last.2, "{stage:?} ends complete: {seen:?}");
    }
}

#[test]
fn the_smoothed_full_precision_model_computes_the_same_function() {
    let (calib, gate) = common::manifests();
    let source = Checkpoint::open(&common::tiny_en()).unwrap();
    let t = WhisperAsr::new(&source).unwrap();
    let set = CalibrationSet::select(&Manifest::read(&calib, None).unwrap(), 6, 16000).unwrap();
    let observed: AbsMaxObserver =
        calibration::observe(&t, &set, || FullPrecision, |_, _, _| {}).unwrap();
    let layout = oasr_quantize::layout_of(&source).unwrap();
    // Every GEMM input was observed: 64 layers (the convolutions too).
    assert_eq!(observed.absmax.len(), 66);
    let quantized: HashSet<String> = layout
        .layers
        .iter()
        .filter(|l| !l.name.contains("conv"))
        .map(|l| l.name.clone())
        .collect();
    let mut working = WorkingTensors::new(&source);
    let groups = smoothquant::plan(&layout, &quantized, &observed, &working, 0.5).unwrap();
    assert_eq!(groups.len(), 4 * 4 + 4 * 7);
    assert!(
        groups
            .iter()
            .any(|g| g.factors.iter().any(|s| (s - 1.0).abs() > 0.5)),
        "smoothing should move real outliers"
    );
    let smooth_inv: BTreeMap<String, Vec<f32>> = smoothquant::apply(&groups, &mut working).unwrap();
    assert_eq!(
        smooth_inv.len(),
        4 + 4 * 3,
        "fc2 everywhere plus the decoder's cross k/v"
    );

    let mut smoothed = source.clone();
    for (name, values) in working.changed_tensors() {
        let shape = source.tensors[name].shape.clone();
        smoothed
            .tensors
            .insert(name.to_string(), Tensor::from_f32(shape, values));
    }
    let ts = WhisperAsr::new(&smoothed).unwrap();
    let manifest = Manifest::read(&gate, None).unwrap();
    let (mut worst_diff, mut worst_cos) = (0f32, 1f64);
    for u in manifest.utterances.iter().step_by(40).take(5) {
        let samples = t.read(u).unwrap();
        let a = t.transcribe(&mut FullPrecision, &samples, false).unwrap();
        let mut exec = smoothquant::RuntimeSmoothedExec {
            smooth_inv: &smooth_inv,
        };
        let b = ts.transcribe(&mut exec, &samples, false).unwrap();
        assert_eq!(
            a.tokens,
            b.tokens,
            "{}: {:?} vs {:?}",
            u.id,
            t.text(&a.tokens),
            t.text(&b.tokens)
        );
        // Logits on the same tokens (teacher-forced) agree to float rounding.
        let mel = t.frontend.log_mel(&samples);
        let ea = t
            .model
            .encode(&mut FullPrecision, &mel.data, mel.n_mels, mel.frames)
            .unwrap();
        let eb = ts
            .model
            .encode(&mut exec, &mel.data, mel.n_mels, mel.frames)
            .unwrap();
        let la = teacher_forced(&t.model, &mut FullPrecision, &ea, &t.rules, &a.tokens).unwrap();
        let lb = teacher_forced(
            &ts.model,
            &mut exec as &mut dyn LinearExec,
            &eb,
            &ts.rules,
            &a.tokens,
        )
        .unwrap();
        for (ra, rb) in la.iter().zip(&lb) {
            let diff = ra
                .iter()
                .zip(rb)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let dot: f64 = ra
                .iter()
                .zip(rb)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let na: f64 = ra.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = rb.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            worst_diff = worst_diff.max(diff);
            worst_cos = worst_cos.min(dot / (na * nb));
        }
    }
    eprintln!(
        "smoothed vs original: max |logit difference| {worst_diff}, min logit cosine {worst_cos}"
    );
    // The documented tolerance (docs/recipes.md): f32 reassociation only.
    assert!(worst_diff < 2e-2, "max |logit difference| {worst_diff}");
    assert!(worst_cos > 0.999_999, "min logit cosine {worst_cos}");
}

#[test]
fn smoothquant_recipes_write_folds_smoothers_and_provenance() {
    let tmp = tempfile::tempdir().unwrap();
    let (calib, _) = common::manifests();
    let dst = tmp.path().join("sq");
    let outcome = Quantizer::new(common::tiny_en(), &dst)
        .recipe("smoothquant_w8a8")
        .calib_manifest(&calib)
        .calib_utterances(4)
        .option("smoothquant.alpha=0.6")
        // The recipe smooths through folds only; the runtime smoothers are still an option, and
        // so is quantizing the decoder's fc2, which the recipe keeps full precision.
        .option("smoothquant.runtime=true")
        .quantize_kept(true)
        .run()
        .unwrap();
    let out = Checkpoint::open(&dst).unwrap();
    let spec = out.config.quantization.as_ref().unwrap();
    assert_eq!(spec.layers.len(), 64);
    let layer = |n: &str| &spec.layers[n];
    assert_eq!(
        layer("encoder.layers.1.self_attn.k_proj").smooth,
        SmoothFold::NormAffine
    );
    assert_eq!(
        layer("encoder.layers.1.self_attn.k_proj")
            .smoothed_into
            .as_deref(),
        Some("encoder.layers.1.self_attn_layer_norm")
    );
    assert_eq!(
        layer("encoder.layers.1.self_attn.out_proj").smooth,
        SmoothFold::VToO
    );
    assert_eq!(
        layer("encoder.layers.1.self_attn.out_proj")
            .smoothed_into
            .as_deref(),
        Some("encoder.layers.1.self_attn.v_proj")
    );
    assert_eq!(
        layer("decoder.layers.2.encoder_attn.q_proj").smooth,
        SmoothFold::NormAffine
    );
    for runtime in [
        "encoder.layers.0.fc2",
        "decoder.layers.3.encoder_attn.k_proj",
        "decoder.layers.3.encoder_attn.v_proj",
    ] {
        assert_eq!(
            (layer(runtime).smooth, layer(runtime).smoothed_into.clone()),
            (SmoothFold::Runtime, None),
            "{runtime}"
        );
        let inv = &out.tensors[&format!("{runtime}.smooth_inv")];
        assert_eq!(
            (inv.dtype, inv.shape.clone()),
            (
                DType::F32,
                vec![out.tensors[&format!("{runtime}.weight")].shape[1]]
            )
        );
    }
    assert_eq!(
        out.tensors
            .keys()
            .filter(|k| k.ends_with(".smooth_inv"))
            .count(),
        4 + 4 * 3
    );
    assert_eq!(spec.links.fused_norms.len(), 20);
    // Folded norms are stored in the source dtype and differ from the source.
    let src = Checkpoint::open(&common::tiny_en()).unwrap();
    let norm = "encoder.layers.1.self_attn_layer_norm.weight";
    assert_eq!(out.tensors[norm].dtype, DType::F16);
    assert_ne!(out.tensors[norm].bytes(), src.tensors[norm].bytes());
    let c = spec.producer.calibration.as_ref().unwrap();
    assert_eq!(
        (c.utterances_used, c.sample_rate, c.dtype.as_str()),
        (4, 16000, "float32")
    );
    assert_eq!(
        c.manifest_sha256,
        oasr_quantize::sha256_file(&calib).unwrap()
    );
    assert!(c.utterances_total > 200 && c.selection.contains("evenly strided"));
    assert_eq!(
        spec.producer.algorithms[0].options["alpha"],
        serde_json::json!(0.6)
    );
    let report = outcome.report.unwrap();
    let fc2 = report
        .layers
        .iter()
        .find(|l| l.name == "encoder.layers.0.fc2")
        .unwrap();
    assert_eq!(fc2.smooth, SmoothFold::Runtime);
    assert!(fc2.smoothing_factor_min.unwrap() > 0.0 && fc2.input_absmax_max.unwrap() > 0.0);
    // Files read include the manifest and the 4 calibration clips.
    assert!(outcome.files_read.iter().any(|f| f == &calib));
    assert_eq!(
        outcome
            .files_read
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "wav"))
            .count(),
        4
    );

    // fp8, and determinism across runs.
    let a = tmp.path().join("fp8-a");
    let b = tmp.path().join("fp8-b");
    for dst in [&a, &b] {
        Quantizer::new(common::tiny_en(), dst)
            .recipe("smoothquant_fp8_w8a8")
            .calib_manifest(&calib)
            .calib_utterances(3)
            .run()
            .unwrap();
    }
    assert_eq!(common::tree_hashes(&a), common::tree_hashes(&b));
    assert_eq!(
        Checkpoint::open(&a).unwrap().tensors["decoder.layers.0.fc1.weight"].dtype,
        DType::F8E4m3
    );
}

#[test]
fn calibration_inputs_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .recipe("smoothquant_w8a8")
        .run()
        .unwrap_err();
    assert!(e.to_string().contains("--calib-manifest"), "{e}");
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .calib_manifest(tmp.path().join("m.jsonl"))
        .run()
        .unwrap_err();
    assert!(e.to_string().contains("does not calibrate"), "{e}");
    // Options are checked before anything is read (the manifest does not exist).
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .recipe("smoothquant_w8a8_fused")
        .calib_manifest(tmp.path().join("m.jsonl"))
        .option("static_inputs.observer=histogram")
        .run()
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidOption { .. })
            && e.to_string().contains("static_inputs.observer"),
        "{e}"
    );
    // An 8 kHz clip is refused by name, not resampled.
    let clip8k = tmp.path().join("clip8k.wav");
    common::write_wav(&clip8k, 8000, 8000, |i| ((i % 50) * 100) as i16);
    let manifest = tmp.path().join("m.jsonl");
    std::fs::write(
        &manifest,
        "# a comment\n\n{\"id\": \"slow\", \"audio\": \"clip8k.wav\"}\n",
    )
    .unwrap();
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .recipe("smoothquant_w8a8")
        .calib_manifest(&manifest)
        .run()
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("utterance `slow`") && text.contains("8000 Hz") && text.contains("16000 Hz"),
        "{text}"
    );
    assert!(!tmp.path().join("x").exists());
}

/// The built-in recipe smooths through folds only (no `smooth_inv` anywhere), with its recorded
/// options, and the floor keeps every factor within reach of the group's others.
#[test]
fn smoothquant_recipe_smooths_through_folds_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (calib, _) = common::manifests();
    let dst = tmp.path().join("sq");
    let outcome = Quantizer::new(common::tiny_en(), &dst)
        .recipe("smoothquant_w8a8")
        .calib_manifest(&calib)
        .calib_utterances(4)
        .run()
        .unwrap();
    let out = Checkpoint::open(&dst).unwrap();
    let spec = out.config.quantization.as_ref().unwrap();
    assert!(!out.tensors.keys().any(|k| k.ends_with(".smooth_inv")));
    for (name, layer) in &spec.layers {
        assert_ne!(layer.smooth, SmoothFold::Runtime, "{name}");
    }
    assert_eq!(spec.layers["encoder.layers.1.fc2"].smooth, SmoothFold::None);
    // The kept layers (keep_full_precision) stay full precision, their weights the source's: no
    // smoothing factor is folded into a layer that is not quantized.
    common::assert_recipe_keeps(spec);
    let source = Checkpoint::open(&common::tiny_en()).unwrap();
    for name in common::recipe_kept_layers() {
        let w = format!("{name}.weight");
        assert_eq!(out.tensors[&w].bytes(), source.tensors[&w].bytes(), "{w}");
        assert!(
            !out.tensors.contains_key(&format!("{name}.weight_scale")),
            "{name}"
        );
    }
    assert_eq!(
        spec.layers["encoder.layers.1.fc1"].smooth,
        SmoothFold::NormAffine
    );
    let options = &spec.producer.algorithms[0].options;
    assert_eq!(options["runtime"], serde_json::json!(false));
    assert_eq!(options["floor"], serde_json::json!(0.1));
    assert_eq!(options["alpha"], serde_json::json!(0.6));
    // The floor: no active channel's max counts below a tenth of the median, so with α 0.6
    // s never drops below (0.1 · median)^0.6 / max|W|^0.4 of its group.
    let report = outcome.report.unwrap();
    assert!(report
        .layers
        .iter()
        .filter(|l| l.smooth == SmoothFold::NormAffine)
        .all(|l| l.smoothing_factor_min.unwrap() > 0.0));
}

/// `smoothquant.search = "grid"`: every smoothed group's α (or no smoothing) is the candidate
/// it measured lowest, and the layers say so; in int8 the search moves groups off the recipe's
/// α. The options are checked by name.
#[test]
fn the_alpha_search_keeps_what_it_measured_lowest() {
    let tmp = tempfile::tempdir().unwrap();
    let (calib, _) = common::manifests();
    let run = |option: &str, dst: &str| {
        Quantizer::new(common::tiny_en(), tmp.path().join(dst))
            .recipe("smoothquant_w8a8")
            .option(option)
            .calib_manifest(&calib)
            .calib_utterances(4)
            .run()
    };
    let report = run("smoothquant.search=grid", "grid")
        .unwrap()
        .report
        .unwrap();
    let searched = &report.smoothing_search;
    assert!(searched.len() >= 20, "{}", searched.len());
    let mut moved = 0;
    for g in searched {
        assert_eq!(g.candidates.len(), 7, "{g:?}");
        assert_eq!(g.candidates[0].0, None, "{g:?}");
        assert!(g.rows > 0 && g.rows <= 4 * 8, "{g:?}");
        let lowest = g
            .candidates
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert_eq!(g.chosen, lowest.0, "{g:?}");
        moved += usize::from(g.chosen != Some(0.6));
        for consumer in &g.consumers {
            let layer = report.layers.iter().find(|l| &l.name == consumer).unwrap();
            assert_eq!(layer.smoothing_alpha, g.chosen, "{consumer}");
            assert_eq!(
                layer.smooth == SmoothFold::None,
                g.chosen.is_none(),
                "{consumer}"
            );
        }
    }
    assert!(moved > 0);
    let off = run("smoothquant.search=off", "off")
        .unwrap()
        .report
        .unwrap();
    assert!(off.smoothing_search.is_empty());
    let err = run("smoothquant.search=best", "bad")
        .unwrap_err()
        .to_string();
    assert!(err.contains("smoothquant.search"), "{err}");
    let err = run("smoothquant.search_rows=4", "bad")
        .unwrap_err()
        .to_string();
    assert!(err.contains("smoothquant.search_rows"), "{err}");
    assert!(!tmp.path().join("bad").exists());
}

/// Audio longer than Whisper's 30 s window is refused by name in transcription and calibration,
/// never truncated (35 s of silence then a word used to transcribe as "you").
#[test]
fn audio_longer_than_the_window_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let clip = tmp.path().join("long.wav");
    common::write_wav(&clip, 16_000, 31 * 16_000, |i| ((i % 40) * 50) as i16);
    let manifest_path = tmp.path().join("m.jsonl");
    std::fs::write(
        &manifest_path,
        "{\"id\": \"long\", \"audio\": \"long.wav\"}\n",
    )
    .unwrap();
    let manifest = Manifest::read(&manifest_path, None).unwrap();
    let e = transcribe_manifest(&common::tiny_en(), &manifest, None, |_, _, _| {}).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("utterance `long`") && text.contains("31.00 s") && text.contains("30 s"),
        "{text}"
    );
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .recipe("smoothquant_w8a8")
        .calib_manifest(&manifest_path)
        .run()
        .unwrap_err();
    assert!(e.to_string().contains("utterance `long`"), "{e}");
    assert!(!tmp.path().join("x").exists());
}

/// The gate's shared first pass: a run that reuses another run's full-precision observations
/// writes the same bytes as one that runs the pass itself, and a run on another calibration
/// selection does not reuse them.
#[test]
fn shared_first_pass_observations_give_the_same_checkpoint() {
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let (calib, _) = common::manifests();
    let store = calibration::SharedObservations::default();
    let run = |name: &str,
               recipe: &str,
               utterances: usize,
               store: Option<&calibration::SharedObservations>| {
        let items = Arc::new(Mutex::new(Vec::new()));
        let seen = items.clone();
        let dst = tmp.path().join(name);
        let mut q = Quantizer::new(common::tiny_en(), &dst)
            .recipe(recipe)
            .calib_manifest(&calib)
            .calib_utterances(utterances)
            .on_progress(move |p| {
                // Each utterance (and a reused pass's "(shared)"), not the stage's start at 0.
                if p.stage == oasr_quantize::Stage::Calibrating && p.done > 0 {
                    seen.lock().unwrap().push(p.item.to_string());
                }
            });
        if let Some(store) = store {
            q = q.share_observations(store.clone());
        }
        q.run().unwrap();
        let items = items.lock().unwrap().clone();
        (common::tree_hashes(&dst), items)
    };
    let (alone, alone_items) = run("alone", "smoothquant_w8a8", 3, None);
    assert_eq!(alone_items.len(), 3, "{alone_items:?}");
    let (first, first_items) = run("first", "smoothquant_fp8_w8a8", 3, Some(&store));
    assert_eq!(
        first_items.len(),
        3,
        "the first run fills the store: {first_items:?}"
    );
    let (reused, reused_items) = run("reused", "smoothquant_w8a8", 3, Some(&store));
    assert_eq!(reused_items, vec!["(shared)".to_string()]);
    assert_eq!(alone, reused);
    assert_ne!(first, reused, "int8 and fp8 checkpoints differ");
    let (_, other_items) = run("other", "smoothquant_w8a8", 2, Some(&store));
    assert_eq!(
        other_items.len(),
        2,
        "another selection runs its own pass: {other_items:?}"
    );
}

/// `smoothquant_fp8_w8a8_gptq` on the real tiny.en: GPTQ lowers the layers' output error on the
/// calibration inputs against RTN; a memory budget that fits one utterance's Σ x xᵀ at a time
/// gives the same checkpoint; one that fits none is refused before calibration, with no output.
#[test]
fn gptq_recipe_fits_its_pass_in_the_memory_budget() {
    let (calib, _) = common::manifests();
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, budget: Option<u64>| {
        let dst = tmp.path().join(name);
        let mut q = Quantizer::new(common::tiny_en(), &dst)
            .recipe("smoothquant_fp8_w8a8_gptq")
            .calib_manifest(&calib)
            .calib_utterances(2);
        if let Some(b) = budget {
            q = q.memory_budget(b);
        }
        q.run().map(|_| dst)
    };
    let free = run("free", None).unwrap();
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(free.join("quantization_report.json")).unwrap(),
    )
    .unwrap();
    let (mut gptq, mut rtn, mut layers) = (0.0, 0.0, 0);
    for l in report["layers"].as_array().unwrap() {
        if let (Some(g), Some(r)) = (
            l["gptq_output_error"].as_f64(),
            l["rtn_output_error"].as_f64(),
        ) {
            gptq += g;
            rtn += r;
            layers += 1;
        }
    }
    // tiny.en's 64 GEMMs less the ten the recipe keeps.
    assert_eq!(layers, 54);
    assert!(gptq < 0.7 * rtn, "GPTQ {gptq} against RTN {rtn}");

    // One copy of Σ x xᵀ: the quantized encoder layers' (1 to 3) q, k, v, out_proj and fc1 read
    // 384 channels and fc2 1536; the decoder's nine quantized GEMMs read 384.
    let widths = (0..3)
        .flat_map(|_| [384, 384, 384, 384, 384, 1536])
        .chain((0..4 * 9).map(|_| 384));
    let per_copy = calibration::gram_bytes(widths);
    // Three copies (merged, one worker, one pending) in three quarters of the budget.
    let one_worker = run("one_worker", Some(per_copy * 9 / 2)).unwrap();
    assert_eq!(common::tree_hashes(&free), common::tree_hashes(&one_worker));

    let e = run("none", Some(per_copy)).unwrap_err().to_string();
    assert!(
        e.contains("smoothquant_fp8_w8a8_gptq") && e.contains("gptq:") && e.contains("GiB"),
        "{e}"
    );
    assert!(!tmp.path().join("none").exists());
}
