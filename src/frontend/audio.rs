//! Audio decoding to mono `f32` samples.
//!
//! WAV goes through hound; FLAC, Ogg Vorbis and MP3 through symphonia. The container is chosen by
//! the file's content (a `RIFF....WAVE` header means WAV; anything else is probed by symphonia,
//! with the extension as a hint), so a misnamed file still decodes.
//!
//! Samples are scaled the way Whisper's `load_audio` (ffmpeg to s16, then `/ 32768`) scales them:
//! integer PCM of `b` bits is divided by its full scale `2^(b-1)` (16-bit: `/ 32768`), float PCM
//! is taken as is. Multi-channel audio is mixed down to the mean of its channels. Nothing is
//! resampled: a sample rate other than the expected one is [`Error::SampleRate`].
//!
//! Malformed input never panics: a file that cannot be opened is [`Error::Io`]; one that is not
//! audio this module can decode, or is truncated or corrupt, is [`Error::Corrupt`]. Both name the
//! file.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_FLAC, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::error::{Error, Result};

/// Decoded audio: mono samples and the file's own sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Mono samples in \[-1, 1\] (the mean of the file's channels).
    pub samples: Vec<f32>,
    /// The file's sample rate in Hz.
    pub sample_rate: u32,
    /// How many channels the file had before the mixdown.
    pub channels: usize,
}

/// Reads an audio file as mono `f32` samples in \[-1, 1\], refusing any sample rate other than
/// `expected_rate` (Hz) with [`Error::SampleRate`], which names the file and both rates.
///
/// WAV (PCM 8/16/24/32-bit integer, 32-bit float), FLAC, Ogg Vorbis and MP3 are supported.
pub fn read_audio(path: &Path, expected_rate: u32) -> Result<Vec<f32>> {
    decode(path, Some(expected_rate)).map(|audio| audio.samples)
}

/// Decodes an audio file at whatever sample rate it has (see [`read_audio`] for the formats and
/// the scaling).
pub fn decode_audio(path: &Path) -> Result<Audio> {
    decode(path, None)
}

fn decode(path: &Path, expected_rate: Option<u32>) -> Result<Audio> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut magic = [0u8; 12];
    let n = read_up_to(&mut file, &mut magic).map_err(|e| Error::io(path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io(path, e))?;
    if n == magic.len() && &magic[0..4] == b"RIFF" && &magic[8..12] == b"WAVE" {
        decode_wav(path, file, expected_rate)
    } else {
        decode_symphonia(path, file, expected_rate)
    }
}

/// Reads until `buf` is full or the end of the file; returns how many bytes were read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(k) => filled += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn check_rate(path: &Path, found: u32, expected: Option<u32>) -> Result<()> {
    match expected {
        Some(expected) if expected != found => Err(Error::SampleRate {
            path: path.to_path_buf(),
            found,
            expected,
        }),
        _ => Ok(()),
    }
}

fn decode_wav(path: &Path, file: File, expected_rate: Option<u32>) -> Result<Audio> {
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let corrupt = |e: hound::Error| Error::corrupt(path, format!("unreadable WAV file: {e}"));
    let mut reader = hound::WavReader::new(BufReader::new(file)).map_err(corrupt)?;
    let spec = reader.spec();
    check_rate(path, spec.sample_rate, expected_rate)?;
    let channels = usize::from(spec.channels);
    let declared = reader.len() as usize;
    if !declared.is_multiple_of(channels) {
        return Err(Error::corrupt(
            path,
            format!(
                "WAV data holds {declared} samples, not a whole number of {channels}-channel frames"
            ),
        ));
    }
    // The header's length is not trusted for the allocation: a corrupt one could claim 4 GiB.
    let bytes_per_sample = u64::from(spec.bits_per_sample).div_ceil(8).max(1);
    let capacity = declared.min((file_len / bytes_per_sample) as usize);
    let mut interleaved = Vec::with_capacity(capacity);
    let truncated = |read: usize, e: hound::Error| {
        Error::corrupt(
            path,
            format!("WAV data truncated or unreadable after {read} of {declared} samples: {e}"),
        )
    };
    match spec.sample_format {
        hound::SampleFormat::Float => {
            if spec.bits_per_sample != 32 {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "unsupported WAV sample format: {}-bit float (only 32-bit float is read)",
                        spec.bits_per_sample
                    ),
                ));
            }
            for sample in reader.samples::<f32>() {
                interleaved.push(sample.map_err(|e| truncated(interleaved.len(), e))?);
            }
        }
        hound::SampleFormat::Int => {
            let bits = spec.bits_per_sample;
            if !(1..=32).contains(&bits) {
                return Err(Error::corrupt(
                    path,
                    format!("unsupported WAV sample format: {bits}-bit integer"),
                ));
            }
            // 2^(bits-1), exactly representable: 16-bit samples are divided by 32768 as
            // Whisper's load_audio does.
            let full_scale = (1u64 << (bits - 1)) as f64;
            for sample in reader.samples::<i32>() {
                let s = sample.map_err(|e| truncated(interleaved.len(), e))?;
                interleaved.push((f64::from(s) / full_scale) as f32);
            }
        }
    }
    Ok(Audio {
        samples: mixdown(interleaved, channels),
        sample_rate: spec.sample_rate,
        channels,
    })
}

/// Mixes interleaved frames of `channels` samples down to their mean. Mono input is returned as
/// is.
fn mixdown(interleaved: Vec<f32>, channels: usize) -> Vec<f32> {
    if channels <= 1 {
        return interleaved;
    }
    let mut mono = Vec::with_capacity(interleaved.len() / channels);
    mix_into(&interleaved, channels, &mut mono);
    mono
}

/// Appends the channel mean of each interleaved frame to `out`.
fn mix_into(interleaved: &[f32], channels: usize, out: &mut Vec<f32>) {
    if channels == 1 {
        out.extend_from_slice(interleaved);
        return;
    }
    let scale = 1.0 / channels as f64;
    out.extend(
        interleaved
            .chunks_exact(channels)
            .map(|frame| (frame.iter().map(|&s| f64::from(s)).sum::<f64>() * scale) as f32),
    );
}

fn decode_symphonia(path: &Path, file: File, expected_rate: Option<u32>) -> Result<Audio> {
    let corrupt = |what: &str, e: SymphoniaError| Error::corrupt(path, format!("{what}: {e}"));
    let stream = MediaSourceStream::new(Box::new(file), MediaSourceStreamOptions::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    // Gapless: drop the encoder delay and padding that MP3 (LAME header) and Vorbis declare, as
    // ffmpeg does, so a lossy file has the length of the audio it was made from.
    let format_options = FormatOptions {
        enable_gapless: true,
        ..FormatOptions::default()
    };
    let probed = symphonia::default::get_probe()
        .format(&hint, stream, &format_options, &MetadataOptions::default())
        .map_err(|e| {
            corrupt(
                "not a WAV, FLAC, Ogg Vorbis or MP3 file that can be decoded",
                e,
            )
        })?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| Error::corrupt(path, "the file holds no audio track"))?;
    let track_id = track.id;
    let params = track.codec_params.clone();
    if let Some(rate) = params.sample_rate {
        check_rate(path, rate, expected_rate)?;
    }
    let mut decoder = symphonia::default::get_codecs()
        .make(&params, &DecoderOptions::default())
        .map_err(|e| corrupt("unsupported audio codec", e))?;

    let mut samples = Vec::new();
    let mut buffer: Option<SampleBuffer<f32>> = None;
    let mut stream_spec: Option<(u32, usize)> = None;
    let mut frames_decoded: u64 = 0;
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            // symphonia reports the end of the stream as an unexpected end of file.
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break
            }
            Err(SymphoniaError::ResetRequired) => {
                return Err(Error::corrupt(
                    path,
                    "the stream changes its parameters mid-file (a chained stream), which is not \
                     supported",
                ))
            }
            Err(e) => return Err(corrupt("unreadable audio data", e)),
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = decoder
            .decode(&packet)
            .map_err(|e| corrupt("corrupt audio data", e))?;
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        match stream_spec {
            None => {
                if channels == 0 {
                    return Err(Error::corrupt(path, "the audio stream has no channels"));
                }
                check_rate(path, spec.rate, expected_rate)?;
                stream_spec = Some((spec.rate, channels));
            }
            Some(first) if first != (spec.rate, channels) => {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "the stream changes from {} Hz, {} channels to {} Hz, {} channels mid-file",
                        first.0, first.1, spec.rate, channels
                    ),
                ))
            }
            Some(_) => {}
        }
        if decoded.frames() == 0 {
            continue;
        }
        frames_decoded += decoded.frames() as u64;
        let needed = decoded.capacity() as u64;
        let buf = match &mut buffer {
            Some(buf) if buf.capacity() as u64 >= needed * channels as u64 => buf,
            _ => buffer.insert(SampleBuffer::new(needed, spec)),
        };
        buf.copy_interleaved_ref(decoded);
        mix_into(buf.samples(), channels, &mut samples);
    }

    // FLAC declares its exact length; fewer samples means the file was cut short. (Lossy codecs'
    // declared lengths are estimates, so they are not held to it.)
    if params.codec == CODEC_TYPE_FLAC {
        if let Some(declared) = params.n_frames {
            if frames_decoded < declared {
                return Err(Error::corrupt(
                    path,
                    format!("FLAC data truncated: {frames_decoded} of {declared} samples decoded"),
                ));
            }
        }
    }
    let (sample_rate, channels) = match (stream_spec, params.sample_rate) {
        (Some(spec), _) => spec,
        (None, Some(rate)) => (rate, params.channels.map_or(1, |c| c.count())),
        (None, None) => {
            return Err(Error::corrupt(
                path,
                "the audio stream has no decodable frames and declares no sample rate",
            ))
        }
    };
    Ok(Audio {
        samples,
        sample_rate,
        channels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixdown_is_the_channel_mean() {
        let stereo = vec![1.0, 0.0, 0.5, -0.5, -1.0, -0.5];
        assert_eq!(mixdown(stereo, 2), vec![0.5, 0.0, -0.75]);
        let mono = vec![0.25, -0.25];
        assert_eq!(mixdown(mono.clone(), 1), mono);
        let three = vec![0.3, 0.3, 0.3];
        assert!((mixdown(three, 3)[0] - 0.3).abs() < 1e-7);
    }
}
