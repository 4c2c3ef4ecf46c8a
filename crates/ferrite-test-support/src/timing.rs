//! CPU-time clocks for the measurements that run on a machine shared with other jobs (the GEMM
//! strategy timings, the GEMM and convolution benches): the time a thread or the process spent
//! on a CPU, which preemption by the other jobs does not inflate as it does wall time.

/// CPU time of the calling thread in seconds (Linux; `None` elsewhere or if the clock fails).
pub fn thread_cpu_seconds() -> Option<f64> {
    clock_seconds(CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of the whole process in seconds, every thread together (Linux; `None` elsewhere or
/// if the clock fails). Run with `RAYON_NUM_THREADS=1` so that idle helpers do not count.
pub fn process_cpu_seconds() -> Option<f64> {
    clock_seconds(CLOCK_PROCESS_CPUTIME_ID)
}

const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

#[cfg(target_os = "linux")]
fn clock_seconds(clock: i32) -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: glibc's clock_gettime with a valid clock id and a pointer to a timespec-sized
    // struct (64-bit Linux layout).
    let r = unsafe { clock_gettime(clock, &mut ts) };
    (r == 0).then_some(ts.sec as f64 + ts.nsec as f64 * 1e-9)
}

#[cfg(not(target_os = "linux"))]
fn clock_seconds(_clock: i32) -> Option<f64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clocks_advance_with_work() {
        let (Some(t0), Some(p0)) = (thread_cpu_seconds(), process_cpu_seconds()) else { return };
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        assert!(thread_cpu_seconds().is_some_and(|t| t > t0));
        assert!(process_cpu_seconds().is_some_and(|p| p > p0));
    }
}
