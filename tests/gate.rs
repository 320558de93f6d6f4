//! The WER gate end to end on the real tiny.en and real speech, on a tiny profile: a missing
//! reference fails, `--record` writes it in place (comments kept), the recorded gate passes, and
//! a reference or floor the checkpoint misses fails with the reason.

mod common;

use common::cli;

fn gate_file(dir: &std::path::Path, entry_extra: &str) -> std::path::PathBuf {
    let (calib, gate) = common::manifests();
    let path = dir.join("gate.toml");
    std::fs::write(
        &path,
        format!(
            "# kept comment\nmodel = '{}'\ncalib_manifest = '{}'\ngate_manifest = '{}'\ntolerance = 0.3\n\n[profiles.tiny]\ngate_utterances = 3\n\n[[entry]]\nname = 'int8_rtn'\nrecipe = 'int8_w8a8_rtn'\n{entry_extra}",
            common::tiny_en().display(),
            calib.display(),
            gate.display()
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
        out.contains("no reference WER recorded for profile `tiny`"),
        "{out}"
    );
    assert!(err.contains("gate failed: 1 of 1"), "{err}");
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
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let measured = report["results"][0]["wer_quantized"].as_f64().unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let recorded = parsed["entry"][0]["reference_wer"]["tiny"]
        .as_float()
        .unwrap();
    assert!(
        (recorded - measured).abs() < 0.006,
        "{recorded} vs {measured}"
    );
    assert_eq!(report["results"][0]["verify"]["utterances"], 3);

    let (ok, out, err) = cli(&["gate", g, "--profile", "tiny"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("int8_rtn") && out.contains("pass"), "{out}");

    // A reference the checkpoint cannot meet, and a cosine floor no quantized model reaches.
    gate_file(
        tmp.path(),
        "min_cosine = 1.0\n[entry.reference_wer]\ntiny = -1.0\n",
    );
    let (ok, out, _) = cli(&["gate", g, "--profile", "tiny"]);
    assert!(!ok, "{out}");
    assert!(out.contains("exceeds the reference -1.00% + 0.30"), "{out}");
    assert!(out.contains("is below 1"), "{out}");
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
        "model = '${OASR_GATE_TEST_NEVER_SET}'\ncalib_manifest = 'c'\ngate_manifest = 'g'\n[profiles.p]\n[[entry]]\nname = 'a'\nrecipe = 'int8_w8a8_rtn'\n",
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
}
