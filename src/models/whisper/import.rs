//! Importers of Whisper checkpoints (Hugging Face and CTranslate2) into OASR names and config,
//! and the checks of a native Whisper checkpoint's config, tokenizer, tensors and spec.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{expected_tensors, WhisperConfig, NAME};
use crate::checkpoint::{
    ct2, safetensors_io, Checkpoint, DType, DecodingSpec, FeatureSpec, NativeConfig, SourceFormat,
    Tensor, TokenizerSpec,
};
use crate::error::{Error, Result};
use crate::format::compressed_tensors as ct;
use crate::format::{QuantDtype, QuantizationSpec, SmoothFold};
use crate::models::registry::NativeParts;
use crate::models::QuantizationLayout;

/// The special tokens Whisper's prompt and decoding need, read from `tokenizer.json`.
pub(super) struct SpecialTokens {
    path: PathBuf,
    /// Every added token, content to id.
    pub(super) ids: BTreeMap<String, u32>,
}

impl SpecialTokens {
    pub(super) fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::corrupt(path, format!("invalid tokenizer.json: {e}")))?;
        let added = json
            .get("added_tokens")
            .and_then(|v| v.as_array())
            .ok_or_else(|| Error::corrupt(path, "tokenizer.json has no `added_tokens` list"))?;
        let ids = added
            .iter()
            .filter_map(|t| {
                Some((
                    t.get("content")?.as_str()?.to_string(),
                    u32::try_from(t.get("id")?.as_u64()?).ok()?,
                ))
            })
            .collect();
        Ok(SpecialTokens {
            path: path.into(),
            ids,
        })
    }

    pub(super) fn get(&self, token: &str) -> Result<u32> {
        self.ids.get(token).copied().ok_or_else(|| {
            Error::corrupt(
                &self.path,
                format!("tokenizer.json does not define the special token `{token}`"),
            )
        })
    }
}

/// Values for the config that only the tokenizer and the source's own config know.
struct Extras {
    suppress_tokens: Vec<u32>,
    begin_suppress_tokens: Vec<u32>,
    language_token_ids: Vec<u32>,
    alignment_heads: Vec<(u32, u32)>,
}

fn dims_of(
    tensors: &BTreeMap<String, Tensor>,
    path: &Path,
    name: &str,
    rank: usize,
) -> Result<Vec<usize>> {
    let t = tensors
        .get(name)
        .ok_or_else(|| Error::tensor(path, name, "missing"))?;
    if t.shape.len() != rank {
        return Err(Error::tensor(
            path,
            name,
            format!("expected rank {rank}, found shape {:?}", t.shape),
        ));
    }
    Ok(t.shape.clone())
}

fn count_layers(tensors: &BTreeMap<String, Tensor>, side: &str) -> usize {
    (0..)
        .take_while(|i| tensors.contains_key(&format!("{side}.layers.{i}.fc1.weight")))
        .count()
}

/// [`WhisperConfig::check`] on an imported config, blaming the file and key each value came
/// from (`origin`).
fn check_imported(
    config: &WhisperConfig,
    origin: impl Fn(&'static str) -> (PathBuf, String),
) -> Result<()> {
    config.check().map_err(|f| {
        let (path, key) = origin(f.key);
        Error::config_key(path, key, f.message)
    })
}

/// Builds the config from the tensor shapes (the geometry) and the tokenizer (the token ids).
fn whisper_config(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
    heads: (usize, usize),
    tokens: &SpecialTokens,
    extras: Extras,
) -> Result<WhisperConfig> {
    let embed = dims_of(tensors, path, "decoder.embed_tokens.weight", 2)?;
    let conv1 = dims_of(tensors, path, "encoder.conv1.weight", 3)?;
    let ffn = |side: &str| -> Result<usize> {
        Ok(dims_of(tensors, path, &format!("{side}.layers.0.fc1.weight"), 2)?[0])
    };
    let positions = |side: &str| -> Result<usize> {
        Ok(dims_of(tensors, path, &format!("{side}.embed_positions.weight"), 2)?[0])
    };
    let mut config = WhisperConfig {
        model_type: "whisper".into(),
        vocab_size: embed[0],
        d_model: embed[1],
        encoder_layers: count_layers(tensors, "encoder"),
        decoder_layers: count_layers(tensors, "decoder"),
        encoder_attention_heads: heads.0,
        decoder_attention_heads: heads.1,
        encoder_ffn_dim: ffn("encoder")?,
        decoder_ffn_dim: ffn("decoder")?,
        // conv1 is stored KSC: [out, k, in].
        num_mel_bins: conv1[2],
        max_source_positions: positions("encoder")?,
        max_target_positions: positions("decoder")?,
        activation_function: "gelu".into(),
        decoder_start_token_id: tokens.get("<|startoftranscript|>")?,
        eos_token_id: tokens.get("<|endoftext|>")?,
        forced_decoder_ids: Vec::new(),
        suppress_tokens: extras.suppress_tokens,
        begin_suppress_tokens: extras.begin_suppress_tokens,
        task_token_ids: BTreeMap::new(),
        language_token_ids: Vec::new(),
        alignment_heads: extras.alignment_heads,
    };
    let no_timestamps = tokens.get("<|notimestamps|>")?;
    if config.is_multilingual() {
        for task in ["transcribe", "translate"] {
            config
                .task_token_ids
                .insert(task.into(), tokens.get(&format!("<|{task}|>"))?);
        }
        config.language_token_ids = extras.language_token_ids;
        config.forced_decoder_ids = vec![
            (1, None),
            (2, Some(config.task_token_ids["transcribe"])),
            (3, Some(no_timestamps)),
        ];
    } else {
        config.forced_decoder_ids = vec![(1, Some(no_timestamps))];
    }
    Ok(config)
}

/// Checks that the tensors are exactly Whisper's: every tensor the architecture needs, with the
/// shape the config gives it and a float dtype, except the weights of the quantized layers of
/// `spec`, whose codes and scales follow docs/format.md (scales finite and positive); and no
/// other tensor.
pub(crate) fn validate(
    path: &Path,
    config: &WhisperConfig,
    tensors: &BTreeMap<String, Tensor>,
    spec: Option<&QuantizationSpec>,
) -> Result<()> {
    let expected = expected_tensors(config);
    fn quantized<'a>(
        spec: Option<&'a QuantizationSpec>,
        name: &'a str,
    ) -> Option<(&'a str, &'a crate::format::LayerSpec)> {
        let layer = name.strip_suffix(".weight")?;
        Some((layer, spec?.layers.get(layer)?))
    }
    let mut allowed: std::collections::HashSet<String> =
        expected.iter().map(|(n, _)| n.clone()).collect();
    for (name, shape) in &expected {
        let t = tensors
            .get(name)
            .ok_or_else(|| Error::tensor(path, name, "missing"))?;
        if let Some((layer, l)) = quantized(spec, name) {
            let code = match l.scheme.dtype() {
                QuantDtype::Int8 => DType::I8,
                QuantDtype::Float8E4m3fn => DType::F8E4m3,
            };
            if t.dtype != code || &t.shape != shape {
                return Err(Error::tensor(
                    path,
                    name,
                    format!(
                        "expected a {code} {shape:?} weight for a {} layer, found {} {:?}",
                        l.scheme.name(),
                        t.dtype,
                        t.shape
                    ),
                ));
            }
            let (n, k) = (shape[0], shape[shape.len() - 1]);
            for (key, shape, present) in [
                ("weight_scale", vec![n], true),
                ("input_scale", vec![1], l.scheme.is_static()),
                ("smooth_inv", vec![k], l.smooth == SmoothFold::Runtime),
            ] {
                let name = format!("{layer}.{key}");
                match (tensors.get(&name), present) {
                    (Some(t), true) if t.dtype == DType::F32 && t.shape == shape => {
                        // Every quantize and GEMM multiplies or divides by them.
                        if let Some((i, v)) = t
                            .to_f32()
                            .into_iter()
                            .enumerate()
                            .find(|(_, v)| !(v.is_finite() && *v > 0.0))
                        {
                            return Err(Error::tensor(
                                path,
                                name,
                                format!("element {i} is {v}; a scale must be finite and positive"),
                            ));
                        }
                        allowed.insert(name);
                    }
                    (Some(t), true) => {
                        return Err(Error::tensor(
                            path,
                            name,
                            format!("expected F32 {shape:?}, found {} {:?}", t.dtype, t.shape),
                        ))
                    }
                    (None, true) => {
                        return Err(Error::tensor(path, name, "missing for a quantized layer"))
                    }
                    (Some(_), false) => {
                        return Err(Error::tensor(
                            path,
                            name,
                            "present but the spec does not call for it",
                        ))
                    }
                    (None, false) => {}
                }
            }
            continue;
        }
        if !t.dtype.is_float() {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "expected a float dtype, found {}{}",
                    t.dtype,
                    if spec.is_some() {
                        " (the spec does not list this layer as quantized)"
                    } else {
                        " (is the source already quantized?)"
                    }
                ),
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
    if let Some(extra) = tensors.keys().find(|k| !allowed.contains(k.as_str())) {
        return Err(Error::tensor(
            path,
            extra,
            "unexpected tensor for a Whisper checkpoint",
        ));
    }
    Ok(())
}

/// The features Whisper's frontend computes for `mel_bins` bands.
pub(crate) fn whisper_features(mel_bins: usize) -> FeatureSpec {
    FeatureSpec {
        kind: crate::frontend::WHISPER_LOGMEL.into(),
        sample_rate: crate::frontend::whisper_logmel::SAMPLE_RATE,
        feature_dim: mel_bins as u32,
        frame_length_ms: 25.0,
        frame_shift_ms: 10.0,
        dither: 0.0,
        lfr_m: 1,
        lfr_n: 1,
        window_type: "hann".into(),
        normalize: None,
        audio_scale: 1.0,
        window_seconds: Some(30.0),
        preemphasis: None,
    }
}

/// The Whisper `model_config` of a native checkpoint, checked with [`WhisperConfig::check`],
/// with its `features` (exactly what the Whisper frontend computes, when not null) and its
/// `decoding` ids (the config's own, inside the vocabulary) checked against it.
pub(crate) fn native_model_config(path: &Path, config: &NativeConfig) -> Result<WhisperConfig> {
    let model: WhisperConfig =
        serde_json::from_value(config.model_config.clone()).map_err(|e| {
            Error::config_key(
                path,
                "model_config",
                format!("invalid Whisper model_config: {e}"),
            )
        })?;
    model
        .check()
        .map_err(|f| Error::config_key(path, format!("model_config.{}", f.key), f.message))?;
    if let Some(features) = &config.features {
        let expected =
            serde_json::to_value(whisper_features(model.num_mel_bins)).unwrap_or_default();
        let found = serde_json::to_value(features).unwrap_or_default();
        if let (Some(expected), Some(found)) = (expected.as_object(), found.as_object()) {
            for (key, want) in expected {
                let got = found.get(key).unwrap_or(&serde_json::Value::Null);
                if got != want {
                    return Err(Error::config_key(
                        path,
                        format!("features.{key}"),
                        format!(
                            "is {got}; the Whisper frontend of a {}-band model computes {want}",
                            model.num_mel_bins
                        ),
                    ));
                }
            }
        }
    }
    let d = &config.decoding;
    if d.default_decode_type != "aed" {
        return Err(Error::config_key(
            path,
            "decoding.default_decode_type",
            format!("is {:?}; Whisper decodes \"aed\"", d.default_decode_type),
        ));
    }
    for (key, id, want) in [
        (
            "decoding.sos_id",
            d.sos_id,
            Some(model.decoder_start_token_id),
        ),
        ("decoding.eos_id", d.eos_id, Some(model.eos_token_id)),
        ("decoding.blank_id", d.blank_id, None),
        ("decoding.unk_id", d.unk_id, None),
    ] {
        if let Some(want) = want {
            if id != Some(want) {
                return Err(Error::config_key(
                    path,
                    key,
                    format!("is {id:?}; model_config says {want}"),
                ));
            }
        }
        if let Some(id) = id.filter(|id| *id as usize >= model.vocab_size) {
            return Err(Error::config_key(
                path,
                key,
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    model.vocab_size
                ),
            ));
        }
    }
    Ok(model)
}

/// A native Whisper checkpoint carries its `tokenizer.json`, whose special tokens are the
/// config's start and end ids.
pub(crate) fn check_native_tokenizer(
    path: &Path,
    config: &NativeConfig,
    model: &WhisperConfig,
    files: &BTreeMap<String, PathBuf>,
) -> Result<()> {
    let Some(spec) = &config.tokenizer else {
        return Err(Error::config_key(
            path,
            "tokenizer",
            "is null; a Whisper checkpoint carries its tokenizer.json",
        ));
    };
    if spec.kind != "whisper" {
        return Err(Error::config_key(
            path,
            "tokenizer.kind",
            format!("is {:?}; expected \"whisper\"", spec.kind),
        ));
    }
    let Some(file) = files.get("tokenizer") else {
        return Err(Error::config_key(
            path,
            "tokenizer.files",
            "has no `tokenizer` entry (the tokenizer.json)",
        ));
    };
    // Loaded once, as `transcribe` and `verify` load it (which also requires
    // `<|notimestamps|>`), so a checkpoint that opens is one they can decode with: valid JSON with
    // the right special tokens can still be a broken tokenizer.
    let tokenizer = crate::models::whisper::decoding::WhisperTokenizer::from_file(file)?;
    for (key, token, id) in [
        (
            "model_config.decoder_start_token_id",
            "<|startoftranscript|>",
            model.decoder_start_token_id,
        ),
        (
            "model_config.eos_token_id",
            "<|endoftext|>",
            model.eos_token_id,
        ),
    ] {
        let want = tokenizer.token_id(token).ok_or_else(|| {
            Error::corrupt(
                file,
                format!("tokenizer.json does not define the special token `{token}`"),
            )
        })?;
        if id != want {
            return Err(Error::config_key(
                path,
                key,
                format!(
                    "is {id} but {} has `{token}` = {want}",
                    crate::error::shown(file)
                ),
            ));
        }
    }
    Ok(())
}

/// The spec's layers, links and smoothing targets name modules of this Whisper model, with the
/// kinds its layout gives them.
pub(crate) fn validate_spec(
    path: &Path,
    model: &WhisperConfig,
    spec: &QuantizationSpec,
) -> Result<()> {
    let modules = expected_tensors(model)
        .into_iter()
        .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
        .collect();
    crate::models::whisper::quantization_layout(model).check_spec(
        path,
        &modules,
        spec,
        "Whisper model",
    )
}

fn native_config(config: &WhisperConfig, tokenizer: bool) -> NativeConfig {
    NativeConfig {
        format_version: 1,
        architecture: NAME.into(),
        model_config: serde_json::to_value(config).unwrap_or_default(),
        aux: serde_json::json!({}),
        tokenizer: tokenizer.then(|| TokenizerSpec {
            kind: "whisper".into(),
            files: BTreeMap::from([(
                "tokenizer".to_string(),
                "tokenizer/tokenizer.json".to_string(),
            )]),
            options: serde_json::json!({"eot_id": config.eos_token_id}),
        }),
        features: Some(whisper_features(config.num_mel_bins)),
        decoding: DecodingSpec {
            default_decode_type: "aed".into(),
            blank_id: Some(0),
            unk_id: None,
            sos_id: Some(config.decoder_start_token_id),
            eos_id: Some(config.eos_token_id),
        },
        quantization: None,
    }
}

fn finish(
    dir: &Path,
    weights: &Path,
    format: SourceFormat,
    config: WhisperConfig,
    tensors: BTreeMap<String, Tensor>,
    files_read: Vec<PathBuf>,
    spec: Option<&QuantizationSpec>,
) -> Result<Checkpoint> {
    validate(weights, &config, &tensors, spec)?;
    let tokenizer = dir.join("tokenizer.json");
    let mut tokenizer_files = BTreeMap::new();
    tokenizer_files.insert("tokenizer".to_string(), tokenizer);
    Ok(Checkpoint {
        dir: dir.into(),
        format,
        config: native_config(&config, true),
        tensors,
        tokenizer_files,
        files_read,
    })
}

fn json_file(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::corrupt(path, format!("invalid JSON: {e}")))
}

/// A JSON file whose top level is an object.
fn json_object(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    match json_file(path)? {
        serde_json::Value::Object(map) => Ok(map),
        other => Err(Error::corrupt(
            path,
            format!("expected a JSON object at the top level, found {other}"),
        )),
    }
}

fn as_u32(value: &serde_json::Value) -> Option<u32> {
    value.as_u64().and_then(|x| u32::try_from(x).ok())
}

/// A list of token ids under `key` (absent or null: empty); anything else is refused by key.
fn u32_list(
    path: &Path,
    json: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<Vec<u32>> {
    match json.get(key) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| {
                as_u32(x)
                    .ok_or_else(|| Error::config_key(path, key, format!("{x} is not a token id")))
            })
            .collect(),
        Some(other) => Err(Error::config_key(
            path,
            key,
            format!("expected a list of token ids, found {other}"),
        )),
    }
}

/// `[layer, head]` pairs under `key` (absent or null: empty); anything else is refused by key.
fn pairs(
    path: &Path,
    json: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Result<Vec<(u32, u32)>> {
    match json.get(key) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|p| {
                match p.as_array().map(|p| p.as_slice()) {
                    Some([l, h]) => as_u32(l).zip(as_u32(h)),
                    _ => None,
                }
                .ok_or_else(|| {
                    Error::config_key(path, key, format!("{p} is not a [layer, head] pair"))
                })
            })
            .collect(),
        Some(other) => Err(Error::config_key(
            path,
            key,
            format!("expected a list of [layer, head] pairs, found {other}"),
        )),
    }
}

/// The `config.json` keys of a Hugging Face Whisper model that restate the tensor geometry.
const HF_GEOMETRY: &[&str] = &[
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "num_mel_bins",
    "max_source_positions",
    "max_target_positions",
];

/// The Hugging Face config's view of the model: `from_tensors` with every geometry key and
/// `activation_function` that `config.json` states in their place.
fn hf_claimed(
    path: &Path,
    hf: &serde_json::Map<String, serde_json::Value>,
    from_tensors: &WhisperConfig,
) -> Result<WhisperConfig> {
    let mut value = serde_json::to_value(from_tensors).unwrap_or_default();
    for key in HF_GEOMETRY {
        if let Some(v) = hf.get(*key) {
            if v.as_u64().is_none() {
                return Err(Error::config_key(
                    path,
                    *key,
                    format!("expected a non-negative integer, found {v}"),
                ));
            }
            value[*key] = v.clone();
        }
    }
    if let Some(v) = hf.get("activation_function") {
        if !v.is_string() {
            return Err(Error::config_key(
                path,
                "activation_function",
                format!("expected a string, found {v}"),
            ));
        }
        value["activation_function"] = v.clone();
    }
    serde_json::from_value(value)
        .map_err(|e| Error::corrupt(path, format!("invalid Whisper config: {e}")))
}

/// Imports a Hugging Face Whisper directory (`config.json` + `model.safetensors`). The geometry
/// comes from the tensors; every value `config.json` states must agree with them and with the
/// forward (the key at fault is named).
pub fn import_hf(dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join("config.json");
    let (weights_path, source, shards) = read_hf_weights(dir)?;
    let hf = json_object(&config_path)?;
    let compressed = match super::import_ct::quant_method(&hf) {
        None => false,
        Some(ct::QUANT_METHOD) => true,
        Some(method) => {
            return Err(Error::NotImplemented {
                what: format!("reading a `{method}` quantized Hugging Face checkpoint"),
                detail: format!(
                    "{} holds quantized weights; of the quantized Hugging Face formats this \
                     version reads compressed-tensors (W8A8) only",
                    crate::error::shown(&config_path)
                ),
            })
        }
    };
    let mut tensors = BTreeMap::new();
    for (name, tensor) in source {
        if name == "proj_out.weight" {
            continue; // tied to decoder.embed_tokens.weight
        }
        let Some(short) = name.strip_prefix("model.") else {
            return Err(Error::tensor(
                &weights_path,
                &name,
                "unexpected tensor for a Whisper checkpoint",
            ));
        };
        let tensor = if short == "encoder.conv1.weight" || short == "encoder.conv2.weight" {
            if tensor.shape.len() != 3 {
                return Err(Error::tensor(
                    &weights_path,
                    &name,
                    format!("expected [out, in, k], found {:?}", tensor.shape),
                ));
            }
            tensor.swap_last_two()
        } else {
            tensor
        };
        tensors.insert(short.to_string(), tensor);
    }
    let head = |key: &str| {
        hf.get(key)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| Error::config_key(&config_path, key, "missing or not an integer"))
    };
    let heads = (
        head("encoder_attention_heads")?,
        head("decoder_attention_heads")?,
    );
    let tokenizer = dir.join("tokenizer.json");
    let tokens = SpecialTokens::read(&tokenizer)?;
    let generation = dir.join("generation_config.json");
    let gen = if generation.is_file() {
        Some(json_object(&generation)?)
    } else {
        None
    };
    let no_gen = serde_json::Map::new();
    let g = gen.as_ref().unwrap_or(&no_gen);
    let language_token_ids = match g.get("lang_to_id") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Object(m)) => {
            let mut ids = m
                .iter()
                .map(|(lang, v)| {
                    as_u32(v).ok_or_else(|| {
                        Error::config_key(
                            &generation,
                            format!("lang_to_id.{lang}"),
                            format!("{v} is not a token id"),
                        )
                    })
                })
                .collect::<Result<Vec<u32>>>()?;
            ids.sort_unstable();
            ids
        }
        Some(other) => {
            return Err(Error::config_key(
                &generation,
                "lang_to_id",
                format!("expected an object of language tokens to ids, found {other}"),
            ))
        }
    };
    let extras = Extras {
        suppress_tokens: u32_list(&config_path, &hf, "suppress_tokens")?,
        begin_suppress_tokens: u32_list(&config_path, &hf, "begin_suppress_tokens")?,
        language_token_ids,
        alignment_heads: pairs(&generation, g, "alignment_heads")?,
    };
    let config = whisper_config(&weights_path, &tensors, heads, &tokens, extras)?;
    let origin = |key: &'static str| -> (PathBuf, String) {
        match key {
            "encoder_attention_heads"
            | "decoder_attention_heads"
            | "suppress_tokens"
            | "begin_suppress_tokens" => (config_path.clone(), key.into()),
            "activation_function" | "model_type" => (config_path.clone(), key.into()),
            k if HF_GEOMETRY.contains(&k) && hf.contains_key(k) => (config_path.clone(), k.into()),
            "alignment_heads" => (generation.clone(), key.into()),
            "language_token_ids" => (generation.clone(), "lang_to_id".into()),
            "decoder_start_token_id" | "eos_token_id" | "task_token_ids" | "forced_decoder_ids" => {
                (tokenizer.clone(), format!("added_tokens ({key})"))
            }
            other => (
                weights_path.clone(),
                format!("{other} (from the tensor shapes)"),
            ),
        }
    };
    // The geometry config.json states against the tensors, then its values against each other
    // and the forward (head counts, activation, token lists).
    let claimed = hf_claimed(&config_path, &hf, &config)?;
    let (stated, actual) = (
        serde_json::to_value(&claimed).unwrap_or_default(),
        serde_json::to_value(&config).unwrap_or_default(),
    );
    for key in HF_GEOMETRY {
        if stated[*key] != actual[*key] {
            return Err(Error::config_key(
                &config_path,
                *key,
                format!(
                    "is {} but the tensors of {} give {}",
                    stated[*key],
                    crate::error::shown(&weights_path),
                    actual[*key]
                ),
            ));
        }
    }
    check_imported(&claimed, origin)?;
    let spec = if compressed {
        Some(super::import_ct::read(
            &config_path,
            &weights_path,
            &hf,
            &config,
            &mut tensors,
        )?)
    } else {
        None
    };
    let mut files_read = vec![config_path, weights_path.clone()];
    files_read.extend(shards);
    files_read.push(tokenizer);
    if gen.is_some() {
        files_read.push(generation);
    }
    let format = if compressed {
        super::CT_WHISPER
    } else {
        super::HF_WHISPER
    };
    let mut ckpt = finish(
        dir,
        &weights_path,
        SourceFormat::Import(format),
        config,
        tensors,
        files_read,
        spec.as_ref(),
    )?;
    if let Some(spec) = spec {
        ckpt.config.format_version = 2;
        ckpt.config.quantization = Some(spec);
    }
    Ok(ckpt)
}

/// Maps one CTranslate2 Whisper variable to its OASR name(s); fused projections are split.
fn map_ct2(path: &Path, name: &str, t: &Tensor, out: &mut BTreeMap<String, Tensor>) -> Result<()> {
    let parts: Vec<&str> = name.split('/').collect();
    let mut put = |n: String, t: Tensor| {
        out.insert(n, t);
    };
    // Top-level tensors.
    match name {
        "encoder/conv1/weight" | "encoder/conv2/weight" => {
            if t.shape.len() != 3 {
                return Err(Error::tensor(
                    path,
                    name,
                    format!("expected [out, in, k], found {:?}", t.shape),
                ));
            }
            put(format!("encoder.{}.weight", parts[1]), t.swap_last_two());
            return Ok(());
        }
        "encoder/conv1/bias" | "encoder/conv2/bias" => {
            put(format!("encoder.{}.bias", parts[1]), t.clone());
            return Ok(());
        }
        "encoder/position_encodings/encodings" | "decoder/position_encodings/encodings" => {
            put(format!("{}.embed_positions.weight", parts[0]), t.clone());
            return Ok(());
        }
        "decoder/embeddings/weight" => {
            put("decoder.embed_tokens.weight".into(), t.clone());
            return Ok(());
        }
        "encoder/layer_norm/gamma" | "decoder/layer_norm/gamma" => {
            put(format!("{}.layer_norm.weight", parts[0]), t.clone());
            return Ok(());
        }
        "encoder/layer_norm/beta" | "decoder/layer_norm/beta" => {
            put(format!("{}.layer_norm.bias", parts[0]), t.clone());
            return Ok(());
        }
        _ => {}
    }
    let unexpected = || {
        Error::tensor(
            path,
            name,
            "unexpected variable for a CTranslate2 Whisper model",
        )
    };
    let (side, layer) = match parts.as_slice() {
        [side @ ("encoder" | "decoder"), layer, ..] if layer.starts_with("layer_") => {
            let index: usize = layer["layer_".len()..].parse().map_err(|_| unexpected())?;
            (*side, index)
        }
        _ => return Err(unexpected()),
    };
    let p = format!("{side}.layers.{layer}");
    let leaf = |x: &str| match x {
        "weight" | "gamma" => Some("weight"),
        "bias" | "beta" => Some("bias"),
        _ => None,
    };
    // Splits a fused [n * d, ...] tensor into n row blocks; a k bias slice must be zero and is dropped.
    let mut split = |targets: &[&str], kind: &str| -> Result<()> {
        let Some(&rows) = t.shape.first() else {
            return Err(Error::tensor(
                path,
                name,
                "expected a tensor, found a scalar",
            ));
        };
        if rows % targets.len() != 0 {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "cannot split {rows} rows into {} projections",
                    targets.len()
                ),
            ));
        }
        let block = rows / targets.len();
        for (i, target) in targets.iter().enumerate() {
            let piece = t.slice_rows(i * block, block);
            if kind == "bias" && target.ends_with("k_proj") {
                if !piece.is_all_zero() {
                    return Err(Error::tensor(path, name, "the k slice of the fused bias is not zero; Whisper's k projection has no bias"));
                }
                continue;
            }
            out.insert(format!("{p}.{target}.{kind}"), piece);
        }
        Ok(())
    };
    match parts[2..] {
        ["self_attention", "linear_0", k] if leaf(k).is_some() => split(
            &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            leaf(k).unwrap_or_default(),
        ),
        ["self_attention", "linear_1", k] if leaf(k).is_some() => {
            split(&["self_attn.out_proj"], leaf(k).unwrap_or_default())
        }
        ["self_attention", "layer_norm", k] if leaf(k).is_some() => {
            split(&["self_attn_layer_norm"], leaf(k).unwrap_or_default())
        }
        ["attention", "linear_0", k] if side == "decoder" && leaf(k).is_some() => {
            split(&["encoder_attn.q_proj"], leaf(k).unwrap_or_default())
        }
        ["attention", "linear_1", k] if side == "decoder" && leaf(k).is_some() => split(
            &["encoder_attn.k_proj", "encoder_attn.v_proj"],
            leaf(k).unwrap_or_default(),
        ),
        ["attention", "linear_2", k] if side == "decoder" && leaf(k).is_some() => {
            split(&["encoder_attn.out_proj"], leaf(k).unwrap_or_default())
        }
        ["attention", "layer_norm", k] if side == "decoder" && leaf(k).is_some() => {
            split(&["encoder_attn_layer_norm"], leaf(k).unwrap_or_default())
        }
        ["ffn", "linear_0", k] if leaf(k).is_some() => split(&["fc1"], leaf(k).unwrap_or_default()),
        ["ffn", "linear_1", k] if leaf(k).is_some() => split(&["fc2"], leaf(k).unwrap_or_default()),
        ["ffn", "layer_norm", k] if leaf(k).is_some() => {
            split(&["final_layer_norm"], leaf(k).unwrap_or_default())
        }
        _ => Err(unexpected()),
    }
}

/// Rank-0 CTranslate2 attributes that describe the architecture rather than hold weights.
const CT2_ATTRIBUTES: &[&str] = &[
    "encoder/num_heads",
    "decoder/num_heads",
    "decoder/activation",
    "decoder/pre_norm",
    "decoder/scale_embeddings",
    "decoder/alibi",
    "decoder/start_from_zero_embedding",
    "decoder/alignment_heads",
    "decoder/alignment_layer",
];

fn ct2_int(path: &Path, model: &ct2::Ct2Model, name: &str) -> Result<i64> {
    let t = model
        .variables
        .get(name)
        .ok_or_else(|| Error::tensor(path, name, "missing attribute"))?;
    let b = t.bytes();
    let value = match (t.dtype, b.len()) {
        (DType::I8, 1) => b[0] as i8 as i64,
        (DType::I16, 2) => i16::from_le_bytes([b[0], b[1]]) as i64,
        (DType::I32, 4) => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        _ => {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "expected an integer scalar, found {} {:?}",
                    t.dtype, t.shape
                ),
            ))
        }
    };
    Ok(value)
}

/// Imports a CTranslate2 Whisper directory (`model.bin` + `config.json` + `tokenizer.json`).
pub fn import_ct2(dir: &Path) -> Result<Checkpoint> {
    let bin = dir.join("model.bin");
    let config_path = dir.join("config.json");
    let model = ct2::read(&bin)?;
    if model.spec != "WhisperSpec" {
        return Err(Error::UnknownFormat {
            path: bin,
            message: format!(
                "CTranslate2 spec `{}` is not supported (only WhisperSpec)",
                model.spec
            ),
        });
    }
    let ct2_config = json_object(&config_path)?;
    let mut tensors = BTreeMap::new();
    for (name, t) in &model.variables {
        if CT2_ATTRIBUTES.contains(&name.as_str()) {
            continue;
        }
        if !t.dtype.is_float() {
            return Err(Error::tensor(
                &bin,
                name,
                format!(
                    "{} weights are not supported: import a float16 or float32 CTranslate2 model",
                    t.dtype
                ),
            ));
        }
        map_ct2(&bin, name, t, &mut tensors)?;
    }
    if let Some((alias, target)) = model
        .aliases
        .iter()
        .find(|(a, t)| !(*a == "decoder/projection/weight" && *t == "decoder/embeddings/weight"))
    {
        return Err(Error::corrupt(
            &bin,
            format!("unexpected alias `{alias}` -> `{target}`"),
        ));
    }
    // The architecture switches of the spec: the forward implements Whisper's values only
    // (`decoder/activation` 3 is CTranslate2's exact-erf GELU).
    for (name, expected, what) in [
        ("decoder/pre_norm", 1, "pre-norm blocks"),
        ("decoder/scale_embeddings", 0, "unscaled embeddings"),
        ("decoder/alibi", 0, "no ALiBi"),
        (
            "decoder/activation",
            3,
            "exact-erf GELU (CTranslate2 activation 3)",
        ),
        (
            "decoder/start_from_zero_embedding",
            0,
            "no zero start embedding",
        ),
    ] {
        let value = ct2_int(&bin, &model, name)?;
        if value != expected {
            return Err(Error::tensor(
                &bin,
                name,
                format!("is {value}; the Whisper forward implements {expected} ({what})"),
            ));
        }
    }
    let heads = |name: &str| -> Result<usize> {
        usize::try_from(ct2_int(&bin, &model, name)?)
            .map_err(|_| Error::tensor(&bin, name, "negative head count"))
    };
    let heads = (heads("encoder/num_heads")?, heads("decoder/num_heads")?);
    let tokenizer = dir.join("tokenizer.json");
    let tokens = SpecialTokens::read(&tokenizer)?;
    let extras = Extras {
        suppress_tokens: u32_list(&config_path, &ct2_config, "suppress_ids")?,
        begin_suppress_tokens: u32_list(&config_path, &ct2_config, "suppress_ids_begin")?,
        language_token_ids: u32_list(&config_path, &ct2_config, "lang_ids")?,
        alignment_heads: pairs(&config_path, &ct2_config, "alignment_heads")?,
    };
    let config = whisper_config(&bin, &tensors, heads, &tokens, extras)?;
    check_imported(&config, |key| match key {
        "encoder_attention_heads" => (bin.clone(), "encoder/num_heads".into()),
        "decoder_attention_heads" => (bin.clone(), "decoder/num_heads".into()),
        "suppress_tokens" => (config_path.clone(), "suppress_ids".into()),
        "begin_suppress_tokens" => (config_path.clone(), "suppress_ids_begin".into()),
        "language_token_ids" => (config_path.clone(), "lang_ids".into()),
        "alignment_heads" => (config_path.clone(), "alignment_heads".into()),
        "decoder_start_token_id" | "eos_token_id" | "task_token_ids" | "forced_decoder_ids" => {
            (tokenizer.clone(), format!("added_tokens ({key})"))
        }
        other => (bin.clone(), format!("{other} (from the tensor shapes)")),
    })?;
    finish(
        dir,
        &bin,
        SourceFormat::Import(super::CT2_WHISPER),
        config,
        tensors,
        vec![bin.clone(), config_path, tokenizer],
        None,
    )
}

/// The index of a sharded Hugging Face checkpoint.
const HF_INDEX: &str = "model.safetensors.index.json";

/// A Hugging Face checkpoint's tensors: `model.safetensors`, or the shards its
/// `model.safetensors.index.json` maps every tensor to, each memory-mapped (never concatenated).
/// Returns the file to blame for the tensors (the weights file or the index), the tensors, and
/// the shards read.
fn read_hf_weights(dir: &Path) -> Result<(PathBuf, BTreeMap<String, Tensor>, Vec<PathBuf>)> {
    let single = dir.join("model.safetensors");
    let index_path = dir.join(HF_INDEX);
    if !index_path.is_file() {
        return Ok((single.clone(), safetensors_io::read(&single)?, Vec::new()));
    }
    if single.is_file() {
        return Err(Error::corrupt(
            dir,
            format!("holds both model.safetensors and {HF_INDEX}; keep one"),
        ));
    }
    let index = json_object(&index_path)?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::config_key(&index_path, "weight_map", "missing or not an object"))?;
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .filter(|s| !s.contains('/') && !s.contains('\\') && s.ends_with(".safetensors"));
        let Some(shard) = shard else {
            return Err(Error::config_key(
                &index_path,
                format!("weight_map.{tensor}"),
                "is not a .safetensors file name in the checkpoint directory",
            ));
        };
        by_shard.entry(shard).or_default().push(tensor);
    }
    let mut tensors = BTreeMap::new();
    let mut shards = Vec::new();
    for (shard, names) in by_shard {
        let path = dir.join(shard);
        let mut read = safetensors_io::read(&path)?;
        for name in names {
            let t = read.remove(name).ok_or_else(|| {
                Error::tensor(
                    &path,
                    name,
                    format!("{HF_INDEX} maps it to this shard, which lacks it"),
                )
            })?;
            tensors.insert(name.to_string(), t);
        }
        if let Some(extra) = read.keys().next() {
            return Err(Error::tensor(
                &path,
                extra,
                format!("in the shard but not in {HF_INDEX}'s weight_map"),
            ));
        }
        shards.push(path);
    }
    Ok((index_path, tensors, shards))
}

/// Hugging Face Whisper: `config.json` with `model_type` "whisper" beside `model.safetensors` or
/// the index of its shards.
pub(crate) fn detect_hf(dir: &Path) -> Result<bool> {
    let is_whisper = || -> Option<bool> {
        let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        Some(json.get("model_type")?.as_str()? == "whisper")
    };
    let weights = dir.join("model.safetensors").is_file() || dir.join(HF_INDEX).is_file();
    Ok(weights && is_whisper() == Some(true))
}

/// CTranslate2: `model.bin` whose header names a model spec, beside `config.json`. The spec
/// (`WhisperSpec`) and the version are checked on import, so that another spec is refused by name.
pub(crate) fn detect_ct2(dir: &Path) -> Result<bool> {
    let bin = dir.join("model.bin");
    if !(bin.is_file() && dir.join("config.json").is_file()) {
        return Ok(false);
    }
    Ok(ct2::peek_header(&bin)?.is_some_and(|(_, spec)| spec.ends_with("Spec")))
}

/// The checks of a native Whisper checkpoint, in order: `model_config`, the tokenizer, the
/// geometry against the number of tensors, the quantization spec, then every tensor.
pub(crate) fn open_native(parts: &NativeParts<'_>) -> Result<BTreeMap<String, Tensor>> {
    let NativeParts {
        config_path,
        weights_path,
        config,
        tokenizer_files,
    } = *parts;
    let model = native_model_config(config_path, config)?;
    check_native_tokenizer(config_path, config, &model, tokenizer_files)?;
    let tensors = safetensors_io::read(weights_path)?;
    // Bounds the geometry before anything is sized by it: each layer holds several tensors.
    if model.encoder_layers.saturating_add(model.decoder_layers) > tensors.len() {
        return Err(Error::config_key(
            config_path,
            "model_config.encoder_layers",
            format!(
                "{} encoder and {} decoder layers cannot fit in the {} tensors of {}",
                model.encoder_layers,
                model.decoder_layers,
                tensors.len(),
                crate::checkpoint::WEIGHTS_FILE
            ),
        ));
    }
    if let Some(spec) = &config.quantization {
        validate_spec(config_path, &model, spec)?;
    }
    validate(weights_path, &model, &tensors, config.quantization.as_ref())?;
    Ok(tensors)
}

/// The quantization layout of a Whisper config.
pub(crate) fn layout(config_path: &Path, config: &NativeConfig) -> Result<QuantizationLayout> {
    let model: WhisperConfig = serde_json::from_value(config.model_config.clone())
        .map_err(|e| Error::corrupt(config_path, format!("invalid Whisper model_config: {e}")))?;
    Ok(super::quantization_layout(&model))
}
