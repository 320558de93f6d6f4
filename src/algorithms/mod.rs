//! The quantization algorithms, registered by name. A recipe names them; an algorithm that is
//! known but not implemented in this version is refused by name.

pub mod gptq;
pub mod rtn;
pub mod smoothquant;
pub mod static_inputs;
mod working;

pub use working::WorkingTensors;

use crate::error::{Error, Result};

/// A registered algorithm: its name, its options, and whether this version implements it.
struct Registered {
    name: &'static str,
    options: &'static [&'static str],
    /// `None` when implemented; otherwise what to do instead.
    missing: Option<&'static str>,
    what: &'static str,
}

const REGISTRY: &[Registered] = &[
    Registered {
        name: "rtn",
        options: &[],
        missing: None,
        what: "round-to-nearest weights per output channel",
    },
    Registered {
        name: "gptq",
        options: &["damp", "act_order"],
        missing: None,
        what: "GPTQ weights per output channel: rounding error compensated with calibration inputs",
    },
    Registered {
        name: "smoothquant",
        options: &[
            "alpha",
            "static_alpha",
            "runtime",
            "floor",
            "shared_folds",
            "search",
            "search_rows",
        ],
        missing: None,
        what: "SmoothQuant activation smoothing from calibration",
    },
    Registered {
        name: "static_inputs",
        options: &[
            "observer",
            "percentile",
            "exclude",
            "max_error_ratio",
            "decoder",
            "headroom",
        ],
        missing: None,
        what: "calibrated static input scales of GEMM-chain consumers",
    },
    Registered {
        name: "static_conv_inputs",
        options: &["observer", "percentile"],
        missing: None,
        what: "calibrated static input scales of convolutions",
    },
];

fn find(name: &str) -> Result<&'static Registered> {
    REGISTRY.iter().find(|r| r.name == name).ok_or_else(|| {
        Error::option(
            "algorithm",
            format!(
                "unknown algorithm `{name}`; known: {}",
                REGISTRY
                    .iter()
                    .map(|r| r.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// The order algorithms run in, as recipe errors state it.
pub const ORDER: &str =
    "smoothquant, then static_inputs and static_conv_inputs (either order), then one weight \
     quantizer: rtn or gptq";

/// An algorithm's place in [`ORDER`]: smoothing changes the inputs the static scales observe, and
/// the weight quantizer (`rtn` or `gptq`) quantizes the weights every earlier step has rewritten.
pub fn stage(name: &str) -> u8 {
    match name {
        "smoothquant" => 0,
        "static_inputs" | "static_conv_inputs" => 1,
        _ => 2,
    }
}

/// Whether the algorithm needs calibration audio.
pub fn calibrates(name: &str) -> bool {
    matches!(
        name,
        "smoothquant" | "static_inputs" | "static_conv_inputs" | "gptq"
    )
}

/// Whether the algorithm is the recipe's weight quantizer (its last step).
pub fn quantizes_weights(name: &str) -> bool {
    matches!(name, "rtn" | "gptq")
}

/// Errors unless `name` is a registered algorithm (implemented or not).
pub fn check_known(name: &str) -> Result<()> {
    find(name).map(|_| ())
}

/// Errors unless `option` is one of the algorithm's options.
pub fn check_option(name: &str, option: &str) -> Result<()> {
    let r = find(name)?;
    if r.options.contains(&option) {
        return Ok(());
    }
    let known = if r.options.is_empty() {
        "it takes no options".to_string()
    } else {
        format!("its options: {}", r.options.join(", "))
    };
    Err(Error::option(
        format!("{name}.{option}"),
        format!("unknown option of `{name}`; {known}"),
    ))
}

/// Errors, by name, when this version does not implement the algorithm.
pub fn check_implemented(name: &str, recipe: &str) -> Result<()> {
    let r = find(name)?;
    match r.missing {
        None => Ok(()),
        Some(instead) => Err(Error::NotImplemented {
            what: format!(
                "algorithm `{name}` ({}), needed by recipe `{recipe}`",
                r.what
            ),
            detail: instead.into(),
        }),
    }
}
