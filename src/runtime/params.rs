//! Kernel parameter blocks, laid out exactly like `Epilogue` and `GemmParams` in
//! `kernels-cuda/common.cuh` (both sides assert the sizes), and the enumerations they carry.

use cudarc::driver::DeviceRepr;

use crate::numerics::{Activation, OutDtype, QuantDtype};

/// `OASR_ACT_*`.
pub(crate) fn activation_code(a: Activation) -> i32 {
    match a {
        Activation::None => 0,
        Activation::Relu => 1,
        Activation::Swish => 2,
        Activation::Gelu => 3,
    }
}

/// `OASR_OUT_*`.
pub(crate) fn out_code(o: OutDtype) -> i32 {
    match o {
        OutDtype::F16 => 0,
        OutDtype::Bf16 => 1,
    }
}

/// `OASR_Q_*`.
pub(crate) fn quant_code(d: QuantDtype) -> i32 {
    match d {
        QuantDtype::Int8 => 0,
        QuantDtype::Float8E4m3fn => 1,
    }
}

/// `struct Epilogue` (56 bytes). Device pointers are raw `CUdeviceptr`s; 0 means absent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EpilogueParams {
    pub a_scale: u64,
    pub weight_scale: u64,
    pub bias: u64,
    pub quant_mult: u64,
    pub out: u64,
    pub a_scale_value: f32,
    pub activation: i32,
    pub out_dtype: i32,
    pub quant_dtype: i32,
}

/// `struct GemmParams` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GemmParams {
    pub a: u64,
    pub w: u64,
    pub epi: EpilogueParams,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub reserved: i32,
}

const _: () = assert!(std::mem::size_of::<EpilogueParams>() == 56);
const _: () = assert!(std::mem::size_of::<GemmParams>() == 88);

// SAFETY: plain-old-data with the C layout of the kernel-side structs (sizes asserted on both
// sides); passed by value as a kernel parameter.
unsafe impl DeviceRepr for EpilogueParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemmParams {}
