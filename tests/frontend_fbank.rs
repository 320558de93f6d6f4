//! The Kaldi fbank frontend (WeNet's features) against two independent implementations on real
//! speech clips: torchaudio's `compliance.kaldi.fbank` (tests/fixtures/wenet/make_fbank_golden.py)
//! and kaldi-native-fbank (make_fbank_golden_knf.py); the frame count rule; the spec checks of
//! `Frontend::from_spec`; and WeNet's global CMVN file.

mod common;

use std::path::{Path, PathBuf};

use oasr_quantize::checkpoint::{Checkpoint, FeatureSpec};
use oasr_quantize::frontend::kaldi_fbank::{num_frames, FRAME_LENGTH, FRAME_SHIFT, SAMPLE_RATE};
use oasr_quantize::frontend::{read_audio, Frontend, GlobalCmvn, KaldiFbank, KALDI_FBANK};
use oasr_quantize::models::whisper::WhisperAsr;
use serde_json::Value;

// The bounds on the absolute difference of a log mel energy (natural log, values about -1 to 25)
// from each golden, over all 394 x 80 values of both clips: the largest, and the mean.
// Measured (docs/frontend.md): torchaudio max 1.98e-4, mean 3.9e-6; kaldi-native-fbank max
// 1.94e-4, mean 4.6e-6. Both references compute in f32 and differ from each other by up to
// 2.8e-4 (mean 6.5e-6); ours (f64) agrees with a numpy float64 transcription of the same steps
// to the f32 rounding of the output, so these differences are the references' own rounding, at
// its largest in the low mel bins that preemphasis attenuates. A wrong step moves both by orders
// of magnitude (checked by hand): preemphasis 0.96 instead of 0.97 gives max 2.0, mean 3.2e-2;
// a plain Hann window instead of povey max 3.8, mean 9.6e-2; no DC offset removal max 4.9,
// mean 1.3e-2; low_freq 0 instead of 20 Hz max 7.6, mean 0.40.
const TORCHAUDIO_MAX_TOLERANCE: f32 = 2.5e-4;
const TORCHAUDIO_MEAN_TOLERANCE: f32 = 1e-5;
const KNF_MAX_TOLERANCE: f32 = 2.5e-4;
const KNF_MEAN_TOLERANCE: f32 = 1e-5;

const CLIPS: [&str; 2] = ["praatio-bobby", "pocketsphinx-goforward"];

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wenet")
}

fn read_f32(name: &str) -> Vec<f32> {
    common::read_f32(&fixture_dir().join(name))
}

fn shape(name: &str) -> (usize, usize) {
    let text = std::fs::read_to_string(fixture_dir().join(name)).unwrap();
    let meta: Value = serde_json::from_str(&text).unwrap();
    let s = meta["shape"].as_array().unwrap();
    (
        s[0].as_u64().unwrap() as usize,
        s[1].as_u64().unwrap() as usize,
    )
}

fn clip(stem: &str) -> Vec<f32> {
    read_audio(&fixture_dir().join(format!("{stem}.wav")), SAMPLE_RATE).unwrap()
}

/// Our features of every clip against the golden `X.fbank-{source}.f32`: (max, mean) absolute
/// difference over all values.
fn compare(source: &str) -> (f32, f32) {
    let frontend = KaldiFbank::new(80).unwrap();
    let (mut worst, mut sum, mut count) = (0.0f32, 0.0f64, 0usize);
    for stem in CLIPS {
        let samples = clip(stem);
        let golden = read_f32(&format!("{stem}.fbank-{source}.f32"));
        let (frames, dim) = shape(&format!("{stem}.fbank-{source}.json"));
        assert_eq!(golden.len(), frames * dim);
        let ours = frontend.compute(&samples).unwrap();
        assert_eq!((ours.frames, ours.n_mels), (frames, dim), "{stem}");
        assert_eq!(ours.frames, num_frames(samples.len()));
        let mut max_diff = 0.0f32;
        let mut at = (0, 0);
        let mut clip_sum = 0.0f64;
        for (i, (a, b)) in ours.data.iter().zip(&golden).enumerate() {
            let d = (a - b).abs();
            clip_sum += f64::from(d);
            if d > max_diff {
                max_diff = d;
                at = (i / dim, i % dim);
            }
        }
        eprintln!(
            "{stem} vs {source}: {frames}x{dim}, max abs diff {max_diff:e} at (frame {}, mel {}) \
             (golden {}, ours {}), mean {:e}",
            at.0,
            at.1,
            golden[at.0 * dim + at.1],
            ours.at(at.0, at.1),
            clip_sum / golden.len() as f64
        );
        worst = worst.max(max_diff);
        sum += clip_sum;
        count += golden.len();
    }
    let mean = (sum / count as f64) as f32;
    eprintln!("{source}: worst max abs diff {worst:e}, mean abs diff {mean:e}");
    (worst, mean)
}

#[test]
fn fbank_matches_torchaudio() {
    let (max, mean) = compare("torchaudio");
    assert!(max <= TORCHAUDIO_MAX_TOLERANCE, "max abs diff {max:e}");
    assert!(mean <= TORCHAUDIO_MEAN_TOLERANCE, "mean abs diff {mean:e}");
}

#[test]
fn fbank_matches_kaldi_native_fbank() {
    let (max, mean) = compare("knf");
    assert!(max <= KNF_MAX_TOLERANCE, "max abs diff {max:e}");
    assert!(mean <= KNF_MEAN_TOLERANCE, "mean abs diff {mean:e}");
}

#[test]
fn fbank_frame_count_is_snip_edges() {
    let frontend = KaldiFbank::new(80).unwrap();
    let samples = clip("pocketsphinx-goforward");
    let whole = frontend.compute(&samples).unwrap();
    for n in [400, 401, 559, 560, 561, 719, 720, 16_000, 16_159, 16_160] {
        let f = frontend.compute(&samples[..n]).unwrap();
        let expected = 1 + (n - FRAME_LENGTH) / FRAME_SHIFT;
        assert_eq!((f.frames, f.n_mels), (expected, 80), "{n} samples");
        assert_eq!(f.data.len(), expected * 80);
        assert_eq!(num_frames(n), expected);
        // Frames are computed from their own samples only: a prefix gives the same rows.
        assert_eq!(f.data[..], whole.data[..expected * 80], "{n} samples");
    }
    assert_eq!(num_frames(399), 0);
    assert_eq!(whole.frames, 1 + (samples.len() - 400) / 160);
}

#[test]
fn fbank_refuses_a_clip_shorter_than_one_frame() {
    let frontend = KaldiFbank::new(80).unwrap();
    for n in [0, 1, 399] {
        let err = frontend.compute(&vec![0.1; n]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{n} samples")) && err.contains("25 ms"),
            "{n}: {err}"
        );
    }
    assert_eq!(frontend.compute(&[0.1; 400]).unwrap().frames, 1);
}

// ---- the spec check ----

fn wenet_spec() -> FeatureSpec {
    FeatureSpec {
        kind: KALDI_FBANK.into(),
        sample_rate: 16_000,
        feature_dim: 80,
        frame_length_ms: 25.0,
        frame_shift_ms: 10.0,
        dither: 0.0,
        lfr_m: 1,
        lfr_n: 1,
        window_type: "povey".into(),
        normalize: None,
        audio_scale: 32768.0,
        window_seconds: None,
        preemphasis: Some(0.97),
    }
}

#[test]
fn from_spec_builds_kaldi_fbank_for_wenet_options() {
    match Frontend::from_spec(&wenet_spec()).unwrap() {
        Frontend::KaldiFbank(f) => assert_eq!(f.n_mels(), 80),
        other => panic!("expected KaldiFbank, got {other:?}"),
    }
}

#[test]
fn from_spec_refuses_options_kaldi_fbank_does_not_compute() {
    type Edit = fn(&mut FeatureSpec);
    let cases: [(&str, &str, Edit); 12] = [
        ("sample_rate", "8000", |s| s.sample_rate = 8000),
        ("feature_dim", "0", |s| s.feature_dim = 0),
        ("frame_length_ms", "20", |s| s.frame_length_ms = 20.0),
        ("frame_shift_ms", "12.5", |s| s.frame_shift_ms = 12.5),
        ("dither", "1", |s| s.dither = 1.0),
        ("window_type", "\"hamming\"", |s| {
            s.window_type = "hamming".into()
        }),
        ("audio_scale", "1", |s| s.audio_scale = 1.0),
        ("preemphasis", "0", |s| s.preemphasis = Some(0.0)),
        ("preemphasis", "null", |s| s.preemphasis = None),
        ("lfr_m", "7", |s| s.lfr_m = 7),
        ("lfr_n", "6", |s| s.lfr_n = 6),
        ("window_seconds", "30", |s| s.window_seconds = Some(30.0)),
    ];
    for (field, value, edit) in cases {
        let mut spec = wenet_spec();
        edit(&mut spec);
        let err = Frontend::from_spec(&spec).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, oasr_quantize::Error::NotImplemented { .. }),
            "{field}: {text}"
        );
        assert!(
            text.contains(&format!("`features.{field}` = {value} ")),
            "{field}: {text}"
        );
        assert!(text.contains(KALDI_FBANK), "{field}: {text}");
    }
    // Too many bins for a 512-point FFT is refused by the frontend itself.
    let mut spec = wenet_spec();
    spec.feature_dim = 400;
    let text = Frontend::from_spec(&spec).unwrap_err().to_string();
    assert!(text.contains("n_mels"), "{text}");
}

#[test]
fn whisper_refuses_kaldi_fbank_features() {
    let mut ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    ckpt.config.features = Some(wenet_spec());
    let err = WhisperAsr::new(&ckpt).err().expect("must be refused");
    let text = err.to_string();
    assert!(
        text.contains("features.kind")
            && text.contains("kaldi_fbank")
            && text.contains("whisper_logmel"),
        "{text}"
    );
}

// ---- global CMVN ----

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn cmvn_reads_wenet_global_cmvn_and_normalises() {
    let tmp = tempfile::tempdir().unwrap();
    // Two dimensions over 4 frames: x0 in {1, 2, 3, 6} (sum 12, sum of squares 50), x1 constant
    // 5 (sum 20, squares 100: zero variance, floored at 1e-20).
    let path = write(
        tmp.path(),
        "global_cmvn",
        r#"{"mean_stat": [12.0, 20], "var_stat": [50.0, 100.0], "frame_num": 4}"#,
    );
    let cmvn = GlobalCmvn::read(&path, 2).unwrap();
    assert_eq!(cmvn.dim(), 2);
    // mean = 12/4 = 3; var = 50/4 - 9 = 3.5; istd = 1/sqrt(3.5).
    assert_eq!(cmvn.mean(), &[3.0, 5.0]);
    assert_eq!(cmvn.istd()[0], (1.0 / 3.5f64.sqrt()) as f32);
    assert_eq!(cmvn.istd()[1], 1e10);
    let mut x = vec![6.0f32, 5.0, 1.0, 5.5];
    cmvn.apply(&mut x).unwrap();
    let s = (1.0 / 3.5f64.sqrt()) as f32;
    assert_eq!(x, vec![3.0 * s, 0.0, -2.0 * s, 0.5 * 1e10]);

    // A larger file with WeNet's layout (frame_num an integer, many values).
    let mean: Vec<f64> = (0..80).map(|i| 1000.0 * (i as f64 + 1.0)).collect();
    let var: Vec<f64> = (0..80)
        .map(|i| 1e4 * (i as f64 + 1.0).powi(2) + 4e4)
        .collect();
    let text =
        serde_json::json!({"mean_stat": mean, "var_stat": var, "frame_num": 100}).to_string();
    let path = write(tmp.path(), "global_cmvn80", &text);
    let cmvn = GlobalCmvn::read(&path, 80).unwrap();
    for i in [0usize, 41, 79] {
        let mu = mean[i] / 100.0;
        let istd = 1.0 / (var[i] / 100.0 - mu * mu).sqrt();
        assert_eq!(cmvn.mean()[i], mu as f32, "{i}");
        assert_eq!(cmvn.istd()[i], istd as f32, "{i}");
    }
    // The variance here is 400 for every dimension: istd 1/20.
    assert!(cmvn.istd().iter().all(|&v| (v - 0.05).abs() < 1e-7));
}

/// `GlobalCmvn::read` of `text` must fail naming the file and every needle.
fn cmvn_refused(text: &str, expected_dim: usize, needles: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), "global_cmvn", text);
    let err = GlobalCmvn::read(&path, expected_dim)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
}

#[test]
fn cmvn_refusals_name_the_file_and_the_key() {
    let ok_var = "[1.0, 1.0, 1.0]";
    let file = |mean: &str, var: &str, n: &str| {
        format!(r#"{{"mean_stat": {mean}, "var_stat": {var}, "frame_num": {n}}}"#)
    };
    // Missing keys.
    cmvn_refused(
        r#"{"var_stat": [1.0], "frame_num": 1}"#,
        1,
        &["`mean_stat`", "missing"],
    );
    cmvn_refused(
        r#"{"mean_stat": [1.0], "frame_num": 1}"#,
        1,
        &["`var_stat`", "missing"],
    );
    cmvn_refused(
        r#"{"mean_stat": [1.0], "var_stat": [1.0]}"#,
        1,
        &["`frame_num`", "missing"],
    );
    // Non-numeric values.
    cmvn_refused(
        &file("[1.0, \"x\", 1.0]", ok_var, "2"),
        3,
        &["`mean_stat[1]`", "expected a number", "\"x\""],
    );
    cmvn_refused(
        &file("[1.0, 2.0, 3.0]", "[1.0, null, 1.0]", "2"),
        3,
        &["`var_stat[1]`", "null"],
    );
    cmvn_refused(
        &file("{\"a\": 1}", ok_var, "2"),
        3,
        &["`mean_stat`", "expected an array"],
    );
    cmvn_refused(
        &file("[1.0, 2.0, 3.0]", ok_var, "\"10\""),
        3,
        &["`frame_num`", "expected a number"],
    );
    // Lengths.
    cmvn_refused(
        &file("[1.0, 2.0]", ok_var, "2"),
        2,
        &["`var_stat`", "has 3 values but `mean_stat` has 2"],
    );
    let forty = format!("[{}]", vec!["1.0"; 40].join(", "));
    cmvn_refused(
        &file(&forty, &forty, "2"),
        80,
        &[
            "`mean_stat`",
            "global_cmvn has 40 values but the model takes 80-dimensional features",
        ],
    );
    cmvn_refused(&file("[]", "[]", "2"), 0, &["`mean_stat`", "has no values"]);
    // frame_num <= 0.
    for n in ["0", "-3", "0.0"] {
        cmvn_refused(
            &file("[1.0, 2.0, 3.0]", ok_var, n),
            3,
            &["`frame_num`", "must be positive"],
        );
    }
    // Non-finite: Python's json writes NaN and Infinity; a number past f64 reads as infinity;
    // a mean that overflows f32.
    cmvn_refused(
        &file("[1.0, NaN, 3.0]", ok_var, "2"),
        3,
        &["`mean_stat[1]`", "NaN is not finite"],
    );
    cmvn_refused(
        &file("[1.0, 2.0, 3.0]", "[1.0, 1.0, -Infinity]", "2"),
        3,
        &["`var_stat[2]`", "-Infinity is not finite"],
    );
    cmvn_refused(
        &file("[1.0, 2.0, 3.0]", ok_var, "1e999"),
        3,
        &["`frame_num`", "Infinity is not finite"],
    );
    cmvn_refused(
        &file("[1.0, 1e300, 3.0]", ok_var, "2"),
        3,
        &["`mean_stat`", "value 1", "not a finite f32"],
    );
    // Not JSON, or not an object.
    cmvn_refused("[1, 2]", 2, &["not a WeNet global_cmvn JSON file"]);
    cmvn_refused("[\n 0.1 0.2 ]\n", 2, &["not a WeNet global_cmvn JSON file"]);
    // A missing file.
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no_such_cmvn");
    let err = GlobalCmvn::read(&missing, 80).unwrap_err().to_string();
    assert!(err.contains("no_such_cmvn"), "{err}");
}
