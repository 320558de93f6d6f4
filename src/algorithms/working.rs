//! f32 copies of the tensors algorithms change, over the read-only source checkpoint.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// The source's tensors as f32, with the changed ones held in memory.
pub struct WorkingTensors<'a> {
    source: &'a Checkpoint,
    changed: BTreeMap<String, Vec<f32>>,
}

impl<'a> WorkingTensors<'a> {
    pub fn new(source: &'a Checkpoint) -> Self {
        WorkingTensors {
            source,
            changed: BTreeMap::new(),
        }
    }

    fn source_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self
            .source
            .tensors
            .get(name)
            .ok_or_else(|| Error::tensor(&self.source.dir, name, "missing"))?;
        if !t.dtype.is_float() {
            return Err(Error::tensor(
                &self.source.dir,
                name,
                format!("expected a float tensor, found {}", t.dtype),
            ));
        }
        Ok(t.to_f32())
    }

    /// The current values of a tensor.
    pub fn get(&self, name: &str) -> Result<Cow<'_, [f32]>> {
        match self.changed.get(name) {
            Some(v) => Ok(Cow::Borrowed(v)),
            None => self.source_f32(name).map(Cow::Owned),
        }
    }

    /// The values of a tensor, to change in place.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut Vec<f32>> {
        if !self.changed.contains_key(name) {
            let values = self.source_f32(name)?;
            self.changed.insert(name.to_string(), values);
        }
        Ok(self.changed.get_mut(name).expect("inserted above"))
    }

    /// The changed values of a tensor, if an algorithm changed it.
    pub fn changed(&self, name: &str) -> Option<&[f32]> {
        self.changed.get(name).map(Vec::as_slice)
    }

    /// Every changed tensor with its new values.
    pub fn changed_tensors(&self) -> impl Iterator<Item = (&str, &[f32])> {
        self.changed.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
    }

    /// The shape of a source tensor.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        self.source
            .tensors
            .get(name)
            .map(|t| t.shape.as_slice())
            .ok_or_else(|| Error::tensor(&self.source.dir, name, "missing"))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.source.tensors.contains_key(name)
    }
}
