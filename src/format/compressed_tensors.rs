//! compressed-tensors' `quantization_config` and this crate's semantic schemes, both ways: the
//! arguments an export writes (exactly the keys compressed-tensors' `QuantizationArgs` accepts;
//! it forbids unknown ones), the scheme an import reads from a config group (refusing by name what
//! is not W8A8: group-wise or block scales, asymmetric, other bit widths, weight-only), and the
//! module matching of its `targets` and `ignore` lists.

use serde_json::{json, Value};

use super::{Granularity, QuantArgs, QuantDtype, Scheme};
use crate::error::{Error, Result};

/// `quant_method` of a compressed-tensors checkpoint.
pub const QUANT_METHOD: &str = "compressed-tensors";

/// The compressed-tensors name of an 8-bit type.
pub fn type_name(dtype: QuantDtype) -> &'static str {
    match dtype {
        QuantDtype::Int8 => "int",
        QuantDtype::Float8E4m3fn => "float",
    }
}

/// The `format` of a checkpoint whose layers are all of `dtype`.
pub fn format_name(dtype: QuantDtype) -> &'static str {
    match dtype {
        QuantDtype::Int8 => "int-quantized",
        QuantDtype::Float8E4m3fn => "float-quantized",
    }
}

/// One tensor's arguments as compressed-tensors writes them; `what` names the scheme in a refusal.
pub fn args_json(args: &QuantArgs, what: &str) -> Result<Value> {
    if !args.symmetric {
        return Err(Error::Scheme {
            name: what.into(),
            message: "asymmetric quantization has no export here".into(),
        });
    }
    let strategy = match args.granularity {
        Granularity::PerChannel => "channel",
        Granularity::PerToken => "token",
        Granularity::PerTensor => "tensor",
    };
    Ok(json!({
        "num_bits": 8,
        "type": type_name(args.dtype),
        "symmetric": true,
        "group_size": null,
        "strategy": strategy,
        "dynamic": args.dynamic,
    }))
}

/// How an imported layer's weight scale is stored: one per output channel, or one for the
/// whole weight (broadcast to every channel on import: the same numerics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightScales {
    PerChannel,
    PerTensor,
}

/// The scheme of one config group (`group` is `config_groups.<key>`, blamed as `key` in `path`'s
/// errors), and how its weight scales are stored.
pub fn scheme_of(group: &Value, key: &str) -> std::result::Result<(Scheme, WeightScales), String> {
    let args = |which: &str| -> std::result::Result<&serde_json::Map<String, Value>, String> {
        match group.get(which) {
            Some(Value::Object(m)) => Ok(m),
            None | Some(Value::Null) => Err(format!(
                "{key}.{which} is absent: {} is not W8A8",
                if which == "input_activations" {
                    "weight-only quantization"
                } else {
                    "activation-only quantization"
                }
            )),
            Some(other) => Err(format!("{key}.{which} is {other}, not an object")),
        }
    };
    if !matches!(group.get("output_activations"), None | Some(Value::Null)) {
        return Err(format!(
            "{key}.output_activations: quantized outputs are not read"
        ));
    }
    let read = |which: &str| -> std::result::Result<(QuantDtype, String, bool), String> {
        let a = args(which)?;
        let field = |k: &str| a.get(k).cloned().unwrap_or(Value::Null);
        let bits = field("num_bits").as_u64().unwrap_or(8);
        if bits != 8 {
            return Err(format!(
                "{key}.{which}.num_bits is {bits}: only 8-bit (W8A8) schemes are read"
            ));
        }
        if field("symmetric") == Value::Bool(false) {
            return Err(format!(
                "{key}.{which}.symmetric is false: asymmetric (zero-point) quantization is not read"
            ));
        }
        if !field("group_size").is_null() || !field("block_structure").is_null() {
            return Err(format!(
                "{key}.{which}: group-wise and block scales are not read (one scale per channel, \
                 token or tensor)"
            ));
        }
        if !matches!(field("actorder"), Value::Null | Value::Bool(false)) {
            return Err(format!("{key}.{which}.actorder is not read"));
        }
        let dtype = match field("type").as_str().unwrap_or("int") {
            "int" => QuantDtype::Int8,
            "float" => QuantDtype::Float8E4m3fn,
            other => return Err(format!("{key}.{which}.type `{other}` is not int or float")),
        };
        let strategy = field("strategy").as_str().unwrap_or("tensor").to_string();
        let dynamic = match field("dynamic") {
            Value::Bool(b) => b,
            Value::Null => false,
            other => {
                return Err(format!(
                    "{key}.{which}.dynamic is {other}; only true or false (not `local`) is read"
                ))
            }
        };
        Ok((dtype, strategy, dynamic))
    };
    let (wd, ws, wdyn) = read("weights")?;
    let (ad, as_, adyn) = read("input_activations")?;
    if wd != ad {
        return Err(format!(
            "{key}: {} weights with {} inputs; W8A8 uses one type",
            type_name(wd),
            type_name(ad)
        ));
    }
    let scales = match (ws.as_str(), wdyn) {
        ("channel", false) => WeightScales::PerChannel,
        ("tensor", false) => WeightScales::PerTensor,
        (s, d) => {
            return Err(format!(
            "{key}.weights: strategy `{s}`{} is not read; static per-channel or per-tensor weights",
            if d { ", dynamic" } else { "" }
        ))
        }
    };
    let scheme = match (wd, as_.as_str(), adyn) {
        (QuantDtype::Int8, "token", true) => Scheme::Int8W8a8,
        (QuantDtype::Int8, "tensor", false) => Scheme::Int8W8a8Static,
        (QuantDtype::Float8E4m3fn, "token", true) => Scheme::Fp8W8a8,
        (QuantDtype::Float8E4m3fn, "tensor", false) => Scheme::Fp8W8a8Static,
        (_, s, d) => {
            return Err(format!(
                "{key}.input_activations: strategy `{s}` with dynamic {d} is not read; dynamic \
                 per-token or static per-tensor inputs"
            ))
        }
    };
    Ok((scheme, scales))
}

/// Whether a `targets` or `ignore` entry names the module `name` of class `class`: the class
/// name, the module's name, or `re:PATTERN` matched at the start of the name (Python's
/// `re.match`, as compressed-tensors does).
pub fn matches(target: &str, name: &str, class: &str) -> std::result::Result<bool, String> {
    if let Some(pattern) = target.strip_prefix("re:") {
        let re = fancy_regex::Regex::new(&format!("^(?:{pattern})"))
            .map_err(|e| format!("the pattern `{target}` does not compile: {e}"))?;
        return re
            .is_match(name)
            .map_err(|e| format!("the pattern `{target}`: {e}"));
    }
    Ok(target == class || target == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_reads_back_as_itself() {
        for scheme in Scheme::ALL {
            let a = scheme.args();
            let group = json!({
                "targets": ["Linear"],
                "weights": args_json(&a.weight, scheme.name()).unwrap(),
                "input_activations": args_json(&a.input, scheme.name()).unwrap(),
            });
            assert_eq!(
                scheme_of(&group, "group_0").unwrap(),
                (scheme, WeightScales::PerChannel)
            );
        }
    }

    #[test]
    fn what_is_not_w8a8_is_refused_by_name() {
        let w = json!({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel"});
        let x = json!({"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token", "dynamic": true});
        let refused = |g: Value| scheme_of(&g, "group_0").unwrap_err();
        assert!(refused(json!({"weights": w})).contains("weight-only"));
        let mut four = w.clone();
        four["num_bits"] = json!(4);
        assert!(refused(json!({"weights": four, "input_activations": x})).contains("num_bits is 4"));
        let mut grouped = w.clone();
        grouped["group_size"] = json!(128);
        grouped["strategy"] = json!("group");
        assert!(refused(json!({"weights": grouped, "input_activations": x})).contains("group-wise"));
        let mut asym = x.clone();
        asym["symmetric"] = json!(false);
        assert!(refused(json!({"weights": w, "input_activations": asym})).contains("asymmetric"));
        let mut tensor_w = w.clone();
        tensor_w["strategy"] = json!("tensor");
        assert_eq!(
            scheme_of(&json!({"weights": tensor_w, "input_activations": x}), "g").unwrap(),
            (Scheme::Int8W8a8, WeightScales::PerTensor)
        );
    }

    #[test]
    fn targets_match_class_name_and_pattern_at_the_start() {
        let m = |t: &str| matches(t, "model.decoder.layers.0.fc1", "Linear").unwrap();
        assert!(m("Linear") && m("model.decoder.layers.0.fc1") && m("re:.*fc1$"));
        assert!(m("re:model\\.decoder"));
        assert!(!m("re:decoder") && !m("Conv1d") && !m("model.decoder.layers.0.fc2"));
        assert!(matches("re:(", "x", "Linear").is_err());
    }
}
