use super::WhisperConfig;
use crate::format::{ModuleKind, SmoothFold};
use crate::models::{GemmChainLayout, QuantizableLayer, QuantizationLayout, SmoothGroup};
use crate::numerics::Activation;

fn linear(name: String, out_features: usize, in_features: usize) -> QuantizableLayer {
    QuantizableLayer {
        name,
        kind: ModuleKind::Linear,
        out_features,
        in_features,
        groups: 1,
    }
}

/// Every tensor a Whisper checkpoint stores under OASR names, with its shape.
pub fn expected_tensors(c: &WhisperConfig) -> Vec<(String, Vec<usize>)> {
    let d = c.d_model;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("encoder.conv1.weight".into(), vec![d, 3, c.num_mel_bins]),
        ("encoder.conv1.bias".into(), vec![d]),
        ("encoder.conv2.weight".into(), vec![d, 3, d]),
        ("encoder.conv2.bias".into(), vec![d]),
        (
            "encoder.embed_positions.weight".into(),
            vec![c.max_source_positions, d],
        ),
        ("encoder.layer_norm.weight".into(), vec![d]),
        ("encoder.layer_norm.bias".into(), vec![d]),
        ("decoder.embed_tokens.weight".into(), vec![c.vocab_size, d]),
        (
            "decoder.embed_positions.weight".into(),
            vec![c.max_target_positions, d],
        ),
        ("decoder.layer_norm.weight".into(), vec![d]),
        ("decoder.layer_norm.bias".into(), vec![d]),
    ];
    let attention = |t: &mut Vec<_>, prefix: String| {
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            t.push((format!("{prefix}.{proj}.weight"), vec![d, d]));
            // Whisper's k projection has no bias.
            if proj != "k_proj" {
                t.push((format!("{prefix}.{proj}.bias"), vec![d]));
            }
        }
    };
    let norm = |t: &mut Vec<(String, Vec<usize>)>, name: String| {
        t.push((format!("{name}.weight"), vec![d]));
        t.push((format!("{name}.bias"), vec![d]));
    };
    for (side, layers, ffn) in [
        ("encoder", c.encoder_layers, c.encoder_ffn_dim),
        ("decoder", c.decoder_layers, c.decoder_ffn_dim),
    ] {
        for i in 0..layers {
            let p = format!("{side}.layers.{i}");
            attention(&mut t, format!("{p}.self_attn"));
            norm(&mut t, format!("{p}.self_attn_layer_norm"));
            if side == "decoder" {
                attention(&mut t, format!("{p}.encoder_attn"));
                norm(&mut t, format!("{p}.encoder_attn_layer_norm"));
            }
            t.push((format!("{p}.fc1.weight"), vec![ffn, d]));
            t.push((format!("{p}.fc1.bias"), vec![ffn]));
            t.push((format!("{p}.fc2.weight"), vec![d, ffn]));
            t.push((format!("{p}.fc2.bias"), vec![d]));
            norm(&mut t, format!("{p}.final_layer_norm"));
        }
    }
    t
}

/// Whisper's quantizable layers, smoothing groups and GEMM chains (docs/recipes.md).
pub fn quantization_layout(c: &WhisperConfig) -> QuantizationLayout {
    let d = c.d_model;
    let mut l = QuantizationLayout {
        layers: vec![
            QuantizableLayer {
                name: "encoder.conv1".into(),
                kind: ModuleKind::Conv1d,
                out_features: d,
                in_features: c.num_mel_bins,
                groups: 1,
            },
            QuantizableLayer {
                name: "encoder.conv2".into(),
                kind: ModuleKind::Conv1d,
                out_features: d,
                in_features: d,
                groups: 1,
            },
        ],
        kept_full_precision: vec![
            (
                "encoder.embed_positions.weight".into(),
                "position table".into(),
            ),
            (
                "decoder.embed_positions.weight".into(),
                "position table".into(),
            ),
            (
                "decoder.embed_tokens.weight".into(),
                "token embedding, tied to the output head".into(),
            ),
        ],
        ..Default::default()
    };
    let group = |producer: Option<String>, fold, consumers: Vec<String>, fuse| SmoothGroup {
        producer,
        fold,
        consumers,
        fuse_output_quant: fuse,
        producer_rows_from: 0,
    };
    for (side, layers, ffn) in [
        ("encoder", c.encoder_layers, c.encoder_ffn_dim),
        ("decoder", c.decoder_layers, c.decoder_ffn_dim),
    ] {
        for i in 0..layers {
            let p = format!("{side}.layers.{i}");
            let attn = |kind: &str, l: &mut QuantizationLayout, norm: &str, cross: bool| {
                let a = format!("{p}.{kind}");
                for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    l.layers.push(linear(format!("{a}.{proj}"), d, d));
                }
                let qkv =
                    |projs: &[&str]| projs.iter().map(|x| format!("{a}.{x}")).collect::<Vec<_>>();
                if cross {
                    // The query reads the norm; keys and values read the encoder output, which
                    // has no norm of its own to fold into: a runtime smoother.
                    l.smooth_groups.push(group(
                        Some(format!("{p}.{norm}")),
                        SmoothFold::NormAffine,
                        qkv(&["q_proj"]),
                        true,
                    ));
                    l.smooth_groups.push(group(
                        None,
                        SmoothFold::Runtime,
                        qkv(&["k_proj", "v_proj"]),
                        false,
                    ));
                } else {
                    l.smooth_groups.push(group(
                        Some(format!("{p}.{norm}")),
                        SmoothFold::NormAffine,
                        qkv(&["q_proj", "k_proj", "v_proj"]),
                        true,
                    ));
                }
                l.smooth_groups.push(group(
                    Some(format!("{a}.v_proj")),
                    SmoothFold::VToO,
                    qkv(&["out_proj"]),
                    false,
                ));
            };
            attn("self_attn", &mut l, "self_attn_layer_norm", false);
            if side == "decoder" {
                attn("encoder_attn", &mut l, "encoder_attn_layer_norm", true);
            }
            l.layers.push(linear(format!("{p}.fc1"), ffn, d));
            l.layers.push(linear(format!("{p}.fc2"), d, ffn));
            l.smooth_groups.push(group(
                Some(format!("{p}.final_layer_norm")),
                SmoothFold::NormAffine,
                vec![format!("{p}.fc1")],
                true,
            ));
            // GELU is not positively homogeneous, so 1/s cannot cross it into fc1's rows.
            l.smooth_groups.push(group(
                None,
                SmoothFold::Runtime,
                vec![format!("{p}.fc2")],
                false,
            ));
            l.gemm_chains.push(GemmChainLayout {
                producer: format!("{p}.fc1"),
                consumer: format!("{p}.fc2"),
                activation: Activation::Gelu,
                decode_step: side == "decoder",
            });
        }
    }
    // The encoder output feeds nothing but the cross-attention keys and values.
    l.shared_folds.push(group(
        Some("encoder.layer_norm".into()),
        SmoothFold::NormAffine,
        (0..c.decoder_layers)
            .flat_map(|i| {
                ["k_proj", "v_proj"].map(|p| format!("decoder.layers.{i}.encoder_attn.{p}"))
            })
            .collect(),
        false,
    ));
    l.batch_invariant = l
        .layers
        .iter()
        .filter(|x| x.kind == ModuleKind::Linear)
        .map(|x| x.name.clone())
        .collect();
    l.decode_step_layers = l
        .layers
        .iter()
        .filter(|x| x.name.starts_with("decoder."))
        .map(|x| x.name.clone())
        .collect();
    l
}
