//! WeNet's searches over the CTC log-posteriors: greedy, prefix beam search, and attention
//! rescoring of the beam's candidates by the decoders.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::models::speech::DecodeOptions;

/// The rescoring weights and beam of WeNet's runtime (`decoder_main`): `ctc_weight` 0.5,
/// `reverse_weight` 0, beam 10.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RescoringOptions {
    /// The weight of a candidate's CTC score added to its decoder score.
    pub ctc_weight: f64,
    /// The weight of the right-to-left decoder's score against the left-to-right one's.
    pub reverse_weight: f64,
    /// Candidates the CTC prefix beam search keeps.
    pub beam_size: usize,
}

impl RescoringOptions {
    /// WeNet's defaults overridden by the options given; refuses by name a weight that is not
    /// finite or out of range, a beam of 0, and a reverse weight for a model without a right
    /// decoder (it would weigh a score nobody computes).
    pub fn resolve(given: &DecodeOptions, right_decoder: bool) -> Result<Self> {
        if given.no_fallback {
            return Err(Error::option(
                "--no-fallback",
                "applies to Whisper's temperature fallback; a CTC model's search has none",
            ));
        }
        if given.padding.is_some() {
            return Err(Error::option(
                "--padding",
                "applies to Whisper's 30 s window; a Conformer encodes the clip as it is",
            ));
        }
        if given.language.is_some() || given.task.is_some() {
            let option = if given.language.is_some() {
                "--language"
            } else {
                "--task"
            };
            return Err(Error::option(
                option,
                "applies to Whisper's multilingual models; a CTC model decodes the one language \
                 it was trained on",
            ));
        }
        let mut o = RescoringOptions::default();
        if let Some(w) = given.ctc_weight {
            if !(w.is_finite() && w >= 0.0) {
                return Err(Error::option(
                    "--ctc-weight",
                    format!("{w} is not a finite weight >= 0"),
                ));
            }
            o.ctc_weight = w;
        }
        if let Some(w) = given.reverse_weight {
            if !(0.0..=1.0).contains(&w) {
                return Err(Error::option(
                    "--reverse-weight",
                    format!("{w} is not a weight in [0, 1]"),
                ));
            }
            if w > 0.0 && !right_decoder {
                return Err(Error::option(
                    "--reverse-weight",
                    "this model has no right-to-left decoder to weigh",
                ));
            }
            o.reverse_weight = w;
        }
        if let Some(b) = given.beam_size {
            if b == 0 {
                return Err(Error::option(
                    "--beam-size",
                    "0 keeps no candidate; give at least 1",
                ));
            }
            o.beam_size = b;
        }
        Ok(o)
    }
}

impl Default for RescoringOptions {
    fn default() -> Self {
        RescoringOptions {
            ctc_weight: 0.5,
            reverse_weight: 0.0,
            beam_size: 10,
        }
    }
}

/// CTC greedy search: the best unit of each frame, repeats collapsed, blanks removed.
pub fn ctc_greedy(log_probs: &[Vec<f32>], blank: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut prev = None;
    for row in log_probs {
        let best = argmax(row);
        if Some(best) != prev && best != blank {
            out.push(best);
        }
        prev = Some(best);
    }
    out
}

fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
            if v > b.1 {
                (i, v)
            } else {
                b
            }
        })
        .0 as u32
}

/// `log(Σ exp(x))`, exactly as WeNet's `log_add` (−∞ when every term is −∞).
fn log_add(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + xs.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// CTC prefix beam search as WeNet's `ctc_prefix_beam_search`: at each frame the `beam` best
/// units extend the `beam` best prefixes, a prefix's probability split into ending in blank and
/// not. Returns the candidates, best first, with their CTC log-probabilities. Ties keep WeNet's
/// order (a stable sort over prefixes in the order they were first reached).
pub fn ctc_prefix_beam_search(
    log_probs: &[Vec<f32>],
    beam: usize,
    blank: u32,
) -> Vec<(Vec<u32>, f64)> {
    let beam = beam.max(1);
    let mut current: Vec<(Vec<u32>, (f64, f64))> = vec![(Vec::new(), (0.0, f64::NEG_INFINITY))];
    for row in log_probs {
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        // torch.topk: the largest first (ties by index).
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        order.truncate(beam);
        let mut next: Vec<(Vec<u32>, (f64, f64))> = Vec::new();
        let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut slot = |next: &mut Vec<(Vec<u32>, (f64, f64))>, prefix: Vec<u32>| -> usize {
            *index.entry(prefix.clone()).or_insert_with(|| {
                next.push((prefix, (f64::NEG_INFINITY, f64::NEG_INFINITY)));
                next.len() - 1
            })
        };
        for &s in &order {
            let ps = f64::from(row[s as usize]);
            for (prefix, (pb, pnb)) in &current {
                let last = prefix.last().copied();
                if s == blank {
                    let i = slot(&mut next, prefix.clone());
                    let (n_pb, n_pnb) = next[i].1;
                    next[i].1 = (log_add(&[n_pb, pb + ps, pnb + ps]), n_pnb);
                } else if Some(s) == last {
                    let i = slot(&mut next, prefix.clone());
                    let (n_pb, n_pnb) = next[i].1;
                    next[i].1 = (n_pb, log_add(&[n_pnb, pnb + ps]));
                    let mut extended = prefix.clone();
                    extended.push(s);
                    let i = slot(&mut next, extended);
                    let (n_pb, n_pnb) = next[i].1;
                    next[i].1 = (n_pb, log_add(&[n_pnb, pb + ps]));
                } else {
                    let mut extended = prefix.clone();
                    extended.push(s);
                    let i = slot(&mut next, extended);
                    let (n_pb, n_pnb) = next[i].1;
                    next[i].1 = (n_pb, log_add(&[n_pnb, pb + ps, pnb + ps]));
                }
            }
        }
        next.sort_by(|a, b| log_add(&[b.1 .0, b.1 .1]).total_cmp(&log_add(&[a.1 .0, a.1 .1])));
        next.truncate(beam);
        current = next;
    }
    current
        .into_iter()
        .map(|(prefix, (pb, pnb))| (prefix, log_add(&[pb, pnb])))
        .collect()
}

/// The CTC log-likelihood of `tokens`: the log of the summed probability of every alignment
/// that collapses to them (the forward algorithm over the tokens interleaved with blanks). The
/// prefix beam search's score of a candidate is this sum restricted to the prefixes it kept.
pub fn ctc_log_likelihood(log_probs: &[Vec<f32>], tokens: &[u32], blank: u32) -> f64 {
    if log_probs.is_empty() {
        return if tokens.is_empty() {
            0.0
        } else {
            f64::NEG_INFINITY
        };
    }
    // The extended label sequence: blank, t1, blank, t2, …, blank.
    let labels: Vec<u32> = std::iter::once(blank)
        .chain(tokens.iter().flat_map(|&t| [t, blank]))
        .collect();
    let at = |row: &[f32], s: usize| {
        row.get(labels[s] as usize)
            .map_or(f64::NEG_INFINITY, |&v| f64::from(v))
    };
    let mut alpha = vec![f64::NEG_INFINITY; labels.len()];
    for (t, row) in log_probs.iter().enumerate() {
        let mut next = vec![f64::NEG_INFINITY; labels.len()];
        for s in 0..labels.len() {
            let reach = if t == 0 {
                if s < 2 {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            } else {
                let mut from = vec![alpha[s]];
                if s >= 1 {
                    from.push(alpha[s - 1]);
                }
                // A label may skip the blank before it unless it repeats the label two back.
                if s >= 2 && labels[s] != blank && labels[s] != labels[s - 2] {
                    from.push(alpha[s - 2]);
                }
                log_add(&from)
            };
            next[s] = reach + at(row, s);
        }
        alpha = next;
    }
    log_add(&alpha[labels.len().saturating_sub(2)..])
}

/// A candidate's decoder score as WeNet's attention rescoring computes it: the sum of the
/// log-probabilities of its tokens and of end-of-sentence, from rows `[len + 1, vocab]` of a
/// decoder fed `sos` and the tokens (for the right decoder, the tokens reversed).
pub fn decoder_score(rows: &[Vec<f32>], tokens: &[u32], eos: u32) -> f64 {
    let mut score: f64 = tokens
        .iter()
        .zip(rows)
        .map(|(&w, row)| f64::from(row.get(w as usize).copied().unwrap_or(f32::NEG_INFINITY)))
        .sum();
    score += rows
        .get(tokens.len())
        .and_then(|r| r.get(eos as usize))
        .map_or(f64::NEG_INFINITY, |&v| f64::from(v));
    score
}

/// The rescored total of one candidate: `left · (1 − reverse_weight) + right · reverse_weight
/// + ctc · ctc_weight`.
pub fn rescored(left: f64, right: Option<f64>, ctc: f64, options: &RescoringOptions) -> f64 {
    let decoder = match right {
        Some(r) => left * (1.0 - options.reverse_weight) + r * options.reverse_weight,
        None => left,
    };
    decoder + ctc * options.ctc_weight
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_beam_search_merges_paths_of_one_prefix() {
        // Two frames over {blank, a}: "a" is reached by a·a, a·-, -·a; its probability is their sum.
        let p = [0.4f64, 0.6];
        let rows: Vec<Vec<f32>> = (0..2)
            .map(|_| p.iter().map(|v| v.ln() as f32).collect())
            .collect();
        let hyps = ctc_prefix_beam_search(&rows, 4, 0);
        let a = hyps.iter().find(|(h, _)| h == &[1]).unwrap().1.exp();
        assert!(
            (a - (0.6 * 0.6 + 0.6 * 0.4 + 0.4 * 0.6)).abs() < 1e-6,
            "{a}"
        );
        let empty = hyps.iter().find(|(h, _)| h.is_empty()).unwrap().1.exp();
        assert!((empty - 0.16).abs() < 1e-6);
        assert_eq!(hyps[0].0, vec![1]);
        assert_eq!(ctc_greedy(&rows, 0), vec![1]);
    }

    /// Every alignment of `frames` frames over `vocab` units, enumerated: the definition the
    /// forward algorithm must match.
    fn brute_force(rows: &[Vec<f32>], tokens: &[u32], blank: u32) -> f64 {
        let (frames, vocab) = (rows.len(), rows[0].len());
        let mut total = 0.0f64;
        for mut code in 0..vocab.pow(frames as u32) {
            let mut path = Vec::new();
            for _ in 0..frames {
                path.push((code % vocab) as u32);
                code /= vocab;
            }
            let mut collapsed = Vec::new();
            let mut prev = None;
            for &p in &path {
                if Some(p) != prev && p != blank {
                    collapsed.push(p);
                }
                prev = Some(p);
            }
            if collapsed == tokens {
                total += path
                    .iter()
                    .zip(rows)
                    .map(|(&p, r)| f64::from(r[p as usize]))
                    .sum::<f64>()
                    .exp();
            }
        }
        total.ln()
    }

    #[test]
    fn ctc_likelihood_sums_every_alignment() {
        // Six frames over {blank, a, b}, uneven posteriors (log-softmax of fixed logits).
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|t| {
                let logits = [
                    0.3 * t as f64,
                    1.0 - 0.2 * t as f64,
                    0.5 + 0.1 * (t % 3) as f64,
                ];
                let z = logits.iter().map(|v| v.exp()).sum::<f64>().ln();
                logits.iter().map(|v| (v - z) as f32).collect()
            })
            .collect();
        for tokens in [
            &[][..],
            &[1],
            &[1, 1],
            &[1, 2, 1],
            &[2, 2, 2],
            &[1, 2, 1, 2, 1, 2],
        ] {
            let (fast, slow) = (
                ctc_log_likelihood(&rows, tokens, 0),
                brute_force(&rows, tokens, 0),
            );
            assert!((fast - slow).abs() < 1e-5, "{tokens:?}: {fast} vs {slow}");
        }
        // Seven labels need more than six frames.
        assert_eq!(
            ctc_log_likelihood(&rows, &[1, 1, 1, 1], 0),
            f64::NEG_INFINITY
        );
        // With a beam as wide as every prefix, the beam's score is the full sum.
        let beam = ctc_prefix_beam_search(&rows, 1000, 0);
        for (prefix, score) in beam.iter().take(5) {
            assert!((score - ctc_log_likelihood(&rows, prefix, 0)).abs() < 1e-5);
        }
    }

    #[test]
    fn options_resolve_with_wenet_defaults_and_refuse_by_name() {
        let d = RescoringOptions::resolve(&DecodeOptions::default(), false).unwrap();
        assert_eq!(d, RescoringOptions::default());
        let given = DecodeOptions {
            ctc_weight: Some(0.3),
            reverse_weight: Some(0.5),
            beam_size: Some(4),
            ..DecodeOptions::default()
        };
        let o = RescoringOptions::resolve(&given, true).unwrap();
        assert_eq!((o.ctc_weight, o.reverse_weight, o.beam_size), (0.3, 0.5, 4));
        let refused = |given: DecodeOptions, right: bool| {
            RescoringOptions::resolve(&given, right)
                .unwrap_err()
                .to_string()
        };
        let no_right = refused(given.clone(), false);
        assert!(no_right.contains("--reverse-weight") && no_right.contains("right-to-left"));
        let whisper_only = DecodeOptions {
            language: Some("de".into()),
            ..DecodeOptions::default()
        };
        assert!(refused(whisper_only, true).contains("--language"));
        let whisper_only = DecodeOptions {
            no_fallback: true,
            ..DecodeOptions::default()
        };
        assert!(refused(whisper_only, true).contains("--no-fallback"));
        let whisper_only = DecodeOptions {
            padding: Some(crate::models::LogMelPadding::FeatureExtractor),
            ..DecodeOptions::default()
        };
        assert!(refused(whisper_only, true).contains("--padding"));
        let bad = DecodeOptions {
            ctc_weight: Some(f64::NAN),
            ..DecodeOptions::default()
        };
        assert!(refused(bad, true).contains("--ctc-weight"));
        let bad = DecodeOptions {
            reverse_weight: Some(1.5),
            ..DecodeOptions::default()
        };
        assert!(refused(bad, true).contains("--reverse-weight"));
        let bad = DecodeOptions {
            beam_size: Some(0),
            ..DecodeOptions::default()
        };
        assert!(refused(bad, true).contains("--beam-size"));
    }

    #[test]
    fn rescoring_weights_follow_wenet() {
        let o = RescoringOptions {
            ctc_weight: 0.5,
            reverse_weight: 0.3,
            beam_size: 10,
        };
        assert!((rescored(-10.0, Some(-20.0), -4.0, &o) - (-7.0 - 6.0 - 2.0)).abs() < 1e-12);
        assert_eq!(rescored(-10.0, None, -4.0, &o), -12.0);
    }
}
