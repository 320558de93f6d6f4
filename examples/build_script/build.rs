//! Quantizes a checkpoint at build time and hands its path to the crate.
//!
//! The source comes from `OASR_EXAMPLE_SOURCE` (default: the Whisper tiny.en that
//! `calib/fetch-assets.sh` caches). Cargo re-runs this script only when an input changes.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=OASR_EXAMPLE_SOURCE");
    let source = match std::env::var_os("OASR_EXAMPLE_SOURCE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(std::env::var("HOME")?).join(".cache/oasr-quantize/whisper-tiny.en"),
    };
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("whisper-int8");
    let outcome = oasr_quantize::Quantizer::new(&source, &out)
        .recipe("int8_w8a8_rtn")
        .overwrite(true)
        .run()?;
    for file in &outcome.files_read {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let layers = outcome.report.map_or(0, |r| r.layers.len());
    println!("cargo:rustc-env=QUANTIZED_CHECKPOINT={}", outcome.output.display());
    println!("cargo:rustc-env=QUANTIZED_LAYERS={layers}");
    Ok(())
}
