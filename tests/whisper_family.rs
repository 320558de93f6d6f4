//! Every published Whisper configuration, as a seeded random-weight Hugging Face checkpoint of
//! its real shape (tests/common/family.rs): it imports with the published geometry, its layers
//! are found and selected, it quantizes, and the spec it writes reads back. Random weights are
//! evidence of structure only, never of accuracy.
//!
//! CI runs one checkpoint of every distinct geometry (the `.en` twin of a size differs from it in
//! one vocabulary row, tested on tiny, base and small) and a sharded large-v3. Set
//! `OASR_FAMILY_SIZES=all` (or a comma list of names) to run every size.

mod common;

use std::path::Path;

use common::family::{self, Size};
use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::{inspect::inspect, Quantizer, Recipe};

/// The sizes CI writes: every distinct geometry once, both vocabularies on the small ones.
const CI_SIZES: &[&str] = &[
    "tiny",
    "base.en",
    "small",
    "small.en",
    "medium",
    "large-v2",
    "large-v3-turbo",
    "distil-small.en",
    "distil-medium.en",
    "distil-large-v3",
];

fn sizes(default: &[&str]) -> Vec<Size> {
    let names: Vec<String> = match std::env::var("OASR_FAMILY_SIZES") {
        Ok(v) if v == "all" => family::FAMILY.iter().map(|s| s.name.to_string()).collect(),
        Ok(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => default.iter().map(|s| s.to_string()).collect(),
    };
    names
        .iter()
        .map(|n| family::by_name(n).unwrap_or_else(|| panic!("no Whisper size {n:?}")))
        .collect()
}

/// The geometry the importer read is the published one, and so are the special tokens.
fn check_import(dir: &Path, size: &Size) {
    let ckpt = Checkpoint::open(dir).unwrap_or_else(|e| panic!("{}: {e}", size.name));
    let c: oasr_quantize::models::whisper::WhisperConfig =
        serde_json::from_value(ckpt.config.model_config.clone()).unwrap();
    assert_eq!(
        (
            c.d_model,
            c.encoder_layers,
            c.decoder_layers,
            c.encoder_attention_heads,
            c.decoder_attention_heads,
            c.encoder_ffn_dim,
            c.vocab_size,
            c.num_mel_bins,
            c.max_source_positions,
            c.max_target_positions
        ),
        (
            size.d_model,
            size.encoder_layers,
            size.decoder_layers,
            size.heads,
            size.heads,
            size.ffn,
            size.vocab_size,
            size.num_mel_bins,
            1500,
            448
        ),
        "{}",
        size.name
    );
    let languages = match size.vocab_size {
        51866 => 100,
        51865 => 99,
        _ => 0,
    };
    assert_eq!(c.language_token_ids.len(), languages, "{}", size.name);
    assert_eq!(c.is_multilingual(), size.multilingual(), "{}", size.name);
    // OpenAI's layout: start of transcript after end-of-text, the task tokens after the
    // languages.
    assert_eq!(
        c.decoder_start_token_id,
        c.eos_token_id + 1,
        "{}",
        size.name
    );
    if size.multilingual() {
        assert_eq!(
            c.task_token_ids["translate"],
            c.decoder_start_token_id + 1 + languages as u32,
            "{}",
            size.name
        );
    }
    let layout = oasr_quantize::layout_of(&ckpt).unwrap();
    let linear = layout
        .layers
        .iter()
        .filter(|l| l.kind.name() == "linear")
        .count();
    assert_eq!(linear, size.linear_layers(), "{}", size.name);
}

/// RTN int8 of the checkpoint: every linear GEMM quantized, the spec read back by `inspect` and
/// by a fresh open.
fn check_rtn(src: &Path, dst: &Path, size: &Size) {
    Quantizer::new(src, dst)
        .recipe("int8_w8a8_rtn")
        .run()
        .unwrap_or_else(|e| panic!("{}: {e}", size.name));
    let summary = inspect(dst).unwrap();
    assert_eq!(summary.architecture, "whisper");
    assert_eq!(
        summary.quantized_layers,
        size.linear_layers(),
        "{}",
        size.name
    );
    assert_eq!(
        summary.layers_by_kind_and_scheme,
        [("linear / int8_w8a8".to_string(), size.linear_layers())].into(),
        "{}",
        size.name
    );
    let back = Checkpoint::open(dst).unwrap();
    let spec = back.config.quantization.as_ref().unwrap();
    assert_eq!(spec.layers.len(), size.linear_layers());
    assert!(spec
        .layers
        .contains_key(&format!("decoder.layers.{}.fc2", size.decoder_layers - 1)));
    // The parameters are the source's (the int8 codes count as their weights), plus one scale
    // per output row of each quantized layer: nothing dropped, nothing invented.
    let source_params = size.parameters();
    let scales: usize = back
        .tensors
        .iter()
        .filter(|(name, _)| name.ends_with(".weight_scale"))
        .map(|(_, t)| t.numel())
        .sum();
    assert_eq!(scales, size.linear_rows(), "{}", size.name);
    assert_eq!(summary.parameters - scales, source_params, "{}", size.name);
}

#[test]
fn every_published_size_imports_and_quantizes_with_its_shape() {
    for size in sizes(CI_SIZES) {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("int8"));
        family::write(&src, &size, safetensors::Dtype::F16, 1, 1);
        check_import(&src, &size);
        check_rtn(&src, &dst, &size);
    }
}

/// large-v3 as the hub ships it: fp16 in shards with an index, 128 mel bands, 100 languages.
#[test]
fn a_sharded_large_v3_source_imports_and_quantizes() {
    let size = family::by_name("large-v3").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("int8"));
    family::write(&src, &size, safetensors::Dtype::F16, 4, 1);
    assert!(src.join("model.safetensors.index.json").is_file());
    assert!(src.join("model-00004-of-00004.safetensors").is_file());
    assert!(!src.join("model.safetensors").exists());
    check_import(&src, &size);
    check_rtn(&src, &dst, &size);
    let summary = inspect(&dst).unwrap();
    assert_eq!(summary.quantized_layers, 32 * 6 + 32 * 10);
}

/// Every built-in recipe on the small shapes, calibrated on two real utterances: each writes a
/// spec that `inspect` reads back. (The decodings of random weights are noise; what is checked
/// is that every stage runs on these shapes.)
#[test]
fn every_recipe_runs_on_the_small_shapes() {
    let (calib, _) = common::manifests();
    for size in sizes(&["tiny", "base.en"]) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        family::write(&src, &size, safetensors::Dtype::F16, 1, 2);
        for recipe in Recipe::built_in() {
            let dst = tmp.path().join(&recipe.name);
            let q = Quantizer::new(&src, &dst).recipe(recipe.name.clone());
            let q = if recipe.calibration {
                q.calib_manifest(&calib).calib_utterances(2)
            } else {
                q
            };
            q.run()
                .unwrap_or_else(|e| panic!("{} {}: {e}", size.name, recipe.name));
            let recipe = &recipe.name;
            let summary = inspect(&dst).unwrap();
            assert!(summary.quantized_layers > 0, "{} {recipe}", size.name);
        }
    }
}
