//! Random number generation.
//!
//! One generator type for the whole framework, so that tensor creation, dropout and data-loader
//! workers draw from streams whose state can be saved, restored and derived reproducibly. It wraps
//! ChaCha8 (a counter-based generator): its full state is `(seed, word position)`, which makes
//! save/restore exact and cheap, and lets parallel kernels jump to a fixed offset so results do not
//! depend on the number of threads.

use std::sync::{Mutex, OnceLock};

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// A seedable random generator with exact, serialisable state.
#[derive(Clone, Debug)]
pub struct Generator {
    seed: u64,
    rng: ChaCha8Rng,
}

/// The complete state of a [`Generator`]; restoring it continues the stream bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GeneratorState {
    pub seed: u64,
    /// Position in the ChaCha8 output stream, in 32-bit words.
    pub word_pos: u128,
}

impl GeneratorState {
    /// 24-byte little-endian encoding: seed (8) then word position (16).
    pub fn to_bytes(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.seed.to_le_bytes());
        out[8..].copy_from_slice(&self.word_pos.to_le_bytes());
        out
    }

    /// Inverse of [`to_bytes`](Self::to_bytes); `None` if the slice is not 24 bytes long.
    pub fn from_bytes(bytes: &[u8]) -> Option<GeneratorState> {
        if bytes.len() != 24 {
            return None;
        }
        let seed = u64::from_le_bytes(bytes[..8].try_into().ok()?);
        let word_pos = u128::from_le_bytes(bytes[8..].try_into().ok()?);
        Some(GeneratorState { seed, word_pos })
    }
}

impl Generator {
    /// A generator whose stream is fully determined by `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator { seed, rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// The seed this generator was created (or last re-seeded) with.
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    /// Re-seed in place (PyTorch's `manual_seed`).
    pub fn manual_seed(&mut self, seed: u64) {
        *self = Generator::new(seed);
    }

    pub fn state(&self) -> GeneratorState {
        GeneratorState { seed: self.seed, word_pos: self.rng.get_word_pos() }
    }

    pub fn set_state(&mut self, state: GeneratorState) {
        let mut rng = ChaCha8Rng::seed_from_u64(state.seed);
        rng.set_word_pos(state.word_pos);
        self.seed = state.seed;
        self.rng = rng;
    }

    /// A copy of this generator advanced to `word_offset` 32-bit words past the current position,
    /// without advancing `self`. Parallel kernels give each chunk its own fixed offset.
    pub fn at_offset(&self, word_offset: u128) -> Generator {
        let mut g = self.clone();
        g.rng.set_word_pos(self.rng.get_word_pos() + word_offset);
        g
    }

    /// Advance this generator by `words` 32-bit words (after a parallel kernel consumed them).
    pub fn skip(&mut self, words: u128) {
        let p = self.rng.get_word_pos();
        self.rng.set_word_pos(p + words);
    }

    pub fn next_u32(&mut self) -> u32 {
        self.rng.next_u32()
    }

    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, 1)` with 24 random bits (one 32-bit word).
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Standard normal (Box–Muller; consumes two 64-bit draws).
    pub fn normal_f64(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform_f64(); // (0, 1]
        let u2 = self.uniform_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Uniform integer in `[0, n)` without modulo bias. `n == 0` returns 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let v = self.next_u64();
            if v < zone {
                return v % n;
            }
        }
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A random permutation of `0..n` (PyTorch's `randperm`).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }
}

fn default_cell() -> &'static Mutex<Generator> {
    static DEFAULT: OnceLock<Mutex<Generator>> = OnceLock::new();
    DEFAULT.get_or_init(|| Mutex::new(Generator::new(DEFAULT_SEED)))
}

/// Seed of the process-wide default generator until [`manual_seed`] is called. Fixed (not time
/// based) so a program that never seeds is still reproducible.
pub const DEFAULT_SEED: u64 = 67280421310721;

/// Re-seed the process-wide default generator (PyTorch's `torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    with_default_generator(|g| g.manual_seed(seed));
}

/// Run `f` with exclusive access to the process-wide default generator.
pub fn with_default_generator<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    let mut g = default_cell().lock().unwrap_or_else(|p| p.into_inner());
    f(&mut g)
}

/// State of the default generator, for checkpoints.
pub fn default_generator_state() -> GeneratorState {
    with_default_generator(|g| g.state())
}

/// Restore the default generator, for resuming from checkpoints.
pub fn set_default_generator_state(state: GeneratorState) {
    with_default_generator(|g| g.set_state(state));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_state_round_trips() {
        let mut a = Generator::new(7);
        let mut b = Generator::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let s = a.state();
        let x: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let mut c = Generator::new(0);
        c.set_state(GeneratorState::from_bytes(&s.to_bytes()).expect("24 bytes"));
        let y: Vec<u64> = (0..5).map(|_| c.next_u64()).collect();
        assert_eq!(x, y);
    }

    #[test]
    fn different_seeds_differ() {
        assert_ne!(Generator::new(1).next_u64(), Generator::new(2).next_u64());
    }

    #[test]
    fn offset_matches_sequential_draws() {
        let g = Generator::new(3);
        let mut seq = g.clone();
        let _ = (0..4).map(|_| seq.next_u32()).count();
        let mut jumped = g.at_offset(4);
        assert_eq!(seq.next_u32(), jumped.next_u32());
    }

    #[test]
    fn uniform_in_range_and_permutation_is_a_permutation() {
        let mut g = Generator::new(11);
        for _ in 0..1000 {
            let u = g.uniform_f32();
            assert!((0.0..1.0).contains(&u));
            let v = g.uniform_f64();
            assert!((0.0..1.0).contains(&v));
        }
        let mut p = g.permutation(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
