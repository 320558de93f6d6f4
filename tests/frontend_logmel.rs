//! The Whisper log-mel frontend against golden values from an independent implementation
//! (tests/fixtures/logmel/make_golden.py: numpy float64 mirroring openai-whisper's audio.py and
//! transcribe.py, with OpenAI's own mel_filters.npz) on a real speech clip.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use oasr_quantize::frontend::whisper_logmel::{N_FRAMES, N_SAMPLES, SAMPLE_RATE};
use oasr_quantize::frontend::{read_audio, slaney_mel_filters, Padding, WhisperFrontend};
use serde_json::Value;

/// The bound the issue sets for the log-mel values.
const LOGMEL_TOLERANCE: f32 = 1e-4;
/// The bound for the filter bank against mel_filters.npz.
const FILTER_TOLERANCE: f32 = 1e-6;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logmel")
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn read_f32(name: &str) -> Vec<f32> {
    common::read_f32(&fixture_dir().join(name))
}

fn clip() -> Vec<f32> {
    let meta = golden();
    let file = meta["clip"]["file"].as_str().unwrap();
    let samples = read_audio(&fixture_dir().join(file), SAMPLE_RATE).unwrap();
    assert_eq!(
        samples.len() as u64,
        meta["clip"]["samples"].as_u64().unwrap()
    );
    samples
}

/// The > 30 s input make_golden.py builds: 13 copies of the clip at gain 0.25, then the clip.
fn tiled(clip: &[f32]) -> Vec<f32> {
    let mut out: Vec<f32> = (0..13)
        .flat_map(|_| clip.iter().map(|&s| s * 0.25))
        .collect();
    out.extend_from_slice(clip);
    out
}

fn expand_frames(ranges: &Value) -> Vec<usize> {
    ranges
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let r: Vec<usize> = r
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            (r[0]..r[1]).step_by(r[2])
        })
        .collect()
}

fn padding_of(mode: &str) -> Padding {
    match mode {
        "transcribe" => Padding::Transcribe,
        "detect_language" => Padding::DetectLanguage,
        "pad_or_trim_audio" => Padding::PadOrTrimAudio,
        other => panic!("unknown mode {other} in golden.json"),
    }
}

#[test]
fn frontend_slaney_filters_match_openai_mel_filters_npz() {
    let meta = golden();
    for entry in meta["filters"].as_array().unwrap() {
        let n_mels = entry["n_mels"].as_u64().unwrap() as usize;
        let reference = read_f32(entry["file"].as_str().unwrap());
        assert_eq!(reference.len(), n_mels * 201);
        let ours = slaney_mel_filters(SAMPLE_RATE, 400, n_mels);
        let frontend = WhisperFrontend::new(n_mels).unwrap();
        assert_eq!(frontend.filters(), &ours[..]);
        let max_diff = ours
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("mel filters {n_mels}: max abs diff vs mel_filters.npz {max_diff:e}");
        assert!(
            max_diff <= FILTER_TOLERANCE,
            "n_mels {n_mels}: max abs diff {max_diff:e}"
        );
        // Zero exactly where OpenAI's is zero: the sparse bands must not lose or gain bins.
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert_eq!(
                *a == 0.0,
                *b == 0.0,
                "n_mels {n_mels}, index {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn frontend_logmel_matches_golden_on_a_real_clip() {
    let meta = golden();
    let clip = clip();
    let tiled = tiled(&clip);
    let mut worst = 0.0f32;
    for entry in meta["logmel"].as_array().unwrap() {
        let mode = entry["mode"].as_str().unwrap();
        let n_mels = entry["n_mels"].as_u64().unwrap() as usize;
        let input = match entry["input"].as_str().unwrap() {
            "clip" => &clip,
            "tiled" => &tiled,
            other => panic!("unknown input {other}"),
        };
        assert_eq!(input.len() as u64, entry["input_samples"].as_u64().unwrap());
        let frames = expand_frames(&entry["frames"]);
        let reference = read_f32(entry["file"].as_str().unwrap());
        assert_eq!(reference.len(), n_mels * frames.len());

        let frontend = WhisperFrontend::new(n_mels).unwrap();
        let mel = frontend.log_mel_with(input, padding_of(mode));
        assert_eq!((mel.n_mels, mel.frames), (n_mels, N_FRAMES));
        assert_eq!(mel.data.len(), n_mels * N_FRAMES);
        let content = entry["content_frames"].as_u64().unwrap() as usize;
        assert_eq!(mel.content_frames, content.min(N_FRAMES), "{mode}");

        let mut max_diff = 0.0f32;
        let mut at = (0, 0);
        for m in 0..n_mels {
            for (k, &f) in frames.iter().enumerate() {
                let d = (mel.at(m, f) - reference[m * frames.len() + k]).abs();
                if d > max_diff {
                    max_diff = d;
                    at = (m, f);
                }
            }
        }
        eprintln!(
            "{mode} n_mels {n_mels} {}: {} values, max abs diff {max_diff:e} at (mel {}, frame {})",
            entry["input"].as_str().unwrap(),
            n_mels * frames.len(),
            at.0,
            at.1
        );
        assert!(
            max_diff <= LOGMEL_TOLERANCE,
            "{mode} n_mels {n_mels}: max abs diff {max_diff:e} at {at:?}"
        );
        worst = worst.max(max_diff);
    }
    eprintln!("worst max abs diff over all golden cases: {worst:e}");
}

#[test]
fn frontend_transcribe_pads_past_content_with_zeros() {
    let clip = clip();
    let frontend = WhisperFrontend::new(80).unwrap();
    let mel = frontend.log_mel(&clip);
    assert_eq!(mel, frontend.log_mel_with(&clip, Padding::Transcribe));
    let content = clip.len() / 160;
    assert_eq!(mel.content_frames, content);
    for m in 0..80 {
        assert!(mel.row(m)[content..].iter().all(|&v| v == 0.0));
        assert!(mel.row(m)[..content].iter().any(|&v| v != 0.0));
    }
    // The other paths keep the (floored) log-mel of the trailing silence instead.
    let detect = frontend.log_mel_with(&clip, Padding::DetectLanguage);
    assert!(detect.row(0)[content + 5..].iter().all(|&v| v != 0.0));
    // Same padded spectrogram, same floor: the content frames agree.
    for m in 0..80 {
        assert_eq!(&detect.row(m)[..content], &mel.row(m)[..content]);
    }
}

#[test]
fn frontend_logmel_30s_is_fast() {
    let clip = clip();
    let audio: Vec<f32> = clip.iter().copied().cycle().take(N_SAMPLES).collect();
    let frontend = WhisperFrontend::new(80).unwrap();
    let mut best = [f64::INFINITY; 2];
    for _ in 0..5 {
        for (k, padding) in [Padding::Transcribe, Padding::PadOrTrimAudio]
            .into_iter()
            .enumerate()
        {
            let t = Instant::now();
            let mel = frontend.log_mel_with(&audio, padding);
            best[k] = best[k].min(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(mel.content_frames, N_FRAMES);
        }
    }
    eprintln!(
        "30 s log-mel: {:.2} ms (transcribe), {:.2} ms (pad_or_trim_audio), best of 5",
        best[0], best[1]
    );
    if !cfg!(debug_assertions) {
        assert!(best[0] < 50.0 && best[1] < 50.0, "{best:?} ms");
    }
}
