//! Shared random generators for layers that draw during forward (dropout), and the record of
//! which generators a region drew from, so activation checkpointing can replay exactly the same
//! random numbers when it recomputes that region in backward.
//!
//! A layer holds an [`RngHandle`]: either its own generator behind a mutex (the default for
//! [`Dropout`](crate::Dropout), seeded from the generator the model was built with, so runs are
//! reproducible and replicas on other threads do not race on one global stream), or the
//! process-wide default generator (PyTorch's behaviour). Every draw goes through
//! [`RngHandle::with`], which — while a [`RngRecording`] is active on this thread — notes the
//! generator's state before its first draw. [`checkpoint`](crate::checkpoint) records during the
//! no-grad forward and restores those states before recomputing, whichever handles the layers use.

use std::cell::RefCell;
use std::sync::Arc;

use ferrite_tensor::random::{Generator, GeneratorState, with_default_generator};
use parking_lot::Mutex;

/// A cloneable handle to a random generator (clones share the stream).
#[derive(Clone, Debug)]
pub struct RngHandle(Source);

#[derive(Clone, Debug)]
enum Source {
    /// The process-wide default generator (`ferrite_tensor::random`).
    Default,
    Own(Arc<Mutex<Generator>>),
}

impl RngHandle {
    /// A new generator seeded with `seed`.
    pub fn new(seed: u64) -> RngHandle {
        RngHandle::from_generator(Generator::new(seed))
    }

    /// Wrap an existing generator (the handle owns it from now on).
    pub fn from_generator(g: Generator) -> RngHandle {
        RngHandle(Source::Own(Arc::new(Mutex::new(g))))
    }

    /// A new generator whose seed is drawn from `g` (so building a model from a seeded generator
    /// gives every layer a distinct, reproducible stream).
    pub fn derived_from(g: &mut Generator) -> RngHandle {
        RngHandle::new(g.next_u64())
    }

    /// The process-wide default generator (re-seeded by `ferrite_tensor::manual_seed`).
    pub fn default_generator() -> RngHandle {
        RngHandle(Source::Default)
    }

    /// Run `f` with exclusive access to the generator. The state before the first draw is noted
    /// by every active [`RngRecording`] on this thread.
    pub fn with<R>(&self, f: impl FnOnce(&mut Generator) -> R) -> R {
        let record = |g: &Generator| {
            RECORDINGS.with(|r| {
                let mut r = r.borrow_mut();
                for rec in r.iter_mut() {
                    if !rec.iter().any(|(h, _)| h.same_as(self)) {
                        rec.push((self.clone(), g.state()));
                    }
                }
            })
        };
        match &self.0 {
            Source::Default => with_default_generator(|g| {
                record(g);
                f(g)
            }),
            Source::Own(m) => {
                let mut g = m.lock();
                record(&g);
                f(&mut g)
            }
        }
    }

    /// Current state (not recorded as a draw).
    pub fn state(&self) -> GeneratorState {
        match &self.0 {
            Source::Default => with_default_generator(|g| g.state()),
            Source::Own(m) => m.lock().state(),
        }
    }

    /// Restore a state saved with [`state`](Self::state).
    pub fn set_state(&self, state: GeneratorState) {
        match &self.0 {
            Source::Default => with_default_generator(|g| g.set_state(state)),
            Source::Own(m) => m.lock().set_state(state),
        }
    }

    /// Re-seed the stream.
    pub fn manual_seed(&self, seed: u64) {
        self.set_state(Generator::new(seed).state());
    }

    /// Whether two handles draw from the same generator.
    pub fn same_as(&self, other: &RngHandle) -> bool {
        match (&self.0, &other.0) {
            (Source::Default, Source::Default) => true,
            (Source::Own(a), Source::Own(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

type Record = Vec<(RngHandle, GeneratorState)>;

thread_local! {
    static RECORDINGS: RefCell<Vec<Record>> = const { RefCell::new(Vec::new()) };
}

/// While alive, notes the pre-draw state of every generator drawn from on this thread (nested
/// recordings each see every draw). Finish it to get the list.
#[must_use = "a recording only lasts while the guard is alive"]
pub struct RngRecording {
    depth: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl RngRecording {
    pub fn start() -> RngRecording {
        let depth = RECORDINGS.with(|r| {
            let mut r = r.borrow_mut();
            r.push(Vec::new());
            r.len()
        });
        RngRecording { depth, _not_send: std::marker::PhantomData }
    }

    /// Stop recording; the generators drawn from, each with its state before the first draw.
    pub fn finish(self) -> Vec<(RngHandle, GeneratorState)> {
        let out = RECORDINGS.with(|r| {
            let mut r = r.borrow_mut();
            // Guards drop in reverse creation order, so ours is on top of the stack.
            if r.len() == self.depth { r.pop().unwrap_or_default() } else { Vec::new() }
        });
        std::mem::forget(self);
        out
    }
}

impl Drop for RngRecording {
    fn drop(&mut self) {
        RECORDINGS.with(|r| {
            let mut r = r.borrow_mut();
            r.truncate(self.depth.saturating_sub(1));
        });
    }
}

/// Set each handle to its recorded state; returns the states they had before, for
/// [`restore_states`] (PyTorch's `fork_rng`: replaying does not disturb the live stream).
pub(crate) fn replay_states(recorded: &[(RngHandle, GeneratorState)]) -> Vec<GeneratorState> {
    recorded
        .iter()
        .map(|(h, s)| {
            let now = h.state();
            h.set_state(*s);
            now
        })
        .collect()
}

pub(crate) fn restore_states(recorded: &[(RngHandle, GeneratorState)], states: Vec<GeneratorState>) {
    for ((h, _), s) in recorded.iter().zip(states) {
        h.set_state(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_notes_state_before_first_draw_only() {
        let h = RngHandle::new(5);
        let before = h.state();
        let rec = RngRecording::start();
        let a = h.with(|g| g.next_u64());
        let _ = h.with(|g| g.next_u64());
        let got = rec.finish();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, before);
        // Replaying gives the same draw and leaves the stream where it was.
        let live = h.state();
        let saved = replay_states(&got);
        assert_eq!(h.with(|g| g.next_u64()), a);
        restore_states(&got, saved);
        assert_eq!(h.state(), live);
    }

    #[test]
    fn nested_recordings_both_see_draws_and_dropping_cleans_up() {
        let h1 = RngHandle::new(1);
        let h2 = RngHandle::new(2);
        let outer = RngRecording::start();
        h1.with(|g| g.next_u32());
        {
            let inner = RngRecording::start();
            h2.with(|g| g.next_u32());
            assert_eq!(inner.finish().len(), 1);
        }
        {
            let _dropped = RngRecording::start();
        }
        let o = outer.finish();
        assert_eq!(o.len(), 2);
        RECORDINGS.with(|r| assert!(r.borrow().is_empty()));
        // Not recording: no bookkeeping.
        h1.with(|g| g.next_u32());
        RECORDINGS.with(|r| assert!(r.borrow().is_empty()));
    }

    #[test]
    fn clones_share_a_stream_and_seeding_is_reproducible() {
        let mut g = Generator::new(9);
        let a = RngHandle::derived_from(&mut g);
        let b = a.clone();
        assert!(a.same_as(&b));
        let x = a.with(|g| g.next_u64());
        let y = b.with(|g| g.next_u64());
        assert_ne!(x, y);
        let c = RngHandle::derived_from(&mut Generator::new(9));
        assert_eq!(c.with(|g| g.next_u64()), x);
        assert!(!c.same_as(&a));
        assert!(RngHandle::default_generator().same_as(&RngHandle::default_generator()));
    }
}
