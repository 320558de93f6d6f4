//! WeNet's global CMVN: per-dimension mean and variance normalisation of the features with
//! statistics over the training set, read from WeNet's `global_cmvn` JSON file.
//!
//! The file is `{"mean_stat": [D numbers], "var_stat": [D numbers], "frame_num": N}`: sums of
//! the features and of their squares over N frames. As WeNet's `load_cmvn` (in `f64`):
//! `mean = mean_stat / frame_num`, `var = var_stat / frame_num − mean²` floored at `1e-20`,
//! `istd = 1 / sqrt(var)`; both are then stored as `f32`, and every frame becomes
//! `(x − mean) · istd` in `f32`, as WeNet's `GlobalCMVN` module computes it on `float32` tensors.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// The floor on the variance, WeNet's `1.0e-20`.
pub const VARIANCE_FLOOR: f64 = 1e-20;

/// Global CMVN statistics, ready to apply: a mean and an inverse standard deviation per feature
/// dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalCmvn {
    mean: Vec<f32>,
    istd: Vec<f32>,
}

impl GlobalCmvn {
    /// Reads WeNet's `global_cmvn` JSON file for a model that takes `expected_dim`-dimensional
    /// features. A missing file is [`Error::Io`]; a file that is not JSON, or not an object, is
    /// [`Error::Corrupt`]; a missing key, a non-numeric or non-finite value, `mean_stat` and
    /// `var_stat` of different lengths, empty, or of a length other than `expected_dim`, or
    /// `frame_num ≤ 0` is [`Error::ConfigKey`] naming the key.
    pub fn read(path: &Path, expected_dim: usize) -> Result<GlobalCmvn> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: Value = serde_json::from_str(&quote_non_finite(&text)).map_err(|e| {
            Error::corrupt(
                path,
                format!(
                    "not a WeNet global_cmvn JSON file: {e} (the Kaldi-format cmvn file is not \
                     read by this version)"
                ),
            )
        })?;
        let Value::Object(map) = &json else {
            return Err(Error::corrupt(
                path,
                "not a WeNet global_cmvn JSON file: expected an object with `mean_stat`, \
                 `var_stat` and `frame_num`",
            ));
        };
        let get = |key: &str| {
            map.get(key)
                .ok_or_else(|| Error::config_key(path, key, "missing"))
        };
        let mean_stat = numbers(path, "mean_stat", get("mean_stat")?)?;
        let var_stat = numbers(path, "var_stat", get("var_stat")?)?;
        let frame_num = number(path, "frame_num", get("frame_num")?)?;
        if var_stat.len() != mean_stat.len() {
            return Err(Error::config_key(
                path,
                "var_stat",
                format!(
                    "has {} values but `mean_stat` has {}",
                    var_stat.len(),
                    mean_stat.len()
                ),
            ));
        }
        if mean_stat.is_empty() {
            return Err(Error::config_key(path, "mean_stat", "has no values"));
        }
        if mean_stat.len() != expected_dim {
            return Err(Error::config_key(
                path,
                "mean_stat",
                format!(
                    "global_cmvn has {} values but the model takes {expected_dim}-dimensional \
                     features",
                    mean_stat.len()
                ),
            ));
        }
        if frame_num <= 0.0 {
            return Err(Error::config_key(
                path,
                "frame_num",
                format!("must be positive, not {frame_num}"),
            ));
        }
        let mut mean = Vec::with_capacity(expected_dim);
        let mut istd = Vec::with_capacity(expected_dim);
        for (i, (&m, &v)) in mean_stat.iter().zip(&var_stat).enumerate() {
            let mu = m / frame_num;
            let var = (v / frame_num - mu * mu).max(VARIANCE_FLOOR);
            let (mu32, istd32) = (mu as f32, (1.0 / var.sqrt()) as f32);
            if !mu32.is_finite() {
                return Err(Error::config_key(
                    path,
                    "mean_stat",
                    format!(
                        "value {i} gives a mean of {mu:e} (mean_stat / frame_num), not a finite \
                         f32"
                    ),
                ));
            }
            if !istd32.is_finite() {
                return Err(Error::config_key(
                    path,
                    "var_stat",
                    format!("value {i} gives a non-finite inverse standard deviation"),
                ));
            }
            mean.push(mu32);
            istd.push(istd32);
        }
        Ok(GlobalCmvn { mean, istd })
    }

    /// Statistics from a mean and an inverse standard deviation per dimension, as given.
    /// Lengths that differ, or are 0, are [`Error::ShapeRefused`].
    pub fn from_mean_istd(mean: Vec<f32>, istd: Vec<f32>) -> Result<GlobalCmvn> {
        if mean.len() != istd.len() || mean.is_empty() {
            return Err(Error::ShapeRefused {
                op: "global CMVN".into(),
                message: format!(
                    "{} means and {} inverse standard deviations",
                    mean.len(),
                    istd.len()
                ),
            });
        }
        Ok(GlobalCmvn { mean, istd })
    }

    /// The feature dimension.
    pub fn dim(&self) -> usize {
        self.mean.len()
    }

    /// The mean per dimension (`mean_stat / frame_num`, as `f32`).
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// The inverse standard deviation per dimension, as `f32`.
    pub fn istd(&self) -> &[f32] {
        &self.istd
    }

    /// Normalises `features`, `[frames, dim]` row-major, in place: `(x − mean) · istd`. A length
    /// that is not a multiple of [`GlobalCmvn::dim`] is [`Error::ShapeRefused`].
    pub fn apply(&self, features: &mut [f32]) -> Result<()> {
        let dim = self.dim();
        if !features.len().is_multiple_of(dim) {
            return Err(Error::ShapeRefused {
                op: "global CMVN".into(),
                message: format!(
                    "{} feature values are not whole frames of {dim}",
                    features.len()
                ),
            });
        }
        for row in features.chunks_exact_mut(dim) {
            for ((x, &m), &s) in row.iter_mut().zip(&self.mean).zip(&self.istd) {
                *x = (*x - m) * s;
            }
        }
        Ok(())
    }
}

/// The values of `key`: an array of numbers.
fn numbers(path: &Path, key: &str, value: &Value) -> Result<Vec<f64>> {
    let Value::Array(items) = value else {
        return Err(Error::config_key(
            path,
            key,
            format!("expected an array of numbers, found {}", kind(value)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| number(path, &format!("{key}[{i}]"), v))
        .collect()
}

/// A finite number. The non-finite numbers Python's `json` writes (`NaN`, `Infinity`) arrive
/// as strings from [`quote_non_finite`].
fn number(path: &Path, key: &str, value: &Value) -> Result<f64> {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => Err(Error::config_key(path, key, format!("{n} is not finite"))),
        },
        Value::String(s) if NON_FINITE.contains(&s.as_str()) => Err(Error::config_key(
            path,
            key,
            format!("{s} is not finite: the statistics must be finite numbers"),
        )),
        other => Err(Error::config_key(
            path,
            key,
            format!("expected a number, found {}", kind(other)),
        )),
    }
}

fn kind(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {:?}", truncated(s)),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

fn truncated(s: &str) -> String {
    if s.chars().count() <= 40 {
        s.to_owned()
    } else {
        let head: String = s.chars().take(40).collect();
        format!("{head}…")
    }
}

/// The non-finite spellings: Python's `json.dumps` writes `NaN`, `Infinity` and `-Infinity`.
const NON_FINITE: [&str; 3] = ["NaN", "Infinity", "-Infinity"];

/// `text` with every bare `NaN`, `Infinity` or `-Infinity` token, and every number too large for
/// an `f64` (which Python reads as infinity), outside strings turned into the string `"NaN"`,
/// `"Infinity"` or `"-Infinity"`, so that the JSON parser accepts it and the key holding it can
/// be named. Everything else is left as is.
fn quote_non_finite(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_string = false;
    let mut copied = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 2,
                b'"' => {
                    in_string = false;
                    i += 1;
                }
                _ => i += 1,
            }
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        let token_end = |from: usize| {
            let mut j = from;
            while j < bytes.len()
                && (bytes[j].is_ascii_alphanumeric() || b"+-.".contains(&bytes[j]))
            {
                j += 1;
            }
            j
        };
        if b == b'-' || b.is_ascii_alphanumeric() {
            let end = token_end(i);
            let token = &text[i..end];
            let replacement = if NON_FINITE.contains(&token) {
                Some(token)
            } else if b == b'-' || b.is_ascii_digit() {
                match token.parse::<f64>() {
                    Ok(x) if x.is_infinite() => {
                        Some(if x > 0.0 { "Infinity" } else { "-Infinity" })
                    }
                    _ => None,
                }
            } else {
                None
            };
            if let Some(r) = replacement {
                out.push_str(&text[copied..i]);
                out.push('"');
                out.push_str(r);
                out.push('"');
                copied = end;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_bare_non_finite_tokens() {
        assert_eq!(
            quote_non_finite(r#"{"a": [1, NaN, -Infinity, 1e999], "b": "NaN x", "c": -2.5e3}"#),
            r#"{"a": [1, "NaN", "-Infinity", "Infinity"], "b": "NaN x", "c": -2.5e3}"#
        );
        assert_eq!(
            quote_non_finite(r#"{"k\"NaN": Infinity}"#),
            r#"{"k\"NaN": "Infinity"}"#
        );
        let plain = r#"{"mean_stat": [1.5, -2], "frame_num": 10, "t": true, "n": null}"#;
        assert_eq!(quote_non_finite(plain), plain);
    }

    #[test]
    fn applies_per_dimension() {
        let cmvn = GlobalCmvn::from_mean_istd(vec![1.0, -2.0], vec![0.5, 4.0]).unwrap();
        let mut x = [3.0, 0.0, 1.0, -2.0];
        cmvn.apply(&mut x).unwrap();
        assert_eq!(x, [1.0, 8.0, 0.0, 0.0]);
        assert!(cmvn.apply(&mut [0.0; 3]).is_err());
        assert!(GlobalCmvn::from_mean_istd(vec![1.0], vec![]).is_err());
    }
}
