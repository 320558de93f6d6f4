//! A compressed-tensors Whisper (what llm-compressor writes, or `oasr-quantize export`) read as a
//! quantized checkpoint for `inspect` and `verify`: its config groups become this crate's
//! semantic schemes (format/compressed_tensors.rs builds them; nothing here chooses a kernel),
//! its `targets` and `ignore` decide which Linear layers are quantized, and its tensors take OASR
//! names and shapes (`weight_scale` `[N]`, per-tensor weight scales broadcast to every channel).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::layout::quantization_layout;
use super::WhisperConfig;
use crate::checkpoint::{DType, Tensor};
use crate::error::{Error, Result};
use crate::format::compressed_tensors::{self as ct, WeightScales};
use crate::format::{
    LayerSpec, ModuleKind, ProducerRecord, QuantDtype, QuantizationSpec, Scheme, SmoothFold,
    SourceRecord,
};

/// `quantization_config.quant_method` of a Hugging Face `config.json`, when it has one.
pub(crate) fn quant_method(hf: &serde_json::Map<String, Value>) -> Option<&str> {
    let q = hf.get("quantization_config")?;
    Some(
        q.get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("unknown"),
    )
}

/// The quantization spec of the checkpoint and its tensors in OASR form. `tensors` holds the
/// Hugging Face tensors already renamed (`model.` stripped, convolutions re-laid).
pub(crate) fn read(
    config_path: &Path,
    weights_path: &Path,
    hf: &serde_json::Map<String, Value>,
    config: &WhisperConfig,
    tensors: &mut BTreeMap<String, Tensor>,
) -> Result<QuantizationSpec> {
    let key_error = |key: &str, message: String| {
        Error::config_key(config_path, format!("quantization_config.{key}"), message)
    };
    let q = hf
        .get("quantization_config")
        .and_then(Value::as_object)
        .ok_or_else(|| key_error("", "is not an object".into()))?;
    match q.get("quantization_status").and_then(Value::as_str) {
        Some("compressed") | Some("frozen") => {}
        other => {
            return Err(key_error(
                "quantization_status",
                format!("is {other:?}; only a compressed checkpoint holds quantized weights"),
            ))
        }
    }
    if !matches!(q.get("kv_cache_scheme"), None | Some(Value::Null)) {
        return Err(key_error(
            "kv_cache_scheme",
            "a quantized KV cache is not read".into(),
        ));
    }
    if matches!(q.get("sparsity_config"), Some(Value::Object(m)) if !m.is_empty()) {
        return Err(key_error(
            "sparsity_config",
            "sparse weights are not read".into(),
        ));
    }
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .ok_or_else(|| key_error("config_groups", "missing or not an object".into()))?;
    let mut schemes = Vec::new();
    for (key, group) in groups {
        let (scheme, scales) =
            ct::scheme_of(group, key).map_err(|m| key_error(&format!("config_groups.{key}"), m))?;
        let targets = strings(group.get("targets"))
            .ok_or_else(|| key_error(&format!("config_groups.{key}.targets"), "missing".into()))?;
        schemes.push((key.clone(), scheme, scales, targets));
    }
    let ignore = strings(q.get("ignore")).unwrap_or_default();

    let layout = quantization_layout(config);
    let mut layers = BTreeMap::new();
    for layer in &layout.layers {
        if layer.kind != ModuleKind::Linear {
            continue;
        }
        let hf_name = super::hf_export::hf_name(&layer.name);
        let mut ignored = false;
        for i in &ignore {
            ignored |= ct::matches(i, &hf_name, "Linear").map_err(|m| key_error("ignore", m))?;
        }
        if ignored {
            continue;
        }
        let mut chosen = None;
        for (key, scheme, scales, targets) in &schemes {
            for t in targets {
                if ct::matches(t, &hf_name, "Linear")
                    .map_err(|m| key_error(&format!("config_groups.{key}.targets"), m))?
                {
                    chosen = Some((*scheme, *scales));
                }
            }
        }
        let Some((scheme, scales)) = chosen else {
            continue;
        };
        to_oasr_scales(
            weights_path,
            &layer.name,
            layer.out_features,
            scheme,
            scales,
            tensors,
        )?;
        layers.insert(
            layer.name.clone(),
            LayerSpec {
                scheme,
                kind: ModuleKind::Linear,
                smooth: SmoothFold::None,
                smoothed_into: None,
                input_quantized_by: None,
            },
        );
    }
    if layers.is_empty() {
        return Err(key_error(
            "config_groups",
            "no Linear layer of this Whisper matches a group's targets".into(),
        ));
    }
    // The links the OASR server would arm for these layers (exports leave them out), so that
    // verify runs the checkpoint as the server serves it.
    let links = crate::links::arm(&layout, &mut layers);
    let used: std::collections::BTreeSet<Scheme> = layers.values().map(|l| l.scheme).collect();
    let fingerprint = crate::hashing::sha256_file(weights_path)?;
    let files = BTreeMap::from([
        (
            "config.json".to_string(),
            crate::hashing::sha256_file(config_path)?,
        ),
        ("model.safetensors".to_string(), fingerprint.clone()),
    ]);
    Ok(QuantizationSpec {
        schemes: used
            .iter()
            .map(|s| (s.name().to_string(), s.args()))
            .collect(),
        kv_cache: None,
        module_types: vec![ModuleKind::Linear],
        layers,
        links,
        producer: ProducerRecord {
            name: ct::QUANT_METHOD.into(),
            version: q
                .get("version")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .into(),
            recipe: "(imported from compressed-tensors)".into(),
            algorithms: Vec::new(),
            calibration: None,
            source: SourceRecord {
                format: super::CT_WHISPER.into(),
                files,
            },
            skipped: BTreeMap::new(),
            fingerprint,
        },
    })
}

/// The strings of a JSON list (`targets`, `ignore`).
fn strings(list: Option<&Value>) -> Option<Vec<String>> {
    let list = list?.as_array()?;
    Some(
        list.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
    )
}

/// A quantized layer's scales in OASR shapes: `weight_scale` F32 `[N]` (a per-tensor scale
/// broadcast), `input_scale` F32 `[1]` for a static input; zero points, which symmetric schemes
/// store as zeros, are checked and dropped.
fn to_oasr_scales(
    path: &Path,
    layer: &str,
    n: usize,
    scheme: Scheme,
    scales: WeightScales,
    tensors: &mut BTreeMap<String, Tensor>,
) -> Result<()> {
    for key in ["weight_zero_point", "input_zero_point"] {
        let name = format!("{layer}.{key}");
        if let Some(zp) = tensors.remove(&name) {
            if !zp.is_all_zero() {
                return Err(Error::tensor(
                    path,
                    format!("model.{name}"),
                    "a non-zero zero point: asymmetric quantization is not read",
                ));
            }
        }
    }
    let float = |name: &str, t: &Tensor| -> Result<Vec<f32>> {
        if t.dtype.is_float() {
            Ok(t.to_f32())
        } else {
            Err(Error::tensor(
                path,
                format!("model.{name}"),
                format!("a scale must be a float tensor, found {}", t.dtype),
            ))
        }
    };
    let name = format!("{layer}.weight_scale");
    let t = tensors.get(&name).ok_or_else(|| {
        Error::tensor(
            path,
            format!("model.{name}"),
            "missing for a quantized layer",
        )
    })?;
    let values = float(&name, t)?;
    let values = match (scales, values.len()) {
        (WeightScales::PerChannel, len) if len == n => values,
        (WeightScales::PerTensor, 1) => vec![values[0]; n],
        (_, len) => {
            return Err(Error::tensor(
                path,
                format!("model.{name}"),
                format!("{len} scales for a layer of {n} output channels ({scales:?})"),
            ))
        }
    };
    tensors.insert(name, Tensor::from_f32(vec![n], &values));
    let name = format!("{layer}.input_scale");
    match (scheme.is_static(), tensors.get(&name)) {
        (true, Some(t)) if t.numel() == 1 => {
            let v = float(&name, t)?;
            tensors.insert(name, Tensor::from_f32(vec![1], &v));
        }
        (true, _) => {
            return Err(Error::tensor(
                path,
                format!("model.{name}"),
                "a static input needs one scale [1]",
            ))
        }
        (false, Some(_)) => {
            return Err(Error::tensor(
                path,
                format!("model.{name}"),
                "present, but the layer's group quantizes its input dynamically",
            ))
        }
        (false, None) => {}
    }
    let code = match scheme.dtype() {
        QuantDtype::Int8 => DType::I8,
        QuantDtype::Float8E4m3fn => DType::F8E4m3,
    };
    let name = format!("{layer}.weight");
    if tensors.get(&name).map(|t| t.dtype) != Some(code) {
        return Err(Error::tensor(
            path,
            format!("model.{name}"),
            format!("expected {code} codes for a {} layer", scheme.name()),
        ));
    }
    Ok(())
}
