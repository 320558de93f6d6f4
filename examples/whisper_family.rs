//! Writes a seeded random-weight Hugging Face Whisper checkpoint of a published size, for the
//! scale benchmarks (BENCHMARKS.md): structure and cost only, never accuracy.
//!
//!     cargo run --release --example whisper_family -- list
//!     cargo run --release --example whisper_family -- SIZE DIR [--shards N] [--dtype f16|bf16|f32]
//!
//! The tokenizers come from `calib/fetch-assets.sh` (`OASR_WHISPER_TOKENIZERS`).

#[path = "../tests/common/family.rs"]
mod family;

/// `family` finds the asset cache through its parent module, as in the tests.
fn cache_dir() -> std::path::PathBuf {
    match std::env::var("OASR_CACHE_DIR") {
        Ok(dir) => dir.into(),
        Err(_) => {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/oasr-quantize")
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: whisper_family list | SIZE DIR [--shards N] [--dtype f16|bf16|f32]";
    match args.first().map(String::as_str) {
        Some("list") => {
            for s in family::FAMILY {
                println!(
                    "{:18} d_model {:4}  layers {:2}/{:2}  heads {:2}  ffn {:4}  vocab {}  mels {:3}  {:5} M parameters",
                    s.name,
                    s.d_model,
                    s.encoder_layers,
                    s.decoder_layers,
                    s.heads,
                    s.ffn,
                    s.vocab_size,
                    s.num_mel_bins,
                    s.parameters() / 1_000_000
                );
            }
            Ok(())
        }
        Some(name) => {
            let size = family::by_name(name).ok_or(format!("unknown size {name:?}; see `list`"))?;
            let dir = args.get(1).ok_or(usage)?;
            let mut shards = 1;
            let mut dtype = safetensors::Dtype::F16;
            let mut rest = args[2..].iter();
            while let Some(flag) = rest.next() {
                let value = rest.next().ok_or(usage)?;
                match flag.as_str() {
                    "--shards" => shards = value.parse()?,
                    "--dtype" => {
                        dtype = match value.as_str() {
                            "f16" => safetensors::Dtype::F16,
                            "bf16" => safetensors::Dtype::BF16,
                            "f32" => safetensors::Dtype::F32,
                            other => return Err(format!("unknown dtype {other:?}").into()),
                        }
                    }
                    other => return Err(format!("unknown flag {other:?}; {usage}").into()),
                }
            }
            if std::path::Path::new(dir).exists() {
                return Err(format!("{dir} exists; give a new directory").into());
            }
            family::write(std::path::Path::new(dir), &size, dtype, shards, 0x5eed);
            Ok(())
        }
        None => Err(usage.into()),
    }
}
