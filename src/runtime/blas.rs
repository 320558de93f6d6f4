//! cuBLASLt baselines for `bench-gemm`, through cudarc's cuBLASLt result API: int8
//! (i8·i8 -> i32, no epilogue), fp8 e4m3 with per-tensor scales (-> bf16), and fp16 with a
//! bias epilogue (-> f16).
//!
//! cuBLASLt is column-major. Our row-major A [M, K] is a column-major K x M matrix and our
//! W [N, K] a column-major K x N one, so every baseline computes the column-major
//! D (N x M) = op_T(W) · op_N(A), whose memory is exactly our row-major [M, N] output (the
//! "TN" layout cuBLASLt's int8 and fp8 kernels require).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::lane::CudaLane;
use super::loader;
use crate::error::{Error, Result};

const CUBLAS_OP_N: i32 = 0;
const CUBLAS_OP_T: i32 = 1;
/// The workspace cuBLASLt may use (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

fn blas_err(what: &str) -> impl FnOnce(lt::CublasError) -> Error + '_ {
    move |e| Error::Cuda {
        what: format!("cuBLASLt {what}"),
        message: format!("{e:?}"),
    }
}

/// A cuBLASLt handle with its workspace, bound to the lane's stream.
pub struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new` and destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Which baseline GEMM a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlasKind {
    /// i8 · i8 -> i32, alpha = 1, no epilogue.
    Int8,
    /// e4m3 · e4m3 -> bf16 with device scale pointers for A and B.
    Fp8,
    /// f16 · f16 -> f16 with a bias epilogue (f16 bias).
    F16Bias,
}

/// A matmul descriptor, its four layouts and the algorithm cuBLASLt's heuristic chose.
pub struct BlasPlan {
    kind: BlasKind,
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for BlasPlan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Blas::plan` and is destroyed once.
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    // SAFETY: `desc` is live; `value` is a valid buffer of size_of::<T>() bytes.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            (value as *const T).cast::<c_void>(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(blas_err("descriptor attribute"))
}

impl Blas {
    /// A handle on the lane's stream. Fails with [`Error::Cuda`] when cuBLASLt cannot be loaded.
    pub fn new(lane: &CudaLane) -> Result<Self> {
        loader::ensure_cublaslt()?;
        lane.context()
            .bind_to_thread()
            .map_err(super::lane::cuda_err("binding the context"))?;
        let handle = lt::create_handle().map_err(blas_err("handle"))?;
        let workspace = match lane.zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created just above.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(e);
            }
        };
        Ok(Blas {
            handle,
            workspace,
            stream: lane.stream().clone(),
        })
    }

    /// Plans `kind` for an M x N x K problem. `extra` is the bias pointer (F16Bias) or the
    /// pair of scale pointers (Fp8: A's = W's scale, B's = the activation's scale).
    pub fn plan(
        &self,
        kind: BlasKind,
        m: usize,
        n: usize,
        k: usize,
        extra: [u64; 2],
    ) -> Result<BlasPlan> {
        use sys::cublasComputeType_t as C;
        use sys::cublasLtMatmulDescAttributes_t as A;
        use sys::cudaDataType as D;

        let (compute, scale, ab, cd) = match kind {
            BlasKind::Int8 => (
                C::CUBLAS_COMPUTE_32I,
                D::CUDA_R_32I,
                D::CUDA_R_8I,
                D::CUDA_R_32I,
            ),
            BlasKind::Fp8 => (
                C::CUBLAS_COMPUTE_32F,
                D::CUDA_R_32F,
                D::CUDA_R_8F_E4M3,
                D::CUDA_R_16BF,
            ),
            BlasKind::F16Bias => (
                C::CUBLAS_COMPUTE_32F,
                D::CUDA_R_32F,
                D::CUDA_R_16F,
                D::CUDA_R_16F,
            ),
        };
        let desc = lt::create_matmul_desc(compute, scale).map_err(blas_err("matmul descriptor"))?;
        let mut layouts: Vec<sys::cublasLtMatrixLayout_t> = Vec::with_capacity(3);
        let build =
            |layouts: &mut Vec<sys::cublasLtMatrixLayout_t>| -> Result<sys::cublasLtMatmulAlgo_t> {
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &CUBLAS_OP_T)?;
                set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &CUBLAS_OP_N)?;
                match kind {
                    BlasKind::Int8 => {}
                    BlasKind::Fp8 => {
                        set_desc(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &extra[0])?;
                        set_desc(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &extra[1])?;
                    }
                    BlasKind::F16Bias => {
                        let epilogue = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
                        set_desc(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
                        set_desc(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &extra[0])?;
                    }
                }
                let (m, n, k) = (m as u64, n as u64, k as u64);
                // W: K x N (ld K), op T; A: K x M (ld K), op N; D: N x M (ld N).
                for (ty, rows, cols) in [(ab, k, n), (ab, k, m), (cd, n, m)] {
                    let l = lt::create_matrix_layout(ty, rows, cols, rows as i64)
                        .map_err(blas_err("matrix layout"))?;
                    layouts.push(l);
                }
                let pref = lt::create_matmul_pref().map_err(blas_err("preference"))?;
                let ws = WORKSPACE_BYTES as u64;
                // SAFETY: `pref` is live; `ws` is a valid u64 buffer.
                let set = unsafe {
                    lt::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&ws as *const u64).cast::<c_void>(),
                    std::mem::size_of::<u64>(),
                )
                };
                // SAFETY: every descriptor is live and describes the problem above.
                let heuristic = set.and_then(|()| unsafe {
                    lt::get_matmul_algo_heuristic(
                        self.handle,
                        desc,
                        layouts[0],
                        layouts[1],
                        layouts[2],
                        layouts[2],
                        pref,
                    )
                });
                // SAFETY: created above, destroyed once.
                let _ = unsafe { lt::destroy_matmul_pref(pref) };
                let h = heuristic.map_err(blas_err("algorithm heuristic"))?;
                Ok(h.algo)
            };
        match build(&mut layouts) {
            Ok(algo) => Ok(BlasPlan {
                kind,
                desc,
                layouts: [layouts[0], layouts[1], layouts[2]],
                algo,
            }),
            Err(e) => {
                // SAFETY: each was created above and is destroyed once.
                unsafe {
                    for l in layouts {
                        let _ = lt::destroy_matrix_layout(l);
                    }
                    let _ = lt::destroy_matmul_desc(desc);
                }
                Err(e)
            }
        }
    }

    /// Enqueues `plan` on the lane's stream: D = W · A (see the module docs).
    ///
    /// # Safety
    /// `w`, `a` and `d` must be device buffers of the plan's types and shape.
    pub unsafe fn run<W, X, Y>(
        &self,
        plan: &BlasPlan,
        w: &CudaSlice<W>,
        a: &CudaSlice<X>,
        d: &mut CudaSlice<Y>,
    ) -> Result<()> {
        let one_i: i32 = 1;
        let zero_i: i32 = 0;
        let one_f: f32 = 1.0;
        let zero_f: f32 = 0.0;
        let (alpha, beta) = match plan.kind {
            BlasKind::Int8 => (
                (&one_i as *const i32).cast::<c_void>(),
                (&zero_i as *const i32).cast::<c_void>(),
            ),
            _ => (
                (&one_f as *const f32).cast::<c_void>(),
                (&zero_f as *const f32).cast::<c_void>(),
            ),
        };
        let (wp, _g1) = w.device_ptr(&self.stream);
        let (ap, _g2) = a.device_ptr(&self.stream);
        let (dp, _g3) = d.device_ptr(&self.stream);
        let (ws, _g4) = self.workspace.device_ptr(&self.stream);
        lt::matmul(
            self.handle,
            plan.desc,
            alpha,
            beta,
            wp as *const c_void,
            plan.layouts[0],
            ap as *const c_void,
            plan.layouts[1],
            dp as *const c_void,
            plan.layouts[2],
            dp as *mut c_void,
            plan.layouts[2],
            &plan.algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            self.stream.cu_stream() as sys::cudaStream_t,
        )
        .map_err(blas_err("matmul"))
    }
}
