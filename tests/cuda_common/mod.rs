//! Shared helpers of the `cuda_*` test binaries (feature `cuda`).
//!
//! GPU tests call [`lane`]: without a usable GPU they print a visible `SKIPPED` line and pass,
//! unless `OASR_REQUIRE_GPU=1`, which turns the skip into a failure (set it on GPU machines so
//! that a broken driver cannot hide behind a skip).

#![allow(dead_code)]

use std::io::Write;
use std::sync::OnceLock;

use oasr_quantize::runtime::{CudaLane, KernelCache};

/// Writes straight to the process's stderr, past the test harness's output capture, so that
/// skip notices and measurements show in a plain `cargo test` run.
pub fn visible(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{msg}");
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Whether `OASR_REQUIRE_GPU=1`.
pub fn gpu_required() -> bool {
    env_flag("OASR_REQUIRE_GPU")
}

/// The lane on GPU 0 (opened once per test binary), or None with a visible skip notice.
pub fn lane(test: &str) -> Option<&'static CudaLane> {
    static LANE: OnceLock<Result<CudaLane, String>> = OnceLock::new();
    let lane = LANE.get_or_init(|| {
        let lane = CudaLane::open(0, &KernelCache::from_env()).map_err(|e| e.to_string());
        if let Ok(l) = &lane {
            let i = l.info();
            visible(&format!(
                "cuda: {} ({}, {} SMs, driver {}), GEMM path {:?}, kernels {:?}",
                i.name, i.arch, i.sm_count, i.driver_version, i.gemm_path, i.module
            ));
        }
        lane
    });
    match lane {
        Ok(l) => Some(l),
        Err(e) if gpu_required() => panic!("OASR_REQUIRE_GPU=1 but the CUDA lane failed: {e}"),
        Err(e) => {
            visible(&format!("SKIPPED {test}: no usable CUDA GPU ({e})"));
            None
        }
    }
}

/// xorshift64* with a seed taken from `OASR_TEST_SEED` (printed, so a failure can be replayed).
pub struct Rng(u64);

impl Rng {
    pub fn new(salt: u64) -> Self {
        let seed = std::env::var("OASR_TEST_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0x5EED_0A5A_0001);
        Rng((seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Normal-ish (sum of uniforms), scaled.
    pub fn normal(&mut self, sigma: f32) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum::<f32>() - 2.0;
        s * sigma * 1.732
    }
    /// int8 codes, -128 included now and then (the GEMM must take any code).
    pub fn int8(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                let r = self.next();
                if r.is_multiple_of(97) {
                    0x80
                } else {
                    ((((r >> 8) & 0xFFFF) % 255) as i32 - 127) as i8 as u8
                }
            })
            .collect()
    }
    /// Finite e4m3 codes over the whole range, subnormals and zeros included.
    pub fn e4m3(&mut self, len: usize, max_exp: u8) -> Vec<u8> {
        (0..len)
            .map(|_| {
                let r = self.next();
                let exp = (r as u8) % (max_exp + 1);
                let man = (r >> 8) as u8 & 7;
                let sign = (r >> 16) as u8 & 0x80;
                let c = sign | (exp << 3) | man;
                if c & 0x7F == 0x7F {
                    c & !1
                } else {
                    c
                }
            })
            .collect()
    }
}
