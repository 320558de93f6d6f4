//! A sample of GEMM input rows, kept whole: what a rule needs to measure a quantized layer's
//! output error on calibration audio (SmoothQuant's per-group search), not only its statistics.

use std::collections::{BTreeMap, BTreeSet};

use super::Observer;
use crate::rng::SplitMix64;

/// Up to `per_utterance` rows of each observed layer's input per utterance, chosen uniformly
/// (reservoir sampling, seeded per layer) from every row the utterance showed it. A fresh
/// observer per utterance, merged in utterance order, gives the same rows whatever the thread
/// count.
#[derive(Clone, Debug, Default)]
pub struct RowSampleObserver {
    layers: BTreeSet<String>,
    per_utterance: usize,
    /// Per layer: its input width and the kept rows (row-major).
    kept: BTreeMap<String, LayerRows>,
}

#[derive(Clone, Debug)]
struct LayerRows {
    cols: usize,
    rows: Vec<f32>,
    /// Rows this utterance showed the layer so far (the reservoir's denominator).
    seen: u64,
    rng: SplitMix64,
}

impl RowSampleObserver {
    /// An observer that keeps up to `per_utterance` input rows of each of these layers.
    pub fn new(layers: impl IntoIterator<Item = String>, per_utterance: usize) -> Self {
        RowSampleObserver {
            layers: layers.into_iter().collect(),
            per_utterance,
            kept: BTreeMap::new(),
        }
    }

    /// A layer's kept rows (row-major `[n, cols]`) and its width, if it was observed.
    pub fn rows(&self, layer: &str) -> Option<(&[f32], usize)> {
        self.kept.get(layer).map(|l| (l.rows.as_slice(), l.cols))
    }
}

/// The layer's name hashed (FNV-1a): the seed of its reservoir, so each layer draws its own rows.
fn seed(layer: &str) -> u64 {
    layer.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Observer for RowSampleObserver {
    fn wants(&self, layer: &str) -> bool {
        self.per_utterance > 0 && self.layers.contains(layer)
    }

    fn observe(&mut self, layer: &str, x: &[f32], cols: usize) {
        if cols == 0 {
            return;
        }
        let per_utterance = self.per_utterance;
        let l = self
            .kept
            .entry(layer.to_string())
            .or_insert_with(|| LayerRows {
                cols,
                rows: Vec::with_capacity(per_utterance * cols),
                seen: 0,
                rng: SplitMix64(seed(layer)),
            });
        if l.cols != cols {
            return;
        }
        for row in x.chunks_exact(cols) {
            l.seen += 1;
            let held = l.rows.len() / cols;
            if held < per_utterance {
                l.rows.extend_from_slice(row);
            } else {
                // Algorithm R: the row replaces a kept one with probability per_utterance / seen.
                let j = (l.rng.next_u64() % l.seen) as usize;
                if j < per_utterance {
                    l.rows[j * cols..(j + 1) * cols].copy_from_slice(row);
                }
            }
        }
    }

    fn merge(&mut self, other: Self) {
        for (layer, theirs) in other.kept {
            match self.kept.get_mut(&layer) {
                Some(mine) if mine.cols == theirs.cols => mine.rows.extend(theirs.rows),
                Some(_) => {}
                None => {
                    self.kept.insert(layer, theirs);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utterance(o: &mut RowSampleObserver, first: f32, rows: usize) {
        let x: Vec<f32> = (0..rows * 2).map(|i| first + i as f32).collect();
        o.observe("a", &x, 2);
    }

    #[test]
    fn keeps_at_most_its_rows_per_utterance_and_merges_in_order() {
        let layers = ["a".to_string()];
        let mut merged = RowSampleObserver::new(layers.clone(), 3);
        let mut u1 = RowSampleObserver::new(layers.clone(), 3);
        utterance(&mut u1, 0.0, 2);
        let mut u2 = RowSampleObserver::new(layers.clone(), 3);
        utterance(&mut u2, 1000.0, 50);
        merged.merge(u1);
        merged.merge(u2.clone());
        let (rows, cols) = merged.rows("a").expect("observed");
        assert_eq!(cols, 2);
        assert_eq!(
            rows.len(),
            (2 + 3) * 2,
            "two rows of the short utterance, three of the long"
        );
        assert_eq!(&rows[..4], &[0.0, 1.0, 2.0, 3.0]);
        // The long utterance's kept rows are whole rows of it, not all its first three.
        let kept = &rows[4..];
        for r in kept.chunks_exact(2) {
            assert!(r[0] >= 1000.0 && r[0] % 2.0 == 0.0 && r[1] == r[0] + 1.0);
        }
        assert_ne!(kept, &[1000.0, 1001.0, 1002.0, 1003.0, 1004.0, 1005.0]);
        // Seeded: the same rows each time.
        let mut again = RowSampleObserver::new(layers.clone(), 3);
        utterance(&mut again, 1000.0, 50);
        assert_eq!(again.rows("a"), u2.rows("a"));
        assert!(!RowSampleObserver::new(layers, 0).wants("a"));
    }
}
