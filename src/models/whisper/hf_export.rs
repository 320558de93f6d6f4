//! Whisper in the Hugging Face transformers layout, for exports (`oasr-quantize export`): the
//! tensor names (`model.` + the OASR name; the convolutions back to `[out, in, k]`), the
//! `config.json`, `generation_config.json`, `preprocessor_config.json` and `tokenizer_config.json`
//! transformers reads, and the projections a server fuses.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::import::{native_model_config, SpecialTokens};
use super::WhisperConfig;
use crate::checkpoint::{Checkpoint, Tensor, CONFIG_FILE};
use crate::error::{Error, Result};
use crate::frontend::whisper_logmel::{HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE};
use crate::models::registry::{HfFiles, HfLayout};

/// Whisper's Hugging Face layout.
pub static HF_LAYOUT: HfLayout = HfLayout {
    name: hf_name,
    relayout,
    tied_linears: &["proj_out"],
    fused_groups,
    files,
};

/// The Hugging Face name of an OASR module or tensor (`proj_out` is tied, never stored).
pub(super) fn hf_name(name: &str) -> String {
    format!("model.{name}")
}

/// OASR stores the convolutions `[out, k, in]`; PyTorch's Conv1d is `[out, in, k]`.
fn relayout(name: &str, t: &Tensor) -> Option<Tensor> {
    let conv = name == "encoder.conv1.weight" || name == "encoder.conv2.weight";
    (conv && t.shape.len() == 3).then(|| t.swap_last_two())
}

/// What vLLM's Whisper fuses into one GEMM each: the self-attention q/k/v of every layer
/// (`qkv_proj`) and the cross-attention k/v of every decoder layer (`kv_proj`). OASR names.
fn fused_groups(ckpt: &Checkpoint) -> Result<Vec<Vec<String>>> {
    let config = native_model_config(&ckpt.dir.join(CONFIG_FILE), &ckpt.config)?;
    let mut groups = Vec::new();
    for (side, layers) in [
        ("encoder", config.encoder_layers),
        ("decoder", config.decoder_layers),
    ] {
        for i in 0..layers {
            groups.push(
                ["q_proj", "k_proj", "v_proj"]
                    .iter()
                    .map(|p| format!("{side}.layers.{i}.self_attn.{p}"))
                    .collect(),
            );
        }
    }
    for i in 0..config.decoder_layers {
        groups.push(
            ["k_proj", "v_proj"]
                .iter()
                .map(|p| format!("decoder.layers.{i}.encoder_attn.{p}"))
                .collect(),
        );
    }
    Ok(groups)
}

/// `config.json` (without `quantization_config`) and the other files transformers reads.
fn files(ckpt: &Checkpoint, dtype: &str) -> Result<HfFiles> {
    let config_path = ckpt.dir.join(CONFIG_FILE);
    let c = native_model_config(&config_path, &ckpt.config)?;
    let tokenizer_path = ckpt
        .tokenizer_files
        .get("tokenizer")
        .ok_or_else(|| Error::corrupt(&ckpt.dir, "the Whisper checkpoint has no tokenizer.json"))?;
    let special = SpecialTokens::read(tokenizer_path)?;
    let tokenizer = std::fs::read(tokenizer_path).map_err(|e| Error::io(tokenizer_path, e))?;
    let ids = &special.ids;
    let end = "<|endoftext|>";
    let (eot, no_timestamps) = (special.get(end)?, special.get("<|notimestamps|>")?);
    let config = json!({
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.encoder_layers,
        "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.encoder_attention_heads,
        "decoder_attention_heads": c.decoder_attention_heads,
        "encoder_ffn_dim": c.encoder_ffn_dim,
        "decoder_ffn_dim": c.decoder_ffn_dim,
        "num_mel_bins": c.num_mel_bins,
        "max_source_positions": c.max_source_positions,
        "max_target_positions": c.max_target_positions,
        "activation_function": c.activation_function,
        "decoder_start_token_id": c.decoder_start_token_id,
        "bos_token_id": eot,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.eos_token_id,
        "suppress_tokens": c.suppress_tokens,
        "begin_suppress_tokens": c.begin_suppress_tokens,
        "scale_embedding": false,
        "tie_word_embeddings": true,
        "use_cache": true,
        "dtype": dtype,
    });
    let mut generation = json!({
        "decoder_start_token_id": c.decoder_start_token_id,
        "bos_token_id": eot,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.eos_token_id,
        "max_length": c.max_target_positions,
        "suppress_tokens": c.suppress_tokens,
        "begin_suppress_tokens": c.begin_suppress_tokens,
        "no_timestamps_token_id": no_timestamps,
        "alignment_heads": c.alignment_heads,
        "is_multilingual": c.is_multilingual(),
    });
    if c.is_multilingual() {
        let by_id: BTreeMap<u32, &String> = ids.iter().map(|(k, v)| (*v, k)).collect();
        let languages: BTreeMap<&String, u32> = c
            .language_token_ids
            .iter()
            .filter_map(|id| by_id.get(id).map(|name| (*name, *id)))
            .collect();
        generation["lang_to_id"] = json!(languages);
        let tasks: BTreeMap<&String, u32> = c.task_token_ids.iter().map(|(k, v)| (k, *v)).collect();
        generation["task_to_id"] = json!(tasks);
    } else {
        generation["forced_decoder_ids"] = json!(forced(&c));
    }
    let preprocessor = json!({
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": c.num_mel_bins,
        "sampling_rate": SAMPLE_RATE,
        "hop_length": HOP_LENGTH,
        "n_fft": N_FFT,
        "chunk_length": N_SAMPLES / SAMPLE_RATE as usize,
        "n_samples": N_SAMPLES,
        "nb_max_frames": N_FRAMES,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": false,
    });
    let tokenizer_config = json!({
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        "bos_token": end,
        "eos_token": end,
        "unk_token": end,
        "pad_token": end,
        "add_prefix_space": false,
        "errors": "replace",
        "model_max_length": 1024,
    });
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    Ok(HfFiles {
        config,
        files: vec![
            ("generation_config.json".into(), pretty(&generation)),
            ("preprocessor_config.json".into(), pretty(&preprocessor)),
            ("tokenizer_config.json".into(), pretty(&tokenizer_config)),
            ("tokenizer.json".into(), tokenizer),
        ],
    })
}

/// The forced (position, token) pairs with a known token.
fn forced(c: &WhisperConfig) -> Vec<(usize, u32)> {
    c.forced_decoder_ids
        .iter()
        .filter_map(|(p, t)| t.map(|t| (*p, t)))
        .collect()
}
