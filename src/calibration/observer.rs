//! Observers on GEMM inputs. Each keeps mergeable statistics, so utterances can be calibrated in
//! parallel and merged in any order with the same result.

use std::collections::BTreeMap;

use candle_core::Tensor;

use crate::error::Result;
use crate::models::exec::{ce, to_vec, Linear, LinearExec};
use crate::numerics::Activation;

/// Something that records statistics of the inputs of named GEMMs.
pub trait Observer: Send {
    /// Whether the observer records this layer's input (others are not copied out).
    fn wants(&self, _layer: &str) -> bool {
        true
    }
    /// `x` is row-major `[rows, cols]`, the input of layer `layer`.
    fn observe(&mut self, layer: &str, x: &[f32], cols: usize);
    /// Folds another observer's statistics (of the same kind) into this one.
    fn merge(&mut self, other: Self)
    where
        Self: Sized;
}

/// Per-channel max |x| of every observed layer input (what SmoothQuant needs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AbsMaxObserver {
    pub absmax: BTreeMap<String, Vec<f32>>,
    /// Rows (tokens) observed per layer.
    pub rows: BTreeMap<String, usize>,
}

impl Observer for AbsMaxObserver {
    fn observe(&mut self, layer: &str, x: &[f32], cols: usize) {
        let m = self
            .absmax
            .entry(layer.to_string())
            .or_insert_with(|| vec![0.0; cols]);
        for row in x.chunks_exact(cols) {
            for (a, v) in m.iter_mut().zip(row) {
                *a = a.max(v.abs());
            }
        }
        *self.rows.entry(layer.to_string()).or_default() += x.len() / cols.max(1);
    }

    fn merge(&mut self, other: Self) {
        for (layer, m) in other.absmax {
            match self.absmax.get_mut(&layer) {
                Some(mine) => mine.iter_mut().zip(&m).for_each(|(a, b)| *a = a.max(*b)),
                None => {
                    self.absmax.insert(layer, m);
                }
            }
        }
        for (layer, n) in other.rows {
            *self.rows.entry(layer).or_default() += n;
        }
    }
}

/// Two observers fed by one pass (each sees the layers it wants).
#[derive(Clone, Debug, Default)]
pub struct BothObservers<A, B> {
    pub first: A,
    pub second: B,
}

impl<A: Observer, B: Observer> Observer for BothObservers<A, B> {
    fn wants(&self, layer: &str) -> bool {
        self.first.wants(layer) || self.second.wants(layer)
    }

    fn observe(&mut self, layer: &str, x: &[f32], cols: usize) {
        if self.first.wants(layer) {
            self.first.observe(layer, x, cols);
        }
        if self.second.wants(layer) {
            self.second.observe(layer, x, cols);
        }
    }

    fn merge(&mut self, other: Self) {
        self.first.merge(other.first);
        self.second.merge(other.second);
    }
}

/// Runs GEMMs through `inner` after showing their inputs to an observer.
pub struct ObservingExec<'a, O: Observer, E: LinearExec> {
    pub observer: &'a mut O,
    pub inner: E,
}

impl<O: Observer, E: LinearExec> ObservingExec<'_, O, E> {
    fn show(&mut self, layer: &Linear, x: &Tensor) -> Result<()> {
        if self.observer.wants(&layer.name) {
            let (_, cols) = x.dims2().map_err(ce(&layer.name))?;
            let values = to_vec(x, &layer.name)?;
            self.observer.observe(&layer.name, &values, cols);
        }
        Ok(())
    }
}

impl<O: Observer, E: LinearExec> LinearExec for ObservingExec<'_, O, E> {
    fn linear(&mut self, layer: &Linear, x: &Tensor) -> Result<Tensor> {
        self.show(layer, x)?;
        self.inner.linear(layer, x)
    }

    fn linear_act(&mut self, layer: &Linear, x: &Tensor, activation: Activation) -> Result<Tensor> {
        self.show(layer, x)?;
        self.inner.linear_act(layer, x, activation)
    }
}
