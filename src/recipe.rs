//! Recipes: a named scheme, the module types it selects, and the algorithms it runs. Built-in
//! recipes are the TOML files of `recipes/`, embedded in the binary; a path to a user file works
//! the same way.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::algorithms;
use crate::error::{Error, Result};
use crate::format::{ModuleKind, Scheme};

/// The built-in recipes, in the order `oasr-quantize recipes` lists them.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "int8_w8a8_rtn",
        include_str!("../recipes/int8_w8a8_rtn.toml"),
    ),
    ("fp8_w8a8_rtn", include_str!("../recipes/fp8_w8a8_rtn.toml")),
    (
        "fp8_w8a8_rtn_keep",
        include_str!("../recipes/fp8_w8a8_rtn_keep.toml"),
    ),
    (
        "fp8_w8a8_gptq_keep",
        include_str!("../recipes/fp8_w8a8_gptq_keep.toml"),
    ),
    (
        "smoothquant_w8a8",
        include_str!("../recipes/smoothquant_w8a8.toml"),
    ),
    (
        "smoothquant_fp8_w8a8",
        include_str!("../recipes/smoothquant_fp8_w8a8.toml"),
    ),
    (
        "smoothquant_fp8_w8a8_gptq",
        include_str!("../recipes/smoothquant_fp8_w8a8_gptq.toml"),
    ),
    (
        "smoothquant_w8a8_fused",
        include_str!("../recipes/smoothquant_w8a8_fused.toml"),
    ),
    (
        "smoothquant_fp8_w8a8_fused",
        include_str!("../recipes/smoothquant_fp8_w8a8_fused.toml"),
    ),
    (
        "smoothquant_w8a8_portable",
        include_str!("../recipes/smoothquant_w8a8_portable.toml"),
    ),
    (
        "smoothquant_fp8_w8a8_portable",
        include_str!("../recipes/smoothquant_fp8_w8a8_portable.toml"),
    ),
];

/// One algorithm step of a recipe with its options.
#[derive(Clone, Debug, PartialEq)]
pub struct AlgorithmStep {
    pub name: String,
    pub options: BTreeMap<String, serde_json::Value>,
}

/// A parsed, validated recipe.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub name: String,
    pub summary: String,
    pub scheme: Scheme,
    pub module_types: Vec<ModuleKind>,
    /// Whether the recipe needs a calibration manifest.
    pub calibration: bool,
    pub kv_cache: Option<String>,
    /// Layer-name globs the recipe leaves full precision: layers its method cannot quantize
    /// without a measured accuracy loss (docs/recipes.md). A glob may match nothing (another
    /// architecture); `Quantizer::quantize_kept` overrides the list.
    pub keep_full_precision: Vec<String>,
    pub algorithms: Vec<AlgorithmStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: String,
    summary: String,
    scheme: String,
    #[serde(default)]
    module_types: Option<Vec<String>>,
    #[serde(default)]
    calibration: bool,
    #[serde(default)]
    kv_cache: Option<String>,
    #[serde(default)]
    keep_full_precision: Vec<String>,
    algorithms: Vec<StepFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepFile {
    name: String,
    #[serde(default)]
    options: BTreeMap<String, toml::Value>,
}

impl Recipe {
    /// Names and one-line summaries of the built-in recipes.
    pub fn built_in() -> Vec<Recipe> {
        // The embedded files are tested to parse, so a failure here is a build defect.
        BUILT_IN
            .iter()
            .filter_map(|(name, text)| Recipe::parse(name, text).ok())
            .collect()
    }

    /// A built-in recipe by name, or a recipe file when `name_or_path` is a path to one.
    pub fn load(name_or_path: &str) -> Result<Recipe> {
        if let Some((name, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Recipe::parse(name, text);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            return Recipe::parse(name_or_path, &text);
        }
        Err(Error::Recipe {
            name: name_or_path.into(),
            message: format!(
                "no built-in recipe and no file of that name; built-in recipes: {}",
                BUILT_IN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Parses and validates recipe TOML; `origin` names it in errors.
    pub fn parse(origin: &str, text: &str) -> Result<Recipe> {
        let err = |message: String| Error::Recipe {
            name: origin.into(),
            message,
        };
        let file: RecipeFile =
            toml::from_str(text).map_err(|e| err(format!("invalid recipe TOML: {e}")))?;
        let scheme = Scheme::from_name(&file.scheme).map_err(|e| err(format!("scheme: {e}")))?;
        if scheme.is_static() {
            return Err(err(format!(
                "scheme `{}`: a recipe names the per-token preset; static input scales come from the static_inputs algorithm",
                file.scheme
            )));
        }
        let module_types = match file.module_types {
            Some(list) => ModuleKind::parse_list(&list.join(","))
                .map_err(|e| err(format!("module_types: {}", inner_message(&e))))?,
            None => ModuleKind::DEFAULT.to_vec(),
        };
        if let Some(kv) = &file.kv_cache {
            if kv != "fp8_e4m3" {
                return Err(err(format!(
                    "kv_cache `{kv}`: expected \"fp8_e4m3\" or no key"
                )));
            }
        }
        for glob in &file.keep_full_precision {
            glob::Pattern::new(glob)
                .map_err(|e| err(format!("keep_full_precision `{glob}`: invalid glob: {e}")))?;
        }
        if file.algorithms.is_empty() {
            return Err(err("a recipe needs at least one algorithm".into()));
        }
        let mut algorithms: Vec<AlgorithmStep> = Vec::new();
        for (index, step) in file.algorithms.into_iter().enumerate() {
            let at = format!("algorithms[{index}] `{}`", step.name);
            algorithms::check_known(&step.name)
                .map_err(|e| err(format!("{at}: {}", inner_message(&e))))?;
            if algorithms.iter().any(|a| a.name == step.name) {
                return Err(err(format!("{at}: the algorithm is listed twice")));
            }
            if let Some(later) = algorithms
                .iter()
                .find(|a| algorithms::stage(&a.name) > algorithms::stage(&step.name))
            {
                return Err(err(format!(
                    "{at}: must come before `{}` (the order is {})",
                    later.name,
                    algorithms::ORDER
                )));
            }
            let options = step
                .options
                .into_iter()
                .map(|(k, v)| {
                    algorithms::check_option(&step.name, &k)
                        .map_err(|e| err(format!("{at}: {}", inner_message(&e))))?;
                    let value = toml_to_json(&v).map_err(|m| err(format!("{at}.{k}: {m}")))?;
                    Ok((k, value))
                })
                .collect::<Result<_>>()?;
            algorithms.push(AlgorithmStep {
                name: step.name,
                options,
            });
        }
        let weight_steps = algorithms
            .iter()
            .filter(|a| algorithms::quantizes_weights(&a.name))
            .count();
        if weight_steps != 1
            || !algorithms
                .last()
                .is_some_and(|a| algorithms::quantizes_weights(&a.name))
        {
            return Err(err(format!(
                "the last algorithm, and only it, must quantize the weights: `rtn` or `gptq` \
                 (the order is {})",
                algorithms::ORDER
            )));
        }
        Ok(Recipe {
            name: file.name,
            summary: file.summary,
            scheme,
            module_types,
            calibration: file.calibration,
            kv_cache: file.kv_cache,
            keep_full_precision: file.keep_full_precision,
            algorithms,
        })
    }

    /// Applies one `--option algorithm.key=value` override (value parsed as a TOML value, or as
    /// a bare string).
    pub fn set_option(&mut self, assignment: &str) -> Result<()> {
        let bad = |message: String| Error::option(format!("--option {assignment}"), message);
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| bad("expected ALGORITHM.KEY=VALUE".into()))?;
        let (algorithm, option) = key
            .trim()
            .split_once('.')
            .ok_or_else(|| bad("expected ALGORITHM.KEY=VALUE".into()))?;
        let value = value.trim();
        let parsed = toml::from_str::<BTreeMap<String, toml::Value>>(&format!("v = {value}"))
            .ok()
            .and_then(|mut m| m.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        let json = toml_to_json(&parsed).map_err(bad)?;
        let step = self
            .algorithms
            .iter_mut()
            .find(|s| s.name == algorithm)
            .ok_or_else(|| {
                bad(format!(
                    "recipe `{}` runs no algorithm `{algorithm}`",
                    self.name
                ))
            })?;
        algorithms::check_option(algorithm, option).map_err(|e| bad(e.to_string()))?;
        step.options.insert(option.to_string(), json);
        Ok(())
    }
}

/// An option error's message without its `option `...`: ` prefix, for a recipe error that names
/// the place itself.
fn inner_message(e: &Error) -> String {
    match e {
        Error::InvalidOption { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn toml_to_json(value: &toml::Value) -> Result<serde_json::Value, String> {
    Ok(match value {
        toml::Value::String(s) if s.chars().any(char::is_control) => {
            return Err(format!(
                "the string {s:?} contains a control character (a newline, tab, ...)"
            ))
        }
        toml::Value::String(s) => serde_json::Value::String(s.clone()),
        toml::Value::Integer(i) => serde_json::Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .ok_or("not a finite number")?,
        toml::Value::Boolean(b) => serde_json::Value::Bool(*b),
        toml::Value::Array(a) => {
            serde_json::Value::Array(a.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        other => return Err(format!("unsupported option value `{other}`")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_recipe_parses() {
        for (name, text) in BUILT_IN {
            let recipe = Recipe::parse(name, text).unwrap();
            assert_eq!(&recipe.name, name);
        }
        assert_eq!(Recipe::built_in().len(), BUILT_IN.len());
    }

    #[test]
    fn the_fp8_keep_recipes_are_the_smoothquant_fp8_recipes_without_smoothing() {
        for (keep, smoothed) in [
            ("fp8_w8a8_rtn_keep", "smoothquant_fp8_w8a8"),
            ("fp8_w8a8_gptq_keep", "smoothquant_fp8_w8a8_gptq"),
        ] {
            let keep = Recipe::load(keep).unwrap();
            let smoothed = Recipe::load(smoothed).unwrap();
            assert_eq!(keep.keep_full_precision, smoothed.keep_full_precision);
            assert_eq!(keep.scheme, smoothed.scheme);
            assert_eq!(smoothed.algorithms[0].name, "smoothquant");
            assert_eq!(keep.algorithms, smoothed.algorithms[1..]);
        }
        assert!(!Recipe::load("fp8_w8a8_rtn_keep").unwrap().calibration);
    }

    #[test]
    fn unknown_recipe_lists_the_built_ins() {
        let e = Recipe::load("no_such_recipe").unwrap_err().to_string();
        assert!(
            e.contains("int8_w8a8_rtn") && e.contains("no_such_recipe"),
            "{e}"
        );
    }

    #[test]
    fn options_are_checked_against_the_algorithm() {
        let mut r = Recipe::load("smoothquant_w8a8").unwrap();
        r.set_option("smoothquant.alpha=0.7").unwrap();
        assert_eq!(r.algorithms[0].options["alpha"], serde_json::json!(0.7));
        assert!(r.set_option("smoothquant.beta=1").is_err());
        assert!(r.set_option("static_inputs.observer=mse").is_err());
        assert!(r.set_option("nonsense").is_err());
    }

    #[test]
    fn bad_recipe_files_name_the_fault() {
        let e = Recipe::parse(
            "x.toml",
            "name='x'\nsummary='s'\nscheme='nvfp4'\n[[algorithms]]\nname='rtn'",
        )
        .unwrap_err();
        assert!(e.to_string().contains("nvfp4"), "{e}");
        let e = Recipe::parse(
            "x.toml",
            "name='x'\nsummary='s'\nscheme='int8_w8a8'\n[[algorithms]]\nname='awq'",
        )
        .unwrap_err();
        assert!(e.to_string().contains("awq"), "{e}");
        let e = Recipe::parse(
            "x.toml",
            "name='x'\nsummary='s'\nscheme='int8_w8a8'\nalgorithms=[]",
        )
        .unwrap_err();
        assert!(e.to_string().contains("at least one"), "{e}");
    }

    fn recipe_error(body: &str) -> String {
        let text = format!("name='x'\nsummary='s'\nscheme='int8_w8a8'\n{body}");
        let e = Recipe::parse("x.toml", &text).unwrap_err();
        assert!(matches!(e, Error::Recipe { .. }), "{e:?}");
        e.to_string()
    }

    #[test]
    fn recipe_files_are_checked_as_strictly_as_the_command_line() {
        // Unknown options inside a recipe, as `--option` refuses them.
        let e = recipe_error("[[algorithms]]\nname='rtn'\noptions={bits=4}");
        assert!(
            e.contains("algorithms[0] `rtn`") && e.contains("takes no options"),
            "{e}"
        );
        let e = recipe_error(
            "[[algorithms]]\nname='smoothquant'\noptions={beta=1}\n[[algorithms]]\nname='rtn'",
        );
        assert!(e.contains("`smoothquant`") && e.contains("alpha"), "{e}");
        // Duplicates and order.
        let e = recipe_error("[[algorithms]]\nname='rtn'\n[[algorithms]]\nname='rtn'");
        assert!(
            e.contains("algorithms[1] `rtn`") && e.contains("twice"),
            "{e}"
        );
        let e = recipe_error("[[algorithms]]\nname='rtn'\n[[algorithms]]\nname='smoothquant'");
        assert!(e.contains("must come before `rtn`"), "{e}");
        let e = recipe_error(
            "[[algorithms]]\nname='static_inputs'\n[[algorithms]]\nname='smoothquant'\n[[algorithms]]\nname='rtn'",
        );
        assert!(e.contains("must come before `static_inputs`"), "{e}");
        let e = recipe_error("[[algorithms]]\nname='smoothquant'");
        assert!(e.contains("only it, must quantize the weights"), "{e}");
        let e = recipe_error("[[algorithms]]\nname='rtn'\n[[algorithms]]\nname='gptq'");
        assert!(e.contains("only it, must quantize the weights"), "{e}");
        let r = Recipe::parse(
            "x.toml",
            "name='x'\nsummary='s'\nscheme='fp8_w8a8'\n[[algorithms]]\nname='gptq'\noptions={damp=0.1}",
        )
        .unwrap();
        assert_eq!(r.algorithms[0].name, "gptq");
        // Control characters in a value, in the file and on the command line.
        let e = recipe_error(
            "[[algorithms]]\nname='static_inputs'\noptions={observer=\"mse\\nminmax\"}\n[[algorithms]]\nname='rtn'",
        );
        assert!(e.contains("control character"), "{e}");
        let mut r = Recipe::load("smoothquant_w8a8_fused").unwrap();
        let e = r
            .set_option("static_inputs.observer=mse\nminmax")
            .unwrap_err();
        assert!(e.to_string().contains("control character"), "{e}");
        // A bad module type is the recipe's fault, not `--module-types`'.
        let e = recipe_error("module_types=['linear','lstm']\n[[algorithms]]\nname='rtn'");
        assert!(
            e.contains("recipe `x.toml`: module_types") && !e.contains("--module-types"),
            "{e}"
        );
        // A bad keep glob.
        let e = recipe_error("keep_full_precision=['[']\n[[algorithms]]\nname='rtn'");
        assert!(e.contains("keep_full_precision"), "{e}");
    }
}
