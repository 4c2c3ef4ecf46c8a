//! NVRTC, found and loaded at run time, and the compilation of one kernel source for one GPU
//! architecture.
//!
//! Where NVRTC is looked for, in order: the file named by `FERRITE_NVRTC`; the library names a
//! CUDA installation puts on the loader's path (`libnvrtc.so.13`, `.so.12`, … — cudarc's list);
//! `CUDA_HOME`/`CUDA_PATH` and `/usr/local/cuda`; and the `nvidia-cuda-nvrtc` wheel in the
//! Python environments of the machine (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib` under
//! `site-packages`/`dist-packages` of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local`, `/usr/local`,
//! `/usr`; for another interpreter, set `FERRITE_NVRTC`). A file
//! found by path is loaded once and kept for the process; cudarc's loader then finds it by its
//! soname.
//!
//! A kernel is compiled for a real architecture (`sm_80`): NVRTC runs ptxas too, so register
//! and spill counts are in the log (`--ptxas-options=--verbose`) and the output is a cubin the
//! driver loads without a JIT step. Any warning in the log is a compile failure: a warning in a
//! kernel is a bug waiting for a GPU to show it.
use std::ffi::{CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::CudaError;
use crate::kernel_sources::KernelSource;

/// The environment variable naming libnvrtc's file.
pub const NVRTC_ENV: &str = "FERRITE_NVRTC";

/// NVRTC, loaded.
#[derive(Debug)]
pub struct Nvrtc {
    /// The file loaded by path, if it was not found on the loader's path.
    pub path: Option<PathBuf>,
    /// `nvrtcVersion`.
    pub version: (i32, i32),
}

/// A compiled kernel source.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The cubin for the architecture.
    pub cubin: Vec<u8>,
    /// NVRTC's log: ptxas's register and spill report per kernel.
    pub log: String,
}

static LOADED: OnceLock<Result<Nvrtc, String>> = OnceLock::new();

impl Nvrtc {
    /// NVRTC, loaded on the first call (see the module note for where it is looked for).
    pub fn load() -> Result<&'static Nvrtc, CudaError> {
        match LOADED.get_or_init(find_and_load) {
            Ok(n) => Ok(n),
            Err(searched) => Err(CudaError::NvrtcNotFound { searched: searched.clone(), env: NVRTC_ENV }),
        }
    }

    /// Compile `source` for `arch` (`sm_80`, `sm_90`, …).
    pub fn compile(&self, source: &KernelSource, arch: &str) -> Result<Compiled, CudaError> {
        let failed = |log: String| CudaError::CompileFailed {
            source_name: source.name.to_string(),
            arch: arch.to_string(),
            log,
        };
        let code = CString::new(source.code).map_err(|_| failed("the source holds a NUL byte".into()))?;
        let name = CString::new(source.name).map_err(|_| failed("the name holds a NUL byte".into()))?;
        let prog = result::create_program(&code, Some(&name))
            .map_err(|e| CudaError::Nvrtc { call: "nvrtcCreateProgram", reason: e.to_string() })?;
        let options =
            [format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "--ptxas-options=--verbose".to_string()];
        // SAFETY: `prog` comes from `create_program` above and is destroyed only at the end of
        // this function; `code` and `name`, which it may reference, live until then.
        let compiled = unsafe { result::compile_program(prog, &options) };
        // SAFETY: as above; the log exists whether or not compilation succeeded.
        let log = unsafe { result::get_program_log(prog) }.map(|l| c_chars_to_string(&l)).unwrap_or_default();
        let outcome = match compiled {
            Err(e) => Err(failed(format!("{e}\n{log}"))),
            Ok(()) if has_warning(&log) => Err(failed(log.clone())),
            // SAFETY: as above; compilation succeeded for a real architecture, so a cubin exists.
            Ok(()) => unsafe { cubin(prog) }.map(|cubin| Compiled { cubin, log: log.clone() }),
        };
        // SAFETY: `prog` was created above and not destroyed yet.
        let _ = unsafe { result::destroy_program(prog) };
        outcome
    }
}

/// Whether NVRTC's log reports a warning (or an error that did not fail the call).
fn has_warning(log: &str) -> bool {
    log.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("warning") || l.contains("error")
    })
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The cubin of a compiled program.
///
/// # Safety
/// `prog` must be a live program compiled for a real architecture.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: the caller's contract; `size` is a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetCUBINSize", reason: e.to_string() })?;
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds exactly the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetCUBIN", reason: e.to_string() })?;
    Ok(buf)
}

/// Find libnvrtc, load it, and read its version; `Err` lists every place searched.
fn find_and_load() -> Result<Nvrtc, String> {
    let mut searched = Vec::new();
    let mut path = None;
    if let Some(p) = std::env::var_os(NVRTC_ENV).map(PathBuf::from) {
        searched.push(format!("{NVRTC_ENV}={}", p.display()));
        load_path(&p)?;
        path = Some(p);
    } else {
        // SAFETY: probing dlopen of library names; a library found is only kept open.
        let on_loader_path = unsafe { sys::is_culib_present() };
        searched.push("the loader's path (libnvrtc.so.13, .so.12, …)".to_string());
        if !on_loader_path {
            let files = candidate_files();
            for file in &files {
                if file.is_file() {
                    load_path(file)?;
                    path = Some(file.clone());
                    break;
                }
            }
            if path.is_none() {
                searched.extend(places(&files));
                return Err(searched.join("; "));
            }
        }
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (by name or by the path above, whose soname cudarc finds);
    // both out-pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| format!("nvrtcVersion failed: {e}"))?;
    Ok(Nvrtc { path, version: (major, minor) })
}

/// Load the library at `path` for the rest of the process.
fn load_path(path: &Path) -> Result<(), String> {
    // SAFETY: loading NVRTC runs its initialisers, which have no preconditions; the handle is
    // leaked on purpose so the library stays loaded for cudarc's lookups.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Where `files` are, said briefly: each CUDA directory once, and the Python environments as
/// their `site-packages` (the wheels' `nvidia/{cu13,cu12,cuda_nvrtc}/lib` under each), so the
/// message names the places to look rather than every file name tried.
fn places(files: &[PathBuf]) -> Vec<String> {
    let mut cuda: Vec<String> = Vec::new();
    let mut pythons: Vec<String> = Vec::new();
    for f in files {
        let Some(dir) = f.parent() else { continue };
        let text = dir.display().to_string();
        match text.find("/nvidia/") {
            Some(at) => {
                let packages = text[..at].to_string();
                if !pythons.contains(&packages) {
                    pythons.push(packages);
                }
            }
            None if !cuda.contains(&text) => cuda.push(text),
            None => {}
        }
    }
    let mut out = Vec::new();
    if !cuda.is_empty() {
        out.push(format!("{} (libnvrtc.so.13, .so.12, .so)", cuda.join(", ")));
    }
    if !pythons.is_empty() {
        out.push(format!("nvidia/{{cu13,cu12,cuda_nvrtc}}/lib under {}", pythons.join(", ")));
    }
    out
}

/// Files that may be libnvrtc, most specific first.
fn candidate_files() -> Vec<PathBuf> {
    let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(PathBuf::from(d).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(v));
        }
    }
    if let Some(h) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(h).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr"].map(PathBuf::from));
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else { continue };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
            .collect();
        pythons.sort();
        for py in pythons {
            for packages in ["site-packages", "dist-packages"] {
                for wheel in ["cu13", "cu12", "cuda_nvrtc"] {
                    dirs.push(py.join(packages).join("nvidia").join(wheel).join("lib"));
                }
            }
        }
    }
    dirs.iter().flat_map(|d| names.iter().map(move |n| d.join(n))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_places_searched_are_named_once_each() {
        let files: Vec<PathBuf> = [
            "/usr/local/cuda/lib64/libnvrtc.so.13",
            "/usr/local/cuda/lib64/libnvrtc.so",
            "/usr/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
            "/usr/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "/usr/lib/python3.11/dist-packages/nvidia/cu12/lib/libnvrtc.so",
        ]
        .map(PathBuf::from)
        .to_vec();
        assert_eq!(
            places(&files),
            vec![
                "/usr/local/cuda/lib64 (libnvrtc.so.13, .so.12, .so)".to_string(),
                "nvidia/{cu13,cu12,cuda_nvrtc}/lib under /usr/lib/python3.11/site-packages, /usr/lib/python3.11/dist-packages".to_string(),
            ]
        );
    }

    #[test]
    fn ptxas_reports_are_not_warnings_but_warnings_are() {
        let info = "ptxas info    : Used 12 registers, 380 bytes cmem[0]\nptxas info    : Compiling entry function 'add_f32' for 'sm_80'";
        assert!(!has_warning(info));
        assert!(has_warning("elementwise.cu(3): warning #177-D: variable \"x\" was declared but never referenced"));
        assert!(has_warning("ptxas warning : Registers are spilled to local memory"));
    }
}
