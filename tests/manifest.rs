//! Manifest parsing and the calibration selection rule.

use oasr_quantize::calibration::CalibrationSet;
use oasr_quantize::Manifest;

fn setup(lines: &str, files: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::write(tmp.path().join(f), b"RIFF").unwrap();
    }
    let path = tmp.path().join("m.jsonl");
    std::fs::write(&path, lines).unwrap();
    (tmp, path)
}

#[test]
fn blank_and_comment_lines_are_skipped_and_paths_resolve_against_the_root() {
    let (tmp, path) = setup("# header\n\n{\"id\": \"b\", \"audio\": \"b.wav\", \"text\": \"bee\"}\n  \n{\"id\": \"a\", \"audio\": \"a.wav\"}\n", &["a.wav", "b.wav"]);
    let m = Manifest::read(&path, None).unwrap();
    assert_eq!(m.utterances.len(), 2);
    assert_eq!(m.utterances[0].line, 3);
    assert_eq!(m.utterances[0].audio, tmp.path().join("b.wav"));
    assert_eq!(m.utterances[0].text.as_deref(), Some("bee"));
    assert_eq!(m.utterances[1].text, None);
    assert_eq!(m.sha256, oasr_quantize::sha256_file(&path).unwrap());
    // Another audio root.
    let other = tempfile::tempdir().unwrap();
    let e = Manifest::read(&path, Some(other.path()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 3") && e.contains("`b`") && e.contains("does not exist"),
        "{e}"
    );
}

#[test]
fn errors_name_the_line() {
    for (text, expect) in [
        (
            "{\"id\": \"a\", \"audio\": \"a.wav\"}\nnot json\n",
            "line 2",
        ),
        (
            "{\"id\": \"a\", \"audio\": \"a.wav\"}\n{\"id\": \"a\", \"audio\": \"a.wav\"}\n",
            "duplicate id `a`",
        ),
        ("{\"audio\": \"a.wav\"}\n", "line 1"),
        ("{\"id\": \"\", \"audio\": \"a.wav\"}\n", "empty id"),
    ] {
        let (_tmp, path) = setup(text, &["a.wav"]);
        let e = Manifest::read(&path, None).unwrap_err().to_string();
        assert!(e.contains(expect) && e.contains("m.jsonl"), "{e}");
    }
}

#[test]
fn selection_sorts_by_id_and_strides_evenly() {
    let ids: Vec<String> = (0..10).rev().map(|i| format!("u{i}")).collect();
    let files: Vec<String> = ids.iter().map(|i| format!("{i}.wav")).collect();
    let lines: String = ids
        .iter()
        .map(|i| format!("{{\"id\": \"{i}\", \"audio\": \"{i}.wav\"}}\n"))
        .collect();
    let (_tmp, path) = setup(
        &lines,
        &files.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let m = Manifest::read(&path, None).unwrap();
    let set = CalibrationSet::select(&m, 4, 16000).unwrap();
    let chosen: Vec<&str> = set.utterances.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(chosen, ["u0", "u2", "u5", "u7"]);
    assert_eq!(
        (set.record.utterances_total, set.record.utterances_used),
        (10, 4)
    );
    assert_eq!(
        CalibrationSet::select(&m, 100, 16000)
            .unwrap()
            .utterances
            .len(),
        10
    );
    assert!(CalibrationSet::select(&m, 0, 16000).is_err());
    // The audio hash covers the chosen files and changes when one changes.
    let before = set.record.audio_sha256.clone();
    std::fs::write(path.parent().unwrap().join("u2.wav"), b"RIFF2").unwrap();
    assert_ne!(
        before,
        CalibrationSet::select(&m, 4, 16000)
            .unwrap()
            .record
            .audio_sha256
    );
    assert_eq!(before.len(), 64);
}

#[test]
fn audio_that_is_not_a_regular_file_is_named_for_what_it_is() {
    // A directory, a FIFO (which would block a reader forever) and an empty manifest.
    let (tmp, path) = setup("{\"id\": \"d\", \"audio\": \"dir.wav\"}\n", &[]);
    std::fs::create_dir(tmp.path().join("dir.wav")).unwrap();
    let e = Manifest::read(&path, None).unwrap_err().to_string();
    assert!(e.contains("`d`") && e.contains("is a directory"), "{e}");
    let (tmp, path) = setup("{\"id\": \"f\", \"audio\": \"fifo.wav\"}\n", &[]);
    let fifo = tmp.path().join("fifo.wav");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = Manifest::read(&path, None).unwrap_err().to_string();
    assert!(e.contains("`f`") && e.contains("not a regular file"), "{e}");
    let (_tmp, path) = setup("# only a comment\n\n", &[]);
    let e = Manifest::read(&path, None).unwrap_err().to_string();
    assert!(e.contains("m.jsonl") && e.contains("no utterance"), "{e}");
}

#[test]
fn a_pathological_audio_path_is_shortened_in_the_message() {
    let long = "x".repeat(100_000);
    let (_tmp, path) = setup(
        &format!("{{\"id\": \"long\", \"audio\": \"{long}.wav\"}}\n"),
        &[],
    );
    let e = Manifest::read(&path, None).unwrap_err().to_string();
    assert!(e.contains("`long`") && e.contains("characters)"), "{e}");
    assert!(e.len() < 1_000, "{} characters", e.len());
}
