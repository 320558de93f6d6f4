//! The CUDA scaled-GEMM runtime (feature `cuda`).
//!
//! The driver, NVRTC and cuBLASLt are loaded at run time (cudarc, `dynamic-loading`): building
//! needs no CUDA toolkit, and a machine without a driver, a GPU or NVRTC gets an
//! [`Error::Cuda`](crate::Error::Cuda) that says what is missing, never a panic.
//!
//! - [`kernels`]: the embedded sources of `kernels-cuda/`, their NVRTC compilation for the
//!   GPU's architecture and the on-disk module cache;
//! - [`CudaLane`]: the GPU lane of a verify run, the quantize and scaled-GEMM kernels behind
//!   the signatures of [`crate::numerics`];
//! - [`bench`]: `oasr-quantize bench-gemm`, our kernels against cuBLASLt.
//!
//! `docs/cuda.md` describes the kernels, the epilogue order, the cache and how to test.

pub mod bench;
pub mod blas;
pub mod kernels;
mod lane;
pub mod loader;
mod params;

pub use kernels::{
    compile_kernels, Arch, CompiledKernels, GemmConfig, GemmKind, KernelCache, KernelResources,
    ModuleOrigin, GEMM_CONFIGS,
};
pub use lane::{CudaLane, DeviceActScale, DeviceGemm, DeviceInfo, DeviceOutput, GemmPath};
