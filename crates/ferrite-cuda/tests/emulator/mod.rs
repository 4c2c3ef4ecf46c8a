//! The test side of `emulator/cuda_on_host.h`: compiles a kernel source of `kernels/` with the
//! host C++ compiler (unchanged, the header forced in front) into a shared library, and launches
//! its kernels one block at a time, each thread of a block on its own OS thread, as
//! `cuLaunchKernel` would on a GPU. Device memory is host memory: a kernel argument is a plain
//! pointer into a `Vec` of the test.
//!
//! Why: CI has no GPU, and NVRTC alone only proves that the kernels compile. Running them here
//! checks what they compute against PyTorch's numbers on every submission.
#![allow(dead_code)]

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;

use libloading::{Library, Symbol};

/// The host C++ compiler: `$CXX`, else `g++`.
fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".to_string())
}

/// Whether the compiler runs; otherwise a loud skip (a failure under
/// `FERRITE_REQUIRE_SYSTEM_DEPS=1`, which CI sets after installing g++).
pub fn compiler_or_skip() -> bool {
    let ok = Command::new(compiler()).arg("--version").output().is_ok_and(|o| o.status.success());
    ferrite_test_support::present_or_skip(
        ok,
        &format!("no C++20 compiler (`{}`) to run the CUDA kernels on the CPU", compiler()),
        "apt-get install g++ (or set CXX)",
    )
}

/// A kernel source compiled for the host and loaded.
pub struct HostKernels {
    lib: Library,
    _dir: tempfile::TempDir,
    pub source: &'static str,
}

/// A launch's grid and block (x only: ferrite's kernels are one-dimensional).
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    pub grid: u32,
    pub block: u32,
}

/// A pointer the emulated threads share (the kernels write disjoint elements, as on the GPU).
pub struct Shared<T>(pub *mut T);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}
// SAFETY: the pointer is only dereferenced by the kernel, whose threads touch disjoint elements or
// synchronise through the block barrier or atomics, exactly as on the GPU.
unsafe impl<T> Sync for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Send for Shared<T> {}

impl<T> Shared<T> {
    /// The pointer (a method, so a closure captures the whole `Shared`, which is `Sync`).
    pub fn get(&self) -> *mut T {
        self.0
    }
}

impl HostKernels {
    /// Compiles `kernels/NAME` with the emulator header.
    pub fn compile(name: &'static str) -> HostKernels {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out: PathBuf = dir.path().join(format!("{name}.so"));
        let o = Command::new(compiler())
            .args(["-std=c++20", "-O1", "-shared", "-fPIC", "-include"])
            .arg(root.join("emulator/cuda_on_host.h"))
            .args(["-x", "c++"])
            .arg(root.join("kernels").join(name))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("the C++ compiler runs");
        assert!(o.status.success(), "{name} does not compile for the host:\n{}", String::from_utf8_lossy(&o.stderr));
        // SAFETY: the library is ours (just compiled from the kernel sources); loading runs no
        // constructors beyond the C++ runtime's.
        let lib = unsafe { Library::new(&out) }.expect("the compiled kernels load");
        HostKernels { lib, _dir: dir, source: name }
    }

    /// The kernel `name` as a function of type `F` (the kernel's C signature, which the caller
    /// must give exactly).
    ///
    /// # Safety
    /// `F` must be the kernel's signature.
    pub unsafe fn kernel<F: Copy>(&self, name: &str) -> F {
        // SAFETY: the caller guarantees F is the symbol's type.
        let s: Symbol<F> = unsafe { self.lib.get(name.as_bytes()) }
            .unwrap_or_else(|e| panic!("{}: no kernel `{name}`: {e}", self.source));
        *s
    }

    /// Runs `body` (which calls one kernel) as `launch.grid` blocks of `launch.block` threads:
    /// blocks one after another, the threads of a block concurrently with a shared barrier.
    pub fn launch(&self, launch: Launch, body: impl Fn() + Sync) {
        type Enter = unsafe extern "C" fn(*const u32, *const u32, *const u32, *const u32, *mut c_void);
        // SAFETY: the signatures of the header's entry points.
        let (new, free, enter, leave) = unsafe {
            (
                self.kernel::<unsafe extern "C" fn(i64) -> *mut c_void>("ferrite_emu_barrier_new"),
                self.kernel::<unsafe extern "C" fn(*mut c_void)>("ferrite_emu_barrier_free"),
                self.kernel::<Enter>("ferrite_emu_enter"),
                self.kernel::<unsafe extern "C" fn()>("ferrite_emu_leave"),
            )
        };
        let block_dim = [launch.block, 1, 1];
        let grid_dim = [launch.grid, 1, 1];
        for b in 0..launch.grid {
            // SAFETY: a barrier for exactly the threads spawned below, freed after they joined.
            let barrier = Shared(unsafe { new(launch.block as i64) });
            std::thread::scope(|s| {
                for t in 0..launch.block {
                    let body = &body;
                    s.spawn(move || {
                        // SAFETY: valid pointers to three u32 each and the block's barrier.
                        unsafe {
                            enter(
                                [t, 0, 0].as_ptr(),
                                [b, 0, 0].as_ptr(),
                                block_dim.as_ptr(),
                                grid_dim.as_ptr(),
                                barrier.get(),
                            )
                        };
                        body();
                        // SAFETY: this thread entered the block above.
                        unsafe { leave() };
                    });
                }
            });
            // SAFETY: every thread of the block has joined.
            unsafe { free(barrier.0) };
        }
    }
}
