//! The U2++ Conformer under OASR names: every stored tensor, and the quantization layout
//! (docs/conformer.md has the table).

use super::ConformerConfig;
use crate::format::{ModuleKind, SmoothFold};
use crate::models::{GemmChainLayout, QuantizableLayer, QuantizationLayout, SmoothGroup};
use crate::numerics::Activation;

/// The decoders' module prefixes: the left (and right) decoder of a bitransformer, or the one
/// decoder of a transformer.
pub fn decoder_prefixes(c: &ConformerConfig) -> Vec<(&'static str, usize)> {
    if c.has_right_decoder() {
        vec![
            ("decoder.left_decoder", c.decoder_left_blocks),
            ("decoder.right_decoder", c.decoder_right_blocks),
        ]
    } else {
        vec![("decoder", c.decoder_left_blocks)]
    }
}

/// Every tensor a Conformer checkpoint stores under OASR names, with its shape. Convolutions
/// are stored with the output channels first and the input channels last: the subsampling
/// convolutions `[out, kh, kw, in]`, the pointwise ones `[out, 1, in]`, the depthwise one
/// `[kernel, 1, channels]`.
pub fn expected_tensors(c: &ConformerConfig) -> Vec<(String, Vec<usize>)> {
    let d = c.d_model;
    let k = super::config::SUBSAMPLING_KERNEL;
    let mut t: Vec<(String, Vec<usize>)> = Vec::new();
    let linear = |t: &mut Vec<(String, Vec<usize>)>, name: String, out: usize, inp: usize| {
        t.push((format!("{name}.weight"), vec![out, inp]));
        t.push((format!("{name}.bias"), vec![out]));
    };
    let norm = |t: &mut Vec<(String, Vec<usize>)>, name: String| {
        t.push((format!("{name}.weight"), vec![d]));
        t.push((format!("{name}.bias"), vec![d]));
    };
    t.push(("encoder.embed.convs.0.weight".into(), vec![d, k, k, 1]));
    t.push(("encoder.embed.convs.0.bias".into(), vec![d]));
    t.push(("encoder.embed.convs.1.weight".into(), vec![d, k, k, d]));
    t.push(("encoder.embed.convs.1.bias".into(), vec![d]));
    linear(
        &mut t,
        "encoder.embed.out".into(),
        d,
        d * c.subsampled_bins(),
    );
    let (h, dk) = (c.encoder_heads, c.encoder_head_dim());
    for i in 0..c.encoder_blocks {
        let p = format!("encoder.encoders.{i}");
        for ff in ["feed_forward_macaron", "feed_forward"] {
            linear(&mut t, format!("{p}.{ff}.w_1"), c.encoder_linear_units, d);
            linear(&mut t, format!("{p}.{ff}.w_2"), d, c.encoder_linear_units);
        }
        linear(&mut t, format!("{p}.self_attn.linear_qkv"), 3 * d, d);
        linear(&mut t, format!("{p}.self_attn.linear_out"), d, d);
        t.push((format!("{p}.self_attn.linear_pos.weight"), vec![d, d]));
        t.push((format!("{p}.self_attn.pos_bias_u"), vec![h, dk]));
        t.push((format!("{p}.self_attn.pos_bias_v"), vec![h, dk]));
        let m = format!("{p}.conv_module");
        t.push((format!("{m}.pointwise_conv1.weight"), vec![2 * d, 1, d]));
        t.push((format!("{m}.pointwise_conv1.bias"), vec![2 * d]));
        t.push((
            format!("{m}.depthwise_conv.weight"),
            vec![c.cnn_module_kernel, 1, d],
        ));
        t.push((format!("{m}.depthwise_conv.bias"), vec![d]));
        norm(&mut t, format!("{m}.norm_activation"));
        if c.cnn_module_norm == "batch_norm" {
            t.push((format!("{m}.norm_activation.running_mean"), vec![d]));
            t.push((format!("{m}.norm_activation.running_var"), vec![d]));
        }
        t.push((format!("{m}.pointwise_conv2.weight"), vec![d, 1, d]));
        t.push((format!("{m}.pointwise_conv2.bias"), vec![d]));
        for n in [
            "norm_ff_macaron",
            "norm_mha",
            "norm_conv",
            "norm_ff",
            "norm_final",
        ] {
            norm(&mut t, format!("{p}.{n}"));
        }
    }
    norm(&mut t, "encoder.after_norm".into());
    linear(&mut t, "ctc.ctc_lo".into(), c.padded_vocab(), d);
    for (prefix, blocks) in decoder_prefixes(c) {
        t.push((format!("{prefix}.embed.0.weight"), vec![c.vocab_size, d]));
        for i in 0..blocks {
            let q = format!("{prefix}.decoders.{i}");
            for att in ["self_attn", "src_attn"] {
                for proj in ["linear_q", "linear_k", "linear_v", "linear_out"] {
                    linear(&mut t, format!("{q}.{att}.{proj}"), d, d);
                }
            }
            linear(
                &mut t,
                format!("{q}.feed_forward.w_1"),
                c.decoder_linear_units,
                d,
            );
            linear(
                &mut t,
                format!("{q}.feed_forward.w_2"),
                d,
                c.decoder_linear_units,
            );
            for n in ["norm1", "norm2", "norm3"] {
                norm(&mut t, format!("{q}.{n}"));
            }
        }
        norm(&mut t, format!("{prefix}.after_norm"));
        linear(
            &mut t,
            format!("{prefix}.output_layer"),
            c.padded_vocab(),
            d,
        );
    }
    t
}

fn layer(
    name: String,
    kind: ModuleKind,
    out_features: usize,
    in_features: usize,
) -> QuantizableLayer {
    QuantizableLayer {
        name,
        kind,
        out_features,
        in_features,
        groups: 1,
    }
}

fn group(
    producer: Option<String>,
    fold: SmoothFold,
    consumers: Vec<String>,
    fuse_output_quant: bool,
) -> SmoothGroup {
    SmoothGroup {
        producer,
        fold,
        consumers,
        fuse_output_quant,
        producer_rows_from: 0,
    }
}

/// The Conformer's quantizable layers, smoothing groups and GEMM chains: 8 GEMMs per encoder
/// block and 10 per decoder block, the two subsampling convolutions as `conv2d` layers.
pub fn quantization_layout(c: &ConformerConfig) -> QuantizationLayout {
    use ModuleKind::{Conv2d, Linear, PointwiseConv};
    let d = c.d_model;
    let mut l = QuantizationLayout {
        layers: vec![
            // One input channel per tap: the alignment rules skip it, with the reason recorded.
            layer("encoder.embed.convs.0".into(), Conv2d, d, 1),
            layer("encoder.embed.convs.1".into(), Conv2d, d, d),
        ],
        ..Default::default()
    };
    let kept = |name: &str, why: &str| (name.to_string(), why.to_string());
    l.kept_full_precision = vec![
        kept(
            "encoder.embed.out.weight",
            "the subsampling projection: batch-invariant, runs once per utterance",
        ),
        kept("ctc.ctc_lo.weight", "the CTC head"),
    ];
    l.batch_invariant = vec!["encoder.embed.out".into()];
    let units = c.encoder_linear_units;
    for i in 0..c.encoder_blocks {
        let p = format!("encoder.encoders.{i}");
        for (ff, norm) in [
            ("feed_forward_macaron", "norm_ff_macaron"),
            ("feed_forward", "norm_ff"),
        ] {
            let (w1, w2) = (format!("{p}.{ff}.w_1"), format!("{p}.{ff}.w_2"));
            l.layers.push(layer(w1.clone(), Linear, units, d));
            l.layers.push(layer(w2.clone(), Linear, d, units));
            l.smooth_groups.push(group(
                Some(format!("{p}.{norm}")),
                SmoothFold::NormAffine,
                vec![w1.clone()],
                true,
            ));
            // Swish is not positively homogeneous: 1/s cannot cross it into w_1's rows.
            l.smooth_groups
                .push(group(None, SmoothFold::Runtime, vec![w2.clone()], false));
            l.gemm_chains.push(GemmChainLayout {
                producer: w1,
                consumer: w2,
                activation: Activation::Swish,
                decode_step: false,
            });
        }
        let qkv = format!("{p}.self_attn.linear_qkv");
        let out = format!("{p}.self_attn.linear_out");
        l.layers.push(layer(qkv.clone(), Linear, 3 * d, d));
        l.layers.push(layer(out.clone(), Linear, d, d));
        l.smooth_groups.push(group(
            Some(format!("{p}.norm_mha")),
            SmoothFold::NormAffine,
            vec![qkv.clone()],
            true,
        ));
        l.smooth_groups.push(SmoothGroup {
            producer_rows_from: 2 * d,
            ..group(Some(qkv), SmoothFold::VToO, vec![out], false)
        });
        l.kept_full_precision.push(kept(
            &format!("{p}.self_attn.linear_pos.weight"),
            "the relative-position projection: batch-invariant",
        ));
        l.batch_invariant.push(format!("{p}.self_attn.linear_pos"));
        let (pw1, pw2) = (
            format!("{p}.conv_module.pointwise_conv1"),
            format!("{p}.conv_module.pointwise_conv2"),
        );
        l.layers.push(layer(pw1.clone(), PointwiseConv, 2 * d, d));
        l.layers.push(layer(pw2.clone(), PointwiseConv, d, d));
        // The mask and the causal padding between norm_conv and pointwise_conv1 only write
        // zeros, which 1/s leaves zero; but they sit between the norm and its consumer, so the
        // norm cannot emit the consumer's 8-bit input.
        l.smooth_groups.push(group(
            Some(format!("{p}.norm_conv")),
            SmoothFold::NormAffine,
            vec![pw1],
            false,
        ));
        l.smooth_groups
            .push(group(None, SmoothFold::Runtime, vec![pw2], false));
    }
    for (prefix, blocks) in decoder_prefixes(c) {
        l.kept_full_precision
            .push(kept(&format!("{prefix}.embed.0.weight"), "token embedding"));
        l.kept_full_precision.push(kept(
            &format!("{prefix}.output_layer.weight"),
            "the decoder's output layer",
        ));
        for i in 0..blocks {
            let q = format!("{prefix}.decoders.{i}");
            let name = |m: &str| format!("{q}.{m}");
            for att in ["self_attn", "src_attn"] {
                for proj in ["linear_q", "linear_k", "linear_v", "linear_out"] {
                    l.layers
                        .push(layer(name(&format!("{att}.{proj}")), Linear, d, d));
                }
            }
            let (w1, w2) = (name("feed_forward.w_1"), name("feed_forward.w_2"));
            l.layers
                .push(layer(w1.clone(), Linear, c.decoder_linear_units, d));
            l.layers
                .push(layer(w2.clone(), Linear, d, c.decoder_linear_units));
            l.smooth_groups.push(group(
                Some(name("norm1")),
                SmoothFold::NormAffine,
                ["linear_q", "linear_k", "linear_v"]
                    .iter()
                    .map(|p| name(&format!("self_attn.{p}")))
                    .collect(),
                true,
            ));
            l.smooth_groups.push(group(
                Some(name("self_attn.linear_v")),
                SmoothFold::VToO,
                vec![name("self_attn.linear_out")],
                false,
            ));
            l.smooth_groups.push(group(
                Some(name("norm2")),
                SmoothFold::NormAffine,
                vec![name("src_attn.linear_q")],
                true,
            ));
            // Keys and values read the encoder output: no parameter of the decoder produces it.
            l.smooth_groups.push(group(
                None,
                SmoothFold::Runtime,
                vec![name("src_attn.linear_k"), name("src_attn.linear_v")],
                false,
            ));
            l.smooth_groups.push(group(
                Some(name("src_attn.linear_v")),
                SmoothFold::VToO,
                vec![name("src_attn.linear_out")],
                false,
            ));
            l.smooth_groups.push(group(
                Some(name("norm3")),
                SmoothFold::NormAffine,
                vec![w1.clone()],
                true,
            ));
            // ReLU(x / s) = ReLU(x) / s for s > 0: 1/s folds into w_1's rows and bias.
            l.smooth_groups.push(group(
                Some(w1.clone()),
                SmoothFold::ProducerRows,
                vec![w2.clone()],
                false,
            ));
            // The rescoring decoder scores whole hypotheses at once, not step by step.
            l.gemm_chains.push(GemmChainLayout {
                producer: w1,
                consumer: w2,
                activation: Activation::Relu,
                decode_step: false,
            });
        }
    }
    // The decoders run in the search (attention rescoring), after the encoder.
    l.decode_step_layers = l
        .layers
        .iter()
        .filter(|x| x.name.starts_with("decoder."))
        .map(|x| x.name.clone())
        .collect();
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn standard() -> ConformerConfig {
        ConformerConfig {
            model_type: super::super::config::MODEL_TYPE.into(),
            input_dim: 80,
            vocab_size: 5002,
            d_model: 256,
            encoder_blocks: 12,
            encoder_heads: 4,
            encoder_linear_units: 2048,
            cnn_module_kernel: 8,
            causal: true,
            cnn_module_norm: "layer_norm".into(),
            decoder_type: "bitransformer".into(),
            decoder_heads: 4,
            decoder_linear_units: 2048,
            decoder_left_blocks: 3,
            decoder_right_blocks: 3,
        }
    }

    #[test]
    fn the_standard_model_has_96_encoder_and_60_decoder_gemms() {
        let c = standard();
        assert_eq!(c.check(), Ok(()));
        let l = quantization_layout(&c);
        let gemms = |prefix: &str| {
            l.layers
                .iter()
                .filter(|x| x.name.starts_with(prefix) && x.kind != ModuleKind::Conv2d)
                .count()
        };
        assert_eq!(gemms("encoder."), 96);
        assert_eq!(gemms("decoder."), 60);
        assert_eq!(l.layers.len(), 96 + 60 + 2);
        assert_eq!(l.gemm_chains.len(), 12 * 2 + 6);
        // Every layer and every group's consumer is a stored weight.
        let tensors: std::collections::HashSet<String> =
            expected_tensors(&c).into_iter().map(|(n, _)| n).collect();
        for x in &l.layers {
            assert!(
                tensors.contains(&format!("{}.weight", x.name)),
                "{}",
                x.name
            );
        }
        for g in &l.smooth_groups {
            for consumer in &g.consumers {
                assert!(l.layers.iter().any(|x| &x.name == consumer), "{consumer}");
            }
        }
        // The subsampling projection: 256 channels x 19 frequency bins.
        assert!(expected_tensors(&c)
            .iter()
            .any(|(n, s)| n == "encoder.embed.out.weight" && s == &vec![256, 256 * 19]));
        assert_eq!(c.padded_vocab(), 5008);
    }

    #[test]
    fn a_transformer_decoder_has_one_stack() {
        let c = ConformerConfig {
            decoder_type: "transformer".into(),
            decoder_right_blocks: 0,
            ..standard()
        };
        assert_eq!(c.check(), Ok(()));
        let l = quantization_layout(&c);
        assert_eq!(
            l.layers
                .iter()
                .filter(|x| x.name.starts_with("decoder.decoders."))
                .count(),
            30
        );
    }
}
