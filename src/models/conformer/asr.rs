//! The Conformer behind the model seam: Kaldi fbank and the global CMVN, the encoder, CTC prefix
//! beam search, and attention rescoring of its candidates by the decoders (WeNet's runtime
//! defaults, [`RescoringOptions`]).

use std::any::Any;
use std::collections::BTreeMap;

use candle_core::Tensor;

use super::search::{
    ctc_log_likelihood, ctc_prefix_beam_search, decoder_score, rescored, RescoringOptions,
};
use super::{Conformer, UNITS};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::frontend::{Frontend, GlobalCmvn, KaldiFbank};
use crate::models::exec::LinearExec;
use crate::models::speech::{DecodeOptions, Decoding, SpeechModel};

/// A U2++ Conformer with its units, frontend and decoding options.
pub struct ConformerAsr {
    pub model: Conformer,
    pub units: Vec<String>,
    pub frontend: KaldiFbank,
    pub cmvn: Option<GlobalCmvn>,
    pub blank: u32,
    pub sos: u32,
    pub eos: u32,
    pub options: RescoringOptions,
}

impl ConformerAsr {
    /// Builds the model from a full-precision Conformer checkpoint (any supported format), with
    /// WeNet's default rescoring.
    pub fn new(ckpt: &Checkpoint) -> Result<Self> {
        Self::with_options(ckpt, &DecodeOptions::default())
    }

    /// [`Self::new`] with the rescoring options given (see [`RescoringOptions::resolve`]).
    pub fn with_options(ckpt: &Checkpoint, given: &DecodeOptions) -> Result<Self> {
        let model = Conformer::load(ckpt)?;
        let options = RescoringOptions::resolve(given, model.decoder_count() > 1)?;
        let features = ckpt.config.features.as_ref().ok_or_else(|| {
            Error::corrupt(&ckpt.dir, "a Conformer checkpoint must name its `features`")
        })?;
        let frontend = match Frontend::from_spec(features)? {
            Frontend::KaldiFbank(f) => f,
            _ => {
                return Err(Error::corrupt(
                    &ckpt.dir,
                    format!(
                        "`features.kind` is {:?}; the Conformer's encoder takes kaldi_fbank",
                        features.kind
                    ),
                ))
            }
        };
        let cmvn = match &features.normalize {
            None => None,
            Some(n) => {
                let stat = |key: &str| -> Result<Vec<f32>> {
                    n.get(key)
                        .and_then(|v| v.as_array())
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_f64())
                                .map(|v| v as f32)
                                .collect()
                        })
                        .ok_or_else(|| {
                            Error::corrupt(
                                &ckpt.dir,
                                format!("`features.normalize.{key}` is not a list of numbers"),
                            )
                        })
                };
                Some(GlobalCmvn::from_mean_istd(stat("mean")?, stat("istd")?)?)
            }
        };
        let units_path = ckpt
            .tokenizer_files
            .get("units")
            .ok_or_else(|| Error::corrupt(&ckpt.dir, format!("no {UNITS}")))?;
        let units = super::import::Units::read(units_path)?.tokens;
        let d = &ckpt.config.decoding;
        let id = |v: Option<u32>, key: &str| {
            v.ok_or_else(|| Error::corrupt(&ckpt.dir, format!("`decoding.{key}` is missing")))
        };
        Ok(ConformerAsr {
            model,
            units,
            frontend,
            cmvn,
            blank: id(d.blank_id, "blank_id")?,
            sos: id(d.sos_id, "sos_id")?,
            eos: id(d.eos_id, "eos_id")?,
            options,
        })
    }

    /// The left and (when the model has one) right decoder's scores of a candidate. Both
    /// decoders run even at `reverse_weight` 0, as WeNet's attention rescoring does.
    fn decoder_scores(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        tokens: &[u32],
    ) -> Result<(f64, Option<f64>)> {
        let rows = self
            .model
            .decoder_log_probs(exec, 0, encoded, self.sos, tokens)?;
        let left = decoder_score(&rows, tokens, self.eos);
        let right = if self.model.decoder_count() > 1 {
            let reversed: Vec<u32> = tokens.iter().rev().copied().collect();
            let rows = self
                .model
                .decoder_log_probs(exec, 1, encoded, self.sos, &reversed)?;
            Some(decoder_score(&rows, &reversed, self.eos))
        } else {
            None
        };
        Ok((left, right))
    }

    /// The normalised features `[frames, input_dim]` of 16 kHz samples.
    pub fn features(&self, samples: &[f32]) -> Result<(Vec<f32>, usize)> {
        let fbank = self.frontend.compute(samples)?;
        let mut data = fbank.data;
        if let Some(cmvn) = &self.cmvn {
            cmvn.apply(&mut data)?;
        }
        Ok((data, fbank.frames))
    }
}

impl SpeechModel for ConformerAsr {
    fn architecture(&self) -> &'static str {
        super::NAME
    }

    fn sample_rate(&self) -> u32 {
        16_000
    }

    /// The encoder needs at least one frame after the 4x subsampling (7 fbank frames, 0.085 s).
    fn check_length(&self, what: &str, samples: usize) -> Result<()> {
        let frames = crate::frontend::kaldi_fbank::num_frames(samples);
        if frames < 7 {
            return Err(Error::Model {
                what: what.to_string(),
                message: format!(
                    "{samples} samples give {frames} fbank frames; the Conformer's subsampling needs at least 7"
                ),
            });
        }
        Ok(())
    }

    fn encode(&self, exec: &mut dyn LinearExec, samples: &[f32]) -> Result<Tensor> {
        let (features, frames) = self.features(samples)?;
        self.model.encode(exec, &features, frames)
    }

    /// CTC prefix beam search, then attention rescoring of every candidate by the decoders (so
    /// calibration observes the decoders on what they serve). The score rows are the CTC
    /// frames' log-posteriors.
    fn decode(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        _samples: usize,
        keep_scores: bool,
    ) -> Result<Decoding> {
        let log_probs = self.model.ctc_log_probs(exec, encoded)?;
        let candidates = ctc_prefix_beam_search(&log_probs, self.options.beam_size, self.blank);
        let mut best: Option<(f64, Vec<u32>)> = None;
        for (tokens, ctc) in candidates {
            let (left, right) = self.decoder_scores(exec, encoded, &tokens)?;
            let score = rescored(left, right, ctc, &self.options);
            if best.as_ref().is_none_or(|(b, _)| score > *b) {
                best = Some((score, tokens));
            }
        }
        Ok(Decoding {
            tokens: best.map(|b| b.1).unwrap_or_default(),
            scores: if keep_scores { log_probs } else { Vec::new() },
            temperature: 0.0,
            attempts: 1,
            hit_limit: false,
            language: None,
        })
    }

    /// The CTC frames' log-posteriors (they do not depend on the hypothesis). Calibration never
    /// scores a Conformer's transcript ([`SpeechModel::score_replays_decode`]), so the decoders
    /// need not run here.
    fn score(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        _tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        self.model.ctc_log_probs(exec, encoded)
    }

    /// The decoders scored every candidate of the beam, not only the kept one.
    fn score_replays_decode(&self) -> bool {
        false
    }

    /// The rescoring of `tokens`: the CTC log-likelihood (every alignment, not only the beam's),
    /// each decoder's score and the rescored total.
    fn hypothesis_scores(
        &self,
        exec: &mut dyn LinearExec,
        encoded: &Tensor,
        tokens: &[u32],
    ) -> Result<Vec<(&'static str, f64)>> {
        let log_probs = self.model.ctc_log_probs(exec, encoded)?;
        let ctc = ctc_log_likelihood(&log_probs, tokens, self.blank);
        let (left, right) = self.decoder_scores(exec, encoded, tokens)?;
        let mut scores = vec![("ctc", ctc), ("left_decoder", left)];
        if let Some(r) = right {
            scores.push(("right_decoder", r));
        }
        scores.push(("rescored", rescored(left, right, ctc, &self.options)));
        Ok(scores)
    }

    fn decode_options_record(&self) -> BTreeMap<String, serde_json::Value> {
        let o = &self.options;
        BTreeMap::from([
            ("ctc_weight".to_string(), o.ctc_weight.into()),
            ("reverse_weight".to_string(), o.reverse_weight.into()),
            ("beam_size".to_string(), o.beam_size.into()),
        ])
    }

    /// The units joined; WeNet's word-piece marker `▁` becomes a space.
    fn text(&self, tokens: &[u32]) -> Result<String> {
        let mut text = String::new();
        for &t in tokens {
            let unit = self.units.get(t as usize).ok_or_else(|| Error::Model {
                what: "units".into(),
                message: format!("token {t} is outside the {} units", self.units.len()),
            })?;
            text.push_str(unit);
        }
        Ok(text.replace('▁', " ").trim().to_string())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The registry's loader.
pub(crate) fn load(ckpt: &Checkpoint, options: &DecodeOptions) -> Result<Box<dyn SpeechModel>> {
    Ok(Box::new(ConformerAsr::with_options(ckpt, options)?))
}
