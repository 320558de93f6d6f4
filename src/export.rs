//! Exports to formats other tools load. `compressed-tensors`: the Hugging Face layout of the
//! architecture with a `quantization_config` that compressed-tensors (transformers) and vLLM
//! read, as llm-compressor writes it. What the format cannot say is refused by name, never
//! dropped: a runtime smoother (`smooth_inv`), an fp8 KV cache scaled at run time, int8 and fp8
//! in one checkpoint, and projections a server fuses that disagree in scheme or static scale.
//! The OASR server's links (fused norms, GEMM chains) are how it runs the layers, not what they
//! hold: the export leaves them out and records nothing it cannot honour (reading the export
//! back arms them again from the layout, as the quantizer does).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use crate::checkpoint::{
    write_weights, Checkpoint, DType, StagedDir, Tensor, TensorPlan, CONFIG_FILE,
};
use crate::error::{Error, Result};
use crate::format::compressed_tensors as ct;
use crate::format::{ModuleKind, QuantDtype, QuantizationSpec, Scheme, SmoothFold};
use crate::models::registry::{architecture, layout_of, HfFiles, HfLayout};

/// A format `oasr-quantize export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExportFormat {
    /// The Hugging Face layout with a compressed-tensors `quantization_config`.
    CompressedTensors,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 1] = [ExportFormat::CompressedTensors];

    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::CompressedTensors => "compressed-tensors",
        }
    }

    /// Parses `--format`; unknown names are refused, listing the known ones.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                Error::option(
                    "--format",
                    format!(
                        "unknown format `{name}`; expected {}",
                        Self::ALL.map(ExportFormat::name).join(", ")
                    ),
                )
            })
    }
}

/// What an export wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportReport {
    pub source: String,
    pub output: String,
    pub format: ExportFormat,
    /// Quantized layers (0 for a full-precision source, exported as plain Hugging Face).
    pub quantized_layers: usize,
    /// `quantization_config.config_groups`: one per scheme.
    pub config_groups: usize,
    /// `quantization_config.ignore`: the Linear layers left full precision (Hugging Face names).
    pub ignored: Vec<String>,
    /// OASR server links the export leaves out (fused norms and GEMM chains; the numerics are
    /// those of the unfused layers).
    pub links_left_out: usize,
    pub tensors: usize,
    /// Bytes of `model.safetensors`.
    pub weight_bytes: u64,
    pub seconds: f64,
}

/// Refuses what compressed-tensors cannot express, naming the layers at fault.
fn check_expressible(src: &Path, spec: &QuantizationSpec, fused: &[Vec<String>]) -> Result<()> {
    let refuse = |message: String| Error::Export {
        path: src.into(),
        format: ExportFormat::CompressedTensors.name(),
        message,
    };
    let runtime: Vec<&String> = spec
        .layers
        .iter()
        .filter(|(_, l)| l.smooth == SmoothFold::Runtime)
        .map(|(name, _)| name)
        .collect();
    if !runtime.is_empty() {
        let shown: Vec<&str> = runtime.iter().take(4).map(|s| s.as_str()).collect();
        return Err(refuse(format!(
            "compressed-tensors has no runtime smoother, and {} layers carry one (`smooth_inv`: {}{}); \
             quantize with `smoothquant_w8a8_portable` or `smoothquant_fp8_w8a8_portable`, which smooth \
             only through folds the weights absorb",
            runtime.len(),
            shown.join(", "),
            if runtime.len() > shown.len() { ", …" } else { "" }
        )));
    }
    if let Some(kv) = &spec.kv_cache {
        return Err(refuse(format!(
            "the KV cache is `{kv}`, which the OASR server scales at run time; compressed-tensors \
             needs calibrated k/v scales this checkpoint does not have"
        )));
    }
    let dtypes: BTreeSet<&str> = spec
        .layers
        .values()
        .map(|l| ct::type_name(l.scheme.dtype()))
        .collect();
    if dtypes.len() > 1 {
        return Err(refuse(
            "the checkpoint mixes int8 and fp8 layers; an export holds one format".into(),
        ));
    }
    if let Some((name, l)) = spec
        .layers
        .iter()
        .find(|(_, l)| l.kind != ModuleKind::Linear)
    {
        return Err(refuse(format!(
            "layer `{name}` is a quantized {}; compressed-tensors' Whisper serving quantizes Linear \
             layers only (quantize with the default --module-types)",
            l.kind.name()
        )));
    }
    for group in fused {
        let schemes: BTreeSet<Option<Scheme>> = group
            .iter()
            .map(|name| spec.layers.get(name).map(|l| l.scheme))
            .collect();
        if schemes.len() > 1 {
            return Err(refuse(format!(
                "{} are fused into one GEMM by vLLM and must share one scheme; here they are {}",
                group.join(", "),
                group
                    .iter()
                    .map(|n| spec
                        .layers
                        .get(n)
                        .map_or("full precision", |l| l.scheme.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

/// The static input scales of the layers of one fused group must be one value.
fn check_fused_scales(
    src: &Path,
    ckpt: &Checkpoint,
    fused: &[Vec<String>],
    spec: &QuantizationSpec,
) -> Result<()> {
    for group in fused {
        let scales: Vec<(String, Vec<u8>)> = group
            .iter()
            .filter(|n| spec.layers.contains_key(*n))
            .filter_map(|n| {
                ckpt.tensors
                    .get(&format!("{n}.input_scale"))
                    .map(|t| (n.clone(), t.bytes().to_vec()))
            })
            .collect();
        if scales.windows(2).any(|w| w[0].1 != w[1].1) {
            return Err(Error::Export {
                path: src.into(),
                format: ExportFormat::CompressedTensors.name(),
                message: format!(
                    "{} are fused into one GEMM by vLLM and need one static input scale; their \
                     calibrated scales differ",
                    group.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// The `quantization_config` of a quantized checkpoint: one config group per scheme (targets
/// `Linear` when one scheme covers every quantized layer, else the layers by name), `ignore`
/// naming every Linear left full precision.
fn quantization_config(
    spec: &QuantizationSpec,
    hf_name: &dyn Fn(&str) -> String,
    ignored: &[String],
) -> Result<Value> {
    let mut by_scheme: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, l) in &spec.layers {
        by_scheme
            .entry(l.scheme.name())
            .or_default()
            .push(hf_name(name));
    }
    let single = by_scheme.len() == 1;
    let mut groups = serde_json::Map::new();
    let mut format = ct::format_name(QuantDtype::Int8);
    for (i, (scheme, layers)) in by_scheme.iter().enumerate() {
        let args = spec.schemes.get(*scheme).ok_or_else(|| Error::Scheme {
            name: scheme.to_string(),
            message: "used by a layer but missing from `quantization.schemes`".into(),
        })?;
        format = ct::format_name(args.weight.dtype);
        let group_format = format;
        let targets = if single {
            vec!["Linear".to_string()]
        } else {
            layers.clone()
        };
        groups.insert(
            format!("group_{i}"),
            json!({
                "targets": targets,
                "weights": ct::args_json(&args.weight, scheme)?,
                "input_activations": ct::args_json(&args.input, scheme)?,
                "output_activations": null,
                "format": group_format,
            }),
        );
    }
    Ok(json!({
        "quant_method": ct::QUANT_METHOD,
        "format": format,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignored,
        "kv_cache_scheme": null,
        "global_compression_ratio": null,
    }))
}

/// The name compressed-tensors and transformers give the dtype of the unquantized tensors.
fn torch_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        _ => "float32",
    }
}

/// Exports the checkpoint in `src` (quantized, or full precision for a plain Hugging Face
/// reference) to `dst` in `format`, atomically.
pub fn export(
    src: &Path,
    dst: &Path,
    format: ExportFormat,
    overwrite: bool,
) -> Result<ExportReport> {
    let started = std::time::Instant::now();
    let staged = StagedDir::create(dst, overwrite, &[src])?;
    let mut report = export_into(src, staged.path(), format)?;
    report.output = staged.commit()?.display().to_string();
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// [`export`] into the (staging) directory `dir`; every refusal comes before the first write.
pub(crate) fn export_into(src: &Path, dir: &Path, format: ExportFormat) -> Result<ExportReport> {
    let started = std::time::Instant::now();
    let ExportFormat::CompressedTensors = format;
    let ckpt = Checkpoint::open(src)?;
    let arch = architecture(&ckpt.dir.join(CONFIG_FILE), &ckpt.config.architecture)?;
    let hf: &HfLayout = arch.hf.ok_or_else(|| Error::NotImplemented {
        what: format!("a {} export of `{}`", format.name(), arch.name),
        detail: "Hugging Face transformers has no such architecture, so there is no layout to \
                 write; the OASR native checkpoint is the one format it has"
            .into(),
    })?;
    let fused = (hf.fused_groups)(&ckpt)?;
    let spec = ckpt.config.quantization.as_ref();
    if let Some(spec) = spec {
        check_expressible(src, spec, &fused)?;
        check_fused_scales(src, &ckpt, &fused, spec)?;
    }
    let no_layers = BTreeMap::new();
    let quantized = spec.map_or(&no_layers, |s| &s.layers);
    let hf_name = hf.name;
    let layout = layout_of(&ckpt)?;
    let mut ignored: Vec<String> = layout
        .layers
        .iter()
        .filter(|l| l.kind == ModuleKind::Linear && !quantized.contains_key(&l.name))
        .map(|l| hf_name(&l.name))
        .chain(hf.tied_linears.iter().map(|s| s.to_string()))
        .collect();
    ignored.sort();

    // The tensors in Hugging Face names and layouts; a quantized layer's scales take
    // compressed-tensors' shapes (weight_scale [N, 1], input_scale [1]).
    let mut float_dtypes: BTreeMap<DType, usize> = BTreeMap::new();
    let mut out: BTreeMap<String, Cow<'_, Tensor>> = BTreeMap::new();
    for (name, t) in &ckpt.tensors {
        let (module, key) = name.rsplit_once('.').unwrap_or((name.as_str(), ""));
        let tensor = if quantized.contains_key(module) {
            match key {
                "weight_scale" => Cow::Owned(Tensor::from_bytes(
                    t.dtype,
                    vec![t.numel(), 1],
                    t.bytes().to_vec(),
                )),
                "weight" | "input_scale" | "bias" => Cow::Borrowed(t),
                other => {
                    return Err(Error::tensor(
                        src,
                        name,
                        format!("`{other}` has no compressed-tensors counterpart"),
                    ))
                }
            }
        } else {
            if t.dtype.is_float() {
                *float_dtypes.entry(t.dtype).or_default() += t.numel();
            }
            (hf.relayout)(name, t).map_or(Cow::Borrowed(t), Cow::Owned)
        };
        out.insert(hf_name(name), tensor);
    }
    let dtype = float_dtypes
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or(DType::F32, |(d, _)| *d);

    let HfFiles { mut config, files } = (hf.files)(&ckpt, torch_dtype(dtype))?;
    if let Some(spec) = spec {
        config["quantization_config"] = quantization_config(spec, &hf_name, &ignored)?;
    }
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))
    };
    let mut text = serde_json::to_vec_pretty(&config).map_err(|e| Error::Output {
        path: dir.into(),
        message: e.to_string(),
    })?;
    text.push(b'\n');
    write("config.json", &text)?;
    for (name, bytes) in &files {
        write(name, bytes)?;
    }
    let plan: Vec<TensorPlan> = out
        .iter()
        .map(|(name, t)| TensorPlan {
            name: name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    let weight_bytes = plan.iter().map(|p| p.byte_len() as u64).sum();
    // A clone of a mapped tensor shares its mapping: nothing is copied.
    write_weights(dir, plan, |entry| Ok(out[&entry.name].as_ref().clone()))?;
    Ok(ExportReport {
        source: src.display().to_string(),
        output: dir.display().to_string(),
        format,
        quantized_layers: quantized.len(),
        config_groups: config["quantization_config"]["config_groups"]
            .as_object()
            .map_or(0, |g| g.len()),
        ignored: if spec.is_some() { ignored } else { Vec::new() },
        links_left_out: spec.map_or(0, |s| s.links.fused_norms.len() + s.links.gemm_chains.len()),
        tensors: out.len(),
        weight_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}
