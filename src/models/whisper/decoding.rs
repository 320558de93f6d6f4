//! Greedy decoding with the model's own prompt, and teacher-forced scoring.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use candle_core::Tensor;

use super::config::WhisperConfig;
use super::forward::{argmax_allowed, logits_rows, DecoderState, Whisper};
use crate::error::{Error, Result};
use crate::models::exec::LinearExec;
use crate::models::gemv::MAX_ROWS;
use crate::models::speech::Task;
use crate::rng::SplitMix64;

/// Whisper's `sample_len`: at most this many generated tokens (n_text_ctx / 2).
pub const MAX_NEW_TOKENS: usize = 224;

/// The tokenizer: special-token lookup and detokenization (Hugging Face `tokenizer.json`).
pub struct WhisperTokenizer {
    inner: tokenizers::Tokenizer,
    /// `<|endoftext|>`: every id from here on is a special token.
    pub eot: u32,
    pub no_timestamps: u32,
    pub no_speech: Option<u32>,
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
            no_speech: ["<|nospeech|>", "<|nocaptions|>"]
                .iter()
                .find_map(|t| inner.token_to_id(t)),
            inner,
        })
    }

    /// The id of a token of the vocabulary, special tokens included.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of an id, special tokens included.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
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
    /// Start-of-transcript then the forced tokens: `<|notimestamps|>` for an English-only model;
    /// language, task and `<|notimestamps|>` for a multilingual one.
    pub prompt: Vec<u32>,
    pub eot: u32,
    suppress: HashSet<u32>,
    suppress_at_begin: HashSet<u32>,
    /// Timestamp tokens start here and are always suppressed (no-timestamps decoding).
    timestamp_begin: u32,
    /// `<|nospeech|>` (`<|nocaptions|>` in older tokenizers), when the vocabulary has it.
    pub no_speech: Option<u32>,
    /// Where the language token sits in `prompt` (multilingual models).
    language_at: Option<usize>,
    /// The language is detected per utterance: `prompt[language_at]` is only a placeholder.
    pub detect_language: bool,
    /// The language tokens of a multilingual vocabulary and their codes (`en`, `de`, ...).
    languages: BTreeMap<u32, String>,
}

impl DecodingRules {
    /// The rules of `model`'s own prompt. A multilingual model decodes in `language` (a code such
    /// as `de`; `None`: detected per utterance, as the reference implementations do) and does
    /// `task` (`None`: transcribe). An English-only model takes neither, except `--language en`.
    pub fn new(
        model: &Whisper,
        tokenizer: &WhisperTokenizer,
        language: Option<&str>,
        task: Option<Task>,
    ) -> Result<Self> {
        let c = &model.config;
        let multilingual = c.is_multilingual();
        if !multilingual {
            if let Some(code) = language.filter(|code| *code != "en") {
                return Err(Error::option(
                    "--language",
                    format!("this model is English-only (a {}-token vocabulary); it cannot decode in {code:?}", c.vocab_size),
                ));
            }
            if task == Some(Task::Translate) {
                return Err(Error::option(
                    "--task",
                    "translate needs a multilingual model; this one is English-only",
                ));
            }
        }
        let languages = if multilingual {
            language_tokens(c, tokenizer)
        } else {
            BTreeMap::new()
        };
        let task_ids: Vec<u32> = c.task_token_ids.values().copied().collect();
        let mut prompt = vec![c.decoder_start_token_id];
        let mut language_at = None;
        let mut forced = c.forced_decoder_ids.clone();
        forced.sort();
        for (position, token) in forced {
            if position != prompt.len() {
                return Err(Error::Model {
                    what: "prompt".into(),
                    message: format!("forced_decoder_ids leave position {} unset", prompt.len()),
                });
            }
            let token = match token {
                // The language slot of a multilingual prompt.
                None if multilingual => {
                    language_at = Some(position);
                    match language {
                        Some(code) => language_token(&languages, code)?,
                        None => c.decoder_start_token_id,
                    }
                }
                None => {
                    return Err(Error::Model {
                        what: "prompt".into(),
                        message: format!(
                            "forced_decoder_ids leave position {position} to be chosen, but the \
                             model is English-only"
                        ),
                    })
                }
                Some(t) if task_ids.contains(&t) => match task {
                    Some(task) => *c.task_token_ids.get(task.name()).ok_or_else(|| {
                        Error::option(
                            "--task",
                            format!("the model has no <|{}|> token", task.name()),
                        )
                    })?,
                    None => t,
                },
                Some(t) => t,
            };
            prompt.push(token);
        }
        if multilingual && language_at.is_none() {
            return Err(Error::Model {
                what: "prompt".into(),
                message:
                    "a multilingual model's forced_decoder_ids must leave the language slot open"
                        .into(),
            });
        }
        Ok(DecodingRules {
            prompt,
            eot: c.eos_token_id,
            suppress: c.suppress_tokens.iter().copied().collect(),
            suppress_at_begin: c.begin_suppress_tokens.iter().copied().collect(),
            timestamp_begin: tokenizer.no_timestamps + 1,
            no_speech: tokenizer.no_speech,
            detect_language: language_at.is_some() && language.is_none(),
            language_at,
            languages,
        })
    }

    /// These rules with the language of `token` set in the prompt.
    pub fn with_language(&self, token: u32) -> Result<Self> {
        let at = self.language_at.ok_or_else(|| Error::Model {
            what: "prompt".into(),
            message: "an English-only model has no language token".into(),
        })?;
        if !self.languages.contains_key(&token) {
            return Err(Error::Model {
                what: "prompt".into(),
                message: format!("token {token} is not a language token"),
            });
        }
        let mut rules = self.clone();
        rules.prompt[at] = token;
        rules.detect_language = false;
        Ok(rules)
    }

    /// The code of the prompt's language, once it is set (multilingual models).
    pub fn language(&self) -> Option<&str> {
        if self.detect_language {
            return None;
        }
        let token = self.prompt.get(self.language_at?)?;
        self.languages.get(token).map(String::as_str)
    }

    /// Whether `token` is a language token.
    pub fn is_language(&self, token: u32) -> bool {
        self.languages.contains_key(&token)
    }

    fn allowed(&self, token: usize, first: bool) -> bool {
        let t = token as u32;
        t < self.timestamp_begin
            && !self.suppress.contains(&t)
            && !(first && self.suppress_at_begin.contains(&t))
    }
}

/// The language tokens of a multilingual model: `lang_to_id` of its generation config, or else
/// the tokenizer's `<|xx|>` tokens between start-of-transcript and `<|translate|>` (OpenAI's
/// layout of the special tokens).
fn language_tokens(c: &WhisperConfig, tokenizer: &WhisperTokenizer) -> BTreeMap<u32, String> {
    let code_of = |id: u32| {
        tokenizer.token(id).and_then(|t| {
            t.strip_prefix("<|")
                .and_then(|t| t.strip_suffix("|>"))
                .filter(|code| !code.is_empty() && code.chars().all(|ch| ch.is_ascii_lowercase()))
                .map(str::to_string)
        })
    };
    let ids: Vec<u32> = if c.language_token_ids.is_empty() {
        let end = c
            .task_token_ids
            .values()
            .copied()
            .min()
            .unwrap_or(c.decoder_start_token_id);
        (c.decoder_start_token_id + 1..end).collect()
    } else {
        c.language_token_ids.clone()
    };
    ids.into_iter()
        .filter_map(|id| code_of(id).map(|code| (id, code)))
        .collect()
}

/// The token of a language code, refused by name when the model has no such language.
fn language_token(languages: &BTreeMap<u32, String>, code: &str) -> Result<u32> {
    languages
        .iter()
        .find(|(_, c)| c.as_str() == code)
        .map(|(id, _)| *id)
        .ok_or_else(|| {
            let known: Vec<&str> = languages.values().map(String::as_str).collect();
            Error::option(
                "--language",
                format!(
                    "{code:?} is not a language of this model; it knows {}",
                    known.join(", ")
                ),
            )
        })
}

/// Whisper's language detection: the decoder fed start-of-transcript alone, its logits over the
/// language tokens only, the most likely one. Run on the encoder output that is then decoded (as
/// faster-whisper and transformers do). Returns the token and the whole row of logits.
pub fn detect_language(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
) -> Result<(u32, Vec<f32>)> {
    let mut state = model.start_decoder(exec, audio)?;
    let logits = model.decode(exec, &mut state, &rules.prompt[..1])?;
    let row = logits_rows(&logits)?.pop().unwrap_or_default();
    let token =
        argmax_allowed(&row, |i| rules.is_language(i as u32)).ok_or_else(|| Error::Model {
            what: "language detection".into(),
            message: "the model has no language tokens; give --language".into(),
        })?;
    Ok((token, row))
}

/// A decoding: the generated tokens (without prompt and end-of-text) and, when asked, the raw
/// logits of every step (including the step that chose end-of-text), with the figures the
/// fallback rule judges it by.
#[derive(Debug, Clone, Default)]
pub struct Decoded {
    pub tokens: Vec<u32>,
    pub step_logits: Vec<Vec<f32>>,
    /// The temperature that produced these tokens (0: greedy).
    pub temperature: f32,
    /// Mean log-probability of the chosen tokens, end-of-text included (Whisper's `avg_logprob`).
    pub avg_logprob: f64,
    /// Bytes of the text over bytes of its zlib compression (Whisper's `compression_ratio`).
    pub compression_ratio: f64,
    /// Probability of the no-speech token after start-of-transcript.
    pub no_speech_prob: f64,
    /// The decoding stopped at the token limit, not at end-of-text.
    pub hit_limit: bool,
    /// Decodings run to get here (1 when the greedy one passed).
    pub attempts: usize,
}

/// Whisper's decoding safeguards (OpenAI `transcribe.py`, faster-whisper): greedy first, then
/// sampling at rising temperatures while a decoding looks like a failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Fallback {
    /// Tried in order; 0 is greedy.
    pub temperatures: Vec<f32>,
    /// A decoding whose text compresses better than this is repetitive: retry.
    pub compression_ratio_threshold: f64,
    /// A decoding whose mean token log-probability is below this is unsure: retry.
    pub logprob_threshold: f64,
    /// ... unless the window is silence (no-speech probability above this), which no
    /// temperature fixes.
    pub no_speech_threshold: f64,
    /// Samples drawn per temperature above 0; the most likely one is kept.
    pub best_of: usize,
    /// Hypotheses kept by the beam search at temperature 0 (Whisper's `beam_size`); 1 decodes
    /// greedily.
    pub beam_size: usize,
    /// Seed of the sampler: every utterance starts from it, so results are deterministic.
    pub seed: u64,
}

impl Default for Fallback {
    fn default() -> Self {
        Fallback {
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: 2.4,
            logprob_threshold: -1.0,
            no_speech_threshold: 0.6,
            best_of: 5,
            beam_size: 1,
            seed: 0x5eed,
        }
    }
}

impl Fallback {
    /// Greedy only: no retries.
    pub fn greedy_only() -> Self {
        Fallback {
            temperatures: vec![0.0],
            ..Fallback::default()
        }
    }

    fn needs_retry(&self, d: &Decoded) -> bool {
        let failed = d.hit_limit
            || d.compression_ratio > self.compression_ratio_threshold
            || d.avg_logprob < self.logprob_threshold;
        let silence =
            d.no_speech_prob > self.no_speech_threshold && d.avg_logprob < self.logprob_threshold;
        failed && !silence
    }
}

/// Tokens a decoding of `samples` audio samples at `sample_rate` may generate: 24 plus 12 per
/// second of audio, at most [`MAX_NEW_TOKENS`]. Read speech runs at 2–4 tokens a second (the
/// densest clip of the gate sets, a spelled word, at 6.4); a decoding that needs more is looping.
pub fn token_limit(samples: usize, sample_rate: u32) -> usize {
    let seconds = samples as f64 / f64::from(sample_rate.max(1));
    (24 + (12.0 * seconds).ceil() as usize).min(MAX_NEW_TOKENS)
}

/// log-softmax of the allowed entries of `row` at `temperature` (1 when 0), as f64; disallowed
/// entries get −∞.
fn log_softmax_allowed(row: &[f32], allowed: impl Fn(usize) -> bool, temperature: f32) -> Vec<f64> {
    let t = if temperature > 0.0 {
        f64::from(temperature)
    } else {
        1.0
    };
    let scaled: Vec<f64> = row
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if allowed(i) && v.is_finite() {
                f64::from(*v) / t
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return scaled;
    }
    let sum: f64 = scaled.iter().map(|v| (v - max).exp()).sum();
    let log_sum = max + sum.ln();
    scaled.into_iter().map(|v| v - log_sum).collect()
}

/// Bytes of `text` over bytes of its zlib stream at level 6 (Python's `zlib.compress` default;
/// miniz's stream can differ from zlib's by a few bytes).
pub fn compression_ratio(text: &str) -> f64 {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return 0.0;
    }
    let compressed = miniz_oxide::deflate::compress_to_vec_zlib(bytes, 6);
    bytes.len() as f64 / compressed.len().max(1) as f64
}

/// One decoding over an encoder output at `temperature` (0: greedy arg-max; above: sampling from
/// the softmax of logits / temperature with `rng`), up to `limit` tokens.
#[allow(clippy::too_many_arguments)]
fn decode_once(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    limit: usize,
    temperature: f32,
    rng: &mut SplitMix64,
    keep_logits: bool,
) -> Result<Decoded> {
    let mut state = model.start_decoder(exec, audio)?;
    let mut out = Decoded {
        temperature,
        hit_limit: true,
        attempts: 1,
        ..Decoded::default()
    };
    let mut input = rules.prompt.clone();
    let mut sum_logprob = 0f64;
    for step in 0..limit {
        let logits = model.decode(exec, &mut state, &input)?;
        let mut rows = logits_rows(&logits)?;
        if step == 0 {
            // The row after start-of-transcript scores "no speech" (over the whole vocabulary).
            if let (Some(first), Some(ns)) = (rows.first(), rules.no_speech) {
                let lp = log_softmax_allowed(first, |_| true, 1.0);
                out.no_speech_prob = lp.get(ns as usize).map_or(0.0, |v| v.exp());
            }
        }
        let last = rows.pop().unwrap_or_default();
        let allowed = |i| rules.allowed(i, step == 0);
        let logprobs = log_softmax_allowed(&last, allowed, 1.0);
        let next = if temperature > 0.0 {
            sample(&log_softmax_allowed(&last, allowed, temperature), rng)
        } else {
            argmax_allowed(&last, allowed)
        }
        .unwrap_or(rules.eot);
        sum_logprob += logprobs
            .get(next as usize)
            .copied()
            .filter(|v| v.is_finite())
            .unwrap_or(-1e4);
        if keep_logits {
            out.step_logits.push(last);
        }
        if next == rules.eot {
            out.hit_limit = false;
            break;
        }
        if state.position >= model.config.max_target_positions {
            break;
        }
        out.tokens.push(next);
        input = vec![next];
    }
    out.avg_logprob = sum_logprob / (out.tokens.len() + 1) as f64;
    Ok(out)
}

/// One hypothesis of a beam search: its generated tokens, its summed log-probability, and the
/// decoder's logits after its last token (with the state that produced them).
struct Beam {
    tokens: Vec<u32>,
    sum_logprob: f64,
    state: DecoderState,
    last: Vec<f32>,
}

/// Beam search over an encoder output, as OpenAI Whisper's `BeamSearchDecoder` (patience 1) and
/// its maximum-likelihood ranker: each step extends every live hypothesis by its `beam_size + 1`
/// most likely allowed tokens, keeps the `beam_size` best extensions that do not end the text,
/// and sets aside those that do; it stops once `beam_size` hypotheses have ended (or at `limit`
/// tokens, when the live ones are ranked too). The hypothesis kept is the one with the highest
/// summed log-probability over its length. With `keep_logits`, its rows are scored again
/// teacher-forced (the rows a greedy decoding keeps as it goes).
fn beam_search(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    limit: usize,
    beam_size: usize,
    keep_logits: bool,
) -> Result<Decoded> {
    let fresh = model.start_decoder(exec, audio)?;
    let mut state = fresh.clone();
    let mut rows = logits_rows(&model.decode(exec, &mut state, &rules.prompt)?)?;
    let mut out = Decoded {
        attempts: 1,
        ..Decoded::default()
    };
    if let (Some(first), Some(ns)) = (rows.first(), rules.no_speech) {
        let lp = log_softmax_allowed(first, |_| true, 1.0);
        out.no_speech_prob = lp.get(ns as usize).map_or(0.0, |v| v.exp());
    }
    let (start_position, max_position) = (state.position, model.config.max_target_positions);
    let mut live = vec![Beam {
        tokens: Vec::new(),
        sum_logprob: 0.0,
        state,
        last: rows.pop().unwrap_or_default(),
    }];
    // (tokens without end-of-text, summed log-probability with it, ended at end-of-text)
    let mut finished: Vec<(Vec<u32>, f64, bool)> = Vec::new();
    for step in 0..limit {
        let allowed = |i| rules.allowed(i, step == 0);
        // (summed log-probability, live hypothesis it extends, token), in the order Whisper
        // lists them: by hypothesis, then by likelihood.
        let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
        for (b, beam) in live.iter().enumerate() {
            let logprobs = log_softmax_allowed(&beam.last, allowed, 1.0);
            for t in most_likely(&logprobs, beam_size + 1) {
                candidates.push((beam.sum_logprob + logprobs[t], b, t as u32));
            }
        }
        // Stable: ties keep that order, as Python's `sorted` does.
        candidates.sort_by(|x, y| y.0.total_cmp(&x.0));
        let mut next: Vec<(f64, usize, u32)> = Vec::new();
        let mut ended: Vec<(Vec<u32>, f64, bool)> = Vec::new();
        for &(score, b, t) in &candidates {
            if t == rules.eot {
                ended.push((live[b].tokens.clone(), score, true));
            } else {
                next.push((score, b, t));
                if next.len() == beam_size {
                    break;
                }
            }
        }
        for e in ended {
            if finished.len() >= beam_size {
                break;
            }
            finished.push(e);
        }
        if finished.len() >= beam_size || next.is_empty() {
            live.clear();
            break;
        }
        let tokens: Vec<u32> = next.iter().map(|&(_, _, t)| t).collect();
        let mut states: Vec<DecoderState> = next
            .iter()
            .map(|&(_, b, _)| live[b].state.clone())
            .collect();
        let mut rows = vec![Vec::new(); next.len()];
        // The last step's extensions are ranked, never extended: no logits needed. The others
        // run in groups of a few rows, whose GEMMs give each row the bits it gets alone.
        if step + 1 < limit && start_position + live[0].tokens.len() < max_position {
            for ((states, tokens), rows) in states
                .chunks_mut(MAX_ROWS)
                .zip(tokens.chunks(MAX_ROWS))
                .zip(rows.chunks_mut(MAX_ROWS))
            {
                let out = logits_rows(&model.decode_step(exec, states, tokens)?)?;
                for (row, logits) in rows.iter_mut().zip(out) {
                    *row = logits;
                }
            }
        }
        let extended: Vec<Beam> = next
            .iter()
            .zip(states)
            .zip(rows)
            .map(|((&(score, b, t), state), last)| {
                let mut tokens = live[b].tokens.clone();
                tokens.push(t);
                Beam {
                    tokens,
                    sum_logprob: score,
                    state,
                    last,
                }
            })
            .collect();
        live = extended;
        if live.iter().any(|b| b.last.is_empty()) {
            break; // the token limit or the decoder's last position
        }
    }
    // Too few ended: the live hypotheses join, most likely first, as if they ended here.
    live.sort_by(|x, y| y.sum_logprob.total_cmp(&x.sum_logprob));
    for beam in live {
        if finished.len() >= beam_size {
            break;
        }
        finished.push((beam.tokens, beam.sum_logprob, false));
    }
    // Whisper's ranker: summed log-probability over the length (end-of-text not counted); the
    // first of equals wins.
    let per_token = |(tokens, sum, _): &(Vec<u32>, f64, bool)| sum / tokens.len().max(1) as f64;
    let mut best: Option<&(Vec<u32>, f64, bool)> = None;
    for f in &finished {
        if best.is_none_or(|b| per_token(f) > per_token(b)) {
            best = Some(f);
        }
    }
    let Some((tokens, sum, ended)) = best.cloned() else {
        return Ok(out);
    };
    out.avg_logprob = sum / (tokens.len() + 1) as f64;
    out.hit_limit = !ended;
    if keep_logits {
        out.step_logits = teacher_forced_from(model, exec, fresh, rules, &tokens, false)?;
        if !ended {
            out.step_logits.pop(); // as greedy keeps them: no row chose end-of-text
        }
    }
    out.tokens = tokens;
    Ok(out)
}

/// The indices of the `k` largest finite entries, largest first (the lower index first among
/// equals).
fn most_likely(logprobs: &[f64], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let mut top: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, lp) in logprobs.iter().enumerate() {
        if !lp.is_finite() || (top.len() == k && *lp <= logprobs[top[k - 1]]) {
            continue;
        }
        let at = top.partition_point(|&j| logprobs[j] >= *lp);
        top.insert(at, i);
        top.truncate(k);
    }
    top
}

/// Draws an index from log-probabilities.
fn sample(logprobs: &[f64], rng: &mut SplitMix64) -> Option<u32> {
    let u = rng.next_f64();
    let mut acc = 0.0;
    let mut last = None;
    for (i, lp) in logprobs.iter().enumerate() {
        if lp.is_finite() {
            acc += lp.exp();
            last = Some(i as u32);
            if u < acc {
                return last;
            }
        }
    }
    last
}

/// Greedy decoding over an encoder output: stops at end-of-text or [`MAX_NEW_TOKENS`].
pub fn greedy(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    keep_logits: bool,
) -> Result<Decoded> {
    let mut rng = SplitMix64(0);
    decode_once(
        model,
        exec,
        audio,
        rules,
        MAX_NEW_TOKENS,
        0.0,
        &mut rng,
        keep_logits,
    )
}

/// Decoding with Whisper's safeguards: greedy, then while the result looks like a failure (it
/// reached `limit`, its text compresses more than the threshold, or its mean log-probability is
/// below the threshold, unless the window is silence) the next temperature, keeping the most
/// likely of `best_of` seeded samples. When every temperature fails, the most likely decoding
/// among those under the compression threshold (or among all) is kept, as faster-whisper does.
#[allow(clippy::too_many_arguments)]
pub fn decode_with_fallback(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    audio: &Tensor,
    rules: &DecodingRules,
    tokenizer: &WhisperTokenizer,
    fallback: &Fallback,
    limit: usize,
    keep_logits: bool,
) -> Result<Decoded> {
    let mut rng = SplitMix64(fallback.seed);
    let mut tried: Vec<Decoded> = Vec::new();
    let mut attempts = 0;
    for &temperature in &fallback.temperatures {
        let draws = if temperature > 0.0 {
            fallback.best_of.max(1)
        } else {
            1
        };
        let mut best: Option<Decoded> = None;
        for _ in 0..draws {
            let mut d = if temperature == 0.0 && fallback.beam_size > 1 {
                beam_search(
                    model,
                    exec,
                    audio,
                    rules,
                    limit,
                    fallback.beam_size,
                    keep_logits,
                )?
            } else {
                decode_once(
                    model,
                    exec,
                    audio,
                    rules,
                    limit,
                    temperature,
                    &mut rng,
                    keep_logits,
                )?
            };
            attempts += 1;
            d.compression_ratio = compression_ratio(&tokenizer.decode(&d.tokens)?);
            // Whisper ranks samples by their summed log-probability over their length.
            let score = |d: &Decoded| {
                d.avg_logprob * (d.tokens.len() + 1) as f64 / d.tokens.len().max(1) as f64
            };
            if best.as_ref().is_none_or(|b| score(&d) > score(b)) {
                best = Some(d);
            }
        }
        let Some(mut d) = best else { continue };
        d.attempts = attempts;
        if !fallback.needs_retry(&d) {
            return Ok(d);
        }
        tried.push(d);
    }
    let threshold = fallback.compression_ratio_threshold;
    let pick = |pool: Vec<Decoded>| {
        pool.into_iter()
            .max_by(|a, b| a.avg_logprob.total_cmp(&b.avg_logprob))
    };
    let below: Vec<Decoded> = tried
        .iter()
        .filter(|d| d.compression_ratio <= threshold && !d.hit_limit)
        .cloned()
        .collect();
    let mut chosen = if below.is_empty() {
        pick(tried)
    } else {
        pick(below)
    }
    .unwrap_or_default();
    chosen.attempts = attempts;
    Ok(chosen)
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
    let state = model.start_decoder(exec, audio)?;
    teacher_forced_from(model, exec, state, rules, tokens, false)
}

/// [`teacher_forced`] from a fresh decoder state (as [`Whisper::start_decoder`] returned it, or
/// a clone of one): the cross-attention keys and values are not computed again.
/// `with_language_row` puts the row after start-of-transcript first (the row a detected language
/// was chosen from).
pub fn teacher_forced_from(
    model: &Whisper,
    exec: &mut dyn LinearExec,
    mut state: DecoderState,
    rules: &DecodingRules,
    tokens: &[u32],
    with_language_row: bool,
) -> Result<Vec<Vec<f32>>> {
    let mut input = rules.prompt.clone();
    input.extend_from_slice(tokens);
    let mut rows = logits_rows(&model.decode(exec, &mut state, &input)?)?;
    let first = rows.first().cloned();
    let mut scored = rows.split_off(rules.prompt.len() - 1);
    // A detected language is the hypothesis' first token: its row is the one after
    // start-of-transcript, the row detection chose it from.
    if with_language_row {
        scored.insert(0, first.unwrap_or_default());
    }
    Ok(scored)
}
