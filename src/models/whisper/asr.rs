//! Whisper behind the model seam: the log-mel frontend, the encoder, greedy or beam-search
//! decoding with Whisper's temperature fallback, and teacher-forced scoring.

use std::any::Any;

use candle_core::Tensor;

use super::decoding::{detect_language, teacher_forced_from};
use super::forward::DecoderState;
use super::import::whisper_features;
use super::{
    decode_with_fallback, token_limit, DecodingRules, Fallback, Whisper, WhisperTokenizer,
};
use crate::checkpoint::{Checkpoint, CONFIG_FILE};
use crate::error::{Error, Result};
use crate::frontend::whisper_logmel::{LogMel, N_SAMPLES};
use crate::frontend::{Frontend, WhisperFrontend, WHISPER_LOGMEL};
use crate::models::exec::LinearExec;
use crate::models::speech::{DecodeOptions, Decoding, LogMelPadding, SpeechModel, Task};

/// A Whisper model with its tokenizer, decoding rules and frontend.
pub struct WhisperAsr {
    pub model: Whisper,
    pub tokenizer: WhisperTokenizer,
    pub rules: DecodingRules,
    pub frontend: WhisperFrontend,
    pub sample_rate: u32,
    /// The decoding safeguards (temperature fallback); [`Fallback::default`] as Whisper's own.
    pub fallback: Fallback,
    /// The task given (`None`: the model's default, transcribe).
    pub task: Option<Task>,
    /// How a clip shorter than 30 s is padded (`None`: as `transcribe()`).
    pub padding: Option<LogMelPadding>,
}

impl WhisperAsr {
    /// Builds the model from a full-precision Whisper checkpoint (any supported format), with
    /// the model's default language handling (detected on a multilingual model) and task.
    pub fn new(ckpt: &Checkpoint) -> Result<Self> {
        Self::with_options(ckpt, &DecodeOptions::default())
    }

    /// [`Self::new`] decoding in `options.language` and doing `options.task`; the rescoring
    /// options of CTC models are refused by name.
    pub fn with_options(ckpt: &Checkpoint, options: &DecodeOptions) -> Result<Self> {
        if let Some(option) = options.set().into_iter().find(|o| {
            ![
                "--language",
                "--task",
                "--no-fallback",
                "--padding",
                "--beam-size",
            ]
            .contains(o)
        }) {
            return Err(Error::option(
                option,
                "applies to CTC models with attention rescoring (u2pp_conformer); Whisper has no \
                 CTC branch",
            ));
        }
        let beam_size = options.beam_size.unwrap_or(1);
        if beam_size == 0 {
            return Err(Error::option(
                "--beam-size",
                "0 keeps no hypothesis; give 1 (greedy) or more",
            ));
        }
        let tokenizer_path = ckpt
            .tokenizer_files
            .get("tokenizer")
            .ok_or_else(|| Error::corrupt(&ckpt.dir, "no tokenizer.json"))?;
        let tokenizer = WhisperTokenizer::from_file(tokenizer_path)?;
        let model = Whisper::load(ckpt)?;
        let rules = DecodingRules::new(
            &model,
            &tokenizer,
            options.language.as_deref(),
            options.task,
        )?;
        let features = ckpt
            .config
            .features
            .clone()
            .unwrap_or_else(|| whisper_features(model.config.num_mel_bins));
        // Whisper's encoder takes its own log-mel only; another kind is refused before its
        // frontend is even set up.
        let wrong_kind = || {
            Error::config_key(
                ckpt.dir.join(CONFIG_FILE),
                "features.kind",
                format!(
                    "Whisper takes `{WHISPER_LOGMEL}` features, not {:?}",
                    features.kind
                ),
            )
        };
        if features.kind != WHISPER_LOGMEL {
            return Err(wrong_kind());
        }
        let Frontend::WhisperLogMel(frontend) = Frontend::from_spec(&features)? else {
            return Err(wrong_kind());
        };
        let sample_rate = features.sample_rate;
        Ok(WhisperAsr {
            model,
            tokenizer,
            rules,
            frontend,
            sample_rate,
            fallback: Fallback {
                beam_size,
                ..if options.no_fallback {
                    Fallback::greedy_only()
                } else {
                    Fallback::default()
                }
            },
            task: options.task,
            padding: options.padding,
        })
    }

    /// The log-mel the encoder takes for `samples`, padded as the options say.
    pub fn log_mel(&self, samples: &[f32]) -> LogMel {
        self.frontend
            .log_mel_with(samples, self.padding.unwrap_or_default().into())
    }
}

impl WhisperAsr {
    /// [`SpeechModel::score`] from a decoder state (as [`Whisper::start_decoder`] returned it,
    /// or a clone of one). A hypothesis of a detected language starts with its language token.
    pub fn score_from(
        &self,
        exec: &mut dyn LinearExec,
        state: DecoderState,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        if !self.rules.detect_language {
            return teacher_forced_from(&self.model, exec, state, &self.rules, tokens, false);
        }
        let (&language, text) = tokens
            .split_first()
            .filter(|(t, _)| self.rules.is_language(**t))
            .ok_or_else(|| Error::Model {
                what: "scoring".into(),
                message: "a hypothesis of a detected language starts with its language token"
                    .into(),
            })?;
        let rules = self.rules.with_language(language)?;
        teacher_forced_from(&self.model, exec, state, &rules, text, true)
    }
}

impl SpeechModel for WhisperAsr {
    fn architecture(&self) -> &'static str {
        super::NAME
    }

    fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Audio longer than Whisper's 30 s window is refused: this version does not decode
    /// long-form audio window by window.
    fn check_length(&self, what: &str, samples: usize) -> Result<()> {
        if samples > N_SAMPLES {
            return Err(Error::NotImplemented {
                what: format!(
                    "audio longer than Whisper's 30 s window ({what}: {:.2} s)",
                    samples as f64 / f64::from(self.sample_rate)
                ),
                detail: "long-form transcription (sequential 30 s windows) is not supported; \
                         split the file into clips of at most 30 s"
                    .into(),
            });
        }
        Ok(())
    }

    /// The encoder output from the 30 s log-mel the model was trained on.
    fn encode(&self, exec: &mut dyn LinearExec, samples: &[f32]) -> Result<Tensor> {
        let mel = self.log_mel(samples);
        self.model.encode(exec, &mel.data, mel.n_mels, mel.frames)
    }

    /// Greedy (or beam search), with temperature fallback, up to [`token_limit`] tokens for the audio's length.
    /// A multilingual model without a given language detects it first; the language token then
    /// leads the tokens (and its row the scores), so that scoring the tokens replays it.
    fn decode(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        samples: usize,
        keep_scores: bool,
    ) -> Result<Decoding> {
        let detected = if self.rules.detect_language {
            Some(detect_language(&self.model, exec, encoded, &self.rules)?)
        } else {
            None
        };
        let rules = match &detected {
            Some((token, _)) => self.rules.with_language(*token)?,
            None => self.rules.clone(),
        };
        let d = decode_with_fallback(
            &self.model,
            exec,
            encoded,
            &rules,
            &self.tokenizer,
            &self.fallback,
            token_limit(samples, self.sample_rate),
            keep_scores,
        )?;
        let (mut tokens, mut scores) = (d.tokens, d.step_logits);
        if let Some((token, row)) = detected {
            tokens.insert(0, token);
            if keep_scores {
                scores.insert(0, row);
            }
        }
        Ok(Decoding {
            tokens,
            scores,
            temperature: d.temperature,
            attempts: d.attempts,
            hit_limit: d.hit_limit,
            language: rules.language().map(str::to_string),
        })
    }

    /// The decoder's logits at each step when fed the prompt and `tokens`.
    fn score(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let state = self.model.start_decoder(exec, encoded)?;
        self.score_from(exec, state, tokens)
    }

    /// Greedy decoding computes the transcript's rows alone; a beam search does not.
    fn calibration_keeps_the_search_rows(&self) -> bool {
        self.fallback.beam_size == 1
    }

    fn decode_options_record(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        let mut record = std::collections::BTreeMap::new();
        if let Some(language) = self.rules.language() {
            record.insert("language".into(), language.into());
        }
        if let Some(task) = self.task {
            record.insert("task".into(), task.name().into());
        }
        if self.fallback.temperatures.len() == 1 {
            record.insert("fallback".into(), false.into());
        }
        if self.fallback.beam_size > 1 {
            record.insert("beam_size".into(), self.fallback.beam_size.into());
        }
        if let Some(padding) = self.padding {
            record.insert("padding".into(), padding.name().into());
        }
        record
    }

    fn text(&self, tokens: &[u32]) -> Result<String> {
        self.tokenizer.decode(tokens)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The registry's loader. Whisper's search (greedy or beam search, with the temperature fallback)
/// takes a language, a task and a beam size, and none of the rescoring options.
pub(crate) fn load(ckpt: &Checkpoint, options: &DecodeOptions) -> Result<Box<dyn SpeechModel>> {
    Ok(Box::new(WhisperAsr::with_options(ckpt, options)?))
}
