//! The WER gate end to end on the real tiny.en and real speech, on a tiny profile with two sets:
//! a missing reference fails, `--record` writes it in place per set (comments kept), the recorded
//! gate passes, and a reference, floor or baseline the checkpoint misses fails with the reason.

mod common;

use common::cli;

fn gate_file(dir: &std::path::Path, entry_extra: &str) -> std::path::PathBuf {
    let (calib, gate) = common::manifests();
    let path = dir.join("gate.toml");
    std::fs::write(
        &path,
        format!(
            "# kept comment\nmodel = '{}'\ncalib_manifest = '{}'\ntolerance = 0.3\n\n[sets.in_domain]\nmanifest = '{}'\n[sets.other]\nmanifest = '{}'\n\n[profiles.tiny]\ngate_utterances = 3\n[profiles.one]\ngate_utterances = 2\nsets = ['other']\n\n[[entry]]\nname = 'int8_rtn'\nrecipe = 'int8_w8a8_rtn'\n{entry_extra}",
            common::tiny_en().display(),
            calib.display(),
            gate.display(),
            calib.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn gate_fails_without_reference_records_and_then_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = gate_file(tmp.path(), "");
    let g = gate.to_str().unwrap();
    let keep = tmp.path().join("work");
    let k = keep.to_str().unwrap();

    let (ok, out, err) = cli(&["gate", g, "--profile", "tiny", "--keep", k]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("no reference WER recorded for profile `tiny`, set `in_domain`")
            && out.contains("no reference WER recorded for profile `tiny`, set `other`"),
        "{out}"
    );
    assert!(err.contains("gate failed: 2 of 2"), "{err}");
    assert!(keep.join("int8_rtn/model.safetensors").is_file());

    let json = tmp.path().join("gate.json");
    let (ok, out, err) = cli(&[
        "gate",
        g,
        "--profile",
        "tiny",
        "--record",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    let text = std::fs::read_to_string(&gate).unwrap();
    assert!(text.starts_with("# kept comment\n"), "{text}");
    // The profile's table gets a header; the table holding the profiles does not.
    assert!(
        text.contains("[entry.reference_wer.tiny]") && !text.contains("[entry.reference_wer]\n"),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    for (i, set) in ["in_domain", "other"].iter().enumerate() {
        assert_eq!(report["results"][i]["set"], *set);
        let measured = report["results"][i]["wer_quantized"].as_f64().unwrap();
        let recorded = parsed["entry"][0]["reference_wer"]["tiny"][set]
            .as_float()
            .unwrap();
        assert!(
            (recorded - measured).abs() < 0.006,
            "{set}: {recorded} vs {measured}"
        );
        assert_eq!(report["results"][i]["verify"]["utterances"], 3);
    }

    let (ok, out, err) = cli(&["gate", g, "--profile", "tiny"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("int8_rtn") && out.contains("pass"), "{out}");
    // A profile that names one set verifies only that one.
    let (ok, out, _) = cli(&["gate", g, "--profile", "one"]);
    assert!(
        !ok && out.contains("set `other`") && !out.contains("in_domain"),
        "{out}"
    );

    // A reference the checkpoint cannot meet, and cosine floors no quantized model reaches.
    gate_file(
        tmp.path(),
        "min_cosine = { other = 1.0 }\nmin_step_cosine = { in_domain = 1.0 }\n[entry.reference_wer.tiny]\nin_domain = -1.0\nother = 50.0\n",
    );
    let (ok, out, _) = cli(&["gate", g, "--profile", "tiny"]);
    assert!(!ok, "{out}");
    assert!(out.contains("exceeds the reference -1.00% + 0.30"), "{out}");
    assert!(
        out.contains("teacher-forced logit cosine") && out.contains("is below 1"),
        "{out}"
    );
    assert!(out.contains("worst teacher-forced step's cosine"), "{out}");
}

/// `not_below`: an entry whose cosine mean is under its baseline's on a set fails there, naming
/// the baseline; the other direction passes.
#[test]
fn gate_compares_an_entry_with_its_baseline() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = gate_file(
        tmp.path(),
        "not_below = 'fp8_rtn'\n[entry.reference_wer.one]\nother = 100.0\n[[entry]]\nname = 'fp8_rtn'\nrecipe = 'fp8_w8a8_rtn'\nnot_below = 'int8_rtn'\n[entry.reference_wer.one]\nother = 100.0\n",
    );
    let json = tmp.path().join("gate.json");
    let (ok, out, _) = cli(&[
        "gate",
        gate.to_str().unwrap(),
        "--profile",
        "one",
        "--json",
        json.to_str().unwrap(),
    ]);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cos = |i: usize| {
        report["results"][i]["verify"]["teacher_forced"]["cosine_mean"]
            .as_f64()
            .unwrap()
    };
    let (int8, fp8) = (cos(0), cos(1));
    assert_ne!(int8, fp8, "{out}");
    // Exactly the lower one fails, naming the other.
    let (loser, winner) = if int8 < fp8 {
        (0, "fp8_rtn")
    } else {
        (1, "int8_rtn")
    };
    assert!(!ok, "{out}");
    let failures = report["results"][loser]["failures"].to_string();
    assert!(
        failures.contains(&format!("below `{winner}`'s")),
        "{failures}"
    );
    assert_eq!(
        report["results"][1 - loser]["failures"]
            .as_array()
            .unwrap()
            .len(),
        0,
        "{out}"
    );
}

#[test]
fn gate_refuses_bad_input_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = gate_file(tmp.path(), "");
    let g = gate.to_str().unwrap();

    let (ok, _, err) = cli(&["gate", g, "--profile", "nightly"]);
    assert!(
        !ok && err.contains("`nightly` is not a profile") && err.contains("tiny"),
        "{err}"
    );
    let (ok, _, err) = cli(&["gate", g, "--profile", "tiny", "--only", "fp16"]);
    assert!(!ok && err.contains("`fp16` is not an entry"), "{err}");

    let dup = gate_file(
        tmp.path(),
        "\n[[entry]]\nname = 'int8_rtn'\nrecipe = 'fp8_w8a8_rtn'\n",
    );
    let (ok, _, err) = cli(&["gate", dup.to_str().unwrap(), "--profile", "tiny"]);
    assert!(
        !ok && err.contains("entry `int8_rtn` appears twice"),
        "{err}"
    );

    let other = tmp.path().join("env.toml");
    std::fs::write(
        &other,
        "model = '${OASR_GATE_TEST_NEVER_SET}'\ncalib_manifest = 'c'\n[sets.s]\nmanifest = 'g'\n[profiles.p]\n[[entry]]\nname = 'a'\nrecipe = 'int8_w8a8_rtn'\n",
    )
    .unwrap();
    let (ok, _, err) = cli(&["gate", other.to_str().unwrap()]);
    assert!(
        !ok && err.contains("OASR_GATE_TEST_NEVER_SET") && err.contains("env.toml"),
        "{err}"
    );

    let typo = gate_file(tmp.path(), "recipes = 'x'\n");
    let (ok, _, err) = cli(&["gate", typo.to_str().unwrap(), "--profile", "tiny"]);
    assert!(!ok && err.contains("recipes"), "{err}");

    let unknown_set = gate_file(tmp.path(), "min_cosine = { cross = 0.9 }\n");
    let (ok, _, err) = cli(&["gate", unknown_set.to_str().unwrap(), "--profile", "tiny"]);
    assert!(!ok && err.contains("unknown set `cross`"), "{err}");
    let bad_baseline = gate_file(tmp.path(), "not_below = 'int8_rtn'\n");
    let (ok, _, err) = cli(&["gate", bad_baseline.to_str().unwrap(), "--profile", "tiny"]);
    assert!(!ok && err.contains("`not_below` names `int8_rtn`"), "{err}");

    // gate_file rewrote `g`: a valid gate file of its own for the GPU options.
    let valid = tempfile::tempdir().unwrap();
    let valid = gate_file(valid.path(), "");
    let g = valid.to_str().unwrap();
    let (ok, _, err) = cli(&[
        "gate",
        g,
        "--profile",
        "tiny",
        "--device",
        "cuda",
        "--record",
    ]);
    assert!(!ok && err.contains("--record with --device cuda"), "{err}");
    // Without the cuda feature the GPU gate is refused before anything is quantized.
    #[cfg(not(feature = "cuda"))]
    {
        let work = tmp.path().join("work");
        let args = ["--profile", "tiny", "--device", "cuda", "--keep"];
        let (ok, _, err) = cli(&[&["gate", g][..], &args[..], &[work.to_str().unwrap()]].concat());
        assert!(
            !ok && err.contains("built without the `cuda` feature") && !work.exists(),
            "{err}"
        );
    }
    let tolerance = gate_file(tmp.path(), "").to_str().unwrap().to_string();
    let text = std::fs::read_to_string(&tolerance).unwrap();
    std::fs::write(
        &tolerance,
        text.replace(
            "tolerance = 0.3",
            "tolerance = 0.3\ngpu_cosine_tolerance = -1",
        ),
    )
    .unwrap();
    let (ok, _, err) = cli(&["gate", &tolerance, "--profile", "tiny"]);
    assert!(!ok && err.contains("`gpu_cosine_tolerance`"), "{err}");
}

#[test]
fn an_entry_with_its_own_model_runs_when_configured_and_is_skipped_visibly_when_not() {
    let tmp = tempfile::tempdir().unwrap();
    // The ESPnet-built small Conformer (seeded weights) beside Whisper's entry.
    let conformer = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wenet/espnet/wenet-small");
    let gate = gate_file(
        tmp.path(),
        "\n[[entry]]\nname = 'conformer_rtn'\nmodel = '${OASR_GATE_TEST_CONFORMER:-}'\nrecipe = 'int8_w8a8_rtn'\n",
    );
    let g = gate.to_str().unwrap();
    let (ok, out, _) = cli(&["gate", g, "--profile", "one", "--record"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("conformer_rtn")
            && out.contains(
                "SKIPPED: its model path `${OASR_GATE_TEST_CONFORMER:-}` is not configured"
            ),
        "{out}"
    );
    let config = oasr_quantize::gate::GateConfig::load(&gate).unwrap();
    assert_eq!(config.entry_models["conformer_rtn"], None);

    std::env::set_var("OASR_GATE_TEST_CONFORMER", &conformer);
    let config = oasr_quantize::gate::GateConfig::load(&gate).unwrap();
    assert_eq!(
        config.entry_models["conformer_rtn"].as_deref(),
        Some(conformer.as_path())
    );
    let options = oasr_quantize::gate::GateOptions {
        profile: "one".into(),
        only: vec!["conformer_rtn".into()],
        work_dir: tmp.path().join("work"),
        served: oasr_quantize::numerics::OutDtype::F16,
        device: oasr_quantize::verify::VerifyDevice::Cpu,
    };
    let report =
        oasr_quantize::gate::run_gate(&config, &options, std::sync::Arc::new(|_: &_| {})).unwrap();
    assert!(report.skipped.is_empty());
    assert_eq!(report.results.len(), 1);
    let r = &report.results[0];
    assert_eq!(r.verify.nonfinite, 0);
    // A random-weight model: a reference is still missing, and the gate says so.
    assert!(
        r.failures.iter().any(|f| f.contains("no reference WER")),
        "{:?}",
        r.failures
    );
}

/// An entry's search options steer verification too, so a recipe that does not calibrate takes
/// them (they were refused as "nothing would use them" before).
#[test]
fn an_entry_that_does_not_calibrate_verifies_with_its_search() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = gate_file(tmp.path(), "beam_size = 2\n");
    let json = tmp.path().join("gate.json");
    let (ok, out, err) = cli(&[
        "gate",
        gate.to_str().unwrap(),
        "--profile",
        "one",
        "--json",
        json.to_str().unwrap(),
    ]);
    // No reference is recorded, so the gate fails, but it ran.
    assert!(!ok && !err.contains("--beam-size"), "{out}\n{err}");
    assert!(out.contains("no reference WER recorded"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["results"][0]["verify"]["utterances"], 2);
}

/// The gate files the project ships parse, every entry's recipe (built-in or a file of the
/// repository) loads with its options, and every entry of calib/gate.toml that runs without a
/// model of its own has its ci references and floors on both sets.
#[test]
fn the_shipped_gate_files_load() {
    use oasr_quantize::gate::GateConfig;
    use oasr_quantize::recipe::Recipe;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "calib/gate.toml",
        "benches/ablation.toml",
        "benches/fp8-gpu.toml",
        "benches/beam.toml",
    ] {
        let gate = GateConfig::load(&root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!gate.entries.is_empty(), "{file}");
        for entry in &gate.entries {
            let path = root.join(&entry.recipe);
            let name = if path.is_file() {
                path.to_string_lossy().into_owned()
            } else {
                entry.recipe.clone()
            };
            let mut recipe =
                Recipe::load(&name).unwrap_or_else(|e| panic!("{file} {}: {e}", entry.name));
            for (key, value) in &entry.options {
                recipe
                    .set_option(&format!("{key}={value}"))
                    .unwrap_or_else(|e| panic!("{file} {}: {e}", entry.name));
            }
            if file == "calib/gate.toml" && entry.model.is_none() {
                let ci = &entry.reference_wer["ci"];
                for set in ["in_domain", "cross_domain"] {
                    assert!(
                        ci.contains_key(set),
                        "{} has no ci reference on {set}",
                        entry.name
                    );
                }
            }
        }
    }
}
