//! Builds examples/build_script, whose build.rs quantizes the real tiny.en with the library, and
//! runs it. Proves the library works from a build script without the CLI's dependencies.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn a_build_script_quantizes_at_build_time() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = root.join("examples/build_script/Cargo.toml");
    // Its own target directory: the outer cargo holds the lock on ours while tests run.
    let target = root.join("target/build-script-example");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .env("OASR_EXAMPLE_SOURCE", common::tiny_en())
        .status()
        .unwrap();
    assert!(status.success(), "building examples/build_script failed");
    let output = Command::new(target.join("release/oasr-quantize-build-script-example"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert!(text.starts_with("64 quantized layers in "), "{text}");
    let dir = text.trim().rsplit(" in ").next().unwrap();
    assert!(Path::new(dir).join("model.safetensors").is_file(), "{dir}");
    // The library alone, without the CLI's terminal dependencies.
    let tree = Command::new(&cargo)
        .args(["tree", "--edges", "normal,build", "--manifest-path"])
        .arg(&manifest)
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&tree.stdout);
    for crate_name in ["clap", "indicatif", "anyhow", "cudarc"] {
        assert!(
            !tree.contains(&format!(" {crate_name} v")),
            "{crate_name} in\n{tree}"
        );
    }
}
