//! The kernel sources, their NVRTC compilation for one GPU architecture, and the on-disk cache
//! of compiled modules.
//!
//! The sources of `kernels-cuda/` are embedded in the library, so a binary needs nothing beside
//! itself but the driver and NVRTC. They are compiled as one translation unit (`common.cuh`
//! followed by every `.cu` file) straight to machine code (CUBIN) for the architecture of the
//! device, e.g. `sm_90`, with `--fmad=false` so no floating-point multiply and add are ever
//! fused. The CUBIN is cached under a key that hashes the sources, the options and the
//! architecture, so a later process (or another test binary) loads it without NVRTC.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::loader;
use crate::error::{Error, Result};
use crate::numerics::{Activation, QuantDtype};

/// The kernel sources in compilation order: (file name, text).
pub const KERNEL_SOURCES: [(&str, &str); 5] = [
    ("common.cuh", include_str!("../../kernels-cuda/common.cuh")),
    (
        "scaled_mm.cu",
        include_str!("../../kernels-cuda/scaled_mm.cu"),
    ),
    (
        "scaled_mm_wgmma.cu",
        include_str!("../../kernels-cuda/scaled_mm_wgmma.cu"),
    ),
    (
        "quantize.cu",
        include_str!("../../kernels-cuda/quantize.cu"),
    ),
    (
        "epilogue.cu",
        include_str!("../../kernels-cuda/epilogue.cu"),
    ),
];

/// The translation unit NVRTC compiles: every source in order, each preceded by a `#line`
/// directive so that compiler messages name the original file and line.
pub fn kernel_bundle() -> String {
    let mut s = String::new();
    for (name, text) in KERNEL_SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// A GPU architecture, as a compute capability (`sm_90` is 9.0), and whether the kernels are
/// compiled for its architecture-specific variant (`sm_90a`: wgmma, which runs on 9.0 devices
/// only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
    /// The `a` target (`sm_90a`): architecture-specific instructions, no forward compatibility.
    pub specific: bool,
}

impl Arch {
    pub const SM80: Arch = Arch::new(8, 0);
    pub const SM89: Arch = Arch::new(8, 9);
    /// Plain sm_90: the wgmma kernels are empty stubs.
    pub const SM90: Arch = Arch::new(9, 0);
    /// sm_90a: what a 9.0 device (H100, H200) runs; the wgmma kernels are compiled.
    pub const SM90A: Arch = Arch::new(9, 0).arch_specific();

    /// The portable target of compute capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Arch {
            major,
            minor,
            specific: false,
        }
    }

    /// The same compute capability, architecture-specific target.
    pub const fn arch_specific(self) -> Self {
        Arch {
            specific: true,
            ..self
        }
    }

    /// The target the runtime compiles for a device of compute capability `major.minor`:
    /// `sm_90a` on 9.0 (for the wgmma kernels), the portable `sm_XY` elsewhere.
    pub const fn for_device(major: u32, minor: u32) -> Self {
        let a = Arch::new(major, minor);
        if major == 9 && minor == 0 {
            a.arch_specific()
        } else {
            a
        }
    }

    /// `sm_90` / `sm_90a` style name (the NVRTC target).
    pub fn name(self) -> String {
        format!(
            "sm_{}{}{}",
            self.major,
            self.minor,
            if self.specific { "a" } else { "" }
        )
    }

    /// The Hopper wgmma / TMA kernels (`scaled_mm_wgmma.cu`) have code on this target.
    pub fn supports_wgmma(self) -> bool {
        self.specific && self.major == 9 && self.minor == 0
    }

    /// The int8 kernels need sm_80 (cp.async, ldmatrix, mma.m16n8k32.s8).
    pub fn supports_int8(self) -> bool {
        self.major >= 8
    }

    /// The e4m3 mma.sync exists from sm_89 on.
    pub fn supports_fp8(self) -> bool {
        (self.major, self.minor) >= (8, 9)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Which kernel family a configuration belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GemmKind {
    /// `scaled_mm.cu`: `mma.sync` from `ldmatrix` fragments, a cp.async ring (sm_80+).
    MmaSync,
    /// `scaled_mm_wgmma.cu`: warp-specialised, persistent, TMA + mbarrier ring, `wgmma`
    /// (sm_90a only).
    Wgmma,
}

/// One tile configuration of the scaled-GEMM kernels, as instantiated in `scaled_mm.cu`
/// (`MmaSync`) or `scaled_mm_wgmma.cu` (`Wgmma`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    pub dtype: QuantDtype,
    pub kind: GemmKind,
    /// Output rows per CTA.
    pub bm: u32,
    /// Output columns per CTA.
    pub bn: u32,
    /// Bytes of K per pipeline stage.
    pub bk: u32,
    /// MmaSync: warps along M. Wgmma: consumer warps (4 per consumer warpgroup of 64 rows).
    pub warps_m: u32,
    /// MmaSync: warps along N. Wgmma: 1 (a consumer warp spans the tile's BN columns).
    pub warps_n: u32,
    /// Depth of the shared-memory ring.
    pub stages: u32,
    /// Wgmma: output columns per epilogue pass (the per-warp scratch width); 0 for MmaSync.
    pub epi_cols: u32,
}

const fn cfg(dtype: QuantDtype, t: [u32; 6]) -> GemmConfig {
    GemmConfig {
        dtype,
        kind: GemmKind::MmaSync,
        bm: t[0],
        bn: t[1],
        bk: t[2],
        warps_m: t[3],
        warps_n: t[4],
        stages: t[5],
        epi_cols: 0,
    }
}

/// A wgmma configuration: BM x BN tile, `stages`-deep ring, `epi_cols` epilogue columns.
const fn wg(dtype: QuantDtype, bm: u32, bn: u32, stages: u32, epi_cols: u32) -> GemmConfig {
    GemmConfig {
        dtype,
        kind: GemmKind::Wgmma,
        bm,
        bn,
        bk: 128,
        warps_m: bm / 16,
        warps_n: 1,
        stages,
        epi_cols,
    }
}

/// Every compiled configuration, largest tiles first. Must list exactly the configurations of
/// `scaled_mm.cu` (`OASR_GEMM_CONFIG` gives both dtypes, `OASR_GEMM_I8` int8 only) and of
/// `scaled_mm_wgmma.cu` (`OASR_WGMMA_I8`, `OASR_WGMMA_E4M3`).
pub const GEMM_CONFIGS: [GemmConfig; 24] = {
    use QuantDtype::{Float8E4m3fn as F8, Int8 as I8};
    [
        cfg(I8, [128, 256, 64, 2, 4, 4]),
        cfg(I8, [128, 256, 128, 2, 4, 3]),
        cfg(I8, [128, 128, 64, 2, 2, 4]),
        cfg(I8, [128, 128, 128, 2, 2, 3]),
        cfg(I8, [128, 128, 64, 2, 2, 6]),
        cfg(I8, [128, 128, 64, 2, 4, 4]),
        cfg(I8, [128, 64, 64, 2, 2, 4]),
        cfg(I8, [64, 128, 64, 2, 2, 4]),
        cfg(I8, [64, 64, 64, 2, 2, 4]),
        cfg(F8, [128, 256, 64, 2, 4, 4]),
        cfg(F8, [128, 128, 64, 2, 2, 4]),
        cfg(F8, [128, 128, 64, 2, 4, 4]),
        cfg(F8, [128, 64, 64, 2, 2, 4]),
        cfg(F8, [64, 128, 64, 2, 2, 4]),
        cfg(F8, [64, 64, 64, 2, 2, 4]),
        wg(I8, 128, 256, 4, 32),
        wg(I8, 128, 192, 4, 32),
        wg(I8, 128, 128, 6, 32),
        wg(I8, 64, 128, 4, 32),
        wg(I8, 64, 64, 3, 32),
        wg(F8, 128, 192, 4, 32),
        wg(F8, 128, 128, 6, 32),
        wg(F8, 64, 128, 4, 32),
        wg(F8, 64, 64, 4, 16),
    ]
};

impl GemmConfig {
    /// The kernel's entry point, e.g. `oasr_scaled_mm_i8_128x256x64_w2x4_s4` or
    /// `oasr_scaled_mm_wgmma_i8_128x256_s4_e32`.
    pub fn kernel_name(&self) -> String {
        let d = match self.dtype {
            QuantDtype::Int8 => "i8",
            QuantDtype::Float8E4m3fn => "e4m3",
        };
        match self.kind {
            GemmKind::MmaSync => format!(
                "oasr_scaled_mm_{d}_{}x{}x{}_w{}x{}_s{}",
                self.bm, self.bn, self.bk, self.warps_m, self.warps_n, self.stages
            ),
            GemmKind::Wgmma => format!(
                "oasr_scaled_mm_wgmma_{d}_{}x{}_s{}_e{}",
                self.bm, self.bn, self.stages, self.epi_cols
            ),
        }
    }

    /// Short label for tables: `128x256x64/8w/s4` (mma.sync), `128x256x128/2wg/s4` (wgmma:
    /// consumer warpgroups).
    pub fn label(&self) -> String {
        match self.kind {
            GemmKind::MmaSync => format!(
                "{}x{}x{}/{}w/s{}",
                self.bm,
                self.bn,
                self.bk,
                self.warps_m * self.warps_n,
                self.stages
            ),
            GemmKind::Wgmma => format!(
                "{}x{}x{}/{}wg/s{}",
                self.bm,
                self.bn,
                self.bk,
                self.bm / 64,
                self.stages
            ),
        }
    }

    /// Threads per CTA. Wgmma: the consumer warpgroups and the producer, a whole warpgroup
    /// beside two consumer warpgroups (its registers go to them through `setmaxnreg`), one
    /// warp beside one.
    pub fn threads(&self) -> u32 {
        match self.kind {
            GemmKind::MmaSync => self.warps_m * self.warps_n * 32,
            GemmKind::Wgmma if self.bm >= 128 => (self.bm / 64) * 128 + 128,
            GemmKind::Wgmma => (self.bm / 64) * 128 + 32,
        }
    }

    /// Dynamic shared memory. MmaSync: the pipeline ring, reused by the epilogue's per-warp
    /// scratch. Wgmma: 1024 bytes of alignment slack, the ring, the per-warp epilogue scratch
    /// (16 rows x (epi_cols + 8) floats per consumer warp) or TMA staging box (16 rows x 128
    /// bytes), whichever is larger, the column operands of two tiles
    /// (weight_scale, bias, consumer multipliers: 3 x BN floats each) and two mbarriers per
    /// stage.
    pub fn smem_bytes(&self) -> u32 {
        match self.kind {
            GemmKind::MmaSync => {
                let ring = self.stages * (self.bm + self.bn) * self.bk;
                let warp_cols = self.bn / self.warps_n;
                let scratch = self.warps_m * self.warps_n * 16 * (warp_cols + 8) * 4;
                ring.max(scratch)
            }
            GemmKind::Wgmma => {
                let ring = self.stages * (self.bm + self.bn) * self.bk;
                let scratch = (self.bm / 16) * 16 * (self.epi_cols + 8) * 4;
                let staging = (self.bm / 16) * 16 * 128;
                let columns = 2 * 3 * self.bn * 4;
                1024 + ring + scratch.max(staging) + columns + 16 * self.stages
            }
        }
    }

    /// Output tiles of this configuration for an M x N output (the CTAs of a mma.sync launch;
    /// a wgmma launch is persistent and runs min(tiles, CTA slots) CTAs).
    pub fn ctas(&self, m: usize, n: usize) -> usize {
        m.div_ceil(self.bm as usize) * n.div_ceil(self.bn as usize)
    }

    /// The configuration the runtime uses for an M x N x K GEMM of `dtype`, among `available`
    /// (each with how many of its CTAs one multiprocessor holds at once, from the driver's
    /// occupancy calculator) on a GPU with `sm_count` multiprocessors.
    ///
    /// A cost model fitted to every configuration on every `bench-gemm` shape of an H200
    /// (BENCHMARKS.md): score = R · K / (K + K0) · fill · used, where R is the configuration's
    /// throughput on a full chip relative to the 64 x 64 mma.sync tile, K0 its per-tile fixed
    /// cost (pipeline fill, epilogue) in units of K, fill the fraction of the CTA slots of all
    /// waves that hold a tile, and used the fraction of the tile inside M x N. Big tiles win on
    /// big, deep problems; small ones fill the chip on the model shapes. Any choice gives
    /// bitwise the same result for int8, and every fp8 configuration of one GPU computes each
    /// output with the same operation sequence (see the kernels): this only picks the fastest.
    /// This is [`choose_for`](Self::choose_for) with no activation.
    pub fn choose(
        dtype: QuantDtype,
        m: usize,
        n: usize,
        k: usize,
        available: &[(GemmConfig, usize)],
        sm_count: usize,
    ) -> Option<GemmConfig> {
        Self::choose_for(dtype, Activation::None, m, n, k, available, sm_count)
    }

    /// [`choose`](Self::choose) for a GEMM whose epilogue applies `activation`: swish and GELU
    /// (~100 exactly rounded operations per output) make the epilogue a large part of a tile's
    /// time, which the wgmma configurations' K0 and R take into account (fitted separately,
    /// with GELU, on the same H200 sweep).
    pub fn choose_for(
        dtype: QuantDtype,
        activation: Activation,
        m: usize,
        n: usize,
        k: usize,
        available: &[(GemmConfig, usize)],
        sm_count: usize,
    ) -> Option<GemmConfig> {
        let heavy = matches!(activation, Activation::Swish | Activation::Gelu);
        let mut best: Option<(f64, GemmConfig)> = None;
        for (c, per_sm) in available.iter().filter(|(c, _)| c.dtype == dtype) {
            let slots = sm_count.max(1) * (*per_sm).max(1);
            let ctas = c.ctas(m, n);
            let waves = ctas.div_ceil(slots);
            let fill = ctas as f64 / (waves * slots) as f64;
            let used = (m as f64 / (m.div_ceil(c.bm as usize) * c.bm as usize) as f64)
                * (n as f64 / (n.div_ceil(c.bn as usize) * c.bn as usize) as f64);
            let (r, k0) = c.cost_model(heavy);
            let depth = k as f64 / (k as f64 + k0);
            let score = r * depth * fill * used;
            match best {
                Some((s, _)) if s >= score => {}
                _ => best = Some((score, *c)),
            }
        }
        best.map(|(_, c)| c)
    }

    /// (R, K0) of [`choose_for`](Self::choose_for); `heavy`: a swish or GELU epilogue.
    fn cost_model(&self, heavy: bool) -> (f64, f64) {
        if heavy && self.kind == GemmKind::Wgmma {
            // Fitted with GELU on the H200 (every default `bench-gemm` shape, 2026-12-01, the
            // branch-free erf: int8 within 3.5 % of the best configuration, 0.3 % on average;
            // fp8 within 0.4 %).
            return match (self.dtype, self.bm, self.bn) {
                (QuantDtype::Int8, 128, 256) => (2.741, 5600.0),
                (QuantDtype::Int8, 128, 192) => (2.72, 5580.0),
                (QuantDtype::Int8, 128, 128) => (2.683, 5560.0),
                (QuantDtype::Int8, 64, 128) => (2.136, 5650.0),
                (QuantDtype::Int8, 64, 64) => (1.434, 2950.0),
                (QuantDtype::Float8E4m3fn, 128, 192) => (1.44, 1230.0),
                (QuantDtype::Float8E4m3fn, 128, 128) => (2.187, 2240.0),
                (QuantDtype::Float8E4m3fn, 64, 128) => (1.825, 2350.0),
                (QuantDtype::Float8E4m3fn, 64, 64) => (1.38, 1400.0),
                _ => (self.throughput(), self.fixed_cost_k()),
            };
        }
        (self.throughput(), self.fixed_cost_k())
    }

    /// K0 of [`choose`](Self::choose): the per-tile fixed cost in units of K. mma.sync:
    /// proportional to the tile area. wgmma: fitted per configuration (H200, every
    /// `bench-gemm` default shape, 2026-11-29; fp8 refitted 2026-12-01 after the TMA-store
    /// epilogue, which made the small fp8 tiles cheaper).
    fn fixed_cost_k(&self) -> f64 {
        match (self.kind, self.dtype, self.bm, self.bn) {
            (GemmKind::MmaSync, ..) => 1000.0 * f64::from(self.bm * self.bn) / (128.0 * 128.0),
            (GemmKind::Wgmma, QuantDtype::Int8, 128, 256) => 1225.0,
            (GemmKind::Wgmma, QuantDtype::Int8, 128, 192) => 1225.0,
            (GemmKind::Wgmma, QuantDtype::Int8, 128, 128) => 1225.0,
            (GemmKind::Wgmma, QuantDtype::Int8, 64, 128) => 1125.0,
            (GemmKind::Wgmma, QuantDtype::Int8, 64, 64) => 775.0,
            (GemmKind::Wgmma, QuantDtype::Float8E4m3fn, 128, 192) => 700.0,
            (GemmKind::Wgmma, QuantDtype::Float8E4m3fn, 128, 128) => 1025.0,
            (GemmKind::Wgmma, QuantDtype::Float8E4m3fn, 64, 128) => 850.0,
            (GemmKind::Wgmma, QuantDtype::Float8E4m3fn, 64, 64) => 675.0,
            (GemmKind::Wgmma, ..) => 1500.0,
        }
    }

    /// Throughput of the configuration on a full chip, relative to the 64 x 64 mma.sync tile
    /// (8192³ on an H200). The wgmma values are fitted together with their K0 on the H200
    /// (2026-12-01, with the TMA-store epilogue: the heuristic's pick is within 4.5 % of the
    /// best int8 configuration on every default shape of `bench-gemm`, 0.3 % on average; fp8
    /// within 7.5 %, 0.3 % on average; the same configuration's time varies by a few percent
    /// from run to run). The fp8 128 x 192 entries were fitted later the same day with the others
    /// held fixed (BENCHMARKS.md, "The fp8 128 x 192 tile").
    fn throughput(&self) -> f64 {
        if self.kind == GemmKind::Wgmma {
            return match (self.dtype, self.bm, self.bn) {
                (QuantDtype::Int8, 128, 256) => 2.825,
                (QuantDtype::Int8, 128, 192) => 2.754,
                (QuantDtype::Int8, 128, 128) => 2.53,
                (QuantDtype::Int8, 64, 128) => 2.585,
                (QuantDtype::Int8, 64, 64) => 1.455,
                (QuantDtype::Float8E4m3fn, 128, 192) => 1.7,
                (QuantDtype::Float8E4m3fn, 128, 128) => 2.08,
                (QuantDtype::Float8E4m3fn, 64, 128) => 1.82,
                (QuantDtype::Float8E4m3fn, 64, 64) => 1.43,
                _ => 1.0,
            };
        }
        match (self.bm, self.bn, self.bk, self.warps_m * self.warps_n) {
            (128, 128, 64, 4) if self.stages == 4 => 1.5,
            (128, 128, 128, 4) => 1.48,
            (128, 256, 128, 8) => 1.42,
            (128, 128, 64, 8) => 1.25,
            (128, 256, 64, 8) => 1.2,
            (64, 128, 64, 4) => 1.12,
            (128, 64, 64, 4) => 1.1,
            (64, 64, 64, 4) => 1.0,
            _ => 0.5,
        }
    }

    /// The configuration named by [`kernel_name`](Self::kernel_name) or [`label`](Self::label)
    /// for `dtype`.
    pub fn find(dtype: QuantDtype, name: &str) -> Option<GemmConfig> {
        GEMM_CONFIGS
            .iter()
            .find(|c| c.dtype == dtype && (c.kernel_name() == name || c.label() == name))
            .copied()
    }
}

/// Names of the non-GEMM kernels.
pub const QUANTIZE_PER_TOKEN: &str = "oasr_quantize_per_token";
pub const QUANTIZE_STATIC: &str = "oasr_quantize_static";
pub const EPILOGUE_I32: &str = "oasr_epilogue_i32";

/// Every kernel entry point of the module.
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = GEMM_CONFIGS.iter().map(|c| c.kernel_name()).collect();
    names.extend([QUANTIZE_PER_TOKEN, QUANTIZE_STATIC, EPILOGUE_I32].map(String::from));
    names
}

/// The NVRTC options for `arch`.
pub fn compile_options(arch: Arch) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={}", arch.name()),
        "--std=c++17".into(),
        // One rounding per operation, exactly as written: never contract a*b+c into an FMA.
        "--fmad=false".into(),
        "--ptxas-options=-v".into(),
        "-DOASR_NVRTC=1".into(),
    ];
    options.extend(extra_options());
    options
}

/// The variable holding extra NVRTC options (whitespace-separated), for kernel experiments
/// such as `-DOASR_WGMMA_GROUP_M=16`; they are part of the cache key.
pub const EXTRA_OPTIONS_ENV: &str = "OASR_NVRTC_OPTIONS";

fn extra_options() -> Vec<String> {
    std::env::var(EXTRA_OPTIONS_ENV)
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// A compiled module: the CUBIN and the compiler's log (ptxas register and spill report).
#[derive(Clone, Debug)]
pub struct CompiledKernels {
    pub arch: Arch,
    pub cubin: Vec<u8>,
    pub log: String,
    /// The cache key: sha256 of sources, options and architecture.
    pub key: String,
}

/// The cache key of the module for `arch`.
pub fn module_key(arch: Arch) -> String {
    let mut h = Sha256::new();
    h.update(b"oasr-quantize kernels v1\0");
    h.update(kernel_bundle().as_bytes());
    for o in compile_options(arch) {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(arch.name().as_bytes());
    let digest = h.finalize();
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn nvrtc_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Cuda {
        what: what.into(),
        message: e.to_string(),
    }
}

/// The NVRTC version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    loader::ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); both pointers are valid for writes.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| nvrtc_err("NVRTC version", e))?;
    Ok((major, minor))
}

/// Compiles every kernel for `arch` with NVRTC (no GPU needed). Fails with [`Error::Cuda`] when
/// NVRTC cannot be loaded or the compilation fails (the message holds the compiler log).
pub fn compile_kernels(arch: Arch) -> Result<CompiledKernels> {
    use cudarc::nvrtc::{result, sys};

    loader::ensure_nvrtc()?;
    let src = CString::new(kernel_bundle()).map_err(|e| nvrtc_err("kernel source", e))?;
    let name = CString::new("oasr_kernels.cu").map_err(|e| nvrtc_err("kernel source", e))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| nvrtc_err("NVRTC create program", e))?;

    struct Program(sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: created above and destroyed exactly once, here.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    let prog = Program(prog);
    let options = compile_options(arch);
    // SAFETY: `prog` is a live program; the options are valid C strings built by cudarc.
    let compiled = unsafe { result::compile_program(prog.0, &options) };
    // SAFETY: `prog` is live; the log is a NUL-terminated buffer.
    let log = match unsafe { result::get_program_log(prog.0) } {
        Ok(raw) => c_buffer_to_string(&raw),
        Err(e) => format!("(no compiler log: {e})"),
    };
    if let Err(e) = compiled {
        return Err(Error::Cuda {
            what: format!("NVRTC compilation of kernels-cuda/ for {arch}"),
            message: format!("{e}\n{log}"),
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is valid for writes.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| nvrtc_err("NVRTC CUBIN size", e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds exactly the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| nvrtc_err("NVRTC CUBIN", e))?;
    Ok(CompiledKernels {
        arch,
        cubin,
        log,
        key: module_key(arch),
    })
}

fn c_buffer_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The variable that names the module cache directory; `off` disables the cache.
pub const CACHE_DIR_ENV: &str = "OASR_CUDA_CACHE_DIR";

/// Where compiled modules are cached: `$OASR_CUDA_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/oasr-quantize/cuda`, else `~/.cache/oasr-quantize/cuda`.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

/// How the module of a lane was obtained.
#[derive(Clone, Debug, PartialEq)]
pub enum ModuleOrigin {
    /// Loaded from the cache, no compilation.
    Cached { path: PathBuf },
    /// Compiled with NVRTC in `seconds`; `stored` is the cache file written, if any.
    Compiled {
        seconds: f64,
        stored: Option<PathBuf>,
    },
}

impl KernelCache {
    /// The cache the environment asks for (see [`CACHE_DIR_ENV`]).
    pub fn from_env() -> Self {
        if let Some(v) = std::env::var_os(CACHE_DIR_ENV) {
            if v == "off" || v.is_empty() {
                return KernelCache { dir: None };
            }
            return KernelCache {
                dir: Some(PathBuf::from(v)),
            };
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
        KernelCache {
            dir: base.map(|b| b.join("oasr-quantize").join("cuda")),
        }
    }

    /// A cache in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        KernelCache {
            dir: Some(dir.into()),
        }
    }

    /// No caching: compile every time.
    pub fn disabled() -> Self {
        KernelCache { dir: None }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn path(&self, arch: Arch) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| {
            d.join(format!(
                "kernels-{}-{}.cubin",
                arch.name(),
                module_key(arch)
            ))
        })
    }

    /// The cached CUBIN for `arch`, if present.
    pub fn load(&self, arch: Arch) -> Option<(PathBuf, Vec<u8>)> {
        let path = self.path(arch)?;
        let bytes = std::fs::read(&path).ok()?;
        (!bytes.is_empty()).then_some((path, bytes))
    }

    /// Stores a compiled module (and its log beside it); returns the file written. A cache that
    /// cannot be written is not an error: the module is simply compiled again next time.
    pub fn store(&self, compiled: &CompiledKernels) -> Option<PathBuf> {
        let path = self.path(compiled.arch)?;
        let dir = path.parent()?;
        std::fs::create_dir_all(dir).ok()?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &compiled.cubin).ok()?;
        if std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return None;
        }
        let _ = std::fs::write(path.with_extension("log"), &compiled.log);
        Some(path)
    }

    /// Removes a cached module that failed to load, so that it is rebuilt.
    pub(crate) fn evict(&self, arch: Arch) {
        if let Some(p) = self.path(arch) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The module for `arch`: from the cache, or compiled now (and cached). Returns the CUBIN, the
/// compiler log when one is at hand, and where the module came from.
pub(crate) fn cached_or_compiled(
    arch: Arch,
    cache: &KernelCache,
) -> Result<(Vec<u8>, Option<String>, ModuleOrigin)> {
    if let Some((path, bytes)) = cache.load(arch) {
        let log = std::fs::read_to_string(path.with_extension("log")).ok();
        return Ok((bytes, log, ModuleOrigin::Cached { path }));
    }
    let t = Instant::now();
    let compiled = compile_kernels(arch)?;
    let seconds = t.elapsed().as_secs_f64();
    let stored = cache.store(&compiled);
    Ok((
        compiled.cubin,
        Some(compiled.log),
        ModuleOrigin::Compiled { seconds, stored },
    ))
}

/// One kernel's resources as ptxas reported them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
}

/// Parses the ptxas `-v` report of a compiler log.
pub fn parse_resources(log: &str) -> Vec<KernelResources> {
    let mut out = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            if let Some(done) = current.take() {
                out.push(done);
            }
            current = Some(KernelResources {
                name: rest.trim().to_string(),
                registers: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
            });
        } else if let Some(cur) = current.as_mut() {
            let number_before = |key: &str| -> Option<u32> {
                let head = &line[..line.find(key)?];
                head.split(|c: char| !c.is_ascii_digit())
                    .rfind(|s| !s.is_empty())?
                    .parse()
                    .ok()
            };
            if let Some(v) = number_before("bytes spill stores") {
                cur.spill_store_bytes = v;
            }
            if let Some(v) = number_before("bytes spill loads") {
                cur.spill_load_bytes = v;
            }
            if let Some(v) = number_before(" registers") {
                cur.registers = v;
            }
        }
    }
    out.extend(current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_match_the_source() {
        let mut listed = Vec::new();
        for line in KERNEL_SOURCES[2].1.lines() {
            let (dtype, rest) = if let Some(r) = line.strip_prefix("OASR_WGMMA_I8(") {
                (QuantDtype::Int8, r)
            } else if let Some(r) = line.strip_prefix("OASR_WGMMA_E4M3(") {
                (QuantDtype::Float8E4m3fn, r)
            } else {
                continue;
            };
            let v: Vec<u32> = rest
                .trim_end_matches(')')
                .split(',')
                .map(|x| x.trim().parse().unwrap_or(0))
                .collect();
            listed.push(wg(dtype, v[0], v[1], v[2], v[3]));
        }
        for line in KERNEL_SOURCES[1].1.lines() {
            let (dtypes, rest): (&[QuantDtype], &str) =
                if let Some(r) = line.strip_prefix("OASR_GEMM_CONFIG(") {
                    (&QuantDtype::ALL, r)
                } else if let Some(r) = line.strip_prefix("OASR_GEMM_I8(") {
                    (&[QuantDtype::Int8], r)
                } else if let Some(r) = line.strip_prefix("OASR_GEMM_E4M3(") {
                    (&[QuantDtype::Float8E4m3fn], r)
                } else {
                    continue;
                };
            let v: Vec<u32> = rest
                .trim_end_matches(')')
                .split(',')
                .map(|x| x.trim().parse().unwrap_or(0))
                .collect();
            for &d in dtypes {
                listed.push(cfg(d, [v[0], v[1], v[2], v[3], v[4], v[5]]));
            }
        }
        let mut want = GEMM_CONFIGS.to_vec();
        let key = |c: &GemmConfig| {
            (
                c.dtype, c.kind, c.bm, c.bn, c.bk, c.warps_m, c.warps_n, c.stages, c.epi_cols,
            )
        };
        listed.sort_by_key(key);
        want.sort_by_key(key);
        assert_eq!(listed, want);
    }

    #[test]
    fn choose_prefers_big_tiles_on_big_problems_and_fills_the_chip_on_small_ones() {
        // Occupancies as the driver reports them on an H200.
        let available: Vec<(GemmConfig, usize)> = GEMM_CONFIGS
            .iter()
            .filter(|c| c.kind == GemmKind::MmaSync)
            .map(|c| {
                let per_sm = match (c.bm, c.bn, c.threads()) {
                    (64, 64, _) => 4,
                    (64, 128, _) | (128, 64, _) => 3,
                    (128, 128, 128) => 2,
                    _ => 1,
                };
                (*c, per_sm)
            })
            .collect();
        let pick = |m, n, k| {
            GemmConfig::choose(QuantDtype::Int8, m, n, k, &available, 132)
                .map(|c| (c.bm, c.bn, c.bk))
        };
        // The fastest configurations measured on an H200 (BENCHMARKS.md).
        assert_eq!(pick(8192, 8192, 8192), Some((128, 128, 64)));
        assert_eq!(pick(4096, 4096, 4096), Some((128, 128, 64)));
        assert_eq!(pick(8192, 512, 2048), Some((128, 128, 64)));
        assert_eq!(pick(1500, 384, 384), Some((64, 64, 64)));
        assert_eq!(pick(1500, 1536, 384), Some((64, 128, 64)));
        assert_eq!(pick(8192, 384, 1536), Some((64, 128, 64)));
        assert_eq!(pick(1, 384, 384), Some((64, 64, 64)));
        for c in GEMM_CONFIGS {
            assert_eq!(GemmConfig::find(c.dtype, &c.label()), Some(c));
        }
    }

    #[test]
    fn choose_wgmma_matches_the_h200_sweep() {
        // The wgmma configurations a 9.0 device runs, with the driver's occupancies.
        let available: Vec<(GemmConfig, usize)> = GEMM_CONFIGS
            .iter()
            .filter(|c| c.kind == GemmKind::Wgmma)
            .map(|c| {
                (
                    *c,
                    if c.bm == 128 {
                        1
                    } else if c.bn == 128 {
                        2
                    } else {
                        3
                    },
                )
            })
            .collect();
        let pick = |dtype, m, n, k| {
            GemmConfig::choose(dtype, m, n, k, &available, 132).map(|c| (c.bm, c.bn))
        };
        use QuantDtype::{Float8E4m3fn as F8, Int8 as I8};
        // The fastest configurations measured on an H200 (BENCHMARKS.md, 2026-12-01), each at
        // least 5 % ahead of the second.
        assert_eq!(pick(I8, 4096, 4096, 4096), Some((128, 256)));
        assert_eq!(pick(I8, 8192, 2048, 512), Some((128, 256)));
        assert_eq!(pick(I8, 1500, 2048, 512), Some((128, 192)));
        assert_eq!(pick(I8, 8192, 384, 1536), Some((128, 192)));
        assert_eq!(pick(I8, 1500, 384, 384), Some((64, 128)));
        assert_eq!(pick(I8, 1500, 512, 2048), Some((64, 128)));
        assert_eq!(pick(F8, 4096, 4096, 4096), Some((128, 128)));
        assert_eq!(pick(F8, 8192, 2048, 512), Some((128, 128)));
        assert_eq!(pick(F8, 1500, 256, 256), Some((64, 64)));
        assert_eq!(pick(F8, 8192, 384, 1536), Some((128, 192)));
        assert_eq!(pick(F8, 1500, 2048, 768), Some((128, 192)));
        // GELU epilogues favour more, smaller CTAs on the small shapes.
        let gelu = |dtype, m, n, k| {
            GemmConfig::choose_for(dtype, Activation::Gelu, m, n, k, &available, 132)
                .map(|c| (c.bm, c.bn))
        };
        assert_eq!(gelu(I8, 1500, 256, 256), Some((64, 64)));
        assert_eq!(gelu(I8, 1500, 2048, 768), Some((128, 192)));
        assert_eq!(gelu(I8, 4096, 4096, 4096), Some((128, 256)));
        assert_eq!(gelu(F8, 1500, 2048, 512), Some((128, 192)));
        assert_eq!(gelu(F8, 1500, 384, 384), Some((64, 64)));
        assert_eq!(gelu(F8, 8192, 2048, 512), Some((128, 128)));
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Function properties for oasr_x\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 6 bytes spill loads\n\
                   ptxas info    : Used 255 registers, used 1 barriers\n";
        assert_eq!(
            parse_resources(log),
            vec![KernelResources {
                name: "oasr_x".into(),
                registers: 255,
                spill_store_bytes: 4,
                spill_load_bytes: 6
            }]
        );
    }
}
