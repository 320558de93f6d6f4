//! The second moments of GEMM inputs (Σ x xᵀ per layer), which GPTQ weighs rounding errors by.

use std::collections::{BTreeMap, BTreeSet};

use super::Observer;
use crate::models::exec::strided_gemm;

/// Σ x xᵀ (`[cols, cols]` row-major, f32) and the number of rows of every observed layer.
///
/// Layers that read one input (q, k and v; the cross-attention keys and values of every decoder
/// layer) are shown it one after another; the product of the last input is kept and reused when
/// the next layer's input is the same bits.
#[derive(Clone, Debug, Default)]
pub struct GramObserver {
    layers: BTreeSet<String>,
    pub grams: BTreeMap<String, Vec<f32>>,
    pub rows: BTreeMap<String, usize>,
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
                    gemm::Parallelism::None,
                );
            }
            self.last_input.clear();
            self.last_input.extend_from_slice(x);
        }
        let g = self
            .grams
            .entry(layer.to_string())
            .or_insert_with(|| vec![0.0; cols * cols]);
        g.iter_mut()
            .zip(&self.last_product)
            .for_each(|(a, b)| *a += b);
        *self.rows.entry(layer.to_string()).or_default() += rows;
    }

    fn merge(&mut self, other: Self) {
        for (layer, g) in other.grams {
            match self.grams.get_mut(&layer) {
                Some(mine) => mine.iter_mut().zip(&g).for_each(|(a, b)| *a += b),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gram_is_the_sum_of_outer_products_and_reuse_changes_nothing() {
        let cols = 5;
        let x: Vec<f32> = (0..3 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut o = GramObserver::new(["a".to_string(), "b".to_string()]);
        o.observe("a", &x, cols);
        o.observe("b", &x, cols); // the same input: the kept product
        o.observe("a", &x[..cols], cols);
        for i in 0..cols {
            for j in 0..cols {
                let full: f32 = x.chunks(cols).map(|r| r[i] * r[j]).sum();
                let a = o.grams["a"][i * cols + j];
                let b = o.grams["b"][i * cols + j];
                assert!((b - full).abs() < 1e-5, "{b} {full}");
                assert!((a - full - x[i] * x[j]).abs() < 1e-5, "{a}");
            }
        }
        assert_eq!((o.rows["a"], o.rows["b"]), (4, 3));
        assert!(!o.wants("c"));
    }
}
