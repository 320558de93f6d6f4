//! The fused links (GEMM chains and fused norms) against the unfused pairs, bit for bit, on a
//! real utterance through any architecture's quantized model.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::Tensor as CandleTensor;
use oasr_quantize::checkpoint::Checkpoint;
use oasr_quantize::format::QuantizationSpec;
use oasr_quantize::models::exec::{Linear, LinearExec};
use oasr_quantize::numerics::{self, ActScale, Activation, GemmEpilogue, OutDtype, QuantDtype};
use oasr_quantize::verify::QuantizedModel;

/// Records the first input and output of every layer while an inner executor runs them.
pub struct Recorder<E> {
    pub inner: E,
    pub inputs: BTreeMap<String, (Vec<f32>, usize, usize)>,
    pub outputs: BTreeMap<String, Vec<f32>>,
    /// The activation the forward applied after each layer (`linear_act`), if any.
    pub activations: BTreeMap<String, Activation>,
}

impl<E: LinearExec> Recorder<E> {
    fn keep(&mut self, name: &str, x: &CandleTensor, y: &CandleTensor) {
        if !self.inputs.contains_key(name) {
            let (rows, cols) = x.dims2().unwrap();
            let flat = |t: &CandleTensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            self.inputs.insert(name.into(), (flat(x), rows, cols));
            self.outputs.insert(name.into(), flat(y));
        }
    }
}

impl<E: LinearExec> LinearExec for Recorder<E> {
    fn linear(&mut self, layer: &Linear, x: &CandleTensor) -> oasr_quantize::Result<CandleTensor> {
        let y = self.inner.linear(layer, x)?;
        self.keep(&layer.name, x, &y);
        Ok(y)
    }

    fn linear_act(
        &mut self,
        layer: &Linear,
        x: &CandleTensor,
        activation: Activation,
    ) -> oasr_quantize::Result<CandleTensor> {
        let y = self.inner.linear_act(layer, x, activation)?;
        self.keep(&layer.name, x, &y);
        self.activations
            .entry(layer.name.clone())
            .or_insert(activation);
        Ok(y)
    }
}

/// A quantized layer's tensors as stored.
pub struct Stored {
    codes: Vec<u8>,
    weight_scale: Vec<f32>,
    bias: Option<Vec<f32>>,
    smooth_inv: Option<Vec<f32>>,
    input_scale: Option<f32>,
    n: usize,
}

pub fn stored(ckpt: &Checkpoint, layer: &str) -> Stored {
    let get = |key: &str| ckpt.tensors.get(&format!("{layer}.{key}"));
    let weight = get("weight").unwrap();
    Stored {
        codes: weight.bytes().to_vec(),
        weight_scale: get("weight_scale").unwrap().to_f32(),
        bias: get("bias").map(|t| t.to_f32()),
        smooth_inv: get("smooth_inv").map(|t| t.to_f32()),
        input_scale: get("input_scale").map(|t| t.to_f32()[0]),
        n: weight.shape[0],
    }
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The fused GEMM chain and the fused norm, on real activations, give exactly what the unfused
/// pairs give (as the verify run computes them), bit for bit.
pub fn check_links_are_bit_identical(
    dst: &Path,
    spec: &QuantizationSpec,
    dtype: QuantDtype,
    utterance: &oasr_quantize::Utterance,
) {
    let served = OutDtype::F16;
    let model = QuantizedModel::load(dst).unwrap();
    let ckpt = Checkpoint::open(dst).unwrap();
    let mut rec = Recorder {
        inner: model.exec(served),
        inputs: BTreeMap::new(),
        outputs: BTreeMap::new(),
        activations: BTreeMap::new(),
    };
    let t = &model.model;
    let samples = t.read(utterance).unwrap();
    t.transcribe(&mut rec, &samples, false).unwrap();

    for chain in &spec.links.gemm_chains {
        let (p, c) = (
            stored(&ckpt, &chain.producer),
            stored(&ckpt, &chain.consumer),
        );
        let (x, m, k) = &rec.inputs[&chain.producer];
        // The producer's input comes from its fused norm.
        let a = numerics::norm_quant_per_token(x, *m, *k, served, dtype);
        fn epi(bias: &Option<Vec<f32>>, activation: Activation) -> GemmEpilogue<'_> {
            GemmEpilogue {
                bias: bias.as_deref(),
                activation,
                out: OutDtype::F16,
            }
        }
        let scale = c.input_scale.unwrap();
        // Fused: the producer emits the consumer's codes; the consumer multiplies them.
        let codes = numerics::scaled_mm_quant(
            dtype,
            &a.codes,
            ActScale::PerRow(&a.scales),
            &p.codes,
            &p.weight_scale,
            *m,
            p.n,
            *k,
            &epi(&p.bias, chain.activation),
            c.smooth_inv.as_deref(),
            scale,
            dtype,
        );
        let out: Vec<f32> = numerics::scaled_mm(
            dtype,
            &codes,
            ActScale::PerTensor(scale),
            &c.codes,
            &c.weight_scale,
            *m,
            c.n,
            p.n,
            &epi(&c.bias, Activation::None),
        )
        .into_iter()
        .map(|b| numerics::out_bits_to_f32(served, b))
        .collect();
        // Unfused, as verify ran it: the producer's scaled_mm (the activation in the epilogue,
        // rounded to f16), then the consumer's own static quantize of that output.
        let (y, _, _) = &rec.inputs[&chain.consumer];
        assert_eq!(
            bits(y),
            bits(&rec.outputs[&chain.producer]),
            "{}",
            chain.producer
        );
        assert_eq!(
            numerics::quantize_static(y, *m, p.n, c.smooth_inv.as_deref(), scale, dtype),
            codes,
            "{}",
            chain.consumer
        );
        assert_eq!(
            bits(&out),
            bits(&rec.outputs[&chain.consumer]),
            "{}",
            chain.consumer
        );
    }

    let chain_producer_activation = |layer: &str| {
        spec.links
            .gemm_chains
            .iter()
            .find(|c| c.producer == layer)
            .map(|c| c.activation)
    };
    for norm in &spec.links.fused_norms {
        let first = &norm.consumers[0];
        let (x, m, k) = &rec.inputs[first];
        // One emission of the fused norm serves every consumer.
        let emitted = numerics::norm_quant_per_token(x, *m, *k, served, norm.dtype);
        for consumer in &norm.consumers {
            let (xc, _, _) = &rec.inputs[consumer];
            assert_eq!(bits(xc), bits(x), "{consumer} reads the norm's output");
            // Unfused: the norm writes f16, the consumer quantizes it with its own rule.
            let s = stored(&ckpt, consumer);
            let written: Vec<f32> = x
                .iter()
                .map(|&v| numerics::out_bits_to_f32(served, numerics::round_to_out(served, v)))
                .collect();
            let own = numerics::quantize_per_token(
                &written,
                *m,
                *k,
                s.smooth_inv.as_deref(),
                spec.layers[consumer].scheme.dtype(),
            );
            assert_eq!(own, emitted, "{consumer}");
            let out: Vec<f32> = numerics::scaled_mm(
                norm.dtype,
                &emitted.codes,
                ActScale::PerRow(&emitted.scales),
                &s.codes,
                &s.weight_scale,
                *m,
                s.n,
                *k,
                &GemmEpilogue {
                    bias: s.bias.as_deref(),
                    // A consumer that produces a chain applies its activation in its epilogue.
                    activation: match chain_producer_activation(consumer) {
                        Some(a) => a,
                        None => Activation::None,
                    },
                    out: served,
                },
            )
            .into_iter()
            .map(|b| numerics::out_bits_to_f32(served, b))
            .collect();
            let mut out = out;
            if chain_producer_activation(consumer).is_none() {
                // A layer outside an armed chain writes its output; its activation then runs in
                // f32.
                if let Some(&a) = rec.activations.get(consumer) {
                    out.iter_mut().for_each(|v| *v = numerics::activate(a, *v));
                }
            }
            assert_eq!(bits(&out), bits(&rec.outputs[consumer]), "{consumer}");
        }
    }
}
