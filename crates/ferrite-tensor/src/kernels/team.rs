//! A fork-join team for kernel loops: the calling thread plus `threads - 1` helpers that spin
//! briefly between jobs before they sleep, the way OpenMP runtimes wait.
//!
//! Why not rayon here: rayon's workers go to sleep within microseconds of running out of work,
//! and waking a sleeping worker goes through the kernel. Measured on the 2-core VM this project
//! runs on, a `rayon::scope` with two trivial tasks costs 14 µs back to back and 70–90 µs when
//! the pool idled for 0.1–1 ms before it — the gap between two tensor ops in a training step.
//! An elementwise op on 1 M f32 takes ~200 µs, so every op paid a third of its time to wake a
//! thread (2 threads ran a 1 M-element multiply only 1.4× faster than 1 thread; PyTorch, whose
//! OpenMP threads spin between parallel regions, gets 1.97×). A team member spins for
//! [`spin_time`] after each job (re-reading one cache line, with `spin_loop` hints) and only
//! then parks on a condition variable, so back-to-back ops hand work over through memory alone
//! and an idle process still goes quiet after a fraction of a millisecond.
//!
//! Semantics: [`run`] calls `f(i)` once for every `i` in `0..tasks`, on the calling thread and
//! the team's helpers, and returns when all calls have returned. One job runs at a time; a call
//! made while the team is busy (from another thread, or from inside a task) runs its tasks on
//! the calling thread, so nesting and concurrent callers can never deadlock. A panic in a task is
//! caught, the remaining tasks still run, and the panic resumes on the caller after every helper
//! has left the job (so the borrowed closure is never used after `run` returns).
//!
//! Size: the team has `rayon::current_num_threads() - 1` helpers when first used, so
//! `RAYON_NUM_THREADS` governs ferrite's kernels and faer's alike. `FERRITE_SPIN_US` sets the
//! spin time in microseconds (default 200; 0 parks at once).

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Most tasks one job may have (the claim counter is 16 bits wide); [`run`] rejects more by
/// running them on the calling thread.
pub(crate) const MAX_TASKS: usize = (1 << 16) - 1;

/// Number of threads a job can use: the helpers plus the caller.
pub(crate) fn threads() -> usize {
    team().map_or(1, |t| t.helpers + 1)
}

/// Run `f` over `0..units` split into at most `threads` equal contiguous ranges on the team.
pub(crate) fn split(units: usize, threads: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let parts = threads.min(units).max(1);
    if parts == 1 {
        return f(0, units);
    }
    run(parts, &|t| f(t * units / parts, (t + 1) * units / parts));
}

/// Call `f(i)` for every `i` in `0..tasks` on the team, returning when all calls returned.
pub(crate) fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let team = match team() {
        Some(t) if tasks > 1 && tasks <= MAX_TASKS => t,
        _ => return run_here(tasks, f),
    };
    if team.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        // Another job is running (a concurrent caller, or a task of that job calling us).
        return run_here(tasks, f);
    }
    // SAFETY: `busy` gives this thread exclusive use of `job` until it is released below; no
    // helper reads `job` except after claiming a task of the generation published next, and
    // this function does not return before every claimed task has finished.
    unsafe {
        // Erase the closure's lifetime: helpers use it only while a task of this job is
        // claimed and unfinished, which cannot outlive this call (see `wait_done`).
        let f_static: &'static (dyn Fn(usize) + Sync) =
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f);
        *team.job.get() = Some(f_static);
    }
    team.remaining.store(tasks, Ordering::Relaxed);
    let generation = (gen_of(team.state.load(Ordering::Relaxed)) + 1) & GEN_MASK;
    team.state.store(pack(generation, tasks, 0), Ordering::SeqCst);
    if team.sleepers.load(Ordering::SeqCst) > 0 {
        let _guard = team.lock.lock();
        team.wake.notify_all();
    }
    team.work_on(generation);
    team.wait_done();
    let panic = team.panic.lock().take();
    // SAFETY: every task finished (remaining == 0), so no helper holds the closure any more.
    unsafe { *team.job.get() = None };
    team.busy.store(false, Ordering::Release);
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// All tasks on the calling thread, with the same panic semantics as a team job: every task
/// runs, and the first panic resumes at the end.
fn run_here(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    let mut first = None;
    for i in 0..tasks {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
            first.get_or_insert(payload);
        }
    }
    if let Some(payload) = first {
        resume_unwind(payload);
    }
}

/// How long a helper spins after a job before it parks.
pub(crate) fn spin_time() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("FERRITE_SPIN_US").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(200);
        Duration::from_micros(us)
    })
}

// ---- implementation -------------------------------------------------------------------------

// `state` packs generation (32 bits) | tasks (16 bits) | next unclaimed task (16 bits), so a
// helper claims a task of a specific job with one compare-and-swap and can never claim a task
// of a job it did not see published.
const GEN_MASK: u64 = 0xFFFF_FFFF;
fn pack(generation: u64, tasks: usize, next: usize) -> u64 {
    (generation << 32) | ((tasks as u64) << 16) | next as u64
}
fn gen_of(s: u64) -> u64 {
    s >> 32
}
fn tasks_of(s: u64) -> usize {
    ((s >> 16) & 0xFFFF) as usize
}
fn next_of(s: u64) -> usize {
    (s & 0xFFFF) as usize
}

struct Team {
    helpers: usize,
    busy: AtomicBool,
    state: AtomicU64,
    remaining: AtomicUsize,
    job: UnsafeCell<Option<&'static (dyn Fn(usize) + Sync)>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread holding `busy`, and read by helpers only between
// claiming a task of the current generation and finishing it, while the writer is blocked in
// `wait_done`; the Release/Acquire pair on `state` orders the write before those reads.
unsafe impl Sync for Team {}

fn team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<&'static Team>> = OnceLock::new();
    *TEAM.get_or_init(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        if helpers == 0 {
            return None;
        }
        let team: &'static Team = Box::leak(Box::new(Team {
            helpers,
            busy: AtomicBool::new(false),
            state: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 0..helpers {
            let spawned =
                std::thread::Builder::new().name(format!("ferrite-kernel-{}", i + 1)).spawn(move || team.helper_loop());
            if spawned.is_err() {
                // No threads to be had: the caller does all the work (tasks are claimed, never
                // assigned, so a missing helper only costs parallelism).
                break;
            }
        }
        Some(team)
    })
}

impl Team {
    /// Claim and run tasks of job `generation` until none is left.
    fn work_on(&self, generation: u64) {
        loop {
            let s = self.state.load(Ordering::Acquire);
            if gen_of(s) != generation || next_of(s) >= tasks_of(s) {
                return;
            }
            if self.state.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
                continue;
            }
            // SAFETY: we own task `next_of(s)` of the live job `generation`; its publisher
            // stored `job` before the Release store of `state` we synchronised with, and waits
            // for `remaining` to reach zero before touching `job` again.
            let f = unsafe { (*self.job.get()).expect("a published job has a closure") };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(next_of(s)))) {
                self.panic.lock().get_or_insert(payload);
            }
            self.remaining.fetch_sub(1, Ordering::Release);
        }
    }

    /// Caller side: wait until every task of the current job has finished.
    fn wait_done(&self) {
        let mut spins = 0u32;
        while self.remaining.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                // A helper was descheduled mid-task; let it run.
                std::thread::yield_now();
            }
        }
    }

    fn helper_loop(&self) {
        let mut seen = gen_of(self.state.load(Ordering::Acquire));
        loop {
            let generation = self.next_generation(seen);
            self.work_on(generation);
            seen = generation;
        }
    }

    /// Spin, then sleep, until a generation other than `seen` is published; return it.
    fn next_generation(&self, seen: u64) -> u64 {
        let deadline = Instant::now() + spin_time();
        let mut polls = 0u32;
        loop {
            let g = gen_of(self.state.load(Ordering::Acquire));
            if g != seen {
                return g;
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            if Instant::now() < deadline {
                continue;
            }
            let mut guard = self.lock.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            loop {
                let g = gen_of(self.state.load(Ordering::SeqCst));
                if g != seen {
                    self.sleepers.fetch_sub(1, Ordering::SeqCst);
                    return g;
                }
                self.wake.wait(&mut guard);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_exactly_once() {
        for tasks in [0usize, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            for round in 0..50 {
                run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                if round % 10 == 0 {
                    // Let the helpers fall asleep so the wake-up path runs too.
                    std::thread::sleep(spin_time() + Duration::from_millis(1));
                }
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50), "tasks={tasks}");
        }
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(4, &|_| {
                            run(3, &|_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 4 * 3);
    }

    #[test]
    fn a_panicking_task_resumes_on_the_caller_after_all_tasks_ran() {
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run(8, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 5 {
                    panic!("task five");
                }
            })
        }));
        assert!(result.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 8);
        // The same inside a task, where the team is busy and the inner job runs on the caller.
        let inner_ran = AtomicUsize::new(0);
        run(2, &|_| {
            let r = catch_unwind(AssertUnwindSafe(|| {
                run(4, &|i| {
                    inner_ran.fetch_add(1, Ordering::Relaxed);
                    if i == 1 {
                        panic!("inner task one");
                    }
                })
            }));
            assert!(r.is_err());
        });
        assert_eq!(inner_ran.load(Ordering::Relaxed), 8);
        // The team is usable afterwards.
        let after = AtomicUsize::new(0);
        run(6, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 6);
    }
}
