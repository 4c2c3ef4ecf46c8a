//! The CUDA C kernels run on the CPU: a kernel source of `kernels/` compiled unchanged as C++20
//! with `emulator/cuda_on_host.h` in front (by `$CXX`, default `g++`) into a shared library, and
//! launched one block at a time, each thread of a block on its own OS thread sharing the block's
//! `__shared__` memory and `__syncthreads` barrier. Device memory is host memory: a pointer
//! argument is a host address.
//!
//! Why in the library: a machine without an NVIDIA GPU (CI) can then run what the kernels
//! compute, through the same argument arrays a GPU launch uses ([`KernelArg`]), against PyTorch's
//! numbers. It is slow (an OS thread per GPU thread) and meant for tests, not for training.
//!
//! Each kernel gets a generated trampoline, `ferrite_emu_call_NAME(void** params)`, that unpacks
//! the launch array into the kernel's parameters (their types come from the kernel's own
//! signature), so any kernel listed in its [`KernelSource`] can be launched by name.

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use libloading::Library;

use crate::CudaError;
use crate::kernel_arg::{KernelArg, param_array};
use crate::kernel_sources::KernelSource;

/// The emulator header, written next to each compiled source.
const HEADER: &str = include_str!("../emulator/cuda_on_host.h");

/// The environment variable naming the host C++ compiler (default `g++`).
pub const CXX_ENV: &str = "CXX";

/// A kernel source compiled for the host and loaded.
#[derive(Debug)]
pub struct HostModule {
    lib: Library,
    dir: PathBuf,
    source: &'static str,
    kernels: &'static [&'static str],
}

/// The host compiler's command.
fn compiler() -> String {
    std::env::var(CXX_ENV).unwrap_or_else(|_| "g++".to_string())
}

/// A pointer the emulated threads share.
#[derive(Clone, Copy)]
struct SharedPtr(*mut c_void);
// SAFETY: the pointer is only passed back to the module's own entry points, which synchronise
// through the block barrier as a GPU block does.
unsafe impl Send for SharedPtr {}
// SAFETY: as above.
unsafe impl Sync for SharedPtr {}

impl SharedPtr {
    fn get(&self) -> *mut c_void {
        self.0
    }
}

type EnterFn = unsafe extern "C" fn(*const u32, *const u32, *const u32, *const u32, *mut c_void);

impl HostModule {
    /// Whether the host C++ compiler runs (`$CXX --version`).
    pub fn compiler_available() -> bool {
        Command::new(compiler()).arg("--version").output().is_ok_and(|o| o.status.success())
    }

    /// Compiles `source` for the host.
    pub fn compile(source: &KernelSource) -> Result<HostModule, CudaError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ferrite-cuda-emu-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |e: std::io::Error| CudaError::HostCompile {
            source_name: source.name.to_string(),
            log: format!("{}: {e}", dir.display()),
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut code = format!("#include \"cuda_on_host.h\"\n#line 1 \"{}\"\n{}\n", source.name, source.code);
        code.push_str("\n// Trampolines: the launch array unpacked into each kernel's parameters.\n");
        for k in source.kernels {
            code.push_str(&format!(
                "extern \"C\" void ferrite_emu_call_{k}(void** p) {{ ferrite_emu_apply(&{k}, p); }}\n"
            ));
        }
        std::fs::write(dir.join("cuda_on_host.h"), HEADER).map_err(io)?;
        let src = dir.join(format!("{}.cpp", source.name));
        std::fs::write(&src, code).map_err(io)?;
        let out = dir.join(format!("{}.so", source.name));
        let o = Command::new(compiler())
            .args(["-std=c++20", "-O1", "-shared", "-fPIC", "-I"])
            .arg(&dir)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .output()
            .map_err(|e| CudaError::HostCompilerMissing { compiler: compiler(), reason: e.to_string() })?;
        if !o.status.success() {
            return Err(CudaError::HostCompile {
                source_name: source.name.to_string(),
                log: String::from_utf8_lossy(&o.stderr).into_owned(),
            });
        }
        // SAFETY: the library was just compiled from ferrite's kernel sources; loading it runs
        // only the C++ runtime's initialisers.
        let lib = unsafe { Library::new(&out) }
            .map_err(|e| CudaError::HostCompile { source_name: source.name.to_string(), log: e.to_string() })?;
        Ok(HostModule { lib, dir, source: source.name, kernels: source.kernels })
    }

    /// Runs `kernel` as `grid` blocks of `block` threads with `args`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters (count and types), and every pointer in them must
    /// be valid for what the kernel reads and writes — as for a GPU launch.
    pub unsafe fn launch(&self, kernel: &str, grid: u32, block: u32, args: &[KernelArg]) -> Result<(), CudaError> {
        if !self.kernels.contains(&kernel) {
            return Err(CudaError::NoSuchKernel { kernel: kernel.to_string(), source_name: self.source.to_string() });
        }
        let missing = |e: libloading::Error| CudaError::NoSuchKernel {
            kernel: format!("{kernel} ({e})"),
            source_name: self.source.to_string(),
        };
        // SAFETY: the signatures of the header's entry points and of the generated trampoline.
        let (new, free, enter, leave, call) = unsafe {
            (
                *self
                    .lib
                    .get::<unsafe extern "C" fn(i64) -> *mut c_void>(b"ferrite_emu_barrier_new")
                    .map_err(missing)?,
                *self.lib.get::<unsafe extern "C" fn(*mut c_void)>(b"ferrite_emu_barrier_free").map_err(missing)?,
                *self.lib.get::<EnterFn>(b"ferrite_emu_enter").map_err(missing)?,
                *self.lib.get::<unsafe extern "C" fn()>(b"ferrite_emu_leave").map_err(missing)?,
                *self
                    .lib
                    .get::<unsafe extern "C" fn(*mut *mut c_void)>(format!("ferrite_emu_call_{kernel}").as_bytes())
                    .map_err(missing)?,
            )
        };
        let params = param_array(args);
        let params = SharedPtr(params.as_ptr() as *mut c_void);
        let (block_dim, grid_dim) = ([block, 1, 1], [grid, 1, 1]);
        for b in 0..grid {
            // SAFETY: a barrier for exactly the threads spawned below, freed after they joined.
            let barrier = SharedPtr(unsafe { new(block as i64) });
            std::thread::scope(|s| {
                for t in 0..block {
                    s.spawn(move || {
                        // SAFETY: three u32 per index, this block's barrier, and the launch array
                        // (alive until the scope ends) whose slots the caller vouched for.
                        unsafe {
                            enter(
                                [t, 0, 0].as_ptr(),
                                [b, 0, 0].as_ptr(),
                                block_dim.as_ptr(),
                                grid_dim.as_ptr(),
                                barrier.get(),
                            );
                            call(params.get() as *mut *mut c_void);
                            leave();
                        }
                    });
                }
            });
            // SAFETY: every thread of the block has joined.
            unsafe { free(barrier.get()) };
        }
        Ok(())
    }
}

impl Drop for HostModule {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
