//! The semantic formats: presets, refusals, and the spec's serde form.

use oasr_quantize::format::{
    Granularity, ModuleKind, QuantArgs, QuantDtype, QuantizationSpec, Scheme, SchemeArgs,
};

#[test]
fn presets_have_the_documented_arguments() {
    let json = serde_json::to_value(Scheme::Int8W8a8Static.args()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "weight": {"dtype": "int8", "granularity": "per_channel", "dynamic": false, "symmetric": true},
            "input": {"dtype": "int8", "granularity": "per_tensor", "dynamic": false, "symmetric": true}
        })
    );
    let fp8 = Scheme::from_name("fp8_w8a8").unwrap().args();
    assert_eq!(
        fp8.input,
        QuantArgs {
            dtype: QuantDtype::Float8E4m3fn,
            granularity: Granularity::PerToken,
            dynamic: true,
            symmetric: true
        }
    );
    for s in Scheme::ALL {
        assert_eq!(Scheme::from_name(s.name()).unwrap(), s);
        s.args().validate(s.name()).unwrap();
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            serde_json::json!(s.name())
        );
    }
}

#[test]
fn nvfp4_is_refused_by_name_and_unknown_schemes_list_the_presets() {
    let e = Scheme::from_name("nvfp4").unwrap_err().to_string();
    assert!(e.contains("nvfp4") && e.contains("8-bit"), "{e}");
    let e = Scheme::from_name("int4_w4a16").unwrap_err().to_string();
    assert!(e.contains("int8_w8a8_static"), "{e}");
}

#[test]
fn a_per_tensor_dynamic_activation_is_refused() {
    let mut args: SchemeArgs = Scheme::Int8W8a8.args();
    args.input.granularity = Granularity::PerTensor;
    let e = args.validate("custom").unwrap_err().to_string();
    assert!(e.contains("per-tensor dynamic"), "{e}");
    let mut asym = Scheme::Fp8W8a8.args();
    asym.weight.symmetric = false;
    assert!(asym
        .validate("asym")
        .unwrap_err()
        .to_string()
        .contains("asymmetric"));
}

#[test]
fn module_type_lists_expand_conv_and_all() {
    assert_eq!(
        ModuleKind::parse_list("conv").unwrap(),
        vec![
            ModuleKind::PointwiseConv,
            ModuleKind::Conv1d,
            ModuleKind::Conv2d
        ]
    );
    assert_eq!(
        ModuleKind::parse_list("all").unwrap(),
        ModuleKind::ALL.to_vec()
    );
    assert_eq!(
        ModuleKind::parse_list("linear,conv1d,linear").unwrap(),
        vec![ModuleKind::Linear, ModuleKind::Conv1d]
    );
    let e = ModuleKind::parse_list("linear,lstm")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--module-types") && e.contains("lstm"), "{e}");
}

#[test]
fn the_spec_round_trips_and_rejects_inconsistencies() {
    let config: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/oasr_config_v2.json")).unwrap();
    let spec: QuantizationSpec = serde_json::from_value(config["quantization"].clone()).unwrap();
    spec.validate().unwrap();
    assert_eq!(serde_json::to_value(&spec).unwrap(), config["quantization"]);

    let mut bad = spec.clone();
    bad.schemes.clear();
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("encoder.layers.0.fc1"));
    let mut bad = spec.clone();
    bad.schemes.get_mut("int8_w8a8").unwrap().input.dynamic = false;
    assert!(bad.validate().is_err());
    let mut bad = spec.clone();
    bad.links.fused_norms[0]
        .consumers
        .push("decoder.nothing".into());
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("decoder.nothing"));
    let mut bad = spec;
    bad.kv_cache = Some("int4".into());
    assert!(bad.validate().is_err());
    // Unknown fields are errors, not silently dropped.
    let mut value = config["quantization"].clone();
    value["layers"]["encoder.layers.0.fc1"]["extra"] = serde_json::json!(1);
    assert!(serde_json::from_value::<QuantizationSpec>(value).is_err());
}
