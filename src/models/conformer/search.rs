//! WeNet's searches over the CTC log-posteriors: greedy, prefix beam search, and attention
//! rescoring of the beam's candidates by the decoders.

use std::collections::HashMap;

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
