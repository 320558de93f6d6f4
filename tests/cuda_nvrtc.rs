//! Every kernel of `kernels-cuda/` compiles with NVRTC for sm_80, sm_89, sm_90 and sm_90a (the
//! target of 9.0 devices, with the wgmma kernels). NVRTC needs no GPU, so CI runs this with the
//! `nvidia-cuda-nvrtc` wheel (see `kernels-cuda/nvrtc-check.sh`).
//!
//! Without NVRTC the test prints `SKIPPED` and passes; `OASR_REQUIRE_NVRTC=1` (CI) makes that
//! a failure. Besides compiling, it checks that every entry point is in each CUBIN, that the
//! fp8 kernels carry code only where the architecture has the fp8 mma, that the wgmma kernels
//! carry code only on sm_90a, that ptxas spilled no register of the GEMM kernels on sm_90 and
//! sm_90a, and that ptxas did not serialize any wgmma.
#![cfg(feature = "cuda")]

mod cuda_common;

use cuda_common::visible;
use oasr_quantize::runtime::kernels::{self, kernel_names, parse_resources};
use oasr_quantize::runtime::{compile_kernels, Arch, GEMM_CONFIGS};
use oasr_quantize::Error;

fn required() -> bool {
    std::env::var("OASR_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn every_kernel_compiles_for_sm80_sm89_sm90_sm90a() {
    let version = match kernels::nvrtc_version() {
        Ok(v) => v,
        Err(e) if required() => panic!("OASR_REQUIRE_NVRTC=1 but NVRTC is not usable: {e}"),
        Err(e) => {
            visible(&format!(
                "SKIPPED every_kernel_compiles_for_sm80_sm89_sm90_sm90a: {e}"
            ));
            return;
        }
    };
    for arch in [Arch::SM80, Arch::SM89, Arch::SM90, Arch::SM90A] {
        let t = std::time::Instant::now();
        let compiled = match compile_kernels(arch) {
            Ok(c) => c,
            Err(Error::Cuda { what, message }) => panic!("{what}:\n{message}"),
            Err(e) => panic!("{e}"),
        };
        for name in kernel_names() {
            assert!(
                contains(&compiled.cubin, name.as_bytes()),
                "{arch}: entry point {name} missing from the CUBIN"
            );
        }
        // ptxas reports a wgmma it had to serialize (C7515..C7520, "Potential Performance
        // Loss: wgmma.mma_async instructions are serialized ..."): that would be a slow kernel.
        assert!(
            !compiled
                .log
                .contains("wgmma.mma_async instructions are serialized"),
            "{arch}: ptxas serialized wgmma:\n{}",
            compiled.log
        );
        let resources = parse_resources(&compiled.log);
        let gemm: Vec<_> = resources
            .iter()
            .filter(|r| r.name.starts_with("oasr_scaled_mm_"))
            .collect();
        assert_eq!(
            gemm.len(),
            GEMM_CONFIGS.len(),
            "{arch}: ptxas report:\n{}",
            compiled.log
        );
        for r in &gemm {
            let fp8 = r.name.contains("_e4m3_");
            let wgmma = r.name.contains("_wgmma_");
            if wgmma {
                if arch.supports_wgmma() {
                    assert!(
                        r.registers > 64,
                        "{arch}: {} has no code ({} registers)",
                        r.name,
                        r.registers
                    );
                } else {
                    assert!(
                        r.registers <= 16,
                        "{arch}: {} should be an empty stub",
                        r.name
                    );
                }
            }
            if fp8 && !arch.supports_fp8() {
                assert!(
                    r.registers <= 16,
                    "{arch}: {} should be an empty stub",
                    r.name
                );
            }
            if arch.major == 9 {
                assert_eq!(
                    (r.spill_store_bytes, r.spill_load_bytes),
                    (0, 0),
                    "{arch}: {} spills registers ({} used)",
                    r.name,
                    r.registers
                );
            }
        }
        let summary: Vec<String> = gemm
            .iter()
            .map(|r| {
                format!(
                    "{} {}r",
                    r.name.trim_start_matches("oasr_scaled_mm_"),
                    r.registers
                )
            })
            .collect();
        visible(&format!(
            "NVRTC {}.{} {arch}: {} kernels, {} KiB CUBIN in {:.1} s; {}",
            version.0,
            version.1,
            kernel_names().len(),
            compiled.cubin.len() / 1024,
            t.elapsed().as_secs_f64(),
            summary.join(", ")
        ));
    }
}

#[test]
fn missing_nvrtc_is_an_error_not_a_panic() {
    // Whatever this machine has, asking for an architecture NVRTC does not know must come
    // back as an error (or, without NVRTC, the missing-library error).
    match std::panic::catch_unwind(|| compile_kernels(Arch::new(1, 0))) {
        Ok(Err(Error::Cuda { .. })) => {}
        Ok(Ok(_)) => panic!("sm_10 compiled"),
        Ok(Err(e)) => panic!("unexpected error kind: {e}"),
        Err(_) => panic!("compile_kernels panicked"),
    }
}

/// Compiles the module for the targets of `OASR_PRECOMPILE_ARCHS` (default `sm_90a`; e.g.
/// `sm_80 sm_89 sm_90a`) and stores it in the module cache of the environment
/// (`OASR_CUDA_CACHE_DIR`), so that a GPU machine given that directory loads the kernels
/// without compiling them (the key covers sources, options and target, not the NVRTC build):
///
/// ```sh
/// OASR_CUDA_CACHE_DIR=.dev-out/cuda-cache cargo test --release --features cuda \
///   --test cuda_nvrtc -- --ignored precompile_module_cache
/// ```
#[test]
#[ignore = "writes the module cache; run explicitly"]
fn precompile_module_cache() {
    use oasr_quantize::runtime::KernelCache;
    let cache = KernelCache::from_env();
    let Some(dir) = cache.dir() else {
        panic!("the module cache is disabled (OASR_CUDA_CACHE_DIR=off)");
    };
    let archs = std::env::var("OASR_PRECOMPILE_ARCHS").unwrap_or_else(|_| "sm_90a".into());
    for name in archs.split_whitespace() {
        let digits = name.trim_start_matches("sm_");
        let specific = digits.ends_with('a');
        let digits = digits.trim_end_matches('a');
        let (major, minor) = match digits.len() {
            2 | 3 => (
                digits[..digits.len() - 1].parse::<u32>(),
                digits[digits.len() - 1..].parse::<u32>(),
            ),
            _ => panic!("OASR_PRECOMPILE_ARCHS: `{name}` is not an sm_XY target"),
        };
        let (Ok(major), Ok(minor)) = (major, minor) else {
            panic!("OASR_PRECOMPILE_ARCHS: `{name}` is not an sm_XY target");
        };
        let mut arch = Arch::new(major, minor);
        if specific {
            arch = arch.arch_specific();
        }
        let compiled = compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
        let path = cache
            .store(&compiled)
            .unwrap_or_else(|| panic!("could not write the module cache in {}", dir.display()));
        visible(&format!("{arch}: {}", path.display()));
    }
}
