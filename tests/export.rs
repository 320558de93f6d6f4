//! The compressed-tensors export of the real Whisper tiny.en: the `quantization_config` field by
//! field, the tensors against the native checkpoint they came from, the files transformers
//! reads, `--format compressed-tensors` on a quantization run, and every refusal by name.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use oasr_quantize::checkpoint::safetensors_io;
use oasr_quantize::checkpoint::{DType, Tensor};
use oasr_quantize::export::{export, ExportFormat};
use oasr_quantize::Quantizer;
use serde_json::{json, Value};

const CT: ExportFormat = ExportFormat::CompressedTensors;

fn quantize(dst: &Path, recipe: &str, extra: &[&str]) {
    let mut q = Quantizer::new(common::tiny_en(), dst).recipe(recipe);
    if recipe.starts_with("smoothquant") {
        q = q.calib_manifest(common::manifests().0).calib_utterances(4);
    }
    for option in extra {
        q = q.option(*option);
    }
    q.run().unwrap();
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn tensors(dir: &Path) -> BTreeMap<String, Tensor> {
    safetensors_io::read(&dir.join("model.safetensors")).unwrap()
}

#[test]
fn int8_rtn_exports_as_compressed_tensors_writes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (native, out) = (tmp.path().join("q"), tmp.path().join("ct"));
    quantize(&native, "int8_w8a8_rtn", &[]);
    let report = export(&native, &out, CT, false).unwrap();
    assert_eq!((report.quantized_layers, report.config_groups), (64, 1));
    assert_eq!(report.ignored, ["proj_out"]);

    let c = config(&out);
    assert_eq!(c["model_type"], "whisper");
    assert_eq!(
        c["architectures"],
        json!(["WhisperForConditionalGeneration"])
    );
    assert_eq!(
        (c["d_model"].clone(), c["encoder_layers"].clone()),
        (json!(384), json!(4))
    );
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["dtype"], "float16");
    let arg = |strategy: &str, dynamic: bool| {
        json!({"num_bits": 8, "type": "int", "symmetric": true, "group_size": null,
               "strategy": strategy, "dynamic": dynamic})
    };
    assert_eq!(
        c["quantization_config"],
        json!({
            "quant_method": "compressed-tensors",
            "format": "int-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": arg("channel", false),
                "input_activations": arg("token", true),
                "output_activations": null,
                "format": "int-quantized",
            }},
            "ignore": ["proj_out"],
            "kv_cache_scheme": null,
            "global_compression_ratio": null,
        })
    );

    let (q, e) = (tensors(&native), tensors(&out));
    assert!(
        e.keys().all(|k| k.starts_with("model.")),
        "Hugging Face names"
    );
    assert!(!e.contains_key("proj_out.weight"), "tied to the embedding");
    assert!(
        e.keys().all(|k| !k.ends_with("k_proj.bias")),
        "Whisper's k has no bias"
    );
    assert_eq!(e.len(), q.len());
    let fc1 = "encoder.layers.0.fc1";
    let w = &e[&format!("model.{fc1}.weight")];
    assert_eq!((w.dtype, w.shape.clone()), (DType::I8, vec![1536, 384]));
    assert_eq!(w.bytes(), q[&format!("{fc1}.weight")].bytes());
    let s = &e[&format!("model.{fc1}.weight_scale")];
    assert_eq!((s.dtype, s.shape.clone()), (DType::F32, vec![1536, 1]));
    assert_eq!(s.to_f32(), q[&format!("{fc1}.weight_scale")].to_f32());
    assert!(
        !e.keys().any(|k| k.ends_with("input_scale")),
        "dynamic inputs only"
    );
    // PyTorch's Conv1d layout [out, in, k].
    let conv = &e["model.encoder.conv1.weight"];
    assert_eq!(conv.shape, vec![384, 80, 3]);
    assert_eq!(
        conv.bytes(),
        q["encoder.conv1.weight"].swap_last_two().bytes()
    );

    for file in [
        "generation_config.json",
        "preprocessor_config.json",
        "tokenizer_config.json",
    ] {
        let _: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join(file)).unwrap()).unwrap();
    }
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(common::tiny_en().join("tokenizer.json")).unwrap()
    );
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(g["no_timestamps_token_id"], 50362);
    assert_eq!(g["forced_decoder_ids"], json!([[1, 50362]]));
    assert_eq!(g["is_multilingual"], false);

    // The source is untouched, and an existing output is replaced only with overwrite.
    let e = export(&native, &out, CT, false).unwrap_err().to_string();
    assert!(e.contains("--overwrite"), "{e}");
    export(&native, &out, CT, true).unwrap();
    assert_eq!(tensors(&out).len(), 231);
    // Read back, the export is the same quantized model: verify gives the same report.
    let back = oasr_quantize::checkpoint::Checkpoint::open(&out).unwrap();
    assert_eq!(back.format.name(), "compressed_tensors_whisper");
    let spec = back.config.quantization.as_ref().unwrap();
    assert_eq!(spec.layers.len(), 64);
    let gate = oasr_quantize::Manifest::read(&common::manifests().1, None).unwrap();
    let run = |q: &Path| {
        let r = oasr_quantize::verify::verify(
            q,
            &common::tiny_en(),
            &gate,
            Some(3),
            oasr_quantize::numerics::OutDtype::F16,
            |_, _, _| {},
        )
        .unwrap();
        serde_json::to_value((
            &r.teacher_forced,
            &r.free_running,
            &r.transcripts,
            r.wer_quantized,
        ))
        .unwrap()
    };
    assert_eq!(run(&out), run(&native));
}

#[test]
fn fp8_and_static_inputs_export_their_own_groups() {
    let tmp = tempfile::tempdir().unwrap();
    let (native, out) = (tmp.path().join("q"), tmp.path().join("ct"));
    quantize(&native, "smoothquant_fp8_w8a8_fused", &[]);
    export(&native, &out, CT, false).unwrap();
    let c = &config(&out)["quantization_config"];
    assert_eq!(c["format"], "float-quantized");
    let groups = c["config_groups"].as_object().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let e = tensors(&out);
    let q = tensors(&native);
    for g in groups.values() {
        assert_eq!(g["weights"]["type"], "float");
        let input = &g["input_activations"];
        let targets: Vec<&str> = g["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let static_input = input["dynamic"] == false;
        assert_eq!(
            input["strategy"],
            if static_input { "tensor" } else { "token" }
        );
        for t in targets {
            let w = &e[&format!("{t}.weight")];
            assert_eq!(w.dtype, DType::F8E4m3, "{t}");
            let scale = e.get(&format!("{t}.input_scale"));
            assert_eq!(scale.is_some(), static_input, "{t}");
            if let Some(s) = scale {
                assert_eq!(s.shape, vec![1]);
                let oasr = t.strip_prefix("model.").unwrap();
                assert_eq!(s.to_f32(), q[&format!("{oasr}.input_scale")].to_f32());
            }
        }
    }
    let ignore = c["ignore"].as_array().unwrap();
    assert!(
        ignore.contains(&json!("model.decoder.layers.0.fc2"))
            && ignore.contains(&json!("model.encoder.layers.0.self_attn.q_proj"))
            && ignore.contains(&json!("proj_out"))
    );
}

#[test]
fn the_fp8_keep_recipe_exports_its_kept_layers_as_ignore() {
    // No smoother to refuse: what the recipe keeps full precision is named in `ignore` and
    // written as the source's weights; every other linear layer is fp8.
    let tmp = tempfile::tempdir().unwrap();
    let (native, out) = (tmp.path().join("q"), tmp.path().join("ct"));
    quantize(&native, "fp8_w8a8_rtn_keep", &[]);
    export(&native, &out, CT, false).unwrap();
    let c = &config(&out)["quantization_config"];
    assert_eq!(c["format"], "float-quantized");
    let ignore: BTreeSet<String> = c["ignore"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let kept: BTreeSet<String> = ["q_proj", "k_proj", "v_proj", "out_proj"]
        .iter()
        .map(|p| format!("model.encoder.layers.0.self_attn.{p}"))
        .chain(["fc1", "fc2"].map(|p| format!("model.encoder.layers.0.{p}")))
        .chain((0..4).map(|i| format!("model.decoder.layers.{i}.fc2")))
        .chain(["proj_out".to_string()])
        .collect();
    assert_eq!(ignore, kept);
    let e = tensors(&out);
    let mut fp8 = 0;
    for (name, t) in &e {
        let Some(layer) = name.strip_suffix(".weight") else {
            continue;
        };
        if t.shape.len() != 2
            || layer.ends_with("embed_tokens")
            || layer.ends_with("embed_positions")
        {
            continue;
        }
        let ignored = ignore.contains(layer);
        assert_eq!(t.dtype == DType::F8E4m3, !ignored, "{name}: {:?}", t.dtype);
        assert_eq!(
            e.contains_key(&format!("{layer}.weight_scale")),
            !ignored,
            "{layer}"
        );
        fp8 += usize::from(!ignored);
    }
    assert_eq!(fp8, 64 - 10, "tiny.en's 64 linear layers less the 10 kept");
}

#[test]
fn a_quantization_run_writes_compressed_tensors_directly() {
    let tmp = tempfile::tempdir().unwrap();
    let (native, via, direct) = (
        tmp.path().join("q"),
        tmp.path().join("via"),
        tmp.path().join("direct"),
    );
    quantize(&native, "smoothquant_w8a8_portable", &[]);
    export(&native, &via, CT, false).unwrap();
    Quantizer::new(common::tiny_en(), &direct)
        .recipe("smoothquant_w8a8_portable")
        .calib_manifest(common::manifests().0)
        .calib_utterances(4)
        .format(Some(CT))
        .run()
        .unwrap();
    for file in ["config.json", "model.safetensors", "generation_config.json"] {
        assert_eq!(
            std::fs::read(via.join(file)).unwrap(),
            std::fs::read(direct.join(file)).unwrap(),
            "{file}"
        );
    }
    assert!(direct.join("quantization_report.json").is_file());
    assert!(!direct.join(".oasr-native").exists());
    // The portable recipe folds the cross-attention k/v into the encoder's final norm.
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(native.join("oasr_config.json")).unwrap())
            .unwrap();
    let k = &spec["quantization"]["layers"]["decoder.layers.3.encoder_attn.k_proj"];
    assert_eq!(
        (k["smooth"].clone(), k["smoothed_into"].clone()),
        (json!("norm_affine"), json!("encoder.layer_norm"))
    );
}

#[test]
fn what_compressed_tensors_cannot_say_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ct");

    // A runtime smoother (smooth_inv): the layers and the recipe to use instead.
    let runtime = tmp.path().join("runtime");
    quantize(&runtime, "smoothquant_w8a8", &["smoothquant.runtime=true"]);
    let e = export(&runtime, &out, CT, false).unwrap_err().to_string();
    assert!(
        e.contains("runtime smoother")
            && e.contains("smoothquant_w8a8_portable")
            && e.contains("encoder_attn.k_proj"),
        "{e}"
    );
    // The same refusal on a quantization run, with nothing left behind.
    let e = Quantizer::new(common::tiny_en(), &out)
        .recipe("smoothquant_w8a8")
        .option("smoothquant.runtime=true")
        .calib_manifest(common::manifests().0)
        .calib_utterances(2)
        .format(Some(CT))
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("runtime smoother"), "{e}");
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // vLLM fuses q/k/v: a k left full precision splits one GEMM into two schemes.
    let split = tmp.path().join("split");
    Quantizer::new(common::tiny_en(), &split)
        .ignore("decoder.layers.1.self_attn.k_proj")
        .run()
        .unwrap();
    let e = export(&split, &out, CT, false).unwrap_err().to_string();
    assert!(
        e.contains("decoder.layers.1.self_attn.q_proj, decoder.layers.1.self_attn.k_proj")
            && e.contains("full precision"),
        "{e}"
    );

    // An fp8 KV cache scaled at run time has no k/v scales to export.
    let kv = tmp.path().join("kv");
    quantize(&kv, "int8_w8a8_rtn", &[]);
    let path = kv.join("oasr_config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["quantization"]["kv_cache"] = json!("fp8_e4m3");
    std::fs::write(&path, serde_json::to_string(&c).unwrap()).unwrap();
    let e = export(&kv, &out, CT, false).unwrap_err().to_string();
    assert!(e.contains("KV cache"), "{e}");

    // An architecture transformers does not have.
    let conformer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wenet/espnet/wenet-small");
    let e = export(&conformer, &out, CT, false).unwrap_err().to_string();
    assert!(
        e.contains("u2pp_conformer") && e.contains("not implemented"),
        "{e}"
    );

    // An output inside the input.
    let e = export(&kv, &kv.join("ct"), CT, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("inside the input"), "{e}");
    assert!(!out.exists());
}

/// The fixture compressed-tensors 0.19 wrote itself (tests/compressed_tensors/make_fixture.py,
/// a seeded tiny.en-shaped Whisper): its `quantization_config` and its tensors' names, dtypes and
/// shapes against this export of the real tiny.en in the same scheme.
/// compressed-tensors checkpoints read as quantized sources: what is not W8A8 is refused by name
/// (the schemes' unit tests cover each argument), naming the key or tensor at fault.
#[test]
fn a_compressed_tensors_source_that_is_not_w8a8_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (native, out) = (tmp.path().join("q"), tmp.path().join("ct"));
    quantize(&native, "int8_w8a8_rtn", &[]);
    export(&native, &out, CT, false).unwrap();
    let path = out.join("config.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut c: Value = serde_json::from_str(&original).unwrap();
        edit(&mut c);
        std::fs::write(&path, serde_json::to_string(&c).unwrap()).unwrap();
        oasr_quantize::checkpoint::Checkpoint::open(&out)
            .unwrap_err()
            .to_string()
    };
    let group = "/quantization_config/config_groups/group_0";
    let e = with(&|c| *c.pointer_mut(&format!("{group}/weights/num_bits")).unwrap() = json!(4));
    assert!(
        e.contains("num_bits is 4") && e.contains("config_groups.group_0"),
        "{e}"
    );
    let e = with(&|c| {
        *c.pointer_mut(&format!("{group}/input_activations"))
            .unwrap() = Value::Null
    });
    assert!(e.contains("weight-only"), "{e}");
    let e = with(&|c| c["quantization_config"]["quant_method"] = json!("gptq"));
    assert!(e.contains("gptq") && e.contains("not implemented"), "{e}");
    let e = with(&|c| c["quantization_config"]["kv_cache_scheme"] = json!({"num_bits": 8}));
    assert!(e.contains("kv_cache_scheme"), "{e}");
    // The static scheme on layers that carry no input scale.
    let e = with(&|c| {
        let g = c
            .pointer_mut(&format!("{group}/input_activations"))
            .unwrap();
        g["strategy"] = json!("tensor");
        g["dynamic"] = json!(false);
    });
    assert!(e.contains("input_scale") && e.contains("static"), "{e}");
}

#[test]
fn the_export_matches_what_compressed_tensors_writes() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/compressed_tensors");
    let tmp = tempfile::tempdir().unwrap();
    // The keys compressed-tensors writes with their defaults, which the export leaves out.
    let defaults = json!({"actorder": null, "block_structure": null, "observer": null,
                          "observer_kwargs": {}, "scale_dtype": null, "zp_dtype": null});
    for (fixture, recipe) in [
        ("w8a8_int8", "int8_w8a8_rtn"),
        ("fp8_dynamic", "fp8_w8a8_rtn"),
    ] {
        let (native, out) = (tmp.path().join(recipe), tmp.path().join(fixture));
        quantize(&native, recipe, &[]);
        export(&native, &out, CT, false).unwrap();
        let (want, got) = (config(&fixtures.join(fixture)), config(&out));
        for key in [
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "vocab_size",
            "num_mel_bins",
            "max_source_positions",
            "max_target_positions",
            "model_type",
            "architectures",
            "decoder_start_token_id",
            "eos_token_id",
            "tie_word_embeddings",
        ] {
            assert_eq!(got[key], want[key], "{fixture}: config.json {key}");
        }
        let (w, g) = (&want["quantization_config"], &got["quantization_config"]);
        for key in [
            "quant_method",
            "format",
            "quantization_status",
            "ignore",
            "kv_cache_scheme",
        ] {
            assert_eq!(g[key], w[key], "{fixture}: {key}");
        }
        let (wg, gg) = (
            &w["config_groups"]["group_0"],
            &g["config_groups"]["group_0"],
        );
        for key in ["targets", "format", "output_activations"] {
            assert_eq!(gg[key], wg[key], "{fixture}: group_0.{key}");
        }
        for args in ["weights", "input_activations"] {
            let (wa, ga) = (wg[args].as_object().unwrap(), gg[args].as_object().unwrap());
            for (k, v) in wa {
                match ga.get(k) {
                    Some(mine) => assert_eq!(mine, v, "{fixture}: {args}.{k}"),
                    None => assert_eq!(&defaults[k], v, "{fixture}: {args}.{k} left out"),
                }
            }
            assert!(
                ga.keys().all(|k| wa.contains_key(k)),
                "{fixture}: {args} {ga:?}"
            );
        }
        // The same tensors, dtypes and shapes; scales are F32 here (vLLM and transformers copy
        // them into f32), the model's dtype there.
        let header: BTreeMap<String, Value> = serde_json::from_str(
            &std::fs::read_to_string(fixtures.join(fixture).join("tensors.json")).unwrap(),
        )
        .unwrap();
        let mine = tensors(&out);
        assert_eq!(
            mine.keys().collect::<Vec<_>>(),
            header.keys().collect::<Vec<_>>(),
            "{fixture}"
        );
        for (name, t) in &mine {
            let h = &header[name];
            assert_eq!(json!(t.shape), h["shape"], "{fixture}: {name}");
            let dtype = if name.ends_with("_scale") {
                "F32"
            } else {
                h["dtype"].as_str().unwrap()
            };
            assert_eq!(t.dtype.safetensors_name(), dtype, "{fixture}: {name}");
        }
    }
    // A static per-tensor input as compressed-tensors writes it: one scale [1] per layer.
    let fixture = fixtures.join("w8a8_int8_static_encoder_fc2");
    let want = config(&fixture);
    let static_group = want["quantization_config"]["config_groups"]["group_1"].clone();
    let native = tmp.path().join("fused");
    // The recipe's error guard declines tiny.en's int8 chains; a looser one arms them.
    quantize(
        &native,
        "smoothquant_w8a8_fused",
        &["static_inputs.max_error_ratio=1000"],
    );
    let out = tmp.path().join("fused-ct");
    export(&native, &out, CT, false).unwrap();
    let got = config(&out);
    let groups = got["quantization_config"]["config_groups"]
        .as_object()
        .unwrap();
    let mine = groups
        .values()
        .find(|g| g["input_activations"]["dynamic"] == false)
        .unwrap();
    for k in ["strategy", "dynamic", "type", "num_bits", "symmetric"] {
        assert_eq!(
            mine["input_activations"][k], static_group["input_activations"][k],
            "{k}"
        );
    }
    let header: BTreeMap<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tensors.json")).unwrap())
            .unwrap();
    assert_eq!(
        header["model.encoder.layers.0.fc2.input_scale"]["shape"],
        json!([1])
    );
    // The layers calibration gave a static scale (where it beat per-token on the calibration
    // audio) each carry one, in the same shape.
    let targets = mine["targets"].as_array().unwrap();
    assert!(!targets.is_empty());
    let e = tensors(&out);
    for t in targets {
        let scale = &e[&format!("{}.input_scale", t.as_str().unwrap())];
        assert_eq!((scale.dtype, scale.shape.clone()), (DType::F32, vec![1]));
    }
}

/// A Hugging Face source in shards (`model-0000N-of-0000M.safetensors` with
/// `model.safetensors.index.json`) reads as the same checkpoint as one `model.safetensors`; an
/// index that disagrees with its shards is refused naming the shard and the tensor. The
/// single-file source is this tool's full-precision export of the real tiny.en.
#[test]
fn a_sharded_hugging_face_source_reads_as_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (single, sharded) = (tmp.path().join("hf"), tmp.path().join("sharded"));
    export(&common::tiny_en(), &single, CT, false).unwrap();
    std::fs::create_dir_all(&sharded).unwrap();
    for f in ["config.json", "tokenizer.json", "generation_config.json"] {
        std::fs::copy(single.join(f), sharded.join(f)).unwrap();
    }
    let all = tensors(&single);
    let names: Vec<&String> = all.keys().collect();
    let mut map = serde_json::Map::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(3)).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = chunk
            .iter()
            .map(|n| {
                let t = &all[*n];
                let dtype = match t.dtype {
                    DType::F16 => safetensors::Dtype::F16,
                    other => panic!("{other}"),
                };
                map.insert(n.to_string(), json!(file));
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(dtype, t.shape.clone(), t.bytes())
                        .unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &None, &sharded.join(&file)).unwrap();
    }
    let index = sharded.join("model.safetensors.index.json");
    let write_index = |map: &serde_json::Map<String, Value>| {
        std::fs::write(
            &index,
            serde_json::to_string(&json!({"metadata": {}, "weight_map": map})).unwrap(),
        )
        .unwrap()
    };
    write_index(&map);
    let open = oasr_quantize::checkpoint::Checkpoint::open;
    let (a, b) = (open(&single).unwrap(), open(&sharded).unwrap());
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (name, t) in &a.tensors {
        assert_eq!(t.bytes(), b.tensors[name].bytes(), "{name}");
    }
    let (qa, qb) = (tmp.path().join("qa"), tmp.path().join("qb"));
    Quantizer::new(&single, &qa).run().unwrap();
    Quantizer::new(&sharded, &qb).run().unwrap();
    assert_eq!(
        std::fs::read(qa.join("model.safetensors")).unwrap(),
        std::fs::read(qb.join("model.safetensors")).unwrap()
    );
    // The index names a tensor in the wrong shard.
    let moved = "model.decoder.embed_tokens.weight";
    let wrong = if map[moved] == json!("model-00001-of-00003.safetensors") {
        "model-00002-of-00003.safetensors"
    } else {
        "model-00001-of-00003.safetensors"
    };
    let mut bad = map.clone();
    bad.insert(moved.into(), json!(wrong));
    write_index(&bad);
    let e = open(&sharded).unwrap_err().to_string();
    // Whichever shard is read first is named: the one that lacks the tensor, or the one that
    // holds it unlisted.
    assert!(
        e.contains(moved)
            && e.contains("-of-00003.safetensors")
            && (e.contains("weight_map") || e.contains("lacks it")),
        "{e}"
    );
}
