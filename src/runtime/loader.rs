//! Finding the CUDA libraries at run time.
//!
//! cudarc loads `libcuda`, `libnvrtc` and `libcublasLt` lazily and panics when one is missing,
//! so every entry point of the runtime first asks here whether the library it needs can be
//! loaded and turns a missing one into an [`Error::Cuda`] that says what to install.
//!
//! NVRTC is searched on the ordinary library path (`LD_LIBRARY_PATH`, the system directories).
//! `OASR_NVRTC_LIB_DIR` names a directory to take it from instead, e.g. the `nvidia/cu13/lib`
//! folder of the `nvidia-cuda-nvrtc` wheel: its `libnvrtc-builtins.so.*` and `libnvrtc.so.*`
//! are loaded from there first (Linux only), after which cudarc's own lookup by soname finds
//! them already in the process.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The directory variable that points at an NVRTC installation.
pub const NVRTC_LIB_DIR_ENV: &str = "OASR_NVRTC_LIB_DIR";

fn missing(what: &str, message: String) -> Error {
    Error::Cuda {
        what: what.into(),
        message,
    }
}

/// The NVIDIA driver library (`libcuda.so.1`).
pub(crate) fn ensure_driver() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate names and closes them again.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing(
            "driver",
            "the NVIDIA driver library (libcuda.so.1) could not be loaded: this machine has no \
             NVIDIA driver, or it is not on the library search path"
                .into(),
        ))
    }
}

/// NVRTC (`libnvrtc.so.13`), from `OASR_NVRTC_LIB_DIR` when set.
pub(crate) fn ensure_nvrtc() -> Result<()> {
    static PRESENT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PRESENT
        .get_or_init(|| {
            let preloaded = preload_nvrtc_from_env();
            // SAFETY: only tries to dlopen the candidate names and closes them again.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Ok(());
            }
            let hint = match preloaded {
                Some(Err(e)) => format!("{NVRTC_LIB_DIR_ENV} is set but {e}"),
                _ => format!(
                    "install the CUDA 13 NVRTC library (the CUDA toolkit, or `pip install \
                     nvidia-cuda-nvrtc`) and put its lib directory on LD_LIBRARY_PATH or in \
                     {NVRTC_LIB_DIR_ENV}"
                ),
            };
            Err(format!(
                "the runtime compiler NVRTC (libnvrtc.so.13) could not be loaded: {hint}"
            ))
        })
        .clone()
        .map_err(|m| missing("NVRTC", m))
}

/// cuBLASLt (`libcublasLt.so.13`), needed by the benchmark baselines only.
pub(crate) fn ensure_cublaslt() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate names and closes them again.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::cublaslt::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(missing(
            "cuBLASLt",
            "libcublasLt.so.13 could not be loaded: install CUDA 13 cuBLAS (the toolkit, or \
             `pip install nvidia-cublas`) and put its lib directory on LD_LIBRARY_PATH"
                .into(),
        ))
    }
}

/// Loads NVRTC from `OASR_NVRTC_LIB_DIR` when the variable is set: `None` when it is not,
/// `Some(Err)` with the reason when the directory holds no loadable NVRTC.
fn preload_nvrtc_from_env() -> Option<std::result::Result<(), String>> {
    let dir = std::env::var_os(NVRTC_LIB_DIR_ENV)?;
    Some(preload_nvrtc(std::path::Path::new(&dir)))
}

#[cfg(target_os = "linux")]
fn preload_nvrtc(dir: &std::path::Path) -> std::result::Result<(), String> {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::os::unix::ffi::OsStrExt;

    extern "C" {
        fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    }
    const RTLD_NOW: c_int = 2;
    const RTLD_GLOBAL: c_int = 0x100;

    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("{} cannot be read: {e}", crate::error::shown(dir)))?;
    let mut names: Vec<std::path::PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| {
                n.starts_with("libnvrtc") && n.contains(".so") && !n.contains(".alt.")
            })
        })
        .collect();
    // The builtins library first: libnvrtc opens it by soname when it compiles.
    names.sort_by_key(|p| !p.to_string_lossy().contains("builtins"));
    if !names
        .iter()
        .any(|p| !p.to_string_lossy().contains("builtins"))
    {
        return Err(format!(
            "{} holds no libnvrtc.so.*",
            crate::error::shown(dir)
        ));
    }
    for path in names {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{} is not a valid path", crate::error::shown(&path)))?;
        // SAFETY: dlopen of a shared library by absolute path; the handle is kept for the life
        // of the process on purpose (the library must stay loaded), so it is never closed.
        let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(format!(
                "{} could not be loaded",
                crate::error::shown(&path)
            ));
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn preload_nvrtc(dir: &std::path::Path) -> std::result::Result<(), String> {
    Err(format!(
        "{} cannot be used: {NVRTC_LIB_DIR_ENV} is supported on Linux only; put NVRTC on the \
         library search path instead",
        crate::error::shown(&dir)
    ))
}
