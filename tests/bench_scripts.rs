//! The Python scripts that turn `verify` and `gate` reports into the paired comparisons of
//! docs/accuracy.md (benches/paired_cosine.py, benches/paired_wer.py) and the WER port they
//! share with tests/compressed_tensors/check_transformers.py. They need only the standard
//! library; run here on small reports whose answers are worked out by hand, so a broken import
//! or a changed formula fails CI instead of the next measurement.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::json;

fn python(args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new("python3")
        .args(args)
        .current_dir(root)
        .output()
        .expect("python3 runs (the project's scripts need it)")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(dir: &Path, name: &str, value: &serde_json::Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

/// A verify report with each utterance's teacher-forced (steps, cosine mean).
fn verify_report(utterances: &[(&str, u64, f64)]) -> serde_json::Value {
    let transcripts: Vec<_> = utterances
        .iter()
        .map(|(id, steps, cos)| json!({"id": id, "teacher_forced": {"steps": steps, "cosine_mean": cos}}))
        .collect();
    json!({ "transcripts": transcripts })
}

#[test]
fn the_wer_port_passes_its_self_test() {
    stdout(&python(&[
        "tests/compressed_tensors/check_transformers.py",
        "--self-test",
    ]));
}

#[test]
fn paired_cosine_weighs_each_utterance_by_its_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(
        tmp.path(),
        "a.json",
        &verify_report(&[("u1", 10, 0.99), ("u2", 30, 0.98)]),
    );
    let b = write(
        tmp.path(),
        "b.json",
        &verify_report(&[("u1", 10, 0.995), ("u2", 30, 0.97)]),
    );
    // (10·0.99 + 30·0.98 − 10·0.995 − 30·0.97) / 40 = 0.25 / 40
    let out = stdout(&python(&["benches/paired_cosine.py", &a, &b]));
    assert!(
        out.contains("2 utterances, 40 teacher-forced steps: cosine mean A − B +0.006250"),
        "{out}"
    );
}

#[test]
fn paired_cosine_refuses_reports_that_scored_other_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.json", &verify_report(&[("u1", 10, 0.99)]));
    let b = write(tmp.path(), "b.json", &verify_report(&[("u1", 11, 0.99)]));
    let out = python(&["benches/paired_cosine.py", &a, &b]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("u1: 10 steps in A, 11 in B"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn paired_wer_compares_entries_over_the_same_utterances() {
    let tmp = tempfile::tempdir().unwrap();
    let utterance = |id: &str, text: &str, fp: &str, q: &str| json!({"id": id, "reference_text": text, "full_precision": fp, "quantized": q});
    let entry = |name: &str, q2: &str| {
        json!({"name": name, "set": "s", "verify": {"transcripts": [
            utterance("u1", "the cat sat", "the cat sat", "the bat sat"),
            utterance("u2", "a b c d", "a b c", q2),
        ]}})
    };
    // 7 reference words; full precision 1 error; `worse` 1 + 2 errors, `better` 1 + 0.
    let report = write(
        tmp.path(),
        "gate.json",
        &json!({"results": [entry("worse", "a b"), entry("better", "a b c d")]}),
    );
    let out = stdout(&python(&["benches/paired_wer.py", &report]));
    assert!(out.contains("s: 2 utterances, 7 words"), "{out}");
    assert!(out.contains("worse                        +28.57"), "{out}"); // (3 − 1) / 7
    assert!(out.contains("better                       +0.00"), "{out}"); // (1 − 1) / 7
    let out = stdout(&python(&[
        "benches/paired_wer.py",
        &report,
        "--against",
        "better",
    ]));
    assert!(out.contains("worse                        +28.57"), "{out}"); // (3 − 1) / 7
}
