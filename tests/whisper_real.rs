//! End-to-end runs on the real Whisper tiny.en (fetched by calib/fetch-assets.sh).

mod common;

use oasr_quantize::checkpoint::{Checkpoint, DType, SourceFormat};
use oasr_quantize::format::{ModuleKind, Scheme, SmoothFold};
use oasr_quantize::numerics::{self, QuantDtype};
use oasr_quantize::{Error, Quantizer};

fn quantize(
    recipe: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    oasr_quantize::Outcome,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let outcome = Quantizer::new(common::tiny_en(), &dst)
        .recipe(recipe)
        .run()
        .unwrap();
    (tmp, dst, outcome)
}

#[test]
fn ctranslate2_import_splits_fused_projections_and_maps_names() {
    let ckpt = Checkpoint::open(&common::tiny_en()).unwrap();
    assert_eq!(ckpt.format, SourceFormat::Import("ctranslate2_whisper"));
    let raw = oasr_quantize::checkpoint::ct2::read(&common::tiny_en().join("model.bin")).unwrap();
    assert_eq!(raw.variables.len(), 148);
    assert_eq!(raw.aliases.len(), 1);
    // q;k;v rows split back in order.
    let fused = raw.variables["encoder/layer_2/self_attention/linear_0/weight"].to_f32();
    let d = 384;
    for (i, proj) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
        let t = &ckpt.tensors[&format!("encoder.layers.2.self_attn.{proj}.weight")];
        assert_eq!(t.shape, vec![d, d]);
        assert_eq!(t.to_f32(), fused[i * d * d..(i + 1) * d * d]);
    }
    // The zero k bias is dropped; q and v biases are kept.
    assert!(!ckpt
        .tensors
        .contains_key("encoder.layers.2.self_attn.k_proj.bias"));
    assert!(!ckpt
        .tensors
        .contains_key("decoder.layers.0.encoder_attn.k_proj.bias"));
    let kv_bias = raw.variables["decoder/layer_0/attention/linear_1/bias"].to_f32();
    assert_eq!(
        ckpt.tensors["decoder.layers.0.encoder_attn.v_proj.bias"].to_f32(),
        kv_bias[d..]
    );
    // Conv weights are stored KSC: [out, k, in] from [out, in, k].
    let conv = raw.variables["encoder/conv1/weight"].to_f32();
    let ksc = ckpt.tensors["encoder.conv1.weight"].to_f32();
    assert_eq!(ckpt.tensors["encoder.conv1.weight"].shape, vec![384, 3, 80]);
    for (o, i, k) in [(0, 0, 0), (5, 79, 2), (383, 17, 1)] {
        assert_eq!(ksc[(o * 3 + k) * 80 + i], conv[(o * 80 + i) * 3 + k]);
    }
    // Hugging Face's parameter count: the fused zero k biases (8 x 384) are gone.
    let params: usize = ckpt.tensors.values().map(|t| t.numel()).sum();
    assert_eq!(params, 37_760_256);
    let mc = &ckpt.config.model_config;
    assert_eq!(mc["vocab_size"], 51864);
    assert_eq!(mc["encoder_attention_heads"], 6);
    assert_eq!(mc["decoder_start_token_id"], 50257);
    assert_eq!(mc["forced_decoder_ids"], serde_json::json!([[1, 50362]]));
}

#[test]
fn int8_rtn_writes_the_contract_for_64_gemms() {
    let (_tmp, dst, outcome) = quantize("int8_w8a8_rtn");
    let source = Checkpoint::open(&common::tiny_en()).unwrap();
    let out = Checkpoint::open(&dst).unwrap();
    assert_eq!(out.format, SourceFormat::OasrNative { version: 2 });
    let spec = out.config.quantization.as_ref().unwrap();
    assert_eq!(spec.layers.len(), 64);
    let encoder = spec
        .layers
        .keys()
        .filter(|k| k.starts_with("encoder."))
        .count();
    assert_eq!((encoder, spec.layers.len() - encoder), (24, 40));
    assert_eq!(spec.schemes.keys().collect::<Vec<_>>(), vec!["int8_w8a8"]);
    assert_eq!(spec.schemes["int8_w8a8"], Scheme::Int8W8a8.args());
    assert_eq!(spec.module_types, ModuleKind::DEFAULT.to_vec());
    assert_eq!(
        spec.producer.skipped.keys().collect::<Vec<_>>(),
        vec!["encoder.conv1", "encoder.conv2"]
    );
    assert_eq!(spec.producer.recipe, "int8_w8a8_rtn");
    assert_eq!(spec.producer.source.format, "ctranslate2_whisper");
    assert_eq!(
        spec.producer.source.files["model.bin"],
        "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
    );
    assert_eq!(
        spec.producer.fingerprint,
        oasr_quantize::sha256_file(&dst.join("model.safetensors")).unwrap()
    );
    // Fused norms arm for every norm whose consumers all take per-token int8 input.
    assert_eq!(spec.links.fused_norms.len(), 4 * 2 + 4 * 3);
    assert!(spec.links.gemm_chains.is_empty());
    assert_eq!(
        spec.layers["encoder.layers.0.fc1"]
            .input_quantized_by
            .as_deref(),
        Some("encoder.layers.0.final_layer_norm")
    );
    assert_eq!(spec.layers["encoder.layers.0.fc2"].input_quantized_by, None);

    for (name, layer) in &spec.layers {
        assert_eq!(layer.smooth, SmoothFold::None);
        let w = &out.tensors[&format!("{name}.weight")];
        let s = &out.tensors[&format!("{name}.weight_scale")];
        let src = &source.tensors[&format!("{name}.weight")];
        assert_eq!(w.dtype, DType::I8, "{name}");
        assert_eq!(w.shape, src.shape, "{name}");
        assert_eq!(
            (s.dtype, s.shape.clone()),
            (DType::F32, vec![src.shape[0]]),
            "{name}"
        );
        assert!(!out.tensors.contains_key(&format!("{name}.input_scale")));
        assert!(!out.tensors.contains_key(&format!("{name}.smooth_inv")));
        // The stored codes are exactly the reference quantization of the source weight.
        let q = numerics::quantize_weight_per_channel(
            &src.to_f32(),
            src.shape[0],
            src.shape[1],
            QuantDtype::Int8,
        );
        assert_eq!(w.bytes(), &q.codes[..], "{name}");
        assert_eq!(s.to_f32(), q.scales, "{name}");
    }
    // Everything else is copied unchanged (biases keep the source dtype).
    for (name, t) in &source.tensors {
        if !spec.layers.contains_key(name.trim_end_matches(".weight")) {
            assert_eq!(
                (out.tensors[name].dtype, out.tensors[name].bytes()),
                (t.dtype, t.bytes()),
                "{name}"
            );
        }
    }
    let report = outcome.report.unwrap();
    assert_eq!(report.layers.len(), 64);
    for l in &report.layers {
        assert!(
            l.relative_weight_error > 0.0 && l.relative_weight_error < 0.05,
            "{}: {}",
            l.name,
            l.relative_weight_error
        );
        assert!(l.weight_scale_min > 0.0 && l.weight_scale_min <= l.weight_scale_max);
    }
    let on_disk: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dst.join("quantization_report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk["layers"].as_array().unwrap().len(), 64);
    assert!(dst.join("tokenizer/tokenizer.json").is_file());
    assert_eq!(
        out.config.tokenizer.as_ref().unwrap().files["tokenizer"],
        "tokenizer/tokenizer.json"
    );
    assert!(outcome.files_read.iter().any(|f| f.ends_with("model.bin")));
}

#[test]
fn fp8_rtn_writes_e4m3_weights() {
    let (_tmp, dst, _) = quantize("fp8_w8a8_rtn");
    let out = Checkpoint::open(&dst).unwrap();
    let spec = out.config.quantization.as_ref().unwrap();
    assert_eq!(spec.layers.len(), 64);
    assert_eq!(spec.schemes.keys().collect::<Vec<_>>(), vec!["fp8_w8a8"]);
    let w = &out.tensors["decoder.layers.1.fc2.weight"];
    assert_eq!(w.dtype, DType::F8E4m3);
    // No NaN code (0x7f / 0xff) is ever written.
    for name in spec.layers.keys() {
        assert!(
            out.tensors[&format!("{name}.weight")]
                .bytes()
                .iter()
                .all(|b| b & 0x7f != 0x7f),
            "{name}"
        );
    }
    let src = Checkpoint::open(&common::tiny_en()).unwrap();
    let x = src.tensors["decoder.layers.1.fc2.weight"].to_f32();
    let scales = out.tensors["decoder.layers.1.fc2.weight_scale"].to_f32();
    let k = 1536;
    let restored: Vec<f32> = w
        .bytes()
        .iter()
        .enumerate()
        .map(|(i, c)| numerics::e4m3_decode(*c) * scales[i / k])
        .collect();
    let err: f64 = x
        .iter()
        .zip(&restored)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
    assert!(err / norm < 0.05, "relative error {}", err / norm);
}

#[test]
fn two_runs_give_byte_identical_outputs() {
    let (_a, dst_a, _) = quantize("int8_w8a8_rtn");
    let (_b, dst_b, _) = quantize("int8_w8a8_rtn");
    let (a, b) = (common::tree_hashes(&dst_a), common::tree_hashes(&dst_b));
    // The four checkpoint files and the output marker (docs/format.md, "Output protocol").
    assert_eq!(a.len(), 5, "{a:?}");
    assert!(
        a.contains_key(oasr_quantize::checkpoint::MARKER_FILE),
        "{a:?}"
    );
    assert_eq!(a, b);
}

#[test]
fn the_source_is_never_modified() {
    let before = common::tree_hashes(&common::tiny_en());
    let _ = quantize("fp8_w8a8_rtn");
    assert_eq!(before, common::tree_hashes(&common::tiny_en()));
}

#[test]
fn convert_then_quantize_matches_quantizing_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let v1 = tmp.path().join("v1");
    oasr_quantize::convert(&common::tiny_en(), &v1, false).unwrap();
    let native = Checkpoint::open(&v1).unwrap();
    assert_eq!(native.format, SourceFormat::OasrNative { version: 1 });
    assert!(native.tensors.values().all(|t| t.dtype == DType::F32));
    assert!(native.config.quantization.is_none());
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(v1.join("oasr_config.json")).unwrap())
            .unwrap();
    assert_eq!(raw["format_version"], 1);
    assert_eq!(raw["features"]["kind"], "whisper_logmel");
    assert_eq!(raw["decoding"]["sos_id"], 50257);
    assert!(raw.get("quantization").is_none());

    let from_native = tmp.path().join("q-native");
    Quantizer::new(&v1, &from_native).run().unwrap();
    let (_t, from_ct2, _) = quantize("int8_w8a8_rtn");
    let (a, b) = (
        Checkpoint::open(&from_native).unwrap(),
        Checkpoint::open(&from_ct2).unwrap(),
    );
    for name in a.config.quantization.as_ref().unwrap().layers.keys() {
        for key in ["weight", "weight_scale"] {
            let k = format!("{name}.{key}");
            assert_eq!(a.tensors[&k].bytes(), b.tensors[&k].bytes(), "{k}");
        }
    }
    assert_eq!(
        a.config
            .quantization
            .as_ref()
            .unwrap()
            .producer
            .source
            .format,
        "oasr_native_v1"
    );
}

/// Builds a Hugging Face Whisper directory from the real weights, as transformers lays it out.
fn write_hf_copy(dir: &std::path::Path) {
    write_hf_copy_as(dir, safetensors::Dtype::F16)
}

fn write_hf_copy_as(dir: &std::path::Path, dtype: safetensors::Dtype) {
    common::write_hf_weights_as(dir, dtype);
    let config = serde_json::json!({
        "model_type": "whisper", "d_model": 384, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
        "encoder_layers": 4, "decoder_layers": 4, "vocab_size": 51864,
        "suppress_tokens": [1, 2, 7], "begin_suppress_tokens": [220, 50256]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        common::tiny_en().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
}

#[test]
fn hugging_face_import_matches_the_ctranslate2_import() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf");
    write_hf_copy(&hf);
    let a = Checkpoint::open(&hf).unwrap();
    let b = Checkpoint::open(&common::tiny_en()).unwrap();
    assert_eq!(a.format, SourceFormat::Import("hf_whisper"));
    assert_eq!(
        a.tensors.keys().collect::<Vec<_>>(),
        b.tensors.keys().collect::<Vec<_>>()
    );
    for (name, t) in &a.tensors {
        assert_eq!(
            (t.shape.clone(), t.bytes()),
            (b.tensors[name].shape.clone(), b.tensors[name].bytes()),
            "{name}"
        );
    }
    let dst = tmp.path().join("q");
    let outcome = Quantizer::new(&hf, &dst)
        .recipe("int8_w8a8_rtn")
        .run()
        .unwrap();
    assert_eq!(outcome.report.unwrap().layers.len(), 64);
    // A directory matching two formats is refused, never guessed.
    std::fs::copy(common::tiny_en().join("model.bin"), hf.join("model.bin")).unwrap();
    let e = Checkpoint::open(&hf).unwrap_err();
    assert!(matches!(e, Error::AmbiguousFormat { .. }), "{e}");
}

#[test]
fn ignore_and_module_types_follow_the_selection_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("q");
    let outcome = Quantizer::new(common::tiny_en(), &dst)
        .ignore("decoder.layers.3.fc*")
        .ignore("*.encoder_attn.k_proj")
        .run()
        .unwrap();
    let report = outcome.report.unwrap();
    assert_eq!(report.layers.len(), 64 - 2 - 4);
    assert_eq!(
        report.skipped["decoder.layers.3.fc1"],
        "ignored by --ignore decoder.layers.3.fc*"
    );
    let spec = Checkpoint::open(&dst).unwrap().config.quantization.unwrap();
    // An ignored consumer disarms its norm's fused output.
    assert!(spec
        .links
        .fused_norms
        .iter()
        .all(|n| n.norm != "decoder.layers.3.final_layer_norm"));
    assert_eq!(spec.links.fused_norms.len(), 20 - 1);

    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .ignore("decoder.layers.9.*")
        .run()
        .unwrap_err();
    assert!(
        e.to_string().contains("decoder.layers.9.*") && e.to_string().contains("matches no"),
        "{e}"
    );
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .module_types(vec![ModuleKind::Linear, ModuleKind::Conv1d])
        .run()
        .unwrap_err();
    assert!(
        e.to_string().contains("--calib-manifest") && e.to_string().contains("conv1d"),
        "{e}"
    );
    let e = Quantizer::new(common::tiny_en(), tmp.path().join("x"))
        .recipe("fp8_w8a8_rtn")
        .module_types(vec![ModuleKind::Conv1d])
        .run()
        .unwrap_err();
    assert!(
        e.to_string().contains("--module-types") && e.to_string().contains("int8 only"),
        "{e}"
    );
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn output_paths_are_checked_and_replaced_only_with_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    oasr_quantize::convert(&common::tiny_en(), &src, false).unwrap();
    let before = common::tree_hashes(&src);
    for (dst, why) in [
        (src.clone(), "is the input"),
        (src.join("inner"), "lies inside the input"),
        (tmp.path().to_path_buf(), "contains the input"),
    ] {
        let e = Quantizer::new(&src, &dst)
            .overwrite(true)
            .run()
            .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    let dst = tmp.path().join("q");
    Quantizer::new(&src, &dst).run().unwrap();
    let e = Quantizer::new(&src, &dst).run().unwrap_err();
    assert!(e.to_string().contains("--overwrite"), "{e}");
    let first = common::tree_hashes(&dst);
    Quantizer::new(&src, &dst)
        .recipe("fp8_w8a8_rtn")
        .overwrite(true)
        .run()
        .unwrap();
    assert_ne!(first, common::tree_hashes(&dst));
    assert_eq!(before, common::tree_hashes(&src));
    // Nothing but the outputs is left beside them.
    let mut names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["q", "src"]);
}

#[test]
fn a_failing_run_leaves_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    // A truncated copy of the real model.
    let src = tmp.path().join("broken");
    std::fs::create_dir(&src).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(common::tiny_en().join(f), src.join(f)).unwrap();
    }
    let bin = std::fs::read(common::tiny_en().join("model.bin")).unwrap();
    std::fs::write(src.join("model.bin"), &bin[..bin.len() / 2]).unwrap();
    let dst = tmp.path().join("out");
    let e = Quantizer::new(&src, &dst).run().unwrap_err();
    assert!(
        e.to_string().contains("model.bin") && e.to_string().contains("truncated"),
        "{e}"
    );
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("broken")]);
}

#[test]
fn progress_is_reported_through_the_callback() {
    let tmp = tempfile::tempdir().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    Quantizer::new(common::tiny_en(), tmp.path().join("q"))
        .on_progress(move |p| sink.lock().unwrap().push((p.stage, p.done, p.total)))
        .run()
        .unwrap();
    let seen = seen.lock().unwrap();
    // 167 source tensors plus 64 weight scales.
    let writing: Vec<_> = seen
        .iter()
        .filter(|(s, ..)| *s == oasr_quantize::Stage::Writing)
        .collect();
    assert_eq!(writing.last().map(|(_, d, t)| (*d, *t)), Some((231, 231)));
    assert!(seen
        .iter()
        .any(|(s, ..)| *s == oasr_quantize::Stage::Hashing));
}

/// A bf16 source (as many Hugging Face checkpoints ship): imported, quantized and transcribed,
/// with exactly the codes and transcripts of an f32 source holding the same values.
#[test]
fn a_bf16_source_quantizes_and_transcribes_like_f32_of_its_values() {
    let tmp = tempfile::tempdir().unwrap();
    let (bf16, f32_of_bf16) = (tmp.path().join("bf16"), tmp.path().join("f32"));
    write_hf_copy_as(&bf16, safetensors::Dtype::BF16);
    // The same directory with the bf16 values widened to f32 (exactly).
    write_hf_copy_as(&f32_of_bf16, safetensors::Dtype::F32);
    let hf_names: Vec<(String, Vec<usize>, Vec<u8>)> = Checkpoint::open(&bf16)
        .unwrap()
        .tensors
        .iter()
        .map(|(n, t)| {
            assert_eq!(t.dtype, DType::BF16, "{n}");
            // Back to transformers' Conv1d layout, as write_hf_copy_as wrote it.
            let t = if n.starts_with("encoder.conv") && n.ends_with(".weight") {
                t.swap_last_two()
            } else {
                t.clone()
            };
            let bytes = t.to_f32().iter().flat_map(|v| v.to_le_bytes()).collect();
            (format!("model.{n}"), t.shape.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = hf_names
        .iter()
        .map(|(n, shape, b)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b);
            (n.clone(), view.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &f32_of_bf16.join("model.safetensors")).unwrap();
    let q = |src: &std::path::Path, name: &str| {
        let dst = tmp.path().join(name);
        Quantizer::new(src, &dst)
            .recipe("int8_w8a8_rtn")
            .run()
            .unwrap();
        Checkpoint::open(&dst).unwrap()
    };
    let (a, b) = (q(&bf16, "q-bf16"), q(&f32_of_bf16, "q-f32"));
    let spec = a.config.quantization.clone().unwrap();
    assert_eq!(spec.layers.len(), 64);
    for layer in spec.layers.keys() {
        for suffix in ["weight", "weight_scale"] {
            let name = format!("{layer}.{suffix}");
            assert_eq!(a.tensors[&name].bytes(), b.tensors[&name].bytes(), "{name}");
        }
    }
    let (_, gate) = common::manifests();
    let manifest = oasr_quantize::Manifest::read(&gate, None).unwrap();
    let say = |src: &std::path::Path| {
        oasr_quantize::transcribe::transcribe_manifest(src, &manifest, Some(3), |_, _, _| {})
            .unwrap()
            .utterances
            .into_iter()
            .map(|u| u.hypothesis)
            .collect::<Vec<_>>()
    };
    let said = say(&bf16);
    assert_eq!(said, say(&f32_of_bf16));
    assert_eq!(said[0], "Added.");
}
