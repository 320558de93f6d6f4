//! Importers of Whisper checkpoints (Hugging Face and CTranslate2) into OASR names and config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::native::{DecodingSpec, FeatureSpec, NativeConfig, TokenizerSpec};
use super::tensor::{DType, Tensor};
use super::{ct2, safetensors_io, Checkpoint, SourceFormat};
use crate::error::{Error, Result};
use crate::models::whisper::{expected_tensors, WhisperConfig, ARCHITECTURE};

/// The special tokens Whisper's prompt and decoding need, read from `tokenizer.json`.
struct SpecialTokens {
    path: PathBuf,
    ids: BTreeMap<String, u32>,
}

impl SpecialTokens {
    fn read(path: &Path) -> Result<Self> {
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

    fn get(&self, token: &str) -> Result<u32> {
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
    for (name, heads) in [
        ("encoder", config.encoder_attention_heads),
        ("decoder", config.decoder_attention_heads),
    ] {
        if heads == 0 || !config.d_model.is_multiple_of(heads) {
            return Err(Error::corrupt(
                path,
                format!(
                    "{name}: {heads} attention heads do not divide d_model {}",
                    config.d_model
                ),
            ));
        }
    }
    if config.encoder_layers == 0 || config.decoder_layers == 0 {
        return Err(Error::corrupt(path, "no encoder or decoder layers found"));
    }
    Ok(config)
}

/// Checks that the tensors are exactly Whisper's, with float dtypes and the expected shapes.
pub(super) fn validate(
    path: &Path,
    config: &WhisperConfig,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<()> {
    let expected = expected_tensors(config);
    for (name, shape) in &expected {
        let t = tensors
            .get(name)
            .ok_or_else(|| Error::tensor(path, name, "missing"))?;
        if !t.dtype.is_float() {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "expected a float dtype, found {} (is the source already quantized?)",
                    t.dtype
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
    if tensors.len() != expected.len() {
        let known: std::collections::HashSet<&str> =
            expected.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(extra) = tensors.keys().find(|k| !known.contains(k.as_str())) {
            return Err(Error::tensor(
                path,
                extra,
                "unexpected tensor for a Whisper checkpoint",
            ));
        }
    }
    Ok(())
}

fn native_config(config: &WhisperConfig, tokenizer: bool) -> NativeConfig {
    NativeConfig {
        format_version: 1,
        architecture: ARCHITECTURE.into(),
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
        features: Some(FeatureSpec {
            kind: "whisper_logmel".into(),
            sample_rate: 16000,
            feature_dim: config.num_mel_bins as u32,
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
        }),
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
    format: SourceFormat,
    config: WhisperConfig,
    tensors: BTreeMap<String, Tensor>,
    files_read: Vec<PathBuf>,
) -> Result<Checkpoint> {
    validate(dir, &config, &tensors)?;
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

fn u32_list(value: Option<&serde_json::Value>) -> Vec<u32> {
    value
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect()
        })
        .unwrap_or_default()
}

fn pairs(value: Option<&serde_json::Value>) -> Vec<(u32, u32)> {
    value
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let p = p.as_array()?;
                    Some((
                        u32::try_from(p.first()?.as_u64()?).ok()?,
                        u32::try_from(p.get(1)?.as_u64()?).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Imports a Hugging Face Whisper directory (`config.json` + `model.safetensors`).
pub fn import_hf(dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join("config.json");
    let weights_path = dir.join("model.safetensors");
    let hf = json_file(&config_path)?;
    let source = safetensors_io::read(&weights_path)?;
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
            .ok_or_else(|| Error::corrupt(&config_path, format!("missing integer `{key}`")))
    };
    let heads = (
        head("encoder_attention_heads")?,
        head("decoder_attention_heads")?,
    );
    let tokenizer = dir.join("tokenizer.json");
    let tokens = SpecialTokens::read(&tokenizer)?;
    let generation = dir.join("generation_config.json");
    let gen = if generation.is_file() {
        Some(json_file(&generation)?)
    } else {
        None
    };
    let extras = Extras {
        suppress_tokens: u32_list(hf.get("suppress_tokens")),
        begin_suppress_tokens: u32_list(hf.get("begin_suppress_tokens")),
        language_token_ids: gen
            .as_ref()
            .and_then(|g| g.get("lang_to_id"))
            .and_then(|m| m.as_object())
            .map(|m| {
                let mut ids: Vec<u32> = m
                    .values()
                    .filter_map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                    .collect();
                ids.sort_unstable();
                ids
            })
            .unwrap_or_default(),
        alignment_heads: pairs(gen.as_ref().and_then(|g| g.get("alignment_heads"))),
    };
    let config = whisper_config(&weights_path, &tensors, heads, &tokens, extras)?;
    let mut files_read = vec![config_path, weights_path, tokenizer];
    if gen.is_some() {
        files_read.push(generation);
    }
    finish(dir, SourceFormat::HfWhisper, config, tensors, files_read)
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
    let ct2_config = json_file(&config_path)?;
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
    for (name, expected) in [
        ("decoder/pre_norm", 1),
        ("decoder/scale_embeddings", 0),
        ("decoder/alibi", 0),
    ] {
        let value = ct2_int(&bin, &model, name)?;
        if value != expected {
            return Err(Error::tensor(
                &bin,
                name,
                format!("is {value}; Whisper has {expected}"),
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
        suppress_tokens: u32_list(ct2_config.get("suppress_ids")),
        begin_suppress_tokens: u32_list(ct2_config.get("suppress_ids_begin")),
        language_token_ids: u32_list(ct2_config.get("lang_ids")),
        alignment_heads: pairs(ct2_config.get("alignment_heads")),
    };
    let config = whisper_config(&bin, &tensors, heads, &tokens, extras)?;
    finish(
        dir,
        SourceFormat::Ct2Whisper,
        config,
        tensors,
        vec![bin, config_path, tokenizer],
    )
}
