//! The arguments of a kernel launch, in the form `cuLaunchKernel` takes them: an array of
//! pointers, each to one argument's value (a number, a device address, or a `repr(C)` struct
//! passed by value). The same array drives the host emulator ([`crate::HostModule`]), so a launch
//! is written once for both.

use std::ffi::c_void;

/// One kernel argument, owned until the launch returns.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelArg {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
    /// A device address (on the host emulator, a host address).
    Ptr(u64),
    /// A `repr(C)` struct passed by value, as its bytes (see [`KernelArg::record`]).
    Record(Vec<u8>),
}

impl KernelArg {
    /// A pointer argument (`const float*`, `long long*`, …); null for the kernels' optional
    /// buffers.
    pub fn ptr<T>(p: *const T) -> KernelArg {
        KernelArg::Ptr(p as u64)
    }

    /// A struct passed by value. `Pod` guarantees the struct has no padding, so its bytes are the
    /// struct the kernel reads (declare the same fields, in the same order, in the kernel source).
    pub fn record<T: bytemuck::Pod>(value: &T) -> KernelArg {
        KernelArg::Record(bytemuck::bytes_of(value).to_vec())
    }

    /// The pointer to this argument's value that the launch array holds.
    fn value_ptr(&self) -> *mut c_void {
        match self {
            KernelArg::I32(v) => v as *const i32 as *mut c_void,
            KernelArg::U32(v) => v as *const u32 as *mut c_void,
            KernelArg::I64(v) => v as *const i64 as *mut c_void,
            KernelArg::U64(v) => v as *const u64 as *mut c_void,
            KernelArg::F32(v) => v as *const f32 as *mut c_void,
            KernelArg::F64(v) => v as *const f64 as *mut c_void,
            KernelArg::Ptr(v) => v as *const u64 as *mut c_void,
            KernelArg::Record(bytes) => bytes.as_ptr() as *mut c_void,
        }
    }
}

/// The pointer array of a launch; valid while `args` is.
pub fn param_array(args: &[KernelArg]) -> Vec<*mut c_void> {
    args.iter().map(KernelArg::value_ptr).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Pair {
        a: i64,
        b: f32,
        c: i32,
    }

    #[test]
    fn each_slot_points_at_its_argument_s_bytes() {
        let args = [
            KernelArg::I64(-7),
            KernelArg::F32(1.5),
            KernelArg::ptr(0x1000 as *const f32),
            KernelArg::record(&Pair { a: 3, b: 2.5, c: -1 }),
        ];
        let p = param_array(&args);
        // SAFETY: each slot points at the value of the argument it was made from.
        unsafe {
            assert_eq!(*(p[0] as *const i64), -7);
            assert_eq!(*(p[1] as *const f32), 1.5);
            assert_eq!(*(p[2] as *const u64), 0x1000);
            let pair = std::ptr::read_unaligned(p[3] as *const Pair);
            assert_eq!((pair.a, pair.b, pair.c), (3, 2.5, -1));
        }
    }
}
