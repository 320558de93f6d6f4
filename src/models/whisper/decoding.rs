//! Greedy decoding with the model's own prompt, and teacher-forced scoring.

use std::collections::HashSet;
use std::path::Path;

use candle_core::Tensor;

use super::forward::{argmax_allowed, logits_rows, LinearExec, Whisper};
use crate::error::{Error, Result};

/// Whisper's `sample_len`: at most this many generated tokens (n_text_ctx / 2).
pub const MAX_NEW_TOKENS: usize = 224;

/// The tokenizer: special-token lookup and detokenization (Hugging Face `tokenizer.json`).
pub struct WhisperTokenizer {
    inner: tokenizers::Tokenizer,
    /// `<|endoftext|>`: every id from here on is a special token.
    pub eot: u32,
    pub no_timestamps: u32,
}

impl WhisperTokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::corrupt(path, format!("cannot load the tokenizer: {e}")))?;
        let id = |t: &str| {
            inner
                .token_to_id(t)
                .ok_or_else(|| Error::corrupt(path, format!("the tokenizer has no `{t}`")))
        };
        Ok(WhisperTokenizer {
            eot: id("<|endoftext|>")?,
            no_timestamps: id("<|notimestamps|>")?,
            inner,
        })
    }

    /// The text of the tokens, special tokens dropped.
    pub fn decode(&self, tokens: &[u32]) -> Result<String> {
        let text: Vec<u32> = tokens.iter().copied().filter(|t| *t < self.eot).collect();
        self.inner
            .decode(&text, true)
            .map(|s| s.trim().to_string())
            .map_err(|e| Error::Model {
                what: "detokenize".into(),
                message: e.to_string(),
            })
    }
}

/// The prompt and the suppression rules of greedy decoding.
#[derive(Debug, Clone)]
pub struct DecodingRules {
    /// Start-of-transcript then the forced tokens (tiny.en: `<|notimestamps|>`).
    pub prompt: Vec<u32>,
    pub eot: u32,
    suppress: HashSet<u32>,
    suppress_at_begin: HashSet<u32>,
    /// Timestamp tokens start here and are always suppressed (no-timestamps decoding).
    timestamp_begin: u32,
}

impl DecodingRules {
    pub fn new(model: &Whisper, tokenizer: &WhisperTokenizer) -> Result<Self> {
        let c = &model.config;
        let mut prompt = vec![c.decoder_start_token_id];
        let mut forced = c.forced_decoder_ids.clone();
        forced.sort();
        for (position, token) in forced {
            let token = token.ok_or_else(|| Error::NotImplemented {
                what: "language detection".into(),
                detail: "a multilingual model needs its language token; this version transcribes English-only models".into(),
            })?;
            if position != prompt.len() {
                return Err(Error::Model {
                    what: "prompt".into(),
                    message: format!("forced_decoder_ids leave position {} unset", prompt.len()),
                });
            }
            prompt.push(token);
        }
        Ok(DecodingRules {
            prompt,
            eot: c.eos_token_id,
            suppress: c.suppress_tokens.iter().copied().collect(),
            suppress_at_begin: c.begin_suppress_tokens.iter().copied().collect(),
            timestamp_begin: tokenizer.no_timestamps + 1,
        })
    }

    fn allowed(&self, token: usize, first: bool) -> bool {
        let t = token as u32;
        t < self.timestamp_begin
            && !self.suppress.contains(&t)
            && !(first && self.suppress_at_begin.contains(&t))
    }
}

/// A greedy decoding: the generated tokens (without prompt and end-of-text) and, when asked, the
/// raw logits of every step (including the step that chose end-of-text).
#[derive(Debug, Clone, Default)]
pub struct Decoded {
    pub tokens: Vec<u32>,
    pub step_logits: Vec<Vec<f32>>,
}

/// Greedy decoding over an encoder output: stops at end-of-text or [`MAX_NEW_TOKENS`].
pub fn greedy(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    keep_logits: bool,
) -> Result<Decoded> {
    let mut state = model.start_decoder(exec, audio)?;
    let mut out = Decoded::default();
    let mut input = rules.prompt.clone();
    for step in 0..MAX_NEW_TOKENS {
        let logits = model.decode(exec, &mut state, &input)?;
        let last = logits_rows(&logits)?.pop().unwrap_or_default();
        let next = argmax_allowed(&last, |i| rules.allowed(i, step == 0)).unwrap_or(rules.eot);
        if keep_logits {
            out.step_logits.push(last);
        }
        if next == rules.eot || state.position >= model.config.max_target_positions {
            break;
        }
        out.tokens.push(next);
        input = vec![next];
    }
    Ok(out)
}

/// Scores a given token sequence: the logits the model gives at each step when fed the prompt
/// and `tokens` (one row per token of `tokens`, plus the row that should predict end-of-text).
pub fn teacher_forced(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>> {
    let mut state = model.start_decoder(exec, audio)?;
    let mut input = rules.prompt.clone();
    input.extend_from_slice(tokens);
    let rows = logits_rows(&model.decode(exec, &mut state, &input)?)?;
    Ok(rows[rules.prompt.len() - 1..].to_vec())
}
