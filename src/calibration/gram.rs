//! The second moments of GEMM inputs (Σ x xᵀ per layer), which GPTQ weighs rounding errors by.

use std::collections::{BTreeMap, BTreeSet};

use super::Observer;
use crate::models::exec::strided_gemm;

/// Σ x xᵀ and the number of rows of every observed layer. The matrix is symmetric, so only its
/// upper triangle is kept (row by row, `cols·(cols+1)/2` f32), which halves what every utterance
/// in flight holds; [`GramObserver::take`] gives back the whole `[cols, cols]` matrix.
///
/// Layers that read one input (q, k and v; the cross-attention keys and values of every decoder
/// layer) are shown it one after another; the product of the last input is kept and reused when
/// the next layer's input is the same bits.
#[derive(Clone, Debug, Default)]
pub struct GramObserver {
    layers: BTreeSet<String>,
    /// Per layer: its input width and the packed upper triangle.
    grams: BTreeMap<String, (usize, Vec<f32>)>,
    rows: BTreeMap<String, usize>,
    last_input: Vec<f32>,
    last_product: Vec<f32>,
}

impl GramObserver {
    /// An observer of these layers' inputs.
    pub fn new(layers: impl IntoIterator<Item = String>) -> Self {
        GramObserver {
            layers: layers.into_iter().collect(),
            ..Default::default()
        }
    }

    /// Scales channel i of a layer's input by `inv[i]`, as a runtime smoother does: entry (i, j)
    /// of Σ x xᵀ by `inv[i] · inv[j]`.
    pub fn scale_channels(&mut self, layer: &str, inv: &[f32]) {
        if let Some((cols, packed)) = self.grams.get_mut(layer) {
            if *cols != inv.len() {
                return;
            }
            let mut at = 0;
            for i in 0..*cols {
                for (v, &inv_j) in packed[at..at + *cols - i].iter_mut().zip(&inv[i..]) {
                    *v *= inv[i] * inv_j;
                }
                at += *cols - i;
            }
        }
    }

    /// Removes a layer's Σ x xᵀ (`[cols, cols]`, row-major, both triangles) and its row count.
    pub fn take(&mut self, layer: &str) -> Option<(Vec<f32>, usize)> {
        let (cols, packed) = self.grams.remove(layer)?;
        let mut full = vec![0f32; cols * cols];
        let mut at = 0;
        for i in 0..cols {
            for j in i..cols {
                full[i * cols + j] = packed[at];
                full[j * cols + i] = packed[at];
                at += 1;
            }
        }
        Some((full, self.rows.get(layer).copied().unwrap_or(0)))
    }
}

impl Observer for GramObserver {
    fn wants(&self, layer: &str) -> bool {
        self.layers.contains(layer)
    }

    fn observe(&mut self, layer: &str, x: &[f32], cols: usize) {
        if cols == 0 {
            return;
        }
        let rows = x.len() / cols;
        let same = self.last_product.len() == cols * cols
            && self.last_input.len() == x.len()
            && self
                .last_input
                .iter()
                .zip(x)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            self.last_product.resize(cols * cols, 0.0);
            // Split across the pool only when fewer utterances than threads are in flight (a
            // large model calibrated on a few utterances); the sums are the same either way.
            let parallelism = if crate::parallel::inner_parallelism() {
                gemm::Parallelism::Rayon(rayon::current_num_threads())
            } else {
                gemm::Parallelism::None
            };
            // SAFETY: xᵀ is [cols, rows] with row stride 1 and column stride cols over x's
            // rows·cols elements, x is [rows, cols] row-major, and the product is [cols, cols].
            unsafe {
                strided_gemm(
                    cols,
                    cols,
                    rows,
                    self.last_product.as_mut_ptr(),
                    cols,
                    x.as_ptr(),
                    1,
                    cols,
                    x.as_ptr(),
                    cols,
                    1,
                    1.0,
                    parallelism,
                );
            }
            self.last_input.clear();
            self.last_input.extend_from_slice(x);
        }
        let (_, packed) = self
            .grams
            .entry(layer.to_string())
            .or_insert_with(|| (cols, vec![0.0; cols * (cols + 1) / 2]));
        let mut at = 0;
        for (i, row) in self.last_product.chunks(cols).enumerate() {
            for (a, b) in packed[at..at + cols - i].iter_mut().zip(&row[i..]) {
                *a += b;
            }
            at += cols - i;
        }
        *self.rows.entry(layer.to_string()).or_default() += rows;
    }

    fn merge(&mut self, other: Self) {
        for (layer, g) in other.grams {
            match self.grams.get_mut(&layer) {
                Some((_, mine)) => mine.iter_mut().zip(&g.1).for_each(|(a, b)| *a += b),
                None => {
                    self.grams.insert(layer, g);
                }
            }
        }
        for (layer, n) in other.rows {
            *self.rows.entry(layer).or_default() += n;
        }
    }
}

/// Bytes of one observer's Σ x xᵀ over layers of these input widths (f32, one upper triangle per
/// layer).
pub fn gram_bytes(in_features: impl IntoIterator<Item = usize>) -> u64 {
    in_features
        .into_iter()
        .map(|k| (k * (k + 1) / 2 * 4) as u64)
        .sum()
}

/// How many utterances the GPTQ pass may observe at once. Every utterance in flight holds a whole
/// observer of `per_copy` bytes, the merged one another, and one that finished ahead of its turn
/// waits beside them; so the pass takes at most `threads` workers and as many as fit, with the
/// same slack, in three quarters of `available` memory (None: unknown, no bound). At large-v3
/// size one observer is about 3 GB, so the bound is what keeps such a run inside the machine.
/// `None` when not even one worker fits: the caller refuses the run.
pub fn gram_workers(per_copy: u64, threads: usize, available: Option<u64>) -> Option<usize> {
    let Some(available) = available else {
        return Some(threads.max(1));
    };
    // The merged copy, then two per worker (its own and one pending).
    let copies = (available / 4 * 3) / per_copy.max(1);
    let workers = copies.saturating_sub(1) / 2;
    (workers >= 1).then(|| (workers as usize).min(threads.max(1)))
}

/// The memory the process can still take without swapping, if known: Linux's `MemAvailable`,
/// and within a container no more than its cgroup's `memory.max` less `memory.current`
/// (`/proc/meminfo` shows the host's memory there).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    Some(cgroup.map_or(kib * 1024, |c| c.min(kib * 1024)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gram_pass_takes_as_many_workers_as_fit() {
        let gib = 1u64 << 30;
        // tiny.en: 0.1 GB per copy; every thread fits.
        assert_eq!(gram_workers(gib / 10, 16, Some(20 * gib)), Some(16));
        // large-v3 (10 GiB per copy): 96 GiB of 128 fit 9 copies, the merged one and 4 workers.
        assert_eq!(gram_workers(10 * gib, 16, Some(128 * gib)), Some(4));
        // Not even the merged copy, one worker and one pending fit: refused.
        assert_eq!(gram_workers(10 * gib, 2, Some(24 * gib)), None);
        assert_eq!(gram_workers(10 * gib, 2, None), Some(2));
        assert_eq!(
            gram_bytes([384, 1536]),
            (384 * 385 / 2 + 1536 * 1537 / 2) * 4
        );
    }

    #[test]
    fn available_memory_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(available_memory().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn the_gram_is_the_same_bits_split_across_the_pool_or_not() {
        let (rows, cols) = (600, 700);
        let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.013).sin()).collect();
        let gram = |alone: bool| {
            let mut o = GramObserver::new(["l".to_string()]);
            let side_by_side = if alone { usize::MAX } else { 1 };
            crate::parallel::one_utterance(side_by_side, || o.observe("l", &x, cols));
            o.take("l")
                .map(|(g, _)| g.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        assert_eq!(gram(true), gram(false));
    }

    #[test]
    fn gram_is_the_sum_of_outer_products_and_reuse_changes_nothing() {
        let cols = 5;
        let x: Vec<f32> = (0..3 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut o = GramObserver::new(["a".to_string(), "b".to_string()]);
        o.observe("a", &x, cols);
        o.observe("b", &x, cols); // the same input: the kept product
        o.observe("a", &x[..cols], cols);
        let inv: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32).collect();
        let mut scaled = o.clone();
        scaled.scale_channels("b", &inv);
        let (a, rows_a) = o.take("a").unwrap();
        let (b, rows_b) = o.take("b").unwrap();
        let (sb, _) = scaled.take("b").unwrap();
        for i in 0..cols {
            for j in 0..cols {
                let full: f32 = x.chunks(cols).map(|r| r[i] * r[j]).sum();
                let (a, b, sb) = (a[i * cols + j], b[i * cols + j], sb[i * cols + j]);
                assert!((b - full).abs() < 1e-5, "{b} {full}");
                assert!((a - full - x[i] * x[j]).abs() < 1e-5, "{a}");
                assert!((sb - full * inv[i] * inv[j]).abs() < 1e-4, "{sb}");
            }
        }
        assert_eq!((rows_a, rows_b), (4, 3));
        assert!(o.take("a").is_none());
        assert!(!o.wants("c"));
    }
}
