//! A synthetic WeNet model directory for structure tests: `train.yaml`, `units.txt`,
//! `global_cmvn`, and a `final.pt` with seeded random weights under WeNet's module names, written
//! in PyTorch's zip format (stored entries, a protocol-2 pickle of an OrderedDict of
//! `_rebuild_tensor_v2` calls). Random weights are evidence of structure, never of accuracy; the
//! reader itself is checked against files torch.save wrote (tests/torch_pt.rs).

use std::path::Path;

/// A state dict as the writer takes it: (name, shape, values).
pub type StateDict = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The geometry of a synthetic model.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub d: usize,
    pub heads: usize,
    pub units: usize,
    pub blocks: usize,
    pub kernel: usize,
    pub causal: bool,
    pub decoder_blocks: usize,
    pub right_blocks: usize,
    pub vocab: usize,
    pub mel: usize,
}

impl Geometry {
    /// WeNet's U2++ LibriSpeech recipe: 12 causal blocks of d 256, a 3 + 3 bitransformer.
    pub fn standard() -> Self {
        Geometry {
            d: 256,
            heads: 4,
            units: 2048,
            blocks: 12,
            kernel: 8,
            causal: true,
            decoder_blocks: 3,
            right_blocks: 3,
            vocab: 5002,
            mel: 80,
        }
    }

    /// A small model for fast tests (non-causal, BatchNorm, 30 units: padded to 32).
    pub fn small() -> Self {
        Geometry {
            d: 32,
            heads: 2,
            units: 64,
            blocks: 2,
            kernel: 5,
            causal: false,
            decoder_blocks: 1,
            right_blocks: 1,
            vocab: 30,
            mel: 80,
        }
    }
}

/// WeNet's state dict for `g`: (name, shape).
pub fn state_dict_shapes(g: &Geometry) -> Vec<(String, Vec<usize>)> {
    let d = g.d;
    let f = ((g.mel - 1) / 2 - 1) / 2;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("encoder.global_cmvn.mean".into(), vec![g.mel]),
        ("encoder.global_cmvn.istd".into(), vec![g.mel]),
        ("encoder.embed.conv.0.weight".into(), vec![d, 1, 3, 3]),
        ("encoder.embed.conv.0.bias".into(), vec![d]),
        ("encoder.embed.conv.2.weight".into(), vec![d, d, 3, 3]),
        ("encoder.embed.conv.2.bias".into(), vec![d]),
        ("encoder.embed.out.0.weight".into(), vec![d, d * f]),
        ("encoder.embed.out.0.bias".into(), vec![d]),
        ("encoder.embed.pos_enc.pe".into(), vec![1, 5000, d]),
    ];
    let lin = |t: &mut Vec<(String, Vec<usize>)>, n: String, o: usize, i: usize| {
        t.push((format!("{n}.weight"), vec![o, i]));
        t.push((format!("{n}.bias"), vec![o]));
    };
    let norm = |t: &mut Vec<(String, Vec<usize>)>, n: String| {
        t.push((format!("{n}.weight"), vec![d]));
        t.push((format!("{n}.bias"), vec![d]));
    };
    for b in 0..g.blocks {
        let p = format!("encoder.encoders.{b}");
        for q in ["linear_q", "linear_k", "linear_v", "linear_out"] {
            lin(&mut t, format!("{p}.self_attn.{q}"), d, d);
        }
        t.push((format!("{p}.self_attn.linear_pos.weight"), vec![d, d]));
        t.push((
            format!("{p}.self_attn.pos_bias_u"),
            vec![g.heads, d / g.heads],
        ));
        t.push((
            format!("{p}.self_attn.pos_bias_v"),
            vec![g.heads, d / g.heads],
        ));
        for ff in ["feed_forward", "feed_forward_macaron"] {
            lin(&mut t, format!("{p}.{ff}.w_1"), g.units, d);
            lin(&mut t, format!("{p}.{ff}.w_2"), d, g.units);
        }
        let m = format!("{p}.conv_module");
        t.push((format!("{m}.pointwise_conv1.weight"), vec![2 * d, d, 1]));
        t.push((format!("{m}.pointwise_conv1.bias"), vec![2 * d]));
        t.push((format!("{m}.depthwise_conv.weight"), vec![d, 1, g.kernel]));
        t.push((format!("{m}.depthwise_conv.bias"), vec![d]));
        norm(&mut t, format!("{m}.norm"));
        if !g.causal {
            t.push((format!("{m}.norm.running_mean"), vec![d]));
            t.push((format!("{m}.norm.running_var"), vec![d]));
            t.push((format!("{m}.norm.num_batches_tracked"), vec![]));
        }
        t.push((format!("{m}.pointwise_conv2.weight"), vec![d, d, 1]));
        t.push((format!("{m}.pointwise_conv2.bias"), vec![d]));
        for n in [
            "norm_ff",
            "norm_mha",
            "norm_ff_macaron",
            "norm_conv",
            "norm_final",
        ] {
            norm(&mut t, format!("{p}.{n}"));
        }
    }
    norm(&mut t, "encoder.after_norm".into());
    lin(&mut t, "ctc.ctc_lo".into(), g.vocab, d);
    let decoders: Vec<(&str, usize)> = if g.right_blocks > 0 {
        vec![
            ("decoder.left_decoder", g.decoder_blocks),
            ("decoder.right_decoder", g.right_blocks),
        ]
    } else {
        vec![("decoder", g.decoder_blocks)]
    };
    for (prefix, blocks) in decoders {
        t.push((format!("{prefix}.embed.0.weight"), vec![g.vocab, d]));
        t.push((format!("{prefix}.embed.1.pe"), vec![1, 5000, d]));
        norm(&mut t, format!("{prefix}.after_norm"));
        lin(&mut t, format!("{prefix}.output_layer"), g.vocab, d);
        for b in 0..blocks {
            let q = format!("{prefix}.decoders.{b}");
            for att in ["self_attn", "src_attn"] {
                for p in ["linear_q", "linear_k", "linear_v", "linear_out"] {
                    lin(&mut t, format!("{q}.{att}.{p}"), d, d);
                }
            }
            lin(&mut t, format!("{q}.feed_forward.w_1"), g.units, d);
            lin(&mut t, format!("{q}.feed_forward.w_2"), d, g.units);
            for n in ["norm1", "norm2", "norm3"] {
                norm(&mut t, format!("{q}.{n}"));
            }
        }
    }
    t
}

/// A seeded value in [-0.05, 0.05) (xorshift).
fn values(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Writes the whole directory for `g` (the current `train.yaml` layout unless `old_layout`),
/// with the CMVN statistics stored in the model agreeing with `global_cmvn`. `edit` may change
/// the state dict (name, shape, values) before it is written.
pub fn write_dir(dir: &Path, g: &Geometry, old_layout: bool, edit: impl FnOnce(&mut StateDict)) {
    std::fs::create_dir_all(dir).unwrap();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    // CMVN: mean_stat = frame_num · mean, var_stat = frame_num · (var + mean²).
    let frames = 1000.0f64;
    let mean: Vec<f64> = (0..g.mel).map(|i| 8.0 + i as f64 * 0.05).collect();
    let var: Vec<f64> = (0..g.mel).map(|i| 2.0 + i as f64 * 0.01).collect();
    let mut state: StateDict = state_dict_shapes(g)
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product::<usize>();
            let v = match name.as_str() {
                "encoder.global_cmvn.mean" => mean.iter().map(|&m| m as f32).collect(),
                "encoder.global_cmvn.istd" => {
                    var.iter().map(|&v| (1.0 / v.sqrt()) as f32).collect()
                }
                n if n.ends_with("running_var") => vec![1.0; g.d],
                n if n.ends_with("num_batches_tracked") => vec![7.0],
                _ => values(&mut seed, n),
            };
            (name, shape, v)
        })
        .collect();
    edit(&mut state);
    write_final_pt(&dir.join("final.pt"), &state);
    let stats = serde_json::json!({
        "mean_stat": mean.iter().map(|m| m * frames).collect::<Vec<_>>(),
        "var_stat": mean.iter().zip(&var).map(|(m, v)| (v + m * m) * frames).collect::<Vec<_>>(),
        "frame_num": frames,
    });
    std::fs::write(dir.join("global_cmvn"), stats.to_string()).unwrap();
    let mut units = String::from("<blank> 0\n<unk> 1\n");
    for i in 2..g.vocab - 1 {
        units.push_str(&format!("t{i} {i}\n"));
    }
    units.push_str(&format!("<sos/eos> {}\n", g.vocab - 1));
    std::fs::write(dir.join("units.txt"), units).unwrap();
    std::fs::write(dir.join("train.yaml"), train_yaml(g, old_layout)).unwrap();
}

/// `train.yaml` for `g` as WeNet writes it.
pub fn train_yaml(g: &Geometry, old_layout: bool) -> String {
    let decoder = if g.right_blocks > 0 {
        "bitransformer"
    } else {
        "transformer"
    };
    let norm = if g.causal { "layer_norm" } else { "batch_norm" };
    let cmvn = if old_layout {
        "cmvn_file: data/train/global_cmvn\nis_json_cmvn: true\n".to_string()
    } else {
        "cmvn: global_cmvn\ncmvn_conf:\n  cmvn_file: data/train/global_cmvn\n  is_json_cmvn: true\n\
         tokenizer: char\ntokenizer_conf:\n  symbol_table_path: data/dict/units.txt\n  special_tokens:\n    \
         <blank>: 0\n    <unk>: 1\n    <sos>: SOS\n    <eos>: SOS\n"
            .replace("SOS", &(g.vocab - 1).to_string())
    };
    format!(
        "accum_grad: 1\n{cmvn}ctc: ctc\nctc_conf:\n  ctc_blank_id: 0\n\
         dataset_conf:\n  fbank_conf:\n    num_mel_bins: {mel}\n    frame_shift: 10\n    frame_length: 25\n    dither: 1.0\n\
         decoder: {decoder}\ndecoder_conf:\n  attention_heads: {heads}\n  dropout_rate: 0.1\n  linear_units: {units}\n  \
         num_blocks: {db}\n  r_num_blocks: {rb}\n  positional_dropout_rate: 0.1\n  self_attention_dropout_rate: 0.0\n  src_attention_dropout_rate: 0.0\n\
         encoder: conformer\nencoder_conf:\n  activation_type: swish\n  attention_dropout_rate: 0.1\n  attention_heads: {heads}\n  \
         causal: {causal}\n  cnn_module_kernel: {kernel}\n  cnn_module_norm: {norm}\n  dropout_rate: 0.1\n  input_layer: conv2d\n  \
         linear_units: {units}\n  normalize_before: true\n  num_blocks: {blocks}\n  output_size: {d}\n  pos_enc_layer_type: rel_pos\n  \
         selfattention_layer_type: rel_selfattn\n  use_cnn_module: true\n  use_dynamic_chunk: true\n\
         input_dim: {mel}\nmodel: asr_model\nmodel_conf:\n  ctc_weight: 0.3\n  length_normalized_loss: false\n  lsm_weight: 0.1\n  reverse_weight: 0.3\n\
         output_dim: {vocab}\n",
        mel = g.mel,
        heads = g.heads,
        units = g.units,
        db = g.decoder_blocks,
        rb = g.right_blocks,
        causal = g.causal,
        kernel = g.kernel,
        blocks = g.blocks,
        d = g.d,
        vocab = g.vocab,
    )
}

/// A pickle string (BINUNICODE).
fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'X');
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
}

/// An integer (BININT).
fn int(out: &mut Vec<u8>, v: usize) {
    out.push(b'J');
    out.extend((v as i32).to_le_bytes());
}

/// Writes `tensors` (float32; a name ending in `num_batches_tracked` as int64) as torch.save
/// would: a zip archive of `archive/data.pkl` and one storage per tensor.
pub fn write_final_pt(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut pkl = vec![0x80, 2];
    pkl.extend(b"ccollections\nOrderedDict\n)R(");
    let mut storages: Vec<Vec<u8>> = Vec::new();
    for (i, (name, shape, values)) in tensors.iter().enumerate() {
        let long = name.ends_with("num_batches_tracked");
        string(&mut pkl, name);
        pkl.extend(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        pkl.push(b'(');
        string(&mut pkl, "storage");
        pkl.extend(if long {
            &b"ctorch\nLongStorage\n"[..]
        } else {
            &b"ctorch\nFloatStorage\n"[..]
        });
        string(&mut pkl, &i.to_string());
        string(&mut pkl, "cpu");
        int(&mut pkl, values.len());
        pkl.extend(b"tQ");
        int(&mut pkl, 0);
        pkl.push(b'(');
        for &s in shape {
            int(&mut pkl, s);
        }
        pkl.push(b't');
        pkl.push(b'(');
        let mut stride = 1;
        let mut strides = vec![0; shape.len()];
        for a in (0..shape.len()).rev() {
            strides[a] = stride;
            stride *= shape[a];
        }
        for s in strides {
            int(&mut pkl, s);
        }
        pkl.push(b't');
        pkl.push(0x89); // NEWFALSE: requires_grad
        pkl.extend(b"ccollections\nOrderedDict\n)R");
        pkl.extend(b"tR");
        storages.push(if long {
            values
                .iter()
                .flat_map(|v| (*v as i64).to_le_bytes())
                .collect()
        } else {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        });
    }
    pkl.extend(b"u.");
    let mut entries: Vec<(String, Vec<u8>)> = vec![
        ("archive/data.pkl".into(), pkl),
        ("archive/byteorder".into(), b"little".to_vec()),
    ];
    for (i, s) in storages.into_iter().enumerate() {
        entries.push((format!("archive/data/{i}"), s));
    }
    entries.push(("archive/version".into(), b"3\n".to_vec()));
    let zip = super::zip_stored(&entries, false);
    std::fs::write(path, zip).unwrap();
}
