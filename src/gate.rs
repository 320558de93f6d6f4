//! The WER gate: regenerates every gated checkpoint from its recipe and calibration manifest,
//! verifies it on each evaluation set (an in-domain set of the calibration's voice, a
//! cross-domain set of voices and sources calibration never heard), and fails when a WER exceeds
//! its recorded reference plus the tolerance, or a logit-agreement floor is missed. References are
//! recorded only on request ([`record`]), never automatically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::calibration::SharedObservations;
use crate::error::{Error, Result};
use crate::format::ModuleKind;
use crate::manifest::Manifest;
use crate::models::{DecodeOptions, LogMelPadding, Task};
use crate::numerics::{OutDtype, QuantDtype};
use crate::quantizer::{Progress, Quantizer};
use crate::recipe::Recipe;
use crate::verify::{verify_many, VerifyDevice, VerifyOptions, VerifyReport};

/// The default tolerance, in WER percentage points.
pub const DEFAULT_TOLERANCE: f64 = 0.3;

/// With `--device cuda`: how far the served (GPU) teacher-forced cosine mean may fall below the
/// CPU reference's on the same checkpoint and set (the default of `gpu_cosine_tolerance`).
pub const DEFAULT_GPU_COSINE_TOLERANCE: f64 = 0.0005;

/// A gate file (`calib/gate.toml`), as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    model: String,
    calib_manifest: String,
    /// Evaluation sets by name, each a manifest; run in name order.
    sets: BTreeMap<String, SetFile>,
    #[serde(default = "default_tolerance")]
    tolerance: f64,
    #[serde(default = "default_gpu_cosine_tolerance")]
    gpu_cosine_tolerance: f64,
    profiles: BTreeMap<String, Profile>,
    #[serde(rename = "entry")]
    entries: Vec<GateEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetFile {
    manifest: String,
}

fn default_tolerance() -> f64 {
    DEFAULT_TOLERANCE
}

fn default_gpu_cosine_tolerance() -> f64 {
    DEFAULT_GPU_COSINE_TOLERANCE
}

/// How much of the gate a run uses: the full gate, or a subset that fits a CI budget.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The first N utterances of each set's manifest (all when absent).
    pub gate_utterances: Option<usize>,
    /// Calibration utterances for the recipes that calibrate (the recipe default when absent).
    pub calib_utterances: Option<usize>,
    /// The sets this profile verifies on (all when absent).
    pub sets: Option<Vec<String>>,
}

/// One gated checkpoint.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GateEntry {
    pub name: String,
    pub recipe: String,
    /// The model this entry quantizes, when not the gate's (for example another architecture);
    /// a path that expands to nothing (`${OASR_WENET_MODEL:-}` unset) skips the entry, visibly.
    pub model: Option<String>,
    /// `--option` assignments, e.g. `"smoothquant.alpha" = "0.5"`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// `--module-types` (the recipe's when absent).
    pub module_types: Option<String>,
    /// `--ignore` globs.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// `--quantize-kept`: also quantize what the recipe keeps full precision.
    #[serde(default)]
    pub quantize_kept: bool,
    /// `--ctc-weight`, `--reverse-weight`, `--beam-size`: the search calibration and verify
    /// decode with (the architecture's defaults when absent).
    pub ctc_weight: Option<f64>,
    pub reverse_weight: Option<f64>,
    pub beam_size: Option<usize>,
    /// Whisper: the spoken language as its code (default: detected on multilingual models).
    pub language: Option<String>,
    /// Whisper: `transcribe` (default) or `translate` (multilingual models).
    pub task: Option<Task>,
    /// Whisper: `transcribe` (default) or `feature-extractor`: how short clips are padded to
    /// 30 s in calibration and verification (`--padding`).
    pub padding: Option<LogMelPadding>,
    /// Floors on the teacher-forced logit cosine mean, per set.
    #[serde(default)]
    pub min_cosine: BTreeMap<String, f64>,
    /// Floors on the worst teacher-forced step's cosine, per set.
    #[serde(default)]
    pub min_step_cosine: BTreeMap<String, f64>,
    /// Another entry whose teacher-forced cosine mean this one must reach on every set (a
    /// calibrated recipe is never worse than plain RTN); checked when both run.
    pub not_below: Option<String>,
    /// Recorded quantized WER (percent) per profile, then per set.
    #[serde(default)]
    pub reference_wer: BTreeMap<String, BTreeMap<String, f64>>,
}

impl GateEntry {
    /// The entry's search options.
    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            ctc_weight: self.ctc_weight,
            reverse_weight: self.reverse_weight,
            beam_size: self.beam_size,
            language: self.language.clone(),
            task: self.task,
            padding: self.padding,
            ..DecodeOptions::default()
        }
    }
}

/// One evaluation set of a gate.
#[derive(Clone, Debug)]
pub struct GateSet {
    pub name: String,
    pub manifest: PathBuf,
}

/// A loaded gate: paths resolved, profiles and entries checked.
#[derive(Clone, Debug)]
pub struct GateConfig {
    pub path: PathBuf,
    pub model: PathBuf,
    pub calib_manifest: PathBuf,
    /// In name order.
    pub sets: Vec<GateSet>,
    /// WER percentage points a checkpoint may exceed its reference by.
    pub tolerance: f64,
    /// With `--device cuda`: how far the GPU's teacher-forced cosine mean may fall below the CPU
    /// reference's.
    pub gpu_cosine_tolerance: f64,
    pub profiles: BTreeMap<String, Profile>,
    pub entries: Vec<GateEntry>,
    /// Each entry's model: the gate's, its own, or `None` when its own path is not configured.
    pub entry_models: BTreeMap<String, Option<PathBuf>>,
}

impl GateConfig {
    /// Reads a gate file. Paths may use `${VAR}` or `${VAR:-default}` and a leading `~/`;
    /// relative paths are taken from the gate file's directory.
    pub fn load(path: &Path) -> Result<GateConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let file: GateFile = toml::from_str(&text)
            .map_err(|e| Error::corrupt(path, format!("invalid gate file: {e}")))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |key: &str, value: &str| -> Result<PathBuf> {
            let expanded =
                expand(value).map_err(|m| Error::corrupt(path, format!("`{key}`: {m}")))?;
            Ok(base.join(expanded))
        };
        let bad = |message: String| Error::corrupt(path, message);
        if !(file.tolerance.is_finite() && file.tolerance >= 0.0) {
            return Err(bad(
                "`tolerance` must be a non-negative number of WER points".into(),
            ));
        }
        if !(file.gpu_cosine_tolerance.is_finite() && file.gpu_cosine_tolerance >= 0.0) {
            return Err(bad(
                "`gpu_cosine_tolerance` must be a non-negative cosine difference".into(),
            ));
        }
        if file.profiles.is_empty() {
            return Err(bad("no [profiles.NAME] table".into()));
        }
        if file.sets.is_empty() {
            return Err(bad("no [sets.NAME] table (an evaluation manifest)".into()));
        }
        let known_set = |set: &str, what: &str| {
            if file.sets.contains_key(set) {
                Ok(())
            } else {
                Err(bad(format!("{what} names unknown set `{set}`")))
            }
        };
        for (name, p) in &file.profiles {
            for set in p.sets.iter().flatten() {
                known_set(set, &format!("profile `{name}`"))?;
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for e in &file.entries {
            if !names.insert(e.name.as_str()) {
                return Err(bad(format!("entry `{}` appears twice", e.name)));
            }
        }
        for e in &file.entries {
            let what = format!("entry `{}`", e.name);
            for (profile, sets) in &e.reference_wer {
                if !file.profiles.contains_key(profile) {
                    return Err(bad(format!(
                        "{what} records a reference for unknown profile `{profile}`"
                    )));
                }
                for set in sets.keys() {
                    known_set(set, &what)?;
                }
            }
            for floors in [&e.min_cosine, &e.min_step_cosine] {
                for (set, floor) in floors {
                    known_set(set, &what)?;
                    if !(floor.is_finite() && *floor <= 1.0) {
                        return Err(bad(format!(
                            "{what}: floor {floor} for `{set}` is not a cosine"
                        )));
                    }
                }
            }
            if let Some(other) = &e.not_below {
                if other == &e.name || !names.contains(other.as_str()) {
                    return Err(bad(format!(
                        "{what}: `not_below` names `{other}`, which is not another entry"
                    )));
                }
            }
        }
        let sets = file
            .sets
            .iter()
            .map(|(name, set)| {
                Ok(GateSet {
                    name: name.clone(),
                    manifest: resolve(&format!("sets.{name}.manifest"), &set.manifest)?,
                })
            })
            .collect::<Result<_>>()?;
        let model = resolve("model", &file.model)?;
        let mut entry_models = BTreeMap::new();
        for e in &file.entries {
            let own = match &e.model {
                None => Some(model.clone()),
                Some(value) => {
                    let key = format!("entry `{}`: `model`", e.name);
                    let expanded =
                        expand(value).map_err(|m| Error::corrupt(path, format!("{key}: {m}")))?;
                    (!expanded.trim().is_empty()).then(|| base.join(expanded))
                }
            };
            entry_models.insert(e.name.clone(), own);
        }
        Ok(GateConfig {
            path: path.to_path_buf(),
            model,
            calib_manifest: resolve("calib_manifest", &file.calib_manifest)?,
            sets,
            tolerance: file.tolerance,
            gpu_cosine_tolerance: file.gpu_cosine_tolerance,
            profiles: file.profiles,
            entries: file.entries,
            entry_models,
        })
    }
}

/// Expands `${VAR}`, `${VAR:-default}` and a leading `~/`.
fn expand(value: &str) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed `${{` in `{value}`"))?;
        let (name, default) = match after[..end].split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (&after[..end], None),
        };
        match (std::env::var(name), default) {
            (Ok(v), _) if !v.is_empty() => out.push_str(&v),
            (_, Some(d)) => out.push_str(d),
            _ => {
                return Err(format!(
                    "environment variable {name} is not set (calib/fetch-assets.sh prints it)"
                ))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if let Some(tail) = out.strip_prefix("~/") {
        let home = std::env::var("HOME").map_err(|_| "`~` needs HOME to be set".to_string())?;
        out = format!("{home}/{tail}");
    }
    Ok(out)
}

/// What a gate run does.
#[derive(Clone, Debug)]
pub struct GateOptions {
    pub profile: String,
    /// Only these entries (all when empty).
    pub only: Vec<String>,
    /// Where the regenerated checkpoints are written (one directory per entry).
    pub work_dir: PathBuf,
    pub served: OutDtype,
    /// Where the quantized GEMMs run. With [`VerifyDevice::Cuda`] every set is also verified on
    /// the CPU reference lane, and each result compares the two ([`LaneComparison`]).
    pub device: VerifyDevice,
}

/// A gate run's progress: entry `entry` is in `stage`, `done` of `total` units.
#[derive(Clone, Debug)]
pub struct GateProgress<'a> {
    pub entry: &'a str,
    pub stage: &'a str,
    pub done: u64,
    pub total: u64,
}

/// Receives progress from every stage of a gate run.
pub type GateProgressFn = Arc<dyn Fn(&GateProgress) + Send + Sync>;

/// One entry's result on one set.
#[derive(Clone, Debug, Serialize)]
pub struct GateResult {
    pub name: String,
    pub recipe: String,
    /// The evaluation set.
    pub set: String,
    pub checkpoint: PathBuf,
    /// Percent.
    pub wer_full_precision: f64,
    /// Percent.
    pub wer_quantized: f64,
    /// The recorded reference for this profile and set (percent), if any.
    pub reference_wer: Option<f64>,
    pub min_cosine: Option<f64>,
    pub min_step_cosine: Option<f64>,
    pub quantize_seconds: f64,
    /// Why the entry fails on this set; empty when it passes.
    pub failures: Vec<String>,
    /// The report of the run's device (the GPU's with `--device cuda`).
    pub verify: VerifyReport,
    /// With `--device cuda`: the same checkpoint and set on the CPU reference lane.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_reference: Option<LaneComparison>,
}

/// A GPU verify report next to the CPU reference's, for the same checkpoint and set.
#[derive(Clone, Debug, Serialize)]
pub struct LaneComparison {
    /// The CPU reference's teacher-forced cosine mean and worst step, and its shift-invariant
    /// figures (centred cosine and softmax KL), which the fp8 lanes agree on more closely than
    /// on the raw cosine (docs/accuracy.md, "fp8 on the GPU").
    pub cosine_mean: f64,
    pub cosine_min: f64,
    pub centered_cosine_mean: f64,
    pub kl_mean: f64,
    /// The CPU reference's quantized WER (percent).
    pub wer_quantized: f64,
    /// GPU minus CPU teacher-forced cosine mean.
    pub cosine_mean_difference: f64,
    /// Whether the two reports agree exactly: transcripts, WER and every logit figure.
    pub identical: bool,
}

impl LaneComparison {
    fn new(gpu: &VerifyReport, cpu: &VerifyReport) -> Self {
        LaneComparison {
            cosine_mean: cpu.teacher_forced.cosine_mean,
            cosine_min: cpu.teacher_forced.cosine_min,
            centered_cosine_mean: cpu.teacher_forced.centered_cosine_mean,
            kl_mean: cpu.teacher_forced.kl_mean,
            wer_quantized: cpu.wer_quantized.unwrap_or(f64::NAN) * 100.0,
            cosine_mean_difference: gpu.teacher_forced.cosine_mean - cpu.teacher_forced.cosine_mean,
            identical: gpu.transcripts == cpu.transcripts
                && gpu.wer_quantized == cpu.wer_quantized
                && gpu.teacher_forced == cpu.teacher_forced
                && gpu.free_running == cpu.free_running,
        }
    }
}

impl GateResult {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// A whole gate run.
#[derive(Clone, Debug, Serialize)]
pub struct GateReport {
    pub gate: PathBuf,
    pub profile: String,
    /// Utterances verified per set.
    pub gate_utterances: BTreeMap<String, usize>,
    pub tolerance: f64,
    /// Per entry, then per set.
    pub results: Vec<GateResult>,
    /// Entries that did not run, with why (a model path that is not configured).
    pub skipped: Vec<SkippedEntry>,
}

/// An entry a gate run did not run.
#[derive(Clone, Debug, Serialize)]
pub struct SkippedEntry {
    pub name: String,
    pub reason: String,
}

impl GateReport {
    pub fn passed(&self) -> bool {
        self.results.iter().all(GateResult::passed)
    }
}

/// Regenerates and verifies the selected entries, one after another.
pub fn run_gate(
    config: &GateConfig,
    options: &GateOptions,
    progress: GateProgressFn,
) -> Result<GateReport> {
    let profile = config.profiles.get(&options.profile).ok_or_else(|| {
        Error::option(
            "--profile",
            format!(
                "`{}` is not a profile of {} (it has: {})",
                options.profile,
                crate::error::shown(&config.path),
                config
                    .profiles
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    for name in &options.only {
        if !config.entries.iter().any(|e| &e.name == name) {
            return Err(Error::option(
                "--only",
                format!(
                    "`{name}` is not an entry of {}",
                    crate::error::shown(&config.path)
                ),
            ));
        }
    }
    crate::verify::check_device(options.device)?;
    let limit = profile.gate_utterances;
    let mut sets = Vec::new();
    for set in &config.sets {
        if profile
            .sets
            .as_ref()
            .is_some_and(|s| !s.contains(&set.name))
        {
            continue;
        }
        sets.push((set, Manifest::read(&set.manifest, None)?));
    }
    let gate_utterances = sets
        .iter()
        .map(|(set, m)| {
            let n = limit.unwrap_or(usize::MAX).min(m.utterances.len());
            (set.name.clone(), n)
        })
        .collect();
    std::fs::create_dir_all(&options.work_dir).map_err(|e| Error::io(&options.work_dir, e))?;
    let mut skipped = Vec::new();
    // The SmoothQuant entries of one model calibrate on the same set: one first pass for all.
    let shared = SharedObservations::default();
    let mut built: Vec<Built> = Vec::new();
    for entry in &config.entries {
        if !options.only.is_empty() && !options.only.contains(&entry.name) {
            continue;
        }
        let Some(model) = config.entry_models.get(&entry.name).cloned().flatten() else {
            skipped.push(SkippedEntry {
                name: entry.name.clone(),
                reason: format!(
                    "its model path `{}` is not configured (set the variable it names to a \
                     model directory to run it)",
                    entry.model.as_deref().unwrap_or_default()
                ),
            });
            continue;
        };
        let dst = options.work_dir.join(&entry.name);
        let started = std::time::Instant::now();
        let recipe = Recipe::load(&entry.recipe).map_err(|e| in_entry(entry, e))?;
        quantizer_for(
            config,
            &model,
            profile,
            entry,
            &recipe,
            &dst,
            progress.clone(),
        )
        .map(|q| q.share_observations(shared.clone()))
        .and_then(Quantizer::run)
        .map_err(|e| in_entry(entry, e))?;
        built.push(Built {
            entry,
            fp8: recipe.scheme.dtype() == QuantDtype::Float8E4m3fn,
            model,
            dst,
            quantize_seconds: started.elapsed().as_secs_f64(),
        });
    }
    // Entries of one model and search are verified together, so the full-precision model runs
    // once per utterance for all of them.
    let mut groups: Vec<Vec<&Built>> = Vec::new();
    for b in &built {
        match groups.iter_mut().find(|g| {
            g[0].model == b.model && g[0].entry.decode_options() == b.entry.decode_options()
        }) {
            Some(group) => group.push(b),
            None => groups.push(vec![b]),
        }
    }
    let mut by_entry: BTreeMap<&str, Vec<GateResult>> = BTreeMap::new();
    for group in &groups {
        let label = match group.as_slice() {
            [one] => one.entry.name.clone(),
            many => format!("{} entries", many.len()),
        };
        let dsts: Vec<&Path> = group.iter().map(|b| b.dst.as_path()).collect();
        for (set, manifest) in &sets {
            let stage = format!("verifying {}", set.name);
            let verify_on = |device: VerifyDevice, stage: &str| {
                let verify_options = VerifyOptions {
                    limit,
                    served: options.served,
                    device,
                    decode: group[0].entry.decode_options(),
                    ..VerifyOptions::default()
                };
                verify_many(
                    &dsts,
                    &group[0].model,
                    manifest,
                    &verify_options,
                    |done, total, _| {
                        progress(&GateProgress {
                            entry: &label,
                            stage,
                            done: done as u64,
                            total: total as u64,
                        })
                    },
                )
                .map_err(|e| match e {
                    Error::Checkpoint { path, error } => {
                        match group.iter().find(|b| b.dst == path) {
                            Some(b) => in_entry(b.entry, *error),
                            None => Error::Checkpoint { path, error },
                        }
                    }
                    e if group.len() == 1 => in_entry(group[0].entry, e),
                    e => e,
                })
            };
            let reports = verify_on(options.device, &stage)?;
            let cpu_reports = match options.device {
                VerifyDevice::Cpu => None,
                VerifyDevice::Cuda => Some(verify_on(
                    VerifyDevice::Cpu,
                    &format!("{stage} on the cpu"),
                )?),
            };
            for (i, (b, report)) in group.iter().zip(reports).enumerate() {
                let mut result = judge(
                    b.entry,
                    &set.name,
                    &options.profile,
                    config.tolerance,
                    b.dst.clone(),
                    b.quantize_seconds,
                    report,
                );
                if let Some(cpu) = cpu_reports.as_ref().and_then(|r| r.get(i)) {
                    judge_lanes(&mut result, cpu, b.fp8, config.gpu_cosine_tolerance);
                }
                by_entry.entry(&b.entry.name).or_default().push(result);
            }
        }
    }
    // Reported in the gate file's order, each entry's sets together.
    let mut results: Vec<GateResult> = built
        .iter()
        .flat_map(|b| by_entry.remove(b.entry.name.as_str()).unwrap_or_default())
        .collect();
    compare_baselines(config, &mut results);
    Ok(GateReport {
        gate: config.path.clone(),
        profile: options.profile.clone(),
        gate_utterances,
        tolerance: config.tolerance,
        results,
        skipped,
    })
}

/// An entry's regenerated checkpoint.
struct Built<'a> {
    entry: &'a GateEntry,
    /// Whether its recipe's scheme is fp8 (judged against the CPU within a tolerance on the GPU).
    fp8: bool,
    model: PathBuf,
    dst: PathBuf,
    quantize_seconds: f64,
}

fn in_entry(entry: &GateEntry, error: Error) -> Error {
    Error::GateEntry {
        entry: entry.name.clone(),
        error: Box::new(error),
    }
}

/// The `not_below` rule: an entry's teacher-forced cosine mean on a set must reach its
/// baseline entry's on the same set (when both ran).
fn compare_baselines(config: &GateConfig, results: &mut [GateResult]) {
    let mean_of = |results: &[GateResult], entry: &str, set: &str| {
        results
            .iter()
            .find(|r| r.name == entry && r.set == set)
            .map(|r| r.verify.teacher_forced.cosine_mean)
    };
    for i in 0..results.len() {
        let Some(entry) = config.entries.iter().find(|e| e.name == results[i].name) else {
            continue;
        };
        let Some(baseline) = &entry.not_below else {
            continue;
        };
        let mine = results[i].verify.teacher_forced.cosine_mean;
        if let Some(theirs) = mean_of(results, baseline, &results[i].set) {
            if below(mine, theirs) {
                results[i].failures.push(format!(
                    "teacher-forced logit cosine {mine:.6} is below `{baseline}`'s {theirs:.6}"
                ));
            }
        }
    }
}

fn quantizer_for(
    config: &GateConfig,
    model: &Path,
    profile: &Profile,
    entry: &GateEntry,
    recipe: &Recipe,
    dst: &Path,
    progress: GateProgressFn,
) -> Result<Quantizer> {
    let mut q = Quantizer::new(model, dst)
        .recipe(&entry.recipe)
        .quantize_kept(entry.quantize_kept)
        .overwrite(true);
    for (key, value) in &entry.options {
        q = q.option(format!("{key}={value}"));
    }
    if let Some(kinds) = &entry.module_types {
        q = q.module_types(ModuleKind::parse_list(kinds)?);
    }
    for glob in &entry.ignore {
        q = q.ignore(glob);
    }
    if recipe.calibration {
        // An entry's search steers calibration and verification; a recipe that does not
        // calibrate takes it for verification only.
        q = q
            .calib_manifest(&config.calib_manifest)
            .decode_options(entry.decode_options());
        if let Some(n) = profile.calib_utterances {
            q = q.calib_utterances(n);
        }
    }
    let name = entry.name.clone();
    Ok(q.on_progress(move |p: &Progress| {
        progress(&GateProgress {
            entry: &name,
            stage: p.stage.name(),
            done: p.done,
            total: p.total,
        })
    }))
}

/// Compares one verify report with the entry's recorded reference and floors for its set.
fn judge(
    entry: &GateEntry,
    set: &str,
    profile: &str,
    tolerance: f64,
    checkpoint: PathBuf,
    quantize_seconds: f64,
    report: VerifyReport,
) -> GateResult {
    let percent = |w: Option<f64>| w.unwrap_or(f64::NAN) * 100.0;
    let (wer_fp, wer_q) = (
        percent(report.wer_full_precision),
        percent(report.wer_quantized),
    );
    let reference = entry
        .reference_wer
        .get(profile)
        .and_then(|sets| sets.get(set))
        .copied();
    let mut failures = Vec::new();
    if report.wer_quantized.is_none() {
        failures.push(format!("set `{set}` has no `text`, so there is no WER"));
    }
    match reference {
        None => failures.push(format!(
            "no reference WER recorded for profile `{profile}`, set `{set}` (record one with --record)"
        )),
        Some(r) if wer_q.is_nan() || wer_q > r + tolerance => failures.push(format!(
            "WER {wer_q:.2}% exceeds the reference {r:.2}% + {tolerance:.2}"
        )),
        Some(_) => {}
    }
    if report.nonfinite > 0 {
        failures.push(format!("{} non-finite values", report.nonfinite));
    }
    let (min_cosine, min_step_cosine) = (
        entry.min_cosine.get(set).copied(),
        entry.min_step_cosine.get(set).copied(),
    );
    let tf = &report.teacher_forced;
    if let Some(floor) = min_cosine {
        if below(tf.cosine_mean, floor) {
            failures.push(format!(
                "teacher-forced logit cosine {:.6} is below {floor}",
                tf.cosine_mean
            ));
        }
    }
    if let Some(floor) = min_step_cosine {
        if below(tf.cosine_min, floor) {
            failures.push(format!(
                "worst teacher-forced step's cosine {:.6} is below {floor}",
                tf.cosine_min
            ));
        }
    }
    GateResult {
        name: entry.name.clone(),
        recipe: entry.recipe.clone(),
        set: set.to_string(),
        checkpoint,
        wer_full_precision: wer_fp,
        wer_quantized: wer_q,
        reference_wer: reference,
        min_cosine,
        min_step_cosine,
        quantize_seconds,
        failures,
        verify: report,
        cpu_reference: None,
    }
}

/// With `--device cuda`: an int8 checkpoint's GPU report must equal the CPU reference's (its
/// GEMMs are exact on both), an fp8 one's teacher-forced cosine mean may fall at most
/// `tolerance` below the CPU's (fp8 tensor cores accumulate in another order and precision).
fn judge_lanes(result: &mut GateResult, cpu: &VerifyReport, fp8: bool, tolerance: f64) {
    let lanes = LaneComparison::new(&result.verify, cpu);
    if !fp8 && !lanes.identical {
        result.failures.push(
            "the GPU report differs from the CPU reference's (int8 must be bit-identical)".into(),
        );
    }
    if below(lanes.cosine_mean_difference, -tolerance) {
        result.failures.push(format!(
            "GPU teacher-forced logit cosine {:.6} is {:.6} below the CPU reference's {:.6} \
             (tolerance {tolerance})",
            result.verify.teacher_forced.cosine_mean,
            -lanes.cosine_mean_difference,
            lanes.cosine_mean
        ));
    }
    result.cpu_reference = Some(lanes);
}

/// A NaN is below every floor.
fn below(value: f64, floor: f64) -> bool {
    value.is_nan() || value < floor
}

/// Writes each result's quantized WER as its entry's reference for `profile`, in place (the rest
/// of the file, comments included, is kept) and atomically. Refuses results that fail for any
/// reason other than the WER itself: a reference is never recorded from a broken checkpoint.
pub fn record(config: &GateConfig, profile: &str, results: &[GateResult]) -> Result<()> {
    for r in results {
        if r.verify.nonfinite > 0 || !r.wer_quantized.is_finite() {
            return Err(Error::option(
                "--record",
                format!(
                    "entry `{}` has no valid WER to record on `{}`",
                    r.name, r.set
                ),
            ));
        }
        let missed = r
            .failures
            .iter()
            .find(|f| !f.starts_with("WER ") && !f.starts_with("no reference"));
        if let Some(why) = missed {
            return Err(Error::option(
                "--record",
                format!(
                    "entry `{}` on `{}`: {why}; fix it before recording",
                    r.name, r.set
                ),
            ));
        }
    }
    let path = &config.path;
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| Error::corrupt(path, format!("invalid gate file: {e}")))?;
    let entries = doc
        .get_mut("entry")
        .and_then(|e| e.as_array_of_tables_mut())
        .ok_or_else(|| Error::corrupt(path, "no [[entry]] tables"))?;
    for r in results {
        let table = entries
            .iter_mut()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(r.name.as_str()))
            .ok_or_else(|| Error::corrupt(path, format!("entry `{}` is gone", r.name)))?;
        let not_table = || {
            Error::corrupt(
                path,
                format!("entry `{}`: reference_wer.{profile} is not a table", r.name),
            )
        };
        let refs = table
            .entry("reference_wer")
            .or_insert_with(|| {
                // Implicit: only its profile tables get a header, not an empty [entry.reference_wer].
                let mut t = toml_edit::Table::new();
                t.set_implicit(true);
                toml_edit::Item::Table(t)
            })
            .as_table_like_mut()
            .ok_or_else(not_table)?
            .entry(profile)
            .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()))
            .as_table_like_mut()
            .ok_or_else(not_table)?;
        // Two decimals: the WER of a few hundred words moves in steps far larger than that.
        let value = (r.wer_quantized * 100.0).round() / 100.0;
        refs.insert(&r.set, toml_edit::value(value));
    }
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, doc.to_string()).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_variables_defaults_and_home() {
        std::env::set_var("OASR_GATE_TEST_VAR", "/data");
        assert_eq!(expand("${OASR_GATE_TEST_VAR}/m").unwrap(), "/data/m");
        assert_eq!(expand("${OASR_GATE_TEST_UNSET:-/x}/m").unwrap(), "/x/m");
        assert!(expand("${OASR_GATE_TEST_UNSET}/m")
            .unwrap_err()
            .contains("OASR_GATE_TEST_UNSET"));
        assert!(expand("${OASR_GATE_TEST_VAR").is_err());
        let home = std::env::var("HOME").unwrap();
        assert_eq!(expand("~/a").unwrap(), format!("{home}/a"));
    }

    #[test]
    fn an_entry_s_padding_reaches_its_decode_options() {
        let entry = |extra: &str| -> std::result::Result<GateEntry, toml::de::Error> {
            toml::from_str(&format!(
                "name = \"e\"\nrecipe = \"int8_w8a8_rtn\"\n{extra}"
            ))
        };
        let hf = entry("padding = \"feature-extractor\"").unwrap();
        assert_eq!(
            hf.decode_options().padding,
            Some(LogMelPadding::FeatureExtractor)
        );
        assert_eq!(entry("").unwrap().decode_options().padding, None);
        assert!(entry("padding = \"audio\"").is_err());
    }
}
