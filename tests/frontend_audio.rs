//! Audio decoding: WAV through hound, FLAC / Ogg Vorbis / MP3 through symphonia, mono mixdown,
//! the sample-rate check, and malformed input (errors naming the file, never a panic).
//!
//! The compressed fixtures in tests/fixtures/logmel were made from the WAV clip by sox (FLAC,
//! Ogg Vorbis) and lame (MP3); see make_golden.py there.

use std::path::{Path, PathBuf};

use oasr_quantize::frontend::{decode_audio, read_audio};
use oasr_quantize::Error;
use proptest::prelude::*;

const CLIP: &str = "conf-getpin";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logmel")
        .join(name)
}

/// The clip as Whisper's load_audio reads it: s16 / 32768, channel mean for stereo, computed
/// here straight from hound.
fn raw_wav(path: &Path) -> Vec<f32> {
    let mut reader = hound::WavReader::open(path).unwrap();
    let channels = usize::from(reader.spec().channels);
    let samples: Vec<f32> = reader
        .samples::<i16>()
        .map(|s| f32::from(s.unwrap()) / 32768.0)
        .collect();
    samples
        .chunks_exact(channels)
        .map(|f| f.iter().sum::<f32>() / channels as f32)
        .collect()
}

fn write_wav<S: hound::Sample + Copy>(path: &Path, spec: hound::WavSpec, samples: &[S]) {
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &s in samples {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
}

fn spec(channels: u16, bits: u16, format: hound::SampleFormat) -> hound::WavSpec {
    hound::WavSpec {
        channels,
        sample_rate: 16_000,
        bits_per_sample: bits,
        sample_format: format,
    }
}

/// Signal-to-noise ratio of `decoded` against `reference` in dB, over their common length.
fn snr_db(reference: &[f32], decoded: &[f32]) -> f64 {
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (&r, &d) in reference.iter().zip(decoded) {
        signal += f64::from(r) * f64::from(r);
        noise += (f64::from(r) - f64::from(d)).powi(2);
    }
    10.0 * (signal / noise.max(1e-30)).log10()
}

#[test]
fn frontend_wav_reads_like_whisper_load_audio() {
    let path = fixture(&format!("{CLIP}.wav"));
    let samples = read_audio(&path, 16_000).unwrap();
    assert_eq!(samples, raw_wav(&path));
    assert!(samples.iter().all(|s| (-1.0..1.0).contains(s)));
    let audio = decode_audio(&path).unwrap();
    assert_eq!((audio.sample_rate, audio.channels), (16_000, 1));
    assert_eq!(audio.samples, samples);
}

#[test]
fn frontend_wrong_sample_rate_names_the_file_and_both_rates() {
    for ext in ["wav", "flac", "ogg", "mp3"] {
        let path = fixture(&format!("{CLIP}.{ext}"));
        let err = read_audio(&path, 8_000).expect_err("16 kHz audio for an 8 kHz model");
        match &err {
            Error::SampleRate {
                path: p,
                found,
                expected,
            } => {
                assert_eq!(p, &path);
                assert_eq!((*found, *expected), (16_000, 8_000));
            }
            other => panic!("{ext}: expected Error::SampleRate, got {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains(&format!("{CLIP}.{ext}")), "{message}");
        assert!(
            message.contains("16000 Hz") && message.contains("8000 Hz"),
            "{message}"
        );
    }
}

#[test]
fn frontend_stereo_is_mixed_down_to_the_channel_mean() {
    let wav = fixture("stereo.wav");
    let audio = decode_audio(&wav).unwrap();
    assert_eq!(audio.channels, 2);
    assert_eq!(audio.samples, raw_wav(&wav));
    assert_eq!(audio.samples.len(), 4000);

    // Three float channels, written here.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("three.wav");
    let frames: Vec<[f32; 3]> = (0..100)
        .map(|i| {
            let x = i as f32 / 100.0;
            [x, -0.5 * x, 0.25]
        })
        .collect();
    let flat: Vec<f32> = frames.iter().flatten().copied().collect();
    write_wav(&path, spec(3, 32, hound::SampleFormat::Float), &flat);
    let mono = read_audio(&path, 16_000).unwrap();
    assert_eq!(mono.len(), 100);
    for (m, f) in mono.iter().zip(&frames) {
        let mean = (f64::from(f[0]) + f64::from(f[1]) + f64::from(f[2])) / 3.0;
        assert!((f64::from(*m) - mean).abs() < 1e-7);
    }
}

#[test]
fn frontend_flac_decodes_exactly_like_the_wav() {
    for (flac, wav) in [
        (format!("{CLIP}.flac"), format!("{CLIP}.wav")),
        ("stereo.flac".to_string(), "stereo.wav".to_string()),
    ] {
        let from_flac = decode_audio(&fixture(&flac)).unwrap();
        let from_wav = decode_audio(&fixture(&wav)).unwrap();
        assert_eq!(from_flac.sample_rate, from_wav.sample_rate);
        assert_eq!(from_flac.channels, from_wav.channels);
        assert_eq!(from_flac.samples.len(), from_wav.samples.len(), "{flac}");
        assert!(
            from_flac.samples == from_wav.samples,
            "{flac} differs from {wav}"
        );
    }
}

#[test]
fn frontend_lossy_formats_decode_to_the_clip() {
    let wav = read_audio(&fixture(&format!("{CLIP}.wav")), 16_000).unwrap();
    for (ext, min_snr) in [("ogg", 10.0), ("mp3", 10.0)] {
        let path = fixture(&format!("{CLIP}.{ext}"));
        let audio = decode_audio(&path).unwrap();
        assert_eq!((audio.sample_rate, audio.channels), (16_000, 1), "{ext}");
        let diff = audio.samples.len().abs_diff(wav.len());
        // Gapless decoding drops the encoder delay and padding: the length is the WAV's, or
        // within one codec frame of it where the file does not say.
        assert!(
            diff <= 1152,
            "{ext}: {} samples vs {}",
            audio.samples.len(),
            wav.len()
        );
        assert!(audio
            .samples
            .iter()
            .all(|s| s.is_finite() && s.abs() <= 1.5));
        let snr = snr_db(&wav, &audio.samples);
        eprintln!(
            "{ext}: {} samples (wav {}), SNR {snr:.1} dB",
            audio.samples.len(),
            wav.len()
        );
        assert!(snr >= min_snr, "{ext}: SNR {snr:.1} dB");
    }
}

#[test]
fn frontend_integer_wav_is_scaled_by_its_full_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let int = hound::SampleFormat::Int;

    let p8 = tmp.path().join("s8.wav");
    write_wav(&p8, spec(1, 8, int), &[-128i8, -64, 0, 64, 127]);
    assert_eq!(
        read_audio(&p8, 16_000).unwrap(),
        vec![-1.0, -0.5, 0.0, 0.5, 127.0 / 128.0]
    );

    let p16 = tmp.path().join("s16.wav");
    write_wav(&p16, spec(1, 16, int), &[i16::MIN, -16384, 0, 1, i16::MAX]);
    assert_eq!(
        read_audio(&p16, 16_000).unwrap(),
        vec![-1.0, -0.5, 0.0, 1.0 / 32768.0, 32767.0 / 32768.0]
    );

    let p24 = tmp.path().join("s24.wav");
    write_wav(&p24, spec(1, 24, int), &[-(1i32 << 23), 1 << 22, 0, 1]);
    assert_eq!(
        read_audio(&p24, 16_000).unwrap(),
        vec![-1.0, 0.5, 0.0, 1.0 / 8_388_608.0]
    );

    let p32 = tmp.path().join("s32.wav");
    write_wav(&p32, spec(1, 32, int), &[i32::MIN, 1 << 30, 0]);
    assert_eq!(read_audio(&p32, 16_000).unwrap(), vec![-1.0, 0.5, 0.0]);

    let pf = tmp.path().join("f32.wav");
    write_wav(
        &pf,
        spec(1, 32, hound::SampleFormat::Float),
        &[0.125f32, -0.75, 0.0],
    );
    assert_eq!(read_audio(&pf, 16_000).unwrap(), vec![0.125, -0.75, 0.0]);
}

#[test]
fn frontend_unreadable_files_are_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();

    let missing = tmp.path().join("missing.wav");
    match read_audio(&missing, 16_000) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("missing.wav")),
        other => panic!("expected Error::Io, got {other:?}"),
    }

    let cases: [(&str, &[u8]); 5] = [
        ("empty.wav", b""),
        ("text.wav", b"this is not audio at all, just some text"),
        ("text.mp3", b"ID3 nope"),
        ("header-only.wav", b"RIFF\x24\x00\x00\x00WAVE"),
        ("riff-not-wave.flac", b"RIFF\x00\x00\x00\x00AVI LIST"),
    ];
    for (name, bytes) in cases {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        match read_audio(&path, 16_000) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains(name), "{e}")
            }
            other => panic!("{name}: expected Error::Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn frontend_truncated_files_are_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    for ext in ["wav", "flac"] {
        let full = std::fs::read(fixture(&format!("{CLIP}.{ext}"))).unwrap();
        let path = tmp.path().join(format!("cut.{ext}"));
        std::fs::write(&path, &full[..full.len() * 2 / 3]).unwrap();
        match read_audio(&path, 16_000) {
            Err(e @ Error::Corrupt { .. }) => {
                assert!(e.to_string().contains(&format!("cut.{ext}")), "{e}");
                assert!(e.to_string().contains("truncated"), "{e}");
            }
            other => panic!("{ext}: expected Error::Corrupt, got {other:?}"),
        }
    }
}

/// A small stereo 16-bit WAV: a 44-byte header and 400 bytes of samples.
fn small_wav() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(make_small_wav)
}

fn make_small_wav() -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("small.wav");
    let samples: Vec<i16> = (0..200)
        .map(|i| ((i * 331) % 65536 - 32768) as i16)
        .collect();
    write_wav(&path, spec(2, 16, hound::SampleFormat::Int), &samples);
    std::fs::read(path).unwrap()
}

/// Truncates `bytes` and flips bits in what is left.
fn damage(bytes: &[u8], keep: usize, flips: &[(usize, u8)]) -> Vec<u8> {
    let mut out = bytes[..keep.min(bytes.len())].to_vec();
    if !out.is_empty() {
        for &(at, bit) in flips {
            let n = out.len();
            out[at % n] ^= 1 << (bit % 8);
        }
    }
    out
}

fn decode_damaged(name: &str, bytes: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    match read_audio(&path, 16_000) {
        // A harmless flip (or one that turns the samples into floats) still decodes.
        Ok(_) => {}
        Err(Error::Corrupt { path: p, .. }) | Err(Error::SampleRate { path: p, .. }) => {
            assert_eq!(p, path)
        }
        Err(other) => panic!("unexpected error kind: {other:?}"),
    }
}

#[test]
fn frontend_every_truncation_and_header_bit_flip_of_a_wav_is_handled() {
    let full = small_wav();
    for keep in 0..=full.len() {
        decode_damaged("cut.wav", &full[..keep]);
    }
    for byte in 0..64 {
        for bit in 0..8 {
            decode_damaged("flipped.wav", &damage(full, full.len(), &[(byte, bit)]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn frontend_damaged_wav_never_panics(
        keep in 0usize..460,
        flips in proptest::collection::vec((0usize..460, 0u8..8), 0..6),
    ) {
        decode_damaged("damaged.wav", &damage(small_wav(), keep, &flips));
    }

    #[test]
    fn frontend_damaged_compressed_files_never_panic(
        which in 0usize..3,
        // Past the files' lengths (10-30 KB) half the time: whole files with flipped bits.
        keep in 0usize..60_000,
        flips in proptest::collection::vec((0usize..60_000, 0u8..8), 0..6),
    ) {
        let ext = ["flac", "ogg", "mp3"][which];
        let full = std::fs::read(fixture(&format!("{CLIP}.{ext}"))).unwrap();
        decode_damaged(&format!("damaged.{ext}"), &damage(&full, keep, &flips));
    }
}
