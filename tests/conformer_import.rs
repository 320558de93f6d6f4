//! The WeNet U2++ Conformer: import (both train.yaml layouts, every name mapping), the layout of
//! the standard 12-block model (96 + 60 quantized GEMMs), the calibration-free recipes end to
//! end, and the refusals of bad input. Seeded random weights: structure, never accuracy.

mod common;

use std::collections::BTreeMap;

use common::wenet::{write_dir, Geometry};
use oasr_quantize::checkpoint::{Checkpoint, SourceFormat};
use oasr_quantize::format::QuantizationSpec;
use oasr_quantize::{convert, Quantizer};

fn state_values(dir: &std::path::Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    // Re-derive what write_dir stored: the same seed gives the same values.
    let mut out = BTreeMap::new();
    let g = Geometry::small();
    let probe = tempfile::tempdir().unwrap();
    write_dir(probe.path(), &g, false, |state| {
        for (n, s, v) in state.iter() {
            out.insert(n.clone(), (s.clone(), v.clone()));
        }
    });
    let _ = dir;
    out
}

#[test]
fn a_wenet_directory_imports_with_every_name_mapped() {
    let g = Geometry::small();
    for old_layout in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        write_dir(tmp.path(), &g, old_layout, |_| {});
        let ckpt = Checkpoint::open(tmp.path()).unwrap();
        assert_eq!(ckpt.format, SourceFormat::Import("wenet"));
        assert_eq!(ckpt.config.architecture, "u2pp_conformer");
        let mc = &ckpt.config.model_config;
        assert_eq!(mc["d_model"], 32);
        assert_eq!(mc["encoder_blocks"], 2);
        assert_eq!(mc["vocab_size"], 30);
        assert_eq!(mc["decoder_type"], "bitransformer");
        assert_eq!(mc["cnn_module_norm"], "batch_norm");
        let d = &ckpt.config.decoding;
        assert_eq!(
            (d.blank_id, d.unk_id, d.sos_id, d.eos_id),
            (Some(0), Some(1), Some(29), Some(29)),
            "old layout: {old_layout}"
        );
        let features = ckpt.config.features.as_ref().unwrap();
        assert_eq!(features.kind, "kaldi_fbank");
        let normalize = features.normalize.as_ref().unwrap();
        let mean = normalize["mean"].as_array().unwrap();
        assert_eq!(mean.len(), 80);
        assert!((mean[0].as_f64().unwrap() - 8.0).abs() < 1e-3);
        assert!(ckpt
            .tensors
            .keys()
            .all(|n| !n.ends_with(".pe") && !n.contains("num_batches")));
    }

    let tmp = tempfile::tempdir().unwrap();
    write_dir(tmp.path(), &g, false, |_| {});
    let ckpt = Checkpoint::open(tmp.path()).unwrap();
    let src = state_values(tmp.path());
    let t = |n: &str| ckpt.tensors[n].to_f32();
    let d = g.d;
    // Conv2d NCHW [o, 1, kh, kw] → [o, kh, kw, 1].
    let (_, w0) = &src["encoder.embed.conv.0.weight"];
    let got = t("encoder.embed.convs.0.weight");
    assert_eq!(
        ckpt.tensors["encoder.embed.convs.0.weight"].shape,
        vec![d, 3, 3, 1]
    );
    assert_eq!(got[5 * 9 + 3 + 2], w0[5 * 9 + 3 + 2]);
    let (_, w2) = &src["encoder.embed.conv.2.weight"];
    let got = t("encoder.embed.convs.1.weight");
    // [o, i, kh, kw] → [o, kh, kw, i]: element (o 3, i 7, kh 1, kw 2).
    assert_eq!(
        got[((3 * 3 + 1) * 3 + 2) * d + 7],
        w2[((3 * d + 7) * 3 + 1) * 3 + 2]
    );
    // embed.out columns: c·F' + f → f·d + c (F' = 19).
    let (_, out) = &src["encoder.embed.out.0.weight"];
    let got = t("encoder.embed.out.weight");
    let cols = d * 19;
    assert_eq!(got[4 * cols + 6 * d + 11], out[4 * cols + 11 * 19 + 6]);
    // q; k; v fused by rows.
    let qkv = t("encoder.encoders.1.self_attn.linear_qkv.weight");
    let (_, k) = &src["encoder.encoders.1.self_attn.linear_k.weight"];
    assert_eq!(&qkv[d * d..2 * d * d], &k[..]);
    // Pointwise [o, i, 1] → [o, 1, i]; depthwise [d, 1, K] → [K, 1, d].
    let (_, dw) = &src["encoder.encoders.0.conv_module.depthwise_conv.weight"];
    let got = t("encoder.encoders.0.conv_module.depthwise_conv.weight");
    assert_eq!(got[3 * d + 9], dw[9 * g.kernel + 3]);
    assert!(ckpt
        .tensors
        .contains_key("encoder.encoders.0.conv_module.norm_activation.running_var"));
    // Heads padded to 32 rows: the CTC head with zeros, the decoders' biases with -1e4.
    assert_eq!(ckpt.tensors["ctc.ctc_lo.weight"].shape, vec![32, d]);
    assert_eq!(t("ctc.ctc_lo.bias")[31], 0.0);
    assert_eq!(t("decoder.left_decoder.output_layer.bias")[30], -1e4);
    assert_eq!(t("decoder.right_decoder.output_layer.weight")[31 * d], 0.0);
}

#[test]
fn the_standard_model_quantizes_96_plus_60_gemms_with_every_recipe() {
    let g = Geometry::standard();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("wenet");
    write_dir(&src, &g, false, |_| {});
    for (recipe, dtype) in [("int8_w8a8_rtn", "int8"), ("fp8_w8a8_rtn", "float8_e4m3fn")] {
        let dst = tmp.path().join(recipe);
        let outcome = Quantizer::new(&src, &dst).recipe(recipe).run().unwrap();
        let ckpt = Checkpoint::open(&dst).unwrap();
        let spec: &QuantizationSpec = ckpt.config.quantization.as_ref().unwrap();
        let count = |prefix: &str| spec.layers.keys().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("encoder."), 96, "{recipe}");
        assert_eq!(count("decoder."), 60, "{recipe}");
        assert!(spec
            .layers
            .values()
            .all(|l| l.scheme.dtype().to_string() == dtype));
        // The subsampling convolutions are skipped with their reasons.
        let skipped = &spec.producer.skipped;
        assert!(skipped["encoder.embed.convs.0"].contains("not selected"));
        assert_eq!(spec.producer.source.format, "wenet");
        // Fused norms arm under RTN: norm_ff_macaron, norm_mha, norm_ff per block, norm1..3 per
        // decoder block; never norm_conv.
        assert_eq!(spec.links.fused_norms.len(), 12 * 3 + 6 * 3);
        assert!(spec
            .links
            .fused_norms
            .iter()
            .all(|n| !n.norm.ends_with("norm_conv")));
        assert!(outcome.report.is_some());
        // Byte-deterministic.
        let again = tmp.path().join(format!("{recipe}-again"));
        Quantizer::new(&src, &again).recipe(recipe).run().unwrap();
        assert_eq!(common::tree_hashes(&dst), common::tree_hashes(&again));
    }
    // The calibrating recipes on two real clips, and a verify run of the fused one.
    let clips = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wenet");
    let manifest = tmp.path().join("clips.jsonl");
    std::fs::write(
        &manifest,
        format!(
            "{{\"id\": \"bobby\", \"audio\": \"{}\"}}\n{{\"id\": \"goforward\", \"audio\": \"{}\"}}\n",
            clips.join("praatio-bobby.wav").display(),
            clips.join("pocketsphinx-goforward.wav").display()
        ),
    )
    .unwrap();
    for recipe in [
        "smoothquant_w8a8",
        "smoothquant_fp8_w8a8",
        "smoothquant_w8a8_fused",
        "smoothquant_fp8_w8a8_fused",
    ] {
        let dst = tmp.path().join(recipe);
        Quantizer::new(&src, &dst)
            .recipe(recipe)
            .calib_manifest(&manifest)
            .run()
            .unwrap();
        let spec = Checkpoint::open(&dst).unwrap().config.quantization.unwrap();
        assert_eq!(spec.layers.len(), 156, "{recipe}");
        if recipe == "smoothquant_w8a8_fused" {
            let m = oasr_quantize::Manifest::read(&manifest, None).unwrap();
            let report = oasr_quantize::verify::verify(
                &dst,
                &src,
                &m,
                None,
                oasr_quantize::numerics::OutDtype::F16,
                |_, _, _| {},
            )
            .unwrap();
            assert_eq!(report.nonfinite, 0);
            assert!(
                report.teacher_forced.cosine_mean > 0.9,
                "{}",
                report.teacher_forced.cosine_mean
            );
        }
    }
    // The second subsampling convolution as int8 static conv2d: 157 layers.
    let dst = tmp.path().join("conv2d");
    Quantizer::new(&src, &dst)
        .recipe("smoothquant_w8a8")
        .module_types(vec![
            oasr_quantize::format::ModuleKind::Linear,
            oasr_quantize::format::ModuleKind::PointwiseConv,
            oasr_quantize::format::ModuleKind::Conv2d,
        ])
        .calib_manifest(&manifest)
        .run()
        .unwrap();
    let spec = Checkpoint::open(&dst).unwrap().config.quantization.unwrap();
    assert_eq!(spec.layers.len(), 157);
    assert!(spec.layers["encoder.embed.convs.1"].scheme.is_static());
    assert!(spec.producer.skipped["encoder.embed.convs.0"].contains("in_features 1"));

    // A native v1 export opens with the same layout.
    let v1 = tmp.path().join("v1");
    convert(&src, &v1, false).unwrap();
    let native = Checkpoint::open(&v1).unwrap();
    let imported = Checkpoint::open(&src).unwrap();
    assert_eq!(
        oasr_quantize::layout_of(&native).unwrap(),
        oasr_quantize::layout_of(&imported).unwrap()
    );
    assert_eq!(native.tensors.len(), imported.tensors.len());
}

fn refused(dir: &std::path::Path, needles: &[&str]) {
    let e = Checkpoint::open(dir).unwrap_err().to_string();
    for n in needles {
        assert!(e.contains(n), "`{n}` not in: {e}");
    }
}

#[test]
fn bad_wenet_directories_are_refused_naming_the_file_and_key() {
    let g = Geometry::small();
    let fresh = |old: bool, edit: &dyn Fn(&mut common::wenet::StateDict)| {
        let tmp = tempfile::tempdir().unwrap();
        write_dir(tmp.path(), &g, old, |s| edit(s));
        tmp
    };
    // An extra tensor, a missing one, a wrong shape.
    let tmp = fresh(false, &|s| {
        s.push(("encoder.bogus.weight".into(), vec![2], vec![0.0, 1.0]))
    });
    refused(
        tmp.path(),
        &["final.pt", "encoder.bogus.weight", "unexpected"],
    );
    let tmp = fresh(false, &|s| {
        s.retain(|(n, _, _)| n != "encoder.encoders.1.norm_conv.bias")
    });
    refused(
        tmp.path(),
        &["final.pt", "encoder.encoders.1.norm_conv.bias", "missing"],
    );
    let tmp = fresh(false, &|s| {
        for (n, shape, v) in s.iter_mut() {
            if n == "encoder.encoders.0.feed_forward.w_2.weight" {
                shape.swap(0, 1);
                v.truncate(v.len());
            }
        }
    });
    refused(
        tmp.path(),
        &["encoder.encoders.0.feed_forward.w_2.weight", "shape"],
    );
    // CMVN stored in the model that disagrees with global_cmvn.
    let tmp = fresh(false, &|s| {
        for (n, _, v) in s.iter_mut() {
            if n == "encoder.global_cmvn.mean" {
                v[3] += 1.0;
            }
        }
    });
    refused(tmp.path(), &["encoder.global_cmvn.mean", "global_cmvn"]);

    let rewrite = |file: &str, from: &str, to: &str| {
        let tmp = fresh(false, &|_| {});
        let path = tmp.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        tmp
    };
    let tmp = rewrite("train.yaml", "encoder: conformer", "encoder: squeezeformer");
    refused(tmp.path(), &["train.yaml", "`encoder`", "squeezeformer"]);
    let tmp = rewrite("train.yaml", "decoder: bitransformer", "decoder: rnnt");
    refused(tmp.path(), &["train.yaml", "`decoder`", "rnnt"]);
    let tmp = rewrite("train.yaml", "  num_blocks: 2\n", "");
    refused(
        tmp.path(),
        &["train.yaml", "encoder_conf.num_blocks", "missing"],
    );
    let tmp = rewrite(
        "train.yaml",
        "selfattention_layer_type: rel_selfattn",
        "selfattention_layer_type: selfattn",
    );
    refused(
        tmp.path(),
        &["train.yaml", "encoder_conf.selfattention_layer_type"],
    );
    let tmp = rewrite("train.yaml", "output_dim: 30", "output_dim: 31");
    refused(tmp.path(), &["train.yaml", "output_dim", "30 units"]);
    let tmp = rewrite("train.yaml", "encoder_conf:\n", "encoder_conf: [unclosed\n");
    refused(tmp.path(), &["train.yaml", "invalid YAML"]);
    // units.txt that disagrees with the heads (and with output_dim, which is checked first).
    let tmp = rewrite("units.txt", "<unk> 1\n", "<unk> 1\nextra 2\n");
    refused(tmp.path(), &["units.txt"]);
    let tmp = rewrite("train.yaml", "output_dim: 30\n", "");
    let units = tmp.path().join("units.txt");
    let text = std::fs::read_to_string(&units).unwrap();
    std::fs::write(&units, format!("{text}extra 30\n")).unwrap();
    refused(tmp.path(), &["final.pt", "ctc.ctc_lo.weight", "31 units"]);
    // A global_cmvn of the wrong dimension.
    let tmp = fresh(false, &|_| {});
    std::fs::write(
        tmp.path().join("global_cmvn"),
        r#"{"mean_stat": [1.0, 2.0], "var_stat": [3.0, 4.0], "frame_num": 2}"#,
    )
    .unwrap();
    refused(tmp.path(), &["global_cmvn"]);
    // A final.pt that is not a PyTorch archive.
    let tmp = fresh(false, &|_| {});
    std::fs::write(tmp.path().join("final.pt"), b"not a zip").unwrap();
    refused(tmp.path(), &["final.pt"]);
}

/// Writes the standard synthetic model for the benchmarks (BENCHMARKS.md):
/// `OASR_CONFORMER_BENCH_DIR=DIR cargo test --release --test conformer_import -- --ignored`.
/// Ignored because it is a tool, not a check: it writes 213 MB where the benchmark reads it, and
/// CI already runs the same writer on the same model in
/// `the_standard_model_quantizes_96_plus_60_gemms_with_every_recipe`.
#[test]
#[ignore = "writes the benchmark model; run explicitly"]
fn write_the_standard_model_for_benchmarks() {
    let dir = std::env::var_os("OASR_CONFORMER_BENCH_DIR").expect("set OASR_CONFORMER_BENCH_DIR");
    write_dir(
        std::path::Path::new(&dir),
        &Geometry::standard(),
        false,
        |_| {},
    );
}
