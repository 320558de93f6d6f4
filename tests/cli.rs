//! The command line, end to end on the real model.

mod common;

use common::cli;

#[test]
fn quantize_inspect_and_recipes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::tiny_en();
    let dst = tmp.path().join("q");
    let (ok, out, err) = cli(&[
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
        "--recipe",
        "int8_w8a8_rtn",
        "--json",
    ]);
    assert!(ok, "{err}");
    let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(summary["quantized_layers"], 64);

    let (ok, out, err) = cli(&["inspect", dst.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["format_version"], 2);
    assert_eq!(s["layers_by_kind_and_scheme"]["linear / int8_w8a8"], 64);
    assert_eq!(
        s["skipped"]["encoder.conv1"],
        "module type conv1d not selected"
    );
    assert_eq!(s["producer"]["recipe"], "int8_w8a8_rtn");

    let (ok, out, _) = cli(&["inspect", dst.to_str().unwrap()]);
    assert!(
        ok && out.contains("64  linear / int8_w8a8") && out.contains("fingerprint"),
        "{out}"
    );
    let (ok, out, _) = cli(&["inspect", src.to_str().unwrap()]);
    assert!(
        ok && out.contains("ctranslate2_whisper") && out.contains("full precision"),
        "{out}"
    );

    let (ok, out, _) = cli(&["recipes"]);
    assert!(ok);
    // One line per recipe, and a second for the nine that keep layers full precision.
    assert_eq!(out.lines().count(), 20, "{out}");
    assert_eq!(
        out.matches("keeps full precision: decoder.layers.*.fc2")
            .count(),
        9,
        "{out}"
    );
    assert!(out.lines().next().unwrap().starts_with("int8_w8a8_rtn "));

    // A user recipe file works like a built-in one.
    let recipe = tmp.path().join("mine.toml");
    std::fs::write(&recipe, "name = 'mine'\nsummary = 'fp8 linear only'\nscheme = 'fp8_w8a8'\nmodule_types = ['linear']\n[[algorithms]]\nname = 'rtn'\n").unwrap();
    let (ok, _, err) = cli(&[
        src.to_str().unwrap(),
        tmp.path().join("mine").to_str().unwrap(),
        "--recipe",
        recipe.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
}

#[test]
fn errors_exit_non_zero_and_name_the_fault() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::tiny_en();
    let dst = tmp.path().join("q");
    let run = |args: &[&str]| {
        let (ok, _, err) = cli(args);
        assert!(!ok, "{args:?} should fail");
        err
    };
    let s = src.to_str().unwrap();
    let d = dst.to_str().unwrap();
    assert!(run(&[s, d, "--recipe", "nope"]).contains("recipe `nope`"));
    assert!(run(&[s, d, "--recipe", "smoothquant_w8a8"]).contains("--calib-manifest"));
    assert!(run(&[s, d, "--module-types", "lstm"]).contains("lstm"));
    assert!(run(&[s, d, "--option", "rtn.alpha=1"]).contains("rtn.alpha"));
    assert!(run(&[s, s]).contains("is the input"));
    // Static-scale and convolution misuse is refused before any work, naming the option.
    let calib = common::manifests().0;
    let c = calib.to_str().unwrap();
    let fused = [
        s,
        d,
        "--recipe",
        "smoothquant_w8a8_fused",
        "--calib-manifest",
        c,
    ];
    assert!(
        run(&[&fused[..], &["--option", "static_inputs.observer=kl"]].concat())
            .contains("static_inputs.observer")
    );
    assert!(run(&[
        &fused[..],
        &["--option", "static_inputs.exclude=conformer.*"]
    ]
    .concat())
    .contains("static_inputs.exclude"));
    assert!(run(&[
        s,
        d,
        "--recipe",
        "fp8_w8a8_rtn",
        "--module-types",
        "linear,conv1d"
    ])
    .contains("--module-types"));
    assert!(run(&[s, d, "--module-types", "linear,conv1d"]).contains("--calib-manifest"));
    // GPTQ whose Σ x xᵀ cannot fit the budget is refused before calibration, naming the recipe.
    let gptq = [
        s,
        d,
        "--recipe",
        "smoothquant_fp8_w8a8_gptq",
        "--calib-manifest",
        c,
    ];
    let e = run(&[&gptq[..], &["--gptq-memory", "0.01"]].concat());
    assert!(
        e.contains("smoothquant_fp8_w8a8_gptq") && e.contains("gptq:"),
        "{e}"
    );
    assert!(run(&[&gptq[..], &["--gptq-memory", "0"]].concat()).contains("--gptq-memory"));
    assert!(!dst.exists());
    // A search option that nothing would use, or that the architecture's search lacks.
    assert!(run(&[s, d, "--beam-size", "4"]).contains("--beam-size"));
    let e = run(&[
        "transcribe",
        s,
        "--manifest",
        c,
        "--limit",
        "1",
        "--ctc-weight",
        "0.3",
    ]);
    assert!(e.contains("--ctc-weight") && e.contains("Whisper"), "{e}");
    assert!(run(&["inspect", tmp.path().to_str().unwrap()]).contains("not a checkpoint"));
    assert!(run(&["convert", "/nonexistent/model", d]).contains("/nonexistent/model"));
    assert!(!dst.exists());

    let (ok, _, err) = cli(&["convert", s, d]);
    assert!(ok, "{err}");
    assert!(run(&["convert", s, d]).contains("--overwrite"));
    let (ok, _, err) = cli(&["convert", s, d, "--overwrite"]);
    assert!(ok, "{err}");
}

/// An error's cause is printed once: the message already contains it, so no chain repeats it.
#[test]
fn error_messages_do_not_repeat_their_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-source");
    let (ok, _, err) = cli(&[
        missing.to_str().unwrap(),
        tmp.path().join("out").to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("no-such-source"), "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    assert!(!tmp.path().join("out").exists());
}
