//! The GPU lane: the quantize and scaled-GEMM kernels behind the same signatures as the CPU
//! reference in [`crate::numerics`], so a verify run can send each quantized GEMM and each
//! quantize step to either and compare.
//!
//! Two levels:
//! - host slices in, host vectors out: [`CudaLane::quantize_per_token`],
//!   [`CudaLane::quantize_static`], [`CudaLane::scaled_mm`], [`CudaLane::scaled_mm_quant`]
//!   mirror the numerics functions argument for argument and return the same values (int8 and
//!   the quantize kernels bit for bit; fp8 within the bound of `docs/cuda.md`);
//! - device buffers: [`CudaLane::launch_scaled_mm`] runs on buffers already on the GPU (the
//!   benchmark, and callers that keep weights resident).
//!
//! Every operand is checked before anything is launched: a shape outside the kernel contract
//! (M >= 1, K % 16 == 0, N % 8 == 0) or a slice of the wrong length is an
//! [`Error::ShapeRefused`], never a panic or an out-of-bounds access.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::kernels::{
    self, parse_resources, Arch, GemmConfig, GemmKind, KernelCache, KernelResources, ModuleOrigin,
    GEMM_CONFIGS,
};
use super::loader;
use super::params::{activation_code, out_code, quant_code, EpilogueParams, GemmParams};
use crate::error::{Error, Result};
use crate::numerics::{
    self, ActScale, Activation, GemmEpilogue, OutDtype, QuantDtype, QuantizedRows, INT8_MAX_K,
};

/// Which scaled-GEMM kernel families a lane runs (`OASR_CUDA_GEMM`: `auto`, `mma`, `wgmma`).
///
/// On a 9.0 device (sm_90a) `Auto` and `Wgmma` run the wgmma kernels (faster than mma.sync on
/// every `bench-gemm` shape of an H200; for fp8 one family per GPU is also what keeps every
/// result batch-invariant), `Mma` only the portable mma.sync kernels. Elsewhere every choice
/// means mma.sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    Auto,
    Mma,
    Wgmma,
}

impl GemmPath {
    /// The variable that selects the path.
    pub const ENV: &'static str = "OASR_CUDA_GEMM";

    /// The path `OASR_CUDA_GEMM` asks for (unset or empty: `Auto`).
    pub fn from_env() -> Result<Self> {
        match std::env::var(Self::ENV).unwrap_or_default().trim() {
            "" | "auto" => Ok(GemmPath::Auto),
            "mma" | "mma.sync" => Ok(GemmPath::Mma),
            "wgmma" => Ok(GemmPath::Wgmma),
            other => Err(Error::InvalidOption {
                option: Self::ENV.into(),
                message: format!("`{other}`: expected auto, mma or wgmma"),
            }),
        }
    }

    /// Whether a lane on `arch` with this path runs `config`.
    pub fn runs(self, arch: Arch, config: &GemmConfig) -> bool {
        let dtype_ok = match config.dtype {
            QuantDtype::Int8 => arch.supports_int8(),
            QuantDtype::Float8E4m3fn => arch.supports_fp8(),
        };
        if !dtype_ok {
            return false;
        }
        if !arch.supports_wgmma() {
            return config.kind == GemmKind::MmaSync;
        }
        match self {
            GemmPath::Mma => config.kind == GemmKind::MmaSync,
            GemmPath::Auto | GemmPath::Wgmma => config.kind == GemmKind::Wgmma,
        }
    }
}

/// What the lane knows about its GPU and its kernels.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// The compilation target of the kernels (`sm_90a` on a 9.0 device).
    pub arch: Arch,
    /// The kernel families the lane runs.
    pub gemm_path: GemmPath,
    pub sm_count: usize,
    pub smem_per_sm: usize,
    pub smem_per_block_optin: usize,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    /// Whether the kernels were loaded from the cache or compiled now.
    pub module: ModuleOrigin,
    /// Registers and spills per kernel, from the compiler log when it is at hand.
    pub resources: Vec<KernelResources>,
}

/// The activation scale of a GEMM whose operands are on the GPU.
#[derive(Clone, Copy, Debug)]
pub enum DeviceActScale<'a> {
    PerRow(&'a CudaSlice<f32>),
    PerTensor(f32),
}

/// A scaled GEMM on device buffers: `a` [M, K] and `w` [N, K] codes of `dtype`.
#[derive(Clone, Copy, Debug)]
pub struct DeviceGemm<'a> {
    pub dtype: QuantDtype,
    pub a: &'a CudaSlice<u8>,
    pub a_scale: DeviceActScale<'a>,
    pub w: &'a CudaSlice<u8>,
    pub weight_scale: &'a CudaSlice<f32>,
    pub bias: Option<&'a CudaSlice<f32>>,
    pub activation: Activation,
    pub out_dtype: OutDtype,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Where a device GEMM writes: f16 / bf16 bits (`scaled_mm`), or 8-bit codes for the next
/// GEMM of a chain (`scaled_mm_quant`, with the consumer's per-column multipliers
/// `numerics::static_multipliers(n, consumer_smooth_inv, consumer_input_scale)`).
#[derive(Debug)]
pub enum DeviceOutput<'a> {
    Rounded(&'a mut CudaSlice<u16>),
    Quantized {
        codes: &'a mut CudaSlice<u8>,
        mult: &'a CudaSlice<f32>,
        dtype: QuantDtype,
    },
}

/// The CUDA lane: one GPU, one stream, the compiled kernels.
pub struct CudaLane {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    _module: Arc<CudaModule>,
    /// Each runnable configuration, its kernel, and how many of its CTAs one SM holds.
    gemm: Vec<(GemmConfig, CudaFunction, usize)>,
    quantize_per_token_fn: CudaFunction,
    quantize_static_fn: CudaFunction,
    epilogue_i32_fn: CudaFunction,
}

impl std::fmt::Debug for CudaLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaLane")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

pub(crate) fn cuda_err(
    what: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    let what = what.into();
    move |e| {
        let detail = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Error::Cuda {
            what,
            message: if detail.is_empty() {
                format!("{e:?}")
            } else {
                format!("{e:?}: {detail}")
            },
        }
    }
}

fn refused(op: &str, message: impl Into<String>) -> Error {
    Error::ShapeRefused {
        op: op.into(),
        message: message.into(),
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown failure".into())
}

/// Checks `len == rows * cols` without overflow.
fn check_len(op: &str, what: &str, len: usize, rows: usize, cols: usize) -> Result<()> {
    match rows.checked_mul(cols) {
        Some(want) if want == len => Ok(()),
        Some(want) => Err(refused(
            op,
            format!("{what} has {len} elements, expected {rows} * {cols} = {want}"),
        )),
        None => Err(refused(op, format!("{what}: {rows} * {cols} overflows"))),
    }
}

fn check_i32(op: &str, what: &str, v: usize) -> Result<()> {
    if v > i32::MAX as usize {
        return Err(refused(op, format!("{what} = {v} exceeds {}", i32::MAX)));
    }
    Ok(())
}

fn check_input_scale(op: &str, s: f32) -> Result<()> {
    if !(s.is_finite() && s > 0.0) {
        return Err(refused(
            op,
            format!("input_scale must be finite and positive, got {s}"),
        ));
    }
    Ok(())
}

/// A TMA tensor map (`CUtensorMap`, 128 opaque bytes), passed by value to the wgmma kernels
/// (`OasrTmap`, a `__grid_constant__` parameter).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct TensorMap([u64; 16]);

// SAFETY: plain bytes with the layout and alignment of the kernel's `OasrTmap` parameter.
unsafe impl DeviceRepr for TensorMap {}

/// The tensor map of a row-major [rows, k] 8-bit matrix at device address `ptr`, read in boxes
/// of 128 bytes of K x `box_rows` rows with the 128-byte swizzle (the wgmma kernels' shared
/// tile layout); elements outside the matrix read as zero.
fn tensor_map(ptr: u64, rows: usize, k: usize, box_rows: u32) -> Result<TensorMap> {
    encode_tensor_map(ptr, 1, rows, k, box_rows).map_err(cuda_err(format!(
        "TMA tensor map of a [{rows}, {k}] operand (box {box_rows} rows)"
    )))
}

/// The tensor map of a row-major [rows, cols] 16-bit output at `ptr`, written by the wgmma
/// kernels' TMA-store epilogue in boxes of 64 columns x 16 rows with the 128-byte swizzle;
/// the TMA unit clips the boxes at the matrix's edges.
fn output_tensor_map(ptr: u64, rows: usize, cols: usize) -> Result<TensorMap> {
    if !ptr.is_multiple_of(16) {
        return Err(refused(
            "scaled_mm",
            format!("the output buffer at {ptr:#x} is not 16-byte aligned"),
        ));
    }
    encode_tensor_map(ptr, 2, rows, cols, 16).map_err(cuda_err(format!(
        "TMA tensor map of the [{rows}, {cols}] output"
    )))
}

/// cuTensorMapEncodeTiled of a row-major [rows, cols] matrix of `elem` = 1 (u8) or 2 (u16)
/// byte elements, in boxes of one 128-byte swizzle row x `box_rows` rows.
fn encode_tensor_map(
    ptr: u64,
    elem: usize,
    rows: usize,
    cols: usize,
    box_rows: u32,
) -> std::result::Result<TensorMap, cudarc::driver::DriverError> {
    use cudarc::driver::sys::{
        cuTensorMapEncodeTiled, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
        CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let data_type = if elem == 2 {
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16
    } else {
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8
    };
    let dims = [cols as u64, rows as u64];
    let strides = [(cols * elem) as u64]; // bytes between rows (dimension 1)
    let boxes = [128 / elem as u32, box_rows]; // one 128-byte swizzle row
    let element_strides = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    // SAFETY: every array holds the rank (2) entries the call reads (strides: rank - 1); the
    // output is a properly aligned CUtensorMap; the function only encodes, it touches no memory
    // at `ptr`.
    unsafe {
        cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()?;
    // SAFETY: initialised by the successful call above.
    let map = unsafe { map.assume_init() };
    Ok(TensorMap(map.opaque))
}

impl CudaLane {
    /// The lane on GPU 0, with the module cache of the environment
    /// ([`KernelCache::from_env`]).
    pub fn new() -> Result<Self> {
        Self::open(0, &KernelCache::from_env())
    }

    /// The lane on GPU `ordinal`, caching compiled kernels in `cache`.
    ///
    /// Fails with [`Error::Cuda`], never a panic, when the driver library is missing, no GPU
    /// is visible, the GPU is older than sm_80, or the kernels cannot be compiled (NVRTC
    /// missing and nothing cached, or a compiler error).
    pub fn open(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        loader::ensure_driver()?;
        // cudarc panics on a missing driver symbol; keep that from escaping as a panic.
        match catch_unwind(AssertUnwindSafe(|| Self::open_inner(ordinal, cache))) {
            Ok(r) => r,
            Err(p) => Err(Error::Cuda {
                what: "initialisation".into(),
                message: panic_message(p),
            }),
        }
    }

    fn open_inner(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        let count = CudaContext::device_count().map_err(|e| {
            let mut err = cuda_err("device discovery")(e);
            if let Error::Cuda { message, .. } = &mut err {
                message.push_str(" (no usable NVIDIA GPU is visible to this process)");
            }
            err
        })?;
        if count <= 0 {
            return Err(Error::Cuda {
                what: "device discovery".into(),
                message: "the driver sees no CUDA GPU".into(),
            });
        }
        if ordinal >= count as usize {
            return Err(Error::Cuda {
                what: "device discovery".into(),
                message: format!("GPU {ordinal} requested, but only {count} visible"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("context creation"))?;
        // One stream, one lane: ordering is the stream's, so per-buffer events are not needed
        // (and would add two event records to every launch in the benchmark).
        // SAFETY: every buffer of this context is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_err("stream creation"))?;
        let (major, minor) = ctx.compute_capability().map_err(cuda_err("device query"))?;
        let arch = Arch::for_device(major as u32, minor as u32);
        let gemm_path = GemmPath::from_env()?;
        let name = ctx.name().map_err(cuda_err("device query"))?;
        if !arch.supports_int8() {
            return Err(Error::Cuda {
                what: "device".into(),
                message: format!("{name} is {arch}; the scaled-GEMM kernels need sm_80 or newer"),
            });
        }
        let attr = |a: CUdevice_attribute| -> Result<usize> {
            ctx.attribute(a)
                .map(|v| v.max(0) as usize)
                .map_err(cuda_err("device query"))
        };
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let smem_per_sm =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
        let smem_per_block_optin =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let mut driver_version = 0;
        // SAFETY: the driver is loaded and initialised (context created); valid out pointer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(cuda_err("driver version"))?;

        let (module, log, origin) = Self::load_module(&ctx, arch, cache)?;
        let resources = log.as_deref().map(parse_resources).unwrap_or_default();

        let function = |name: &str| -> Result<CudaFunction> {
            module
                .load_function(name)
                .map_err(cuda_err(format!("kernel `{name}`")))
        };
        let mut gemm = Vec::new();
        for c in GEMM_CONFIGS {
            if !gemm_path.runs(arch, &c) || c.smem_bytes() as usize > smem_per_block_optin {
                continue;
            }
            let f = function(&c.kernel_name())?;
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                c.smem_bytes() as i32,
            )
            .map_err(cuda_err(format!("shared memory of `{}`", c.kernel_name())))?;
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(
                    c.threads(),
                    c.smem_bytes() as usize,
                    None,
                )
                .map_err(cuda_err(format!("occupancy of `{}`", c.kernel_name())))?;
            if per_sm == 0 {
                continue;
            }
            gemm.push((c, f, per_sm as usize));
        }
        let info = DeviceInfo {
            ordinal,
            name,
            arch,
            gemm_path,
            sm_count,
            smem_per_sm,
            smem_per_block_optin,
            driver_version,
            module: origin,
            resources,
        };
        Ok(CudaLane {
            quantize_per_token_fn: function(kernels::QUANTIZE_PER_TOKEN)?,
            quantize_static_fn: function(kernels::QUANTIZE_STATIC)?,
            epilogue_i32_fn: function(kernels::EPILOGUE_I32)?,
            ctx,
            stream,
            info,
            _module: module,
            gemm,
        })
    }

    /// Loads the cached module, or compiles it; a cached module the driver rejects is evicted
    /// and rebuilt once.
    fn load_module(
        ctx: &Arc<CudaContext>,
        arch: Arch,
        cache: &KernelCache,
    ) -> Result<(Arc<CudaModule>, Option<String>, ModuleOrigin)> {
        let (cubin, log, origin) = kernels::cached_or_compiled(arch, cache)?;
        match ctx.load_module(Ptx::from_binary(cubin)) {
            Ok(m) => Ok((m, log, origin)),
            Err(e) if matches!(origin, ModuleOrigin::Cached { .. }) => {
                let _ = e;
                cache.evict(arch);
                let (cubin, log, origin) = kernels::cached_or_compiled(arch, cache)?;
                let m = ctx
                    .load_module(Ptx::from_binary(cubin))
                    .map_err(cuda_err(format!("loading the kernels for {arch}")))?;
                Ok((m, log, origin))
            }
            Err(e) => Err(cuda_err(format!("loading the kernels for {arch}"))(e)),
        }
    }

    /// The GPU and its kernels.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The context (for callers that allocate their own buffers).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The lane's stream: every kernel of the lane runs on it, in order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copies `data` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(data)
            .map_err(cuda_err("host-to-device copy"))
    }

    /// A device buffer of `len` zeros.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(len)
            .map_err(cuda_err("device allocation"))
    }

    /// Copies a device buffer back (waits for the stream, so it also reports any earlier
    /// asynchronous kernel failure).
    pub fn download<T: DeviceRepr>(&self, data: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(data)
            .map_err(cuda_err("device-to-host copy"))
    }

    /// Waits for every kernel of the lane.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("stream synchronisation"))
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // Event tracking is off, so the guard records nothing.
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// The GEMM configurations this GPU runs for `dtype`.
    pub fn gemm_configs(&self, dtype: QuantDtype) -> Vec<GemmConfig> {
        self.gemm
            .iter()
            .filter(|(c, _, _)| c.dtype == dtype)
            .map(|(c, _, _)| *c)
            .collect()
    }

    /// How many CTAs of `config` one multiprocessor holds at once (None: it does not run here).
    pub fn gemm_occupancy(&self, config: &GemmConfig) -> Option<usize> {
        self.gemm
            .iter()
            .find(|(c, _, _)| c == config)
            .map(|(_, _, per_sm)| *per_sm)
    }

    /// The configuration [`launch_scaled_mm`](Self::launch_scaled_mm) uses for this shape when
    /// none is given and the epilogue has no activation.
    pub fn choose_config(
        &self,
        dtype: QuantDtype,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<GemmConfig> {
        self.choose_config_for(dtype, Activation::None, m, n, k)
    }

    /// The configuration [`launch_scaled_mm`](Self::launch_scaled_mm) uses for this shape and
    /// epilogue activation when none is given.
    pub fn choose_config_for(
        &self,
        dtype: QuantDtype,
        activation: Activation,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<GemmConfig> {
        let available: Vec<(GemmConfig, usize)> = self
            .gemm
            .iter()
            .map(|(c, _, per_sm)| (*c, *per_sm))
            .collect();
        GemmConfig::choose_for(dtype, activation, m, n, k, &available, self.info.sm_count)
            .ok_or_else(|| Error::Cuda {
                what: "scaled_mm".into(),
                message: format!("no {dtype} GEMM kernel runs on {}", self.info.arch),
            })
    }

    fn check_dtype(&self, op: &str, dtype: QuantDtype) -> Result<()> {
        if dtype == QuantDtype::Float8E4m3fn && !self.info.arch.supports_fp8() {
            return Err(Error::Cuda {
                what: op.into(),
                message: format!(
                    "float8_e4m3fn GEMMs need sm_89 or newer; {} is {}",
                    self.info.name, self.info.arch
                ),
            });
        }
        Ok(())
    }

    /// The kernel contract of a GEMM shape.
    fn check_gemm_shape(
        &self,
        op: &str,
        dtype: QuantDtype,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        self.check_dtype(op, dtype)?;
        if m == 0 {
            return Err(refused(op, "M must be at least 1"));
        }
        if n == 0 || !n.is_multiple_of(8) {
            return Err(refused(
                op,
                format!("N = {n} must be a positive multiple of 8"),
            ));
        }
        if k == 0 || !k.is_multiple_of(16) {
            return Err(refused(
                op,
                format!("K = {k} must be a positive multiple of 16"),
            ));
        }
        if dtype == QuantDtype::Int8 && k > INT8_MAX_K {
            return Err(refused(
                op,
                format!("K = {k} exceeds {INT8_MAX_K}, the int32 accumulator's exact range"),
            ));
        }
        check_i32(op, "M", m)?;
        check_i32(op, "N", n)?;
        check_i32(op, "K", k)?;
        for (what, x, y) in [("M * K", m, k), ("N * K", n, k), ("M * N", m, n)] {
            if x.checked_mul(y).is_none() {
                return Err(refused(op, format!("{what} overflows")));
            }
        }
        Ok(())
    }

    /// Runs a scaled GEMM on device buffers; `config` None picks one with
    /// [`choose_config`](Self::choose_config). Returns the configuration used. Asynchronous:
    /// the result is ready when the stream reaches it ([`download`](Self::download) waits).
    pub fn launch_scaled_mm(
        &self,
        g: &DeviceGemm,
        out: DeviceOutput,
        config: Option<GemmConfig>,
    ) -> Result<GemmConfig> {
        let op = "scaled_mm";
        let (m, n, k) = (g.m, g.n, g.k);
        self.check_gemm_shape(op, g.dtype, m, n, k)?;
        check_len(op, "a", g.a.len(), m, k)?;
        check_len(op, "w", g.w.len(), n, k)?;
        check_len(op, "weight_scale", g.weight_scale.len(), n, 1)?;
        if let DeviceActScale::PerRow(s) = g.a_scale {
            check_len(op, "a_scale", s.len(), m, 1)?;
        }
        if let Some(b) = g.bias {
            check_len(op, "bias", b.len(), n, 1)?;
        }
        let (out_ptr, quant_mult, quant_dtype) = match out {
            DeviceOutput::Rounded(o) => {
                check_len(op, "the output", o.len(), m, n)?;
                (self.ptr(o), 0, 0)
            }
            DeviceOutput::Quantized { codes, mult, dtype } => {
                check_len("scaled_mm_quant", "the output", codes.len(), m, n)?;
                check_len(
                    "scaled_mm_quant",
                    "the consumer multipliers",
                    mult.len(),
                    n,
                    1,
                )?;
                (self.ptr(codes), self.ptr(mult), quant_code(dtype))
            }
        };
        let config = match config {
            Some(c) => c,
            None => self.choose_config_for(g.dtype, g.activation, m, n, k)?,
        };
        let (a_scale, a_scale_value) = match g.a_scale {
            DeviceActScale::PerRow(s) => (self.ptr(s), 0.0),
            DeviceActScale::PerTensor(v) => (0, v),
        };
        let params = GemmParams {
            a: self.ptr(g.a),
            w: self.ptr(g.w),
            epi: EpilogueParams {
                a_scale,
                weight_scale: self.ptr(g.weight_scale),
                bias: g.bias.map_or(0, |b| self.ptr(b)),
                quant_mult,
                out: out_ptr,
                a_scale_value,
                activation: activation_code(g.activation),
                out_dtype: out_code(g.out_dtype),
                quant_dtype,
            },
            m: m as i32,
            n: n as i32,
            k: k as i32,
            reserved: 0,
        };
        self.launch_gemm(&config, &params, m, n, k)?;
        Ok(config)
    }

    fn launch_gemm(
        &self,
        config: &GemmConfig,
        p: &GemmParams,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let Some((_, f, per_sm)) = self.gemm.iter().find(|(c, _, _)| c == config) else {
            return Err(Error::Cuda {
                what: "scaled_mm".into(),
                message: format!(
                    "configuration {} ({}) does not run on {}",
                    config.label(),
                    config.dtype,
                    self.info.arch
                ),
            });
        };
        let ctas = config.ctas(m, n);
        check_i32("scaled_mm", "the number of CTAs", ctas)?;
        if config.kind == GemmKind::Wgmma {
            // Persistent: at most one CTA per slot, each looping over output tiles.
            let grid = ctas.min(per_sm * self.info.sm_count.max(1)).max(1);
            let ta = tensor_map(p.a, m, k, config.bm)?;
            let tb = tensor_map(p.w, n, k, config.bn)?;
            // The 16-bit output of the TMA-store epilogue (8-bit codes never go through it).
            let to = if p.epi.quant_mult == 0 {
                output_tensor_map(p.epi.out, m, n)?
            } else {
                ta
            };
            let cfg = LaunchConfig {
                grid_dim: (grid as u32, 1, 1),
                block_dim: (config.threads(), 1, 1),
                shared_mem_bytes: config.smem_bytes(),
            };
            // SAFETY: `p` matches the kernel's `GemmParams` (layout asserted on both sides) and
            // the three tensor maps its `OasrTmap` parameters (128 opaque bytes); every pointer
            // is a live device buffer whose length was checked against m, n, k, and the maps
            // describe exactly those [m, k], [n, k] and [m, n] buffers (the kernel reads `to`
            // only for a 16-bit output, with activation none or ReLU).
            unsafe {
                self.stream
                    .launch_builder(f)
                    .arg(p)
                    .arg(&ta)
                    .arg(&tb)
                    .arg(&to)
                    .launch(cfg)
            }
            .map_err(cuda_err(format!("launch of {}", config.kernel_name())))?;
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (ctas as u32, 1, 1),
            block_dim: (config.threads(), 1, 1),
            shared_mem_bytes: config.smem_bytes(),
        };
        // SAFETY: `p` matches the kernel's `GemmParams` (layout asserted on both sides); every
        // pointer in it is a live device buffer whose length was checked against m, n, k.
        unsafe { self.stream.launch_builder(f).arg(p).launch(cfg) }
            .map_err(cuda_err(format!("launch of {}", config.kernel_name())))?;
        Ok(())
    }

    /// The stand-alone epilogue on an int32 accumulator `acc` [M, N] (what follows cuBLASLt's
    /// i8·i8 -> i32 GEMM in the benchmark); same operands and result as the fused epilogue.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_epilogue_i32(
        &self,
        acc: &CudaSlice<i32>,
        a_scale: DeviceActScale,
        weight_scale: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        activation: Activation,
        out: &mut CudaSlice<u16>,
        out_dtype: OutDtype,
        m: usize,
        n: usize,
    ) -> Result<()> {
        let op = "epilogue";
        if m == 0 || n == 0 || !n.is_multiple_of(8) {
            return Err(refused(
                op,
                format!("M = {m}, N = {n}: need M >= 1 and N % 8 == 0"),
            ));
        }
        check_i32(op, "M", m)?;
        check_i32(op, "N", n)?;
        check_len(op, "acc", acc.len(), m, n)?;
        check_len(op, "out", out.len(), m, n)?;
        check_len(op, "weight_scale", weight_scale.len(), n, 1)?;
        if let Some(b) = bias {
            check_len(op, "bias", b.len(), n, 1)?;
        }
        let (a_scale_ptr, a_scale_value) = match a_scale {
            DeviceActScale::PerRow(s) => {
                check_len(op, "a_scale", s.len(), m, 1)?;
                (self.ptr(s), 0.0)
            }
            DeviceActScale::PerTensor(v) => (0, v),
        };
        let epi = EpilogueParams {
            a_scale: a_scale_ptr,
            weight_scale: self.ptr(weight_scale),
            bias: bias.map_or(0, |b| self.ptr(b)),
            quant_mult: 0,
            out: self.ptr(out),
            a_scale_value,
            activation: activation_code(activation),
            out_dtype: out_code(out_dtype),
            quant_dtype: 0,
        };
        let groups = m * n / 8;
        let blocks = groups.div_ceil(256).min(self.info.sm_count.max(1) * 16) as u32;
        let (mi, ni) = (m as i32, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let acc_ptr = self.ptr(acc);
        // SAFETY: argument types match `oasr_epilogue_i32(const i32*, Epilogue, i32, i32)`;
        // buffer lengths were checked against m and n.
        unsafe {
            self.stream
                .launch_builder(&self.epilogue_i32_fn)
                .arg(&acc_ptr)
                .arg(&epi)
                .arg(&mi)
                .arg(&ni)
                .launch(cfg)
        }
        .map_err(cuda_err("launch of oasr_epilogue_i32"))?;
        Ok(())
    }

    /// GPU [`numerics::quantize_per_token`]: bit-identical codes and scales.
    pub fn quantize_per_token(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        smooth_inv: Option<&[f32]>,
        dtype: QuantDtype,
    ) -> Result<QuantizedRows> {
        let op = "quantize_per_token";
        check_len(op, "x", x.len(), rows, cols)?;
        if let Some(s) = smooth_inv {
            check_len(op, "smooth_inv", s.len(), cols, 1)?;
        }
        check_i32(op, "rows", rows)?;
        check_i32(op, "cols", cols)?;
        if rows == 0 || cols == 0 {
            // Nothing to launch; the reference gives the degenerate answer.
            return Ok(numerics::quantize_per_token(
                x, rows, cols, smooth_inv, dtype,
            ));
        }
        let xd = self.upload(x)?;
        let sd = smooth_inv.map(|s| self.upload(s)).transpose()?;
        let mut codes = self.zeros::<u8>(x.len())?;
        let mut scales = self.zeros::<f32>(rows)?;
        self.launch_quantize_per_token(
            &xd,
            sd.as_ref(),
            &mut codes,
            &mut scales,
            rows,
            cols,
            dtype,
        )?;
        let codes_h = self.download(&codes)?;
        let scales_h = self.download(&scales)?;
        Ok(QuantizedRows {
            dtype,
            rows,
            cols,
            codes: codes_h,
            scales: scales_h,
        })
    }

    /// [`quantize_per_token`](Self::quantize_per_token) on device buffers: `x` [rows, cols]
    /// into `codes` [rows, cols] and `scales` [rows]. Asynchronous, on the lane's stream.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_quantize_per_token(
        &self,
        x: &CudaSlice<f32>,
        smooth_inv: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        dtype: QuantDtype,
    ) -> Result<()> {
        let op = "quantize_per_token";
        if rows == 0 || cols == 0 {
            return Err(refused(op, "rows and cols must be at least 1"));
        }
        check_i32(op, "rows", rows)?;
        check_i32(op, "cols", cols)?;
        check_len(op, "x", x.len(), rows, cols)?;
        check_len(op, "codes", codes.len(), rows, cols)?;
        check_len(op, "scales", scales.len(), rows, 1)?;
        if let Some(s) = smooth_inv {
            check_len(op, "smooth_inv", s.len(), cols, 1)?;
        }
        let (xp, sp, cp, scp) = (
            self.ptr(x),
            smooth_inv.map_or(0, |s| self.ptr(s)),
            self.ptr(codes),
            self.ptr(scales),
        );
        let (r, c, d) = (rows as i32, cols as i32, quant_code(dtype));
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match `oasr_quantize_per_token(const float*, const float*,
        // u8*, float*, i32, i32, i32)`; buffers hold rows * cols / cols / rows * cols / rows
        // elements (checked above).
        unsafe {
            self.stream
                .launch_builder(&self.quantize_per_token_fn)
                .arg(&xp)
                .arg(&sp)
                .arg(&cp)
                .arg(&scp)
                .arg(&r)
                .arg(&c)
                .arg(&d)
                .launch(cfg)
        }
        .map_err(cuda_err("launch of oasr_quantize_per_token"))?;
        Ok(())
    }

    /// GPU [`numerics::quantize_static`]: bit-identical codes.
    pub fn quantize_static(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        smooth_inv: Option<&[f32]>,
        input_scale: f32,
        dtype: QuantDtype,
    ) -> Result<Vec<u8>> {
        let op = "quantize_static";
        check_len(op, "x", x.len(), rows, cols)?;
        if let Some(s) = smooth_inv {
            check_len(op, "smooth_inv", s.len(), cols, 1)?;
        }
        check_input_scale(op, input_scale)?;
        check_i32(op, "rows", rows)?;
        check_i32(op, "cols", cols)?;
        if x.is_empty() {
            return Ok(Vec::new());
        }
        let mult = numerics::static_multipliers(cols, smooth_inv, input_scale);
        let xd = self.upload(x)?;
        let md = self.upload(&mult)?;
        let mut codes = self.zeros::<u8>(x.len())?;
        self.launch_quantize_static(&xd, &md, &mut codes, rows, cols, dtype)?;
        self.download(&codes)
    }

    /// [`quantize_static`](Self::quantize_static) on device buffers, with the per-column
    /// multipliers `mult` = `numerics::static_multipliers(cols, smooth_inv, input_scale)`
    /// already on the GPU. Asynchronous, on the lane's stream.
    pub fn launch_quantize_static(
        &self,
        x: &CudaSlice<f32>,
        mult: &CudaSlice<f32>,
        codes: &mut CudaSlice<u8>,
        rows: usize,
        cols: usize,
        dtype: QuantDtype,
    ) -> Result<()> {
        let op = "quantize_static";
        if rows == 0 || cols == 0 {
            return Err(refused(op, "rows and cols must be at least 1"));
        }
        check_i32(op, "rows", rows)?;
        check_i32(op, "cols", cols)?;
        check_len(op, "x", x.len(), rows, cols)?;
        check_len(op, "codes", codes.len(), rows, cols)?;
        check_len(op, "mult", mult.len(), cols, 1)?;
        let (xp, mp, cp) = (self.ptr(x), self.ptr(mult), self.ptr(codes));
        let (r, c, d) = (rows as i32, cols as i32, quant_code(dtype));
        let blocks = (rows * cols)
            .div_ceil(256)
            .min(self.info.sm_count.max(1) * 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types match `oasr_quantize_static(const float*, const float*, u8*,
        // i32, i32, i32)`; buffers hold rows * cols / cols / rows * cols elements (checked).
        unsafe {
            self.stream
                .launch_builder(&self.quantize_static_fn)
                .arg(&xp)
                .arg(&mp)
                .arg(&cp)
                .arg(&r)
                .arg(&c)
                .arg(&d)
                .launch(cfg)
        }
        .map_err(cuda_err("launch of oasr_quantize_static"))?;
        Ok(())
    }

    /// GPU [`numerics::scaled_mm`]: int8 bit-identical to the reference; fp8 within the bound
    /// of `docs/cuda.md` and batch-invariant.
    #[allow(clippy::too_many_arguments)]
    pub fn scaled_mm(
        &self,
        dtype: QuantDtype,
        a: &[u8],
        a_scale: ActScale,
        w: &[u8],
        weight_scale: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Result<Vec<u16>> {
        self.scaled_mm_with(None, dtype, a, a_scale, w, weight_scale, m, n, k, epi)
    }

    /// [`scaled_mm`](Self::scaled_mm) with a given tile configuration (None: the heuristic's).
    #[allow(clippy::too_many_arguments)]
    pub fn scaled_mm_with(
        &self,
        config: Option<GemmConfig>,
        dtype: QuantDtype,
        a: &[u8],
        a_scale: ActScale,
        w: &[u8],
        weight_scale: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Result<Vec<u16>> {
        let ops = self.upload_gemm(
            "scaled_mm",
            dtype,
            a,
            a_scale,
            w,
            weight_scale,
            m,
            n,
            k,
            epi,
        )?;
        let mut out = self.zeros::<u16>(m * n)?;
        self.launch_scaled_mm(
            &ops.view(dtype, epi, m, n, k),
            DeviceOutput::Rounded(&mut out),
            config,
        )?;
        self.download(&out)
    }

    /// GPU [`numerics::scaled_mm_quant`]: the producer GEMM of a chain, writing the consumer's
    /// 8-bit codes. int8 bit-identical to the reference.
    #[allow(clippy::too_many_arguments)]
    pub fn scaled_mm_quant(
        &self,
        dtype: QuantDtype,
        a: &[u8],
        a_scale: ActScale,
        w: &[u8],
        weight_scale: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
        consumer_smooth_inv: Option<&[f32]>,
        consumer_input_scale: f32,
        out_dtype8: QuantDtype,
    ) -> Result<Vec<u8>> {
        self.scaled_mm_quant_with(
            None,
            dtype,
            a,
            a_scale,
            w,
            weight_scale,
            m,
            n,
            k,
            epi,
            consumer_smooth_inv,
            consumer_input_scale,
            out_dtype8,
        )
    }

    /// [`scaled_mm_quant`](Self::scaled_mm_quant) with a given tile configuration.
    #[allow(clippy::too_many_arguments)]
    pub fn scaled_mm_quant_with(
        &self,
        config: Option<GemmConfig>,
        dtype: QuantDtype,
        a: &[u8],
        a_scale: ActScale,
        w: &[u8],
        weight_scale: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
        consumer_smooth_inv: Option<&[f32]>,
        consumer_input_scale: f32,
        out_dtype8: QuantDtype,
    ) -> Result<Vec<u8>> {
        let op = "scaled_mm_quant";
        if let Some(s) = consumer_smooth_inv {
            check_len(op, "consumer_smooth_inv", s.len(), n, 1)?;
        }
        check_input_scale(op, consumer_input_scale)?;
        let ops = self.upload_gemm(op, dtype, a, a_scale, w, weight_scale, m, n, k, epi)?;
        let mult = self.upload(&numerics::static_multipliers(
            n,
            consumer_smooth_inv,
            consumer_input_scale,
        ))?;
        let mut codes = self.zeros::<u8>(m * n)?;
        self.launch_scaled_mm(
            &ops.view(dtype, epi, m, n, k),
            DeviceOutput::Quantized {
                codes: &mut codes,
                mult: &mult,
                dtype: out_dtype8,
            },
            config,
        )?;
        self.download(&codes)
    }

    /// Checks and uploads the operands of a host-side GEMM call.
    #[allow(clippy::too_many_arguments)]
    fn upload_gemm(
        &self,
        op: &str,
        dtype: QuantDtype,
        a: &[u8],
        a_scale: ActScale,
        w: &[u8],
        weight_scale: &[f32],
        m: usize,
        n: usize,
        k: usize,
        epi: &GemmEpilogue,
    ) -> Result<GemmOperands> {
        self.check_gemm_shape(op, dtype, m, n, k)?;
        check_len(op, "a", a.len(), m, k)?;
        check_len(op, "w", w.len(), n, k)?;
        check_len(op, "weight_scale", weight_scale.len(), n, 1)?;
        if let ActScale::PerRow(s) = a_scale {
            check_len(op, "a_scale", s.len(), m, 1)?;
        }
        if let Some(b) = epi.bias {
            check_len(op, "bias", b.len(), n, 1)?;
        }
        Ok(GemmOperands {
            a: self.upload(a)?,
            w: self.upload(w)?,
            weight_scale: self.upload(weight_scale)?,
            a_scale: match a_scale {
                ActScale::PerRow(s) => HostScale::PerRow(self.upload(s)?),
                ActScale::PerTensor(v) => HostScale::PerTensor(v),
            },
            bias: epi.bias.map(|b| self.upload(b)).transpose()?,
        })
    }
}

enum HostScale {
    PerRow(CudaSlice<f32>),
    PerTensor(f32),
}

/// Operands of a host-side GEMM call, uploaded.
struct GemmOperands {
    a: CudaSlice<u8>,
    w: CudaSlice<u8>,
    weight_scale: CudaSlice<f32>,
    a_scale: HostScale,
    bias: Option<CudaSlice<f32>>,
}

impl GemmOperands {
    fn view<'a>(
        &'a self,
        dtype: QuantDtype,
        epi: &GemmEpilogue,
        m: usize,
        n: usize,
        k: usize,
    ) -> DeviceGemm<'a> {
        DeviceGemm {
            dtype,
            a: &self.a,
            a_scale: match &self.a_scale {
                HostScale::PerRow(s) => DeviceActScale::PerRow(s),
                HostScale::PerTensor(v) => DeviceActScale::PerTensor(*v),
            },
            w: &self.w,
            weight_scale: &self.weight_scale,
            bias: self.bias.as_ref(),
            activation: epi.activation,
            out_dtype: epi.out,
            m,
            n,
            k,
        }
    }
}
