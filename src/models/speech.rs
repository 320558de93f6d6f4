//! The model seam that the calibration loop, `transcribe`, `verify` and `gate` drive: an
//! architecture's frontend and encoder, its own search with its safeguards, and the scores it
//! gives a given hypothesis. Every GEMM runs through the caller's [`LinearExec`], so the same
//! calls serve calibration (observed), transcription (full precision) and verification (the
//! quantized numerics).

use std::any::Any;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::exec::LinearExec;
use crate::error::{Error, Result};
use crate::frontend::read_audio;
use crate::manifest::Utterance;

/// What a model that can translate is asked to do: write down the speech in its language, or
/// translate it into English (Whisper's multilingual models).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    Transcribe,
    Translate,
}

impl Task {
    /// The name of the task token, `<|transcribe|>` or `<|translate|>` without its brackets.
    pub fn name(self) -> &'static str {
        match self {
            Task::Transcribe => "transcribe",
            Task::Translate => "translate",
        }
    }
}

impl std::str::FromStr for Task {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "transcribe" => Ok(Task::Transcribe),
            "translate" => Ok(Task::Translate),
            other => Err(format!(
                "{other:?} is not a task; use transcribe or translate"
            )),
        }
    }
}

/// How Whisper brings a clip shorter than 30 s to its encoder's window (`--padding`). The two
/// serving stacks differ, and a short clip decodes differently under each: the padded frames are
/// most of the encoder's input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogMelPadding {
    /// openai-whisper's `transcribe()`, faster-whisper and CTranslate2: the clip's log-mel, then
    /// zeros ([`crate::frontend::Padding::Transcribe`]).
    #[default]
    Transcribe,
    /// Hugging Face's `WhisperFeatureExtractor` (transformers, vLLM): the audio zero-padded to
    /// 30 s, then its log-mel ([`crate::frontend::Padding::PadOrTrimAudio`]).
    FeatureExtractor,
}

impl LogMelPadding {
    pub fn name(self) -> &'static str {
        match self {
            LogMelPadding::Transcribe => "transcribe",
            LogMelPadding::FeatureExtractor => "feature-extractor",
        }
    }
}

impl From<LogMelPadding> for crate::frontend::Padding {
    fn from(p: LogMelPadding) -> Self {
        match p {
            LogMelPadding::Transcribe => crate::frontend::Padding::Transcribe,
            LogMelPadding::FeatureExtractor => crate::frontend::Padding::PadOrTrimAudio,
        }
    }
}

impl std::str::FromStr for LogMelPadding {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "transcribe" => Ok(LogMelPadding::Transcribe),
            "feature-extractor" => Ok(LogMelPadding::FeatureExtractor),
            other => Err(format!(
                "{other:?} is not a padding; use transcribe or feature-extractor"
            )),
        }
    }
}

/// Options of a model's search, as given on the command line or in a gate entry; `None` leaves
/// the architecture's default. An architecture refuses by name an option its search does not
/// have (Whisper has no CTC weight), so a setting is never ignored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeOptions {
    /// Attention rescoring: the weight of a candidate's CTC score (`--ctc-weight`).
    pub ctc_weight: Option<f64>,
    /// Attention rescoring: the right-to-left decoder's weight against the left-to-right one's
    /// (`--reverse-weight`).
    pub reverse_weight: Option<f64>,
    /// CTC prefix beam search: the candidates kept; Whisper: the beam search's hypotheses at
    /// temperature 0 (`--beam-size`; 1 is greedy).
    pub beam_size: Option<usize>,
    /// The spoken language, as its code (`--language`; Whisper: detected when not given).
    pub language: Option<String>,
    /// Transcribe or translate (`--task`; Whisper's multilingual models).
    pub task: Option<Task>,
    /// Whisper: one greedy decoding at temperature 0, without the temperature fallback
    /// (`--no-fallback`), as transformers' `generate` and CTranslate2 decode by default.
    pub no_fallback: bool,
    /// Whisper: how a short clip is padded to 30 s (`--padding`; default: as `transcribe()`).
    pub padding: Option<LogMelPadding>,
}

impl DecodeOptions {
    /// The options that are set, by their command-line names.
    pub fn set(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.ctc_weight.is_some() {
            set.push("--ctc-weight");
        }
        if self.reverse_weight.is_some() {
            set.push("--reverse-weight");
        }
        if self.beam_size.is_some() {
            set.push("--beam-size");
        }
        if self.language.is_some() {
            set.push("--language");
        }
        if self.task.is_some() {
            set.push("--task");
        }
        if self.no_fallback {
            set.push("--no-fallback");
        }
        if self.padding.is_some() {
            set.push("--padding");
        }
        set
    }
}

/// What a model's search produced for one utterance.
#[derive(Clone, Debug, Default)]
pub struct Decoding {
    pub tokens: Vec<u32>,
    /// The score rows of the hypothesis, when asked for: one per decoder step for an
    /// encoder-decoder (the logits that chose each token, then end-of-text).
    pub scores: Vec<Vec<f32>>,
    /// The temperature of the kept decoding (0 unless a fallback retried).
    pub temperature: f32,
    /// Decodings run (1 when the first passed the model's checks).
    pub attempts: usize,
    /// The kept decoding stopped at the token limit.
    pub hit_limit: bool,
    /// The language the search decoded in, as its code (multilingual models; detected or given).
    pub language: Option<String>,
}

/// A speech recognition model, full precision or run with a verify executor.
pub trait SpeechModel: Send + Sync {
    /// The architecture's registry name.
    fn architecture(&self) -> &'static str;

    /// The sample rate the frontend takes (mono).
    fn sample_rate(&self) -> u32;

    /// Refuses by name audio of `samples` samples that the model cannot decode whole (`what`
    /// names the file). Truncating would drop speech silently.
    fn check_length(&self, what: &str, samples: usize) -> Result<()>;

    /// The frontend and the encoder: the encoder output of `samples`.
    fn encode(&self, exec: &mut dyn LinearExec, samples: &[f32]) -> Result<Tensor>;

    /// The model's own search, with its safeguards, over the encoder output of `samples`
    /// samples of audio; `keep_scores` keeps the score rows.
    fn decode(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        samples: usize,
        keep_scores: bool,
    ) -> Result<Decoding>;

    /// The score rows the model gives the hypothesis `tokens` (teacher-forced), comparable row by
    /// row with [`Decoding::scores`] of the decoding that produced `tokens`.
    fn score(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>>;

    /// Whether [`Self::score`] on a decoding's tokens shows the GEMMs the same rows that
    /// [`Self::decode`] computed (an autoregressive decoder scoring its own transcript: yes; a
    /// rescoring search, whose decoders scored every candidate: no). When not, a calibration
    /// pass that needs the decoder's inputs decodes again instead of scoring the transcript.
    fn score_replays_decode(&self) -> bool {
        true
    }

    /// Whether calibration keeps every row a decoding computed when its first attempt passed
    /// (greedy: they are the transcript's rows), or observes the kept transcript scored alone
    /// (a beam search: its discarded hypotheses are no more the audio's transcript than a
    /// fallback's discarded attempts are). A rescoring search whose scoring does not replay its
    /// decoders keeps them.
    fn calibration_keeps_the_search_rows(&self) -> bool {
        true
    }

    /// Named sequence-level scores the search gives the hypothesis `tokens` (for attention
    /// rescoring: the CTC score, each decoder's and the combined one); empty when the search
    /// ranks nothing beyond its score rows. `verify` compares them between the two models.
    fn hypothesis_scores(
        &self,
        _exec: &mut dyn LinearExec,
        _encoded: &Tensor,
        _tokens: &[u32],
    ) -> Result<Vec<(&'static str, f64)>> {
        Ok(Vec::new())
    }

    /// The effective search options, for the provenance of a calibration that decoded with
    /// them; empty when the search has none to record.
    fn decode_options_record(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        std::collections::BTreeMap::new()
    }

    /// The text of a hypothesis.
    fn text(&self, tokens: &[u32]) -> Result<String>;

    /// The architecture's own type, for analyses that need its internals (`verify --per-layer`).
    fn as_any(&self) -> &dyn Any;

    /// Reads an utterance's audio at the model's rate; errors name the utterance.
    fn read(&self, utterance: &Utterance) -> Result<Vec<f32>> {
        let in_utterance = |e: Error| Error::Utterance {
            id: utterance.id.clone(),
            error: Box::new(e),
        };
        let samples = read_audio(&utterance.audio, self.sample_rate()).map_err(in_utterance)?;
        self.check_length(&crate::error::shown(&utterance.audio), samples.len())
            .map_err(in_utterance)?;
        Ok(samples)
    }

    /// [`Self::encode`] then [`Self::decode`].
    fn transcribe(
        &self,
        exec: &mut dyn LinearExec,
        samples: &[f32],
        keep_scores: bool,
    ) -> Result<Decoding> {
        let encoded = self.encode(exec, samples)?;
        self.decode(exec, &encoded, samples.len(), keep_scores)
    }
}
