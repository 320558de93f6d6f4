//! The published Whisper family as seeded random-weight Hugging Face checkpoints: the
//! `config.json` geometry of every size (facts copied from the model cards' configs on the
//! Hugging Face hub), written with transformers' tensor names and layouts, fp16 / bf16 / f32, in
//! one `model.safetensors` or in shards with `model.safetensors.index.json`.
//!
//! Random weights are evidence of structure and cost only, never of accuracy. Shared by the
//! family tests and `examples/whisper_family.rs` (the scale benchmarks).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One published configuration.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub name: &'static str,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    /// Attention heads (the same on both sides in every published size).
    pub heads: usize,
    pub ffn: usize,
    pub vocab_size: usize,
    pub num_mel_bins: usize,
}

impl Size {
    /// English-only vocabularies have 51864 tokens, multilingual ones 51865 (99 languages) or
    /// 51866 (large-v3 and its distillations: 100 languages).
    pub fn tokenizer(&self) -> &'static str {
        match self.vocab_size {
            51864 => "english",
            51865 => "multilingual",
            _ => "multilingual-v3",
        }
    }

    pub fn multilingual(&self) -> bool {
        self.vocab_size > 51864
    }

    /// The GEMMs a linear-only recipe quantizes: q, k, v, out, fc1, fc2 per encoder layer;
    /// self and cross attention (4 each), fc1 and fc2 per decoder layer.
    pub fn linear_layers(&self) -> usize {
        6 * self.encoder_layers + 10 * self.decoder_layers
    }

    /// Output rows of those GEMMs (one weight scale each).
    pub fn linear_rows(&self) -> usize {
        let (d, f) = (self.d_model, self.ffn);
        self.encoder_layers * (4 * d + f + d) + self.decoder_layers * (8 * d + f + d)
    }

    /// Every tensor of the Hugging Face checkpoint: transformers' names and shapes (Conv1d
    /// `[out, in, k]`, no k_proj bias, `proj_out` tied and not stored).
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f) = (self.d_model, self.ffn);
        let mut t: Vec<(String, Vec<usize>)> = Vec::new();
        let mut add = |name: String, shape: &[usize]| t.push((name, shape.to_vec()));
        let attention = |add: &mut dyn FnMut(String, &[usize]), p: &str| {
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                add(format!("{p}.{proj}.weight"), &[d, d]);
                if proj != "k_proj" {
                    add(format!("{p}.{proj}.bias"), &[d]);
                }
            }
        };
        let norm = |add: &mut dyn FnMut(String, &[usize]), p: &str| {
            add(format!("{p}.weight"), &[d]);
            add(format!("{p}.bias"), &[d]);
        };
        let ffn = |add: &mut dyn FnMut(String, &[usize]), p: &str| {
            add(format!("{p}.fc1.weight"), &[f, d]);
            add(format!("{p}.fc1.bias"), &[f]);
            add(format!("{p}.fc2.weight"), &[d, f]);
            add(format!("{p}.fc2.bias"), &[d]);
        };
        add(
            "model.encoder.conv1.weight".into(),
            &[d, self.num_mel_bins, 3],
        );
        add("model.encoder.conv1.bias".into(), &[d]);
        add("model.encoder.conv2.weight".into(), &[d, d, 3]);
        add("model.encoder.conv2.bias".into(), &[d]);
        add("model.encoder.embed_positions.weight".into(), &[1500, d]);
        for i in 0..self.encoder_layers {
            let p = format!("model.encoder.layers.{i}");
            attention(&mut add, &format!("{p}.self_attn"));
            norm(&mut add, &format!("{p}.self_attn_layer_norm"));
            ffn(&mut add, &p);
            norm(&mut add, &format!("{p}.final_layer_norm"));
        }
        norm(&mut add, "model.encoder.layer_norm");
        add(
            "model.decoder.embed_tokens.weight".into(),
            &[self.vocab_size, d],
        );
        add("model.decoder.embed_positions.weight".into(), &[448, d]);
        for i in 0..self.decoder_layers {
            let p = format!("model.decoder.layers.{i}");
            attention(&mut add, &format!("{p}.self_attn"));
            norm(&mut add, &format!("{p}.self_attn_layer_norm"));
            attention(&mut add, &format!("{p}.encoder_attn"));
            norm(&mut add, &format!("{p}.encoder_attn_layer_norm"));
            ffn(&mut add, &p);
            norm(&mut add, &format!("{p}.final_layer_norm"));
        }
        norm(&mut add, "model.decoder.layer_norm");
        t
    }

    pub fn parameters(&self) -> usize {
        self.tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

const fn size(
    name: &'static str,
    (d_model, encoder_layers, decoder_layers, heads, ffn): (usize, usize, usize, usize, usize),
    vocab_size: usize,
    num_mel_bins: usize,
) -> Size {
    Size {
        name,
        d_model,
        encoder_layers,
        decoder_layers,
        heads,
        ffn,
        vocab_size,
        num_mel_bins,
    }
}

/// The published sizes: `openai/whisper-*`, `distil-whisper/distil-*` (d_model, encoder layers,
/// decoder layers, heads, ffn), vocabulary, mel bins. max_source_positions is 1500 and
/// max_target_positions 448 in all of them.
pub const FAMILY: &[Size] = &[
    size("tiny.en", (384, 4, 4, 6, 1536), 51864, 80),
    size("tiny", (384, 4, 4, 6, 1536), 51865, 80),
    size("base.en", (512, 6, 6, 8, 2048), 51864, 80),
    size("base", (512, 6, 6, 8, 2048), 51865, 80),
    size("small.en", (768, 12, 12, 12, 3072), 51864, 80),
    size("small", (768, 12, 12, 12, 3072), 51865, 80),
    size("medium.en", (1024, 24, 24, 16, 4096), 51864, 80),
    size("medium", (1024, 24, 24, 16, 4096), 51865, 80),
    size("large-v2", (1280, 32, 32, 20, 5120), 51865, 80),
    size("large-v3", (1280, 32, 32, 20, 5120), 51866, 128),
    size("large-v3-turbo", (1280, 32, 4, 20, 5120), 51866, 128),
    size("distil-small.en", (768, 12, 4, 12, 3072), 51864, 80),
    size("distil-medium.en", (1024, 24, 2, 16, 4096), 51864, 80),
    size("distil-large-v3", (1280, 32, 2, 20, 5120), 51866, 128),
];

/// Not published: a multilingual Whisper small enough to carry (14 MB in f32), for the parity
/// check of language detection and the multilingual prompt against transformers
/// (tests/whisper_multilingual.rs).
pub const PARITY: Size = size("parity-multilingual", (64, 2, 2, 4, 256), 51865, 80);

pub fn by_name(name: &str) -> Option<Size> {
    FAMILY
        .iter()
        .chain([&PARITY])
        .copied()
        .find(|s| s.name == name)
}

/// The tokenizers `calib/fetch-assets.sh` builds from OpenAI's vocabularies.
pub fn tokenizers_dir() -> PathBuf {
    let dir = std::env::var("OASR_WHISPER_TOKENIZERS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| super::cache_dir().join("whisper-tokenizers"));
    assert!(
        dir.join("multilingual/tokenizer.json").is_file(),
        "the Whisper tokenizers are not at {}: run `bash calib/fetch-assets.sh` first",
        dir.display()
    );
    dir
}

/// SplitMix64, seeded per tensor: the same checkpoint on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) * 2.0 - 1.0
    }
}

fn seed_of(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The values of one tensor: layer-norm weights 1 and biases 0, other biases small, weights
/// uniform with the variance of 1 / fan-in (so activations keep their scale through the layers).
pub fn values(seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if name.contains("layer_norm") {
        return vec![if name.ends_with(".weight") { 1.0 } else { 0.0 }; n];
    }
    let scale = match shape {
        [_, rest @ ..] if !rest.is_empty() => (3.0 / rest.iter().product::<usize>() as f32).sqrt(),
        _ => 0.02, // biases
    };
    let mut rng = Rng(seed_of(seed, name));
    (0..n).map(|_| rng.uniform() * scale).collect()
}

fn encode(values: &[f32], dtype: safetensors::Dtype) -> Vec<u8> {
    match dtype {
        safetensors::Dtype::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        safetensors::Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        safetensors::Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        other => panic!("no random weights in {other:?}"),
    }
}

fn dtype_name(dtype: safetensors::Dtype) -> &'static str {
    match dtype {
        safetensors::Dtype::F16 => "float16",
        safetensors::Dtype::BF16 => "bfloat16",
        _ => "float32",
    }
}

/// Writes `size` as a Hugging Face Whisper directory: config.json, generation_config.json, the
/// vocabulary's tokenizer.json and the weights, in `shards` files (1: one model.safetensors).
/// The published suppression lists are not copied (they are not shape facts): the configs
/// suppress nothing, except the parity model, which lists the timestamp tokens so that
/// transformers' no-timestamps decoding suppresses them as this tool always does.
pub fn write(dir: &Path, size: &Size, dtype: safetensors::Dtype, shards: usize, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let tokenizers = tokenizers_dir().join(size.tokenizer());
    std::fs::copy(
        tokenizers.join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let languages: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&std::fs::read(tokenizers.join("languages.json")).unwrap()).unwrap();
    let lang_to_id: serde_json::Map<String, serde_json::Value> = languages
        .iter()
        .map(|(code, id)| (format!("<|{code}|>"), id.clone()))
        .collect();
    // OpenAI's layout of the special tokens: end-of-text, start of transcript, the languages,
    // translate, transcribe, start of LM, start of previous, no speech, no timestamps.
    let eot = if size.multilingual() { 50257 } else { 50256 };
    let sot = eot + 1;
    let translate = sot + 1 + languages.len() as u64;
    let (transcribe, no_timestamps) = (translate + 1, translate + 5);
    let suppress: Vec<u64> = if size.name == PARITY.name {
        (no_timestamps + 1..size.vocab_size as u64).collect()
    } else {
        Vec::new()
    };
    let config = serde_json::json!({
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "activation_function": "gelu",
        "d_model": size.d_model,
        "encoder_layers": size.encoder_layers,
        "decoder_layers": size.decoder_layers,
        "encoder_attention_heads": size.heads,
        "decoder_attention_heads": size.heads,
        "encoder_ffn_dim": size.ffn,
        "decoder_ffn_dim": size.ffn,
        "num_mel_bins": size.num_mel_bins,
        "vocab_size": size.vocab_size,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "scale_embedding": false,
        "tie_word_embeddings": true,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "begin_suppress_tokens": [220, eot],
        "suppress_tokens": suppress,
        "torch_dtype": dtype_name(dtype),
    });
    let mut generation = serde_json::json!({
        "decoder_start_token_id": sot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "bos_token_id": eot,
        "begin_suppress_tokens": [220, eot],
        "suppress_tokens": suppress,
        "no_timestamps_token_id": no_timestamps,
        "max_length": 448,
        "is_multilingual": size.multilingual(),
    });
    if size.multilingual() {
        generation["lang_to_id"] = serde_json::Value::Object(lang_to_id);
        generation["task_to_id"] =
            serde_json::json!({"translate": translate, "transcribe": transcribe});
        generation["forced_decoder_ids"] = serde_json::json!([[1, null], [2, transcribe]]);
    } else {
        generation["forced_decoder_ids"] = serde_json::json!([[1, no_timestamps]]);
    }
    let json = |name: &str, v: &serde_json::Value| {
        std::fs::write(dir.join(name), serde_json::to_vec_pretty(v).unwrap()).unwrap()
    };
    json("config.json", &config);
    json("generation_config.json", &generation);

    let tensors = size.tensors();
    let total: usize = tensors
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    let per_shard = total.div_ceil(shards.max(1));
    let mut groups: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new()];
    let mut filled = 0;
    for t in tensors {
        let n: usize = t.1.iter().product();
        if filled > 0 && filled + n > per_shard && groups.len() < shards {
            groups.push(Vec::new());
            filled = 0;
        }
        filled += n;
        groups.last_mut().unwrap().push(t);
    }
    let count = groups.len();
    let mut weight_map = serde_json::Map::new();
    let mut bytes_total = 0usize;
    for (i, group) in groups.into_iter().enumerate() {
        let file = if shards <= 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = group
            .into_iter()
            .map(|(name, shape)| {
                let bytes = encode(&values(seed, &name, &shape), dtype);
                (name, shape, bytes)
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = data
            .iter()
            .map(|(n, s, b)| {
                weight_map.insert(n.clone(), serde_json::Value::String(file.clone()));
                bytes_total += b.len();
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, &None, &dir.join(&file)).unwrap();
    }
    if shards > 1 {
        json(
            "model.safetensors.index.json",
            &serde_json::json!({"metadata": {"total_size": bytes_total}, "weight_map": weight_map}),
        );
    }
}

/// The bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}
