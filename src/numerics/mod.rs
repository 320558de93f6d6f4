//! The bit-exact CPU reference of every kernel: rounding, float8 e4m3, quantization, activations
//! and the scaled GEMM with its epilogue.
//!
//! The CUDA kernels must reproduce these functions bit for bit, so every function here states its
//! floating-point operation order, and none uses fused multiply-add or libm. `docs/numerics.md`
//! restates the contract.

mod activation;
mod e4m3;
mod gemm;
mod kernels;
mod quantize;
mod rounding;
mod tensor_core;

pub use activation::{
    activate, erf_f32, exp_f32, gelu, gelu_in_place, relu, softmax_in_place, swish, Activation,
    ERF_SERIES_MAX, EXP_INPUT_MAX, EXP_INPUT_MIN,
};
pub use e4m3::{e4m3_decode, e4m3_decode_table, e4m3_encode, E4M3_MAX, E4M3_MAX_CODE};
pub use gemm::{
    epilogue_value, scaled_mm, scaled_mm_accumulating, scaled_mm_quant, ActScale, Fp8Accumulation,
    GemmEpilogue, INT8_MAX_K,
};
pub use quantize::{
    decode, dequantize_rows, encode, norm_quant_per_token, quantize_per_token, quantize_static,
    quantize_weight_per_channel, row_multiplier, static_input_scale, static_multipliers,
    QuantDtype, QuantizedRows, AMAX_FLOOR,
};
pub use rounding::{
    bf16_bits_to_f32, f16_bits_to_f32, out_bits_to_f32, round_half_even, round_to_out, OutDtype,
    BF16_CANONICAL_NAN, F16_CANONICAL_NAN,
};
