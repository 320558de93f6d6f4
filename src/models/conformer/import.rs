//! Importing a WeNet model directory (`train.yaml`, `final.pt`, `units.txt`, `global_cmvn`) into
//! OASR names and config, and the checks of a native Conformer checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::config::{ConfigFault, MODEL_TYPE};
use super::{expected_tensors, ConformerConfig, NAME};
use crate::checkpoint::{
    safetensors_io, torch_pt, Checkpoint, DecodingSpec, FeatureSpec, NativeConfig, SourceFormat,
    Tensor, TokenizerSpec,
};
use crate::error::{Error, Result};
use crate::frontend::GlobalCmvn;
use crate::models::registry::NativeParts;
use crate::models::QuantizationLayout;

/// The files of a WeNet model directory.
pub const TRAIN_YAML: &str = "train.yaml";
pub const FINAL_PT: &str = "final.pt";
pub const UNITS: &str = "units.txt";
pub const GLOBAL_CMVN: &str = "global_cmvn";

/// The bias an output layer's padding rows get, so that no search ever picks them.
pub const PADDING_LOGIT: f32 = -1e4;

/// WeNet: `train.yaml` beside `final.pt`.
pub(crate) fn detect(dir: &Path) -> Result<bool> {
    Ok(dir.join(TRAIN_YAML).is_file() && dir.join(FINAL_PT).is_file())
}

/// A YAML document as JSON values (strings, numbers, booleans, null, lists, maps with string
/// keys), so that serde and the error paths treat it like any other config.
fn yaml_file(path: &Path) -> Result<serde_json::Value> {
    use yaml_rust2::{Yaml, YamlLoader};
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let docs = YamlLoader::load_from_str(&text)
        .map_err(|e| Error::corrupt(path, format!("invalid YAML: {e}")))?;
    fn convert(path: &Path, y: &Yaml) -> Result<serde_json::Value> {
        use serde_json::Value;
        Ok(match y {
            Yaml::Real(s) => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(s.clone())),
            Yaml::Integer(i) => Value::from(*i),
            Yaml::String(s) => Value::String(s.clone()),
            Yaml::Boolean(b) => Value::Bool(*b),
            Yaml::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|v| convert(path, v))
                    .collect::<Result<_>>()?,
            ),
            Yaml::Hash(map) => {
                let mut out = serde_json::Map::new();
                for (k, v) in map {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        other => {
                            return Err(Error::corrupt(
                                path,
                                format!("a mapping key that is not a scalar: {other:?}"),
                            ))
                        }
                    };
                    out.insert(key, convert(path, v)?);
                }
                Value::Object(out)
            }
            Yaml::Null => Value::Null,
            Yaml::Alias(_) | Yaml::BadValue => {
                return Err(Error::corrupt(path, "an unresolved YAML alias or value"))
            }
        })
    }
    match docs.as_slice() {
        [doc] => convert(path, doc),
        [] => Err(Error::corrupt(path, "an empty YAML file")),
        _ => Err(Error::corrupt(path, "several YAML documents; expected one")),
    }
}

/// `train.yaml`, with every lookup naming the key it reads.
struct TrainYaml<'a> {
    path: &'a Path,
    root: &'a serde_json::Value,
}

impl TrainYaml<'_> {
    fn get(&self, key: &str) -> Option<&serde_json::Value> {
        key.split('.')
            .try_fold(self.root, |v, part| v.get(part))
            .filter(|v| !v.is_null())
    }

    fn required(&self, key: &str) -> Result<&serde_json::Value> {
        self.get(key)
            .ok_or_else(|| Error::config_key(self.path, key, "missing"))
    }

    fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        Error::config_key(
                            self.path,
                            key,
                            format!("expected a non-negative integer, found {v}"),
                        )
                    })
            })
            .transpose()
    }

    fn required_usize(&self, key: &str) -> Result<usize> {
        self.required(key)?;
        self.usize(key).map(|v| v.unwrap_or_default())
    }

    fn string(&self, key: &str) -> Result<Option<&str>> {
        self.get(key)
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    Error::config_key(self.path, key, format!("expected a string, found {v}"))
                })
            })
            .transpose()
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    Error::config_key(self.path, key, format!("expected true or false, found {v}"))
                })
            })
            .transpose()
    }

    /// A string option the forward implements only one value of (WeNet's default when absent).
    fn only(&self, key: &str, expected: &str) -> Result<()> {
        match self.string(key)? {
            None => Ok(()),
            Some(v) if v == expected => Ok(()),
            Some(v) => Err(Error::config_key(
                self.path,
                key,
                format!("is {v:?}; this version implements {expected:?} only"),
            )),
        }
    }

    /// A boolean option the forward implements only one value of.
    fn only_bool(&self, key: &str, expected: bool) -> Result<()> {
        match self.bool(key)? {
            None => Ok(()),
            Some(v) if v == expected => Ok(()),
            Some(v) => Err(Error::config_key(
                self.path,
                key,
                format!("is {v}; this version implements {expected} only"),
            )),
        }
    }
}

/// The Conformer's geometry from `train.yaml` (the current layout with `cmvn_conf` and
/// `tokenizer_conf`, and the pre-2024 one with a top-level `cmvn_file`), before it is checked
/// against the tensors. Options the forward does not implement are refused by key.
fn yaml_config(y: &TrainYaml<'_>, vocab_size: usize) -> Result<ConformerConfig> {
    match y.string("encoder")? {
        Some("conformer") => {}
        Some(other) => {
            return Err(Error::config_key(
                y.path,
                "encoder",
                format!("is {other:?}; this version imports the \"conformer\" encoder only"),
            ))
        }
        None => return Err(Error::config_key(y.path, "encoder", "missing")),
    }
    let decoder_type = match y.string("decoder")? {
        Some(t @ ("bitransformer" | "transformer")) => t.to_string(),
        Some(other) => {
            return Err(Error::config_key(
                y.path,
                "decoder",
                format!(
                    "is {other:?}; this version imports \"bitransformer\" and \"transformer\" \
                     decoders"
                ),
            ))
        }
        None => return Err(Error::config_key(y.path, "decoder", "missing")),
    };
    y.only("encoder_conf.input_layer", "conv2d")?;
    y.only("encoder_conf.pos_enc_layer_type", "rel_pos")?;
    y.only("encoder_conf.selfattention_layer_type", "rel_selfattn")?;
    y.only("encoder_conf.activation_type", "swish")?;
    y.only_bool("encoder_conf.normalize_before", true)?;
    y.only_bool("encoder_conf.macaron_style", true)?;
    y.only_bool("encoder_conf.use_cnn_module", true)?;
    let input_dim = match y.usize("input_dim")? {
        Some(d) => d,
        None => y
            .usize("dataset_conf.fbank_conf.num_mel_bins")?
            .ok_or_else(|| Error::config_key(y.path, "input_dim", "missing"))?,
    };
    if let Some(out) = y.usize("output_dim")? {
        if out != vocab_size {
            return Err(Error::config_key(
                y.path,
                "output_dim",
                format!("is {out}, but {UNITS} lists {vocab_size} units"),
            ));
        }
    }
    let right = if decoder_type == "bitransformer" {
        y.required_usize("decoder_conf.r_num_blocks")?
    } else {
        0
    };
    Ok(ConformerConfig {
        model_type: MODEL_TYPE.into(),
        input_dim,
        vocab_size,
        d_model: y.required_usize("encoder_conf.output_size")?,
        encoder_blocks: y.required_usize("encoder_conf.num_blocks")?,
        encoder_heads: y.required_usize("encoder_conf.attention_heads")?,
        encoder_linear_units: y.required_usize("encoder_conf.linear_units")?,
        cnn_module_kernel: y.required_usize("encoder_conf.cnn_module_kernel")?,
        causal: y.bool("encoder_conf.causal")?.unwrap_or(false),
        cnn_module_norm: y
            .string("encoder_conf.cnn_module_norm")?
            .unwrap_or("batch_norm")
            .to_string(),
        decoder_type,
        decoder_heads: y.required_usize("decoder_conf.attention_heads")?,
        decoder_linear_units: y.required_usize("decoder_conf.linear_units")?,
        decoder_left_blocks: y.required_usize("decoder_conf.num_blocks")?,
        decoder_right_blocks: right,
    })
}

/// Where a `model_config` key comes from in `train.yaml`.
fn yaml_key(key: &str) -> &'static str {
    match key {
        "input_dim" => "input_dim",
        "vocab_size" => "output_dim",
        "d_model" => "encoder_conf.output_size",
        "encoder_blocks" => "encoder_conf.num_blocks",
        "encoder_heads" => "encoder_conf.attention_heads",
        "encoder_linear_units" => "encoder_conf.linear_units",
        "cnn_module_kernel" => "encoder_conf.cnn_module_kernel",
        "causal" => "encoder_conf.causal",
        "cnn_module_norm" => "encoder_conf.cnn_module_norm",
        "decoder_type" => "decoder",
        "decoder_heads" => "decoder_conf.attention_heads",
        "decoder_linear_units" => "decoder_conf.linear_units",
        "decoder_left_blocks" => "decoder_conf.num_blocks",
        "decoder_right_blocks" => "decoder_conf.r_num_blocks",
        _ => "model_type",
    }
}

/// `units.txt`: one `token id` line per unit, ids 0..n in order.
pub(crate) struct Units {
    pub tokens: Vec<String>,
}

impl Units {
    pub(crate) fn read(path: &Path) -> Result<Units> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |why: String| Error::corrupt(path, format!("line {}: {why}", i + 1));
            let (token, id) = line
                .trim_end()
                .rsplit_once(char::is_whitespace)
                .ok_or_else(|| bad(format!("expected `token id`, found {line:?}")))?;
            let id: usize = id
                .parse()
                .map_err(|_| bad(format!("`{id}` is not a unit id")))?;
            if id != tokens.len() {
                return Err(bad(format!(
                    "unit id {id} out of order (expected {})",
                    tokens.len()
                )));
            }
            tokens.push(token.trim().to_string());
        }
        if tokens.is_empty() {
            return Err(Error::corrupt(path, "no units"));
        }
        Ok(Units { tokens })
    }

    pub(crate) fn id(&self, token: &str) -> Option<u32> {
        self.tokens
            .iter()
            .position(|t| t == token)
            .and_then(|i| u32::try_from(i).ok())
    }
}

/// The special ids: `tokenizer_conf.special_tokens` (current layout) or WeNet's older
/// convention (`<blank>` 0, `<unk>`, and `<sos/eos>` the last unit).
fn special_ids(y: &TrainYaml<'_>, units: &Units, units_path: &Path) -> Result<DecodingSpec> {
    let n = units.tokens.len();
    let from_yaml = |key: &str| -> Result<Option<u32>> {
        match y.usize(&format!("tokenizer_conf.special_tokens.{key}"))? {
            None => Ok(None),
            Some(id) if id < n => Ok(u32::try_from(id).ok()),
            Some(id) => Err(Error::config_key(
                y.path,
                format!("tokenizer_conf.special_tokens.{key}"),
                format!("{id} is outside the {n} units of {UNITS}"),
            )),
        }
    };
    let last = u32::try_from(n - 1).ok();
    let blank = from_yaml("<blank>")?.or(units.id("<blank>")).unwrap_or(0);
    let unk = from_yaml("<unk>")?.or(units.id("<unk>"));
    let sos = from_yaml("<sos>")?.or(units.id("<sos/eos>")).or(last);
    let eos = from_yaml("<eos>")?.or(units.id("<sos/eos>")).or(last);
    if blank != 0 {
        return Err(Error::corrupt(
            units_path,
            format!("the blank unit has id {blank}; WeNet's CTC blank is 0"),
        ));
    }
    Ok(DecodingSpec {
        default_decode_type: "attention_rescoring".into(),
        blank_id: Some(blank),
        unk_id: unk,
        sos_id: sos,
        eos_id: eos,
    })
}

/// The CMVN as `features.normalize` records it: `(x − mean) · istd` per feature dimension.
fn cmvn_json(cmvn: &GlobalCmvn) -> serde_json::Value {
    serde_json::json!({"kind": "global_cmvn", "mean": cmvn.mean(), "istd": cmvn.istd()})
}

/// WeNet's fbank as the encoder was trained on it, with the global CMVN.
fn features(input_dim: usize, cmvn: Option<&GlobalCmvn>) -> FeatureSpec {
    FeatureSpec {
        kind: crate::frontend::KALDI_FBANK.into(),
        sample_rate: 16_000,
        feature_dim: input_dim as u32,
        frame_length_ms: 25.0,
        frame_shift_ms: 10.0,
        dither: 0.0,
        lfr_m: 1,
        lfr_n: 1,
        window_type: "povey".into(),
        normalize: cmvn.map(cmvn_json),
        audio_scale: 32768.0,
        window_seconds: None,
        preemphasis: Some(0.97),
    }
}

/// The `global_cmvn` file `train.yaml` names (`cmvn_conf.cmvn_file`, or the older top-level
/// `cmvn_file`), looked up in the model directory by its file name (the training path it names
/// is not shipped); `None` when the model has no CMVN.
fn cmvn_path(dir: &Path, y: &TrainYaml<'_>) -> Result<Option<PathBuf>> {
    let named = match y.string("cmvn_conf.cmvn_file")? {
        Some(p) => Some(("cmvn_conf.cmvn_file", p)),
        None => y.string("cmvn_file")?.map(|p| ("cmvn_file", p)),
    };
    let Some((key, named)) = named else {
        return Ok(dir
            .join(GLOBAL_CMVN)
            .is_file()
            .then(|| dir.join(GLOBAL_CMVN)));
    };
    let json = y
        .bool("cmvn_conf.is_json_cmvn")?
        .or(y.bool("is_json_cmvn")?)
        .unwrap_or(true);
    if !json {
        return Err(Error::NotImplemented {
            what: "a Kaldi-format (non-JSON) global_cmvn".into(),
            detail: format!("{key} names a Kaldi stats file; convert it to WeNet's JSON form"),
        });
    }
    let name = Path::new(named)
        .file_name()
        .ok_or_else(|| Error::config_key(y.path, key, format!("`{named}` names no file")))?;
    let path = dir.join(name);
    if !path.is_file() {
        return Err(Error::config_key(
            y.path,
            key,
            format!(
                "names `{named}`, but the model directory has no `{}`",
                name.to_string_lossy()
            ),
        ));
    }
    Ok(Some(path))
}

/// A float tensor's values.
fn values(path: &Path, name: &str, t: &Tensor) -> Result<Vec<f32>> {
    if !t.dtype.is_float() {
        return Err(Error::tensor(
            path,
            name,
            format!("expected a float tensor, found {}", t.dtype),
        ));
    }
    Ok(t.to_f32())
}

/// Permutes a row-major tensor of `shape` by `order` (the new axis i is the old axis order[i]).
fn permute(values: &[f32], shape: &[usize], order: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let new_shape: Vec<usize> = order.iter().map(|&a| shape[a]).collect();
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let mut out = Vec::with_capacity(values.len());
    let mut index = vec![0usize; shape.len()];
    for _ in 0..values.len() {
        let src: usize = index.iter().zip(order).map(|(&i, &a)| i * strides[a]).sum();
        out.push(values[src]);
        for a in (0..index.len()).rev() {
            index[a] += 1;
            if index[a] < new_shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
    (out, new_shape)
}

/// Maps WeNet's state dict to OASR names and layouts (docs/conformer.md): the subsampling
/// convolutions to `[out, kh, kw, in]`, the subsampling projection's columns from channel-major
/// to frequency-major, q/k/v fused, the convolution module's weights channels-last, the CTC
/// head and output layers padded to a multiple of 8. Computed buffers (`pe`) and BatchNorm's
/// `num_batches_tracked` are dropped; CMVN buffers stored in the model are checked against
/// `global_cmvn` and dropped. Any other tensor is refused by name.
fn map_state_dict(
    path: &Path,
    c: &ConformerConfig,
    mut state: BTreeMap<String, Tensor>,
    cmvn: Option<&GlobalCmvn>,
) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    let d = c.d_model;
    let take = |state: &mut BTreeMap<String, Tensor>, name: &str| {
        state
            .remove(name)
            .ok_or_else(|| Error::tensor(path, name, "missing"))
    };
    // The subsampling: NCHW → [out, kh, kw, in]; embed.conv.{0,2} → embed.convs.{0,1}.
    for (from, to) in [
        ("encoder.embed.conv.0", "encoder.embed.convs.0"),
        ("encoder.embed.conv.2", "encoder.embed.convs.1"),
    ] {
        let w = take(&mut state, &format!("{from}.weight"))?;
        if w.shape.len() != 4 {
            return Err(Error::tensor(
                path,
                format!("{from}.weight"),
                format!("expected [out, in, kh, kw], found {:?}", w.shape),
            ));
        }
        let (v, shape) = permute(
            &values(path, &format!("{from}.weight"), &w)?,
            &w.shape,
            &[0, 2, 3, 1],
        );
        out.insert(format!("{to}.weight"), Tensor::from_f32(shape, &v));
        out.insert(
            format!("{to}.bias"),
            take(&mut state, &format!("{from}.bias"))?,
        );
    }
    // embed.out.0: columns c·F' + f (PyTorch flattens [C, F']) → f·C + c.
    let w = take(&mut state, "encoder.embed.out.0.weight")?;
    let f = c.subsampled_bins();
    if w.shape != [d, d * f] {
        return Err(Error::tensor(
            path,
            "encoder.embed.out.0.weight",
            format!("expected [{d}, {}], found {:?}", d * f, w.shape),
        ));
    }
    let (v, _) = permute(
        &values(path, "encoder.embed.out.0.weight", &w)?,
        &[d, d, f],
        &[0, 2, 1],
    );
    out.insert(
        "encoder.embed.out.weight".into(),
        Tensor::from_f32(vec![d, d * f], &v),
    );
    out.insert(
        "encoder.embed.out.bias".into(),
        take(&mut state, "encoder.embed.out.0.bias")?,
    );
    for i in 0..c.encoder_blocks {
        let p = format!("encoder.encoders.{i}");
        let att = format!("{p}.self_attn");
        let (mut rows, mut bias) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for proj in ["linear_q", "linear_k", "linear_v"] {
            let name = format!("{att}.{proj}.weight");
            let w = take(&mut state, &name)?;
            if w.shape != [d, d] {
                return Err(Error::tensor(
                    path,
                    &name,
                    format!("expected [{d}, {d}], found {:?}", w.shape),
                ));
            }
            rows.extend(values(path, &name, &w)?);
            match state.remove(&format!("{att}.{proj}.bias")) {
                Some(b) => bias.extend(values(path, &format!("{att}.{proj}.bias"), &b)?),
                None => bias.extend(std::iter::repeat_n(0.0, d)),
            }
        }
        out.insert(
            format!("{att}.linear_qkv.weight"),
            Tensor::from_f32(vec![3 * d, d], &rows),
        );
        out.insert(
            format!("{att}.linear_qkv.bias"),
            Tensor::from_f32(vec![3 * d], &bias),
        );
        let m = format!("{p}.conv_module");
        for (conv, order) in [
            ("pointwise_conv1", [0, 2, 1]),
            ("pointwise_conv2", [0, 2, 1]),
            ("depthwise_conv", [2, 1, 0]),
        ] {
            let name = format!("{m}.{conv}.weight");
            let w = take(&mut state, &name)?;
            if w.shape.len() != 3 {
                return Err(Error::tensor(
                    path,
                    &name,
                    format!("expected a 1-D convolution weight, found {:?}", w.shape),
                ));
            }
            let (v, shape) = permute(&values(path, &name, &w)?, &w.shape, &order);
            out.insert(name, Tensor::from_f32(shape, &v));
        }
        for key in ["weight", "bias", "running_mean", "running_var"] {
            if let Some(t) = state.remove(&format!("{m}.norm.{key}")) {
                out.insert(format!("{m}.norm_activation.{key}"), t);
            }
        }
    }
    let pad = |path: &Path, name: &str, t: Tensor, fill: f32| -> Result<Tensor> {
        let v = values(path, name, &t)?;
        let rows = t.shape.first().copied().unwrap_or(0);
        if rows != c.vocab_size {
            return Err(Error::tensor(
                path,
                name,
                format!("{rows} rows, but {UNITS} lists {} units", c.vocab_size),
            ));
        }
        let cols = t.shape.iter().skip(1).product::<usize>();
        let mut shape = t.shape.clone();
        shape[0] = c.padded_vocab();
        let mut padded = v;
        padded.resize(c.padded_vocab() * cols, fill);
        Ok(Tensor::from_f32(shape, &padded))
    };
    let mut heads = vec!["ctc.ctc_lo".to_string()];
    heads.extend(
        super::layout::decoder_prefixes(c)
            .iter()
            .map(|(p, _)| format!("{p}.output_layer")),
    );
    for (i, head) in heads.iter().enumerate() {
        let w = take(&mut state, &format!("{head}.weight"))?;
        out.insert(
            format!("{head}.weight"),
            pad(path, &format!("{head}.weight"), w, 0.0)?,
        );
        let b = take(&mut state, &format!("{head}.bias"))?;
        // The decoders' padding rows never win; the CTC head's are never read past the units.
        let fill = if i == 0 { 0.0 } else { PADDING_LOGIT };
        out.insert(
            format!("{head}.bias"),
            pad(path, &format!("{head}.bias"), b, fill)?,
        );
    }
    for (name, t) in std::mem::take(&mut state) {
        if name.ends_with(".num_batches_tracked")
            || name.ends_with(".pos_enc.pe")
            || name.ends_with(".1.pe")
        {
            continue;
        }
        if let Some(stat) = name.strip_prefix("encoder.global_cmvn.") {
            let stored = values(path, &name, &t)?;
            let expected = match (stat, cmvn) {
                ("mean", Some(c)) => c.mean(),
                ("istd", Some(c)) => c.istd(),
                _ => return Err(Error::tensor(path, &name, format!("the model normalises its features, but the directory has no `{GLOBAL_CMVN}`"))),
            };
            let close = stored.len() == expected.len()
                && stored
                    .iter()
                    .zip(expected)
                    .all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0));
            if !close {
                return Err(Error::tensor(
                    path,
                    &name,
                    format!("disagrees with `{GLOBAL_CMVN}`"),
                ));
            }
            continue;
        }
        out.insert(name, t);
    }
    Ok(out)
}

/// Every tensor against the config: present, float, and of the expected shape; nothing extra.
pub(crate) fn validate(
    path: &Path,
    c: &ConformerConfig,
    tensors: &BTreeMap<String, Tensor>,
    quantized: &std::collections::HashSet<String>,
) -> Result<()> {
    let expected = expected_tensors(c);
    for (name, shape) in &expected {
        let t = tensors
            .get(name)
            .ok_or_else(|| Error::tensor(path, name, "missing"))?;
        let layer = name
            .strip_suffix(".weight")
            .filter(|l| quantized.contains(*l));
        if layer.is_none() && !t.dtype.is_float() {
            return Err(Error::tensor(
                path,
                name,
                format!("expected a float tensor, found {}", t.dtype),
            ));
        }
        if &t.shape != shape {
            return Err(Error::tensor(
                path,
                name,
                format!("expected shape {shape:?}, found {:?}", t.shape),
            ));
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    for name in tensors.keys() {
        let is_quant_extra = ["weight_scale", "input_scale", "smooth_inv"]
            .iter()
            .any(|s| {
                name.strip_suffix(&format!(".{s}"))
                    .is_some_and(|l| quantized.contains(l))
            });
        if !known.contains(name.as_str()) && !is_quant_extra {
            return Err(Error::tensor(
                path,
                name,
                "unexpected tensor for a U2++ Conformer",
            ));
        }
    }
    Ok(())
}

fn check_config(path: &Path, c: &ConformerConfig, key_of: impl Fn(&str) -> String) -> Result<()> {
    c.check()
        .map_err(|ConfigFault { key, message }| Error::config_key(path, key_of(key), message))
}

/// Imports a WeNet model directory: `train.yaml`, `final.pt`, `units.txt` and (when the model
/// normalises its features) `global_cmvn`.
pub(crate) fn import(dir: &Path) -> Result<Checkpoint> {
    let yaml_path = dir.join(TRAIN_YAML);
    let pt = dir.join(FINAL_PT);
    let units_path = dir.join(UNITS);
    let root = yaml_file(&yaml_path)?;
    let y = TrainYaml {
        path: &yaml_path,
        root: &root,
    };
    if !units_path.is_file() {
        return Err(Error::UnknownFormat {
            path: dir.into(),
            message: format!("a WeNet model directory needs `{UNITS}` beside {TRAIN_YAML}"),
        });
    }
    let units = Units::read(&units_path)?;
    let config = yaml_config(&y, units.tokens.len())?;
    check_config(&yaml_path, &config, |k| yaml_key(k).to_string())?;
    let decoding = special_ids(&y, &units, &units_path)?;
    let cmvn_file = cmvn_path(dir, &y)?;
    let cmvn = cmvn_file
        .as_deref()
        .map(|p| GlobalCmvn::read(p, config.input_dim))
        .transpose()?;
    let state = torch_pt::read(&pt)?;
    let tensors = map_state_dict(&pt, &config, state, cmvn.as_ref())?;
    validate(&pt, &config, &tensors, &Default::default())?;
    let mut files_read = vec![yaml_path, pt, units_path.clone()];
    files_read.extend(cmvn_file);
    Ok(Checkpoint {
        dir: dir.into(),
        format: SourceFormat::Import(super::WENET),
        config: NativeConfig {
            format_version: 1,
            architecture: NAME.into(),
            model_config: serde_json::to_value(&config).unwrap_or_default(),
            aux: serde_json::json!({}),
            tokenizer: Some(TokenizerSpec {
                kind: "wenet_units".into(),
                files: BTreeMap::from([("units".to_string(), format!("tokenizer/{UNITS}"))]),
                options: serde_json::json!({}),
            }),
            features: Some(features(config.input_dim, cmvn.as_ref())),
            decoding,
            quantization: None,
        },
        tensors,
        tokenizer_files: BTreeMap::from([("units".to_string(), units_path)]),
        files_read,
    })
}

/// A native Conformer checkpoint's `model_config`, checked.
fn native_model_config(path: &Path, config: &NativeConfig) -> Result<ConformerConfig> {
    let c: ConformerConfig = serde_json::from_value(config.model_config.clone()).map_err(|e| {
        Error::config_key(
            path,
            "model_config",
            format!("not a U2++ Conformer config: {e}"),
        )
    })?;
    check_config(path, &c, |k| format!("model_config.{k}"))?;
    Ok(c)
}

/// The checks of a native Conformer checkpoint: `model_config`, the units file, then every tensor.
pub(crate) fn open_native(parts: &NativeParts<'_>) -> Result<BTreeMap<String, Tensor>> {
    let c = native_model_config(parts.config_path, parts.config)?;
    let units = parts
        .tokenizer_files
        .get("units")
        .ok_or_else(|| Error::config_key(parts.config_path, "tokenizer.files.units", "missing"))?;
    let n = Units::read(units)?.tokens.len();
    if n != c.vocab_size {
        return Err(Error::config_key(
            parts.config_path,
            "model_config.vocab_size",
            format!(
                "is {}, but {} lists {n} units",
                c.vocab_size,
                crate::error::shown(units)
            ),
        ));
    }
    if let Some(spec) = &parts.config.quantization {
        let modules = expected_tensors(&c)
            .into_iter()
            .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
            .collect();
        super::quantization_layout(&c).check_spec(
            parts.config_path,
            &modules,
            spec,
            "U2++ Conformer",
        )?;
    }
    let tensors = safetensors_io::read(parts.weights_path)?;
    let quantized = parts
        .config
        .quantization
        .as_ref()
        .map(|s| s.layers.keys().cloned().collect())
        .unwrap_or_default();
    validate(parts.weights_path, &c, &tensors, &quantized)?;
    Ok(tensors)
}

/// The quantization layout of a Conformer config.
pub(crate) fn layout(config_path: &Path, config: &NativeConfig) -> Result<QuantizationLayout> {
    Ok(super::quantization_layout(&native_model_config(
        config_path,
        config,
    )?))
}
