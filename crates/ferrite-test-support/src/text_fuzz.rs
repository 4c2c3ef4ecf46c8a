//! Grammar-aware mutation fuzzing of text parsers, shared by every crate that parses a user's
//! strings (allocator settings, device names, traces, addresses, scraped metrics, dataset files).
//!
//! Why mutation of valid inputs rather than random strings alone: a random string is rejected by
//! the first character, so it never reaches the code after the key, the separator or the number.
//! Starting from real inputs (`seeds`) and splicing in the grammar's own tokens (`vocabulary`:
//! keys, separators, edge-case numbers) walks every branch of a small parser within a few
//! thousand cases. A tenth of the inputs are unconstrained Unicode, for the branches nobody
//! thought of. The long-running counterpart of each test is a cargo-fuzz target in `fuzz/`.
//!
//! `PROPTEST_CASES` sets the inputs per test (default [`DEFAULT_CASES`]); each test prints how
//! many it ran, so the CI log shows the budget was spent.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Inputs per parser in CI when `PROPTEST_CASES` is unset.
pub const DEFAULT_CASES: u32 = 3000;

/// One edit of a text.
#[derive(Debug, Clone)]
pub enum TextEdit {
    /// Insert a vocabulary token at a character position.
    InsertToken(usize, usize),
    /// Replace the characters `[at, at + len)` by a vocabulary token.
    ReplaceWithToken(usize, usize, usize),
    /// Delete the characters `[at, at + len)`.
    Delete(usize, usize),
    /// Repeat the characters `[at, at + len)` `times` times.
    Repeat(usize, usize, usize),
    /// Insert one arbitrary character.
    InsertChar(usize, char),
    /// Cut the text at a character position.
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = TextEdit> {
    prop_oneof![
        4 => (any::<usize>(), any::<usize>()).prop_map(|(a, t)| TextEdit::InsertToken(a, t)),
        4 => (any::<usize>(), 0usize..8, any::<usize>()).prop_map(|(a, n, t)| TextEdit::ReplaceWithToken(a, n, t)),
        3 => (any::<usize>(), 1usize..8).prop_map(|(a, n)| TextEdit::Delete(a, n)),
        1 => (any::<usize>(), 1usize..16, 2usize..64).prop_map(|(a, n, k)| TextEdit::Repeat(a, n, k)),
        2 => (any::<usize>(), any::<char>()).prop_map(|(a, c)| TextEdit::InsertChar(a, c)),
        1 => any::<usize>().prop_map(TextEdit::Truncate),
    ]
}

/// `text` after `edits`, with positions taken modulo the text's length in characters.
pub fn apply_edits(text: &str, edits: &[TextEdit], vocabulary: &[&str]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let token = |t: usize| -> Vec<char> {
        if vocabulary.is_empty() { Vec::new() } else { vocabulary[t % vocabulary.len()].chars().collect() }
    };
    for e in edits {
        let len = chars.len();
        let at = |a: usize| if len == 0 { 0 } else { a % (len + 1) };
        match *e {
            TextEdit::InsertToken(a, t) => {
                let p = at(a);
                chars.splice(p..p, token(t));
            }
            TextEdit::ReplaceWithToken(a, n, t) => {
                let p = at(a);
                let end = (p + n).min(len);
                chars.splice(p..end, token(t));
            }
            TextEdit::Delete(a, n) => {
                let p = at(a);
                chars.drain(p..(p + n).min(len));
            }
            TextEdit::Repeat(a, n, k) => {
                let p = at(a);
                let piece: Vec<char> = chars[p..(p + n).min(len)].to_vec();
                for _ in 1..k {
                    chars.splice(p..p, piece.iter().copied());
                }
            }
            TextEdit::InsertChar(a, c) => {
                let p = at(a);
                chars.insert(p, c);
            }
            TextEdit::Truncate(a) => chars.truncate(at(a)),
        }
    }
    chars.into_iter().collect()
}

/// Texts made from `seeds` by up to eight edits drawn from `vocabulary`, plus some arbitrary
/// strings and some plain concatenations of tokens.
pub fn mutated_text(seeds: Vec<String>, vocabulary: Vec<&'static str>) -> impl Strategy<Value = String> {
    assert!(!seeds.is_empty(), "mutated_text needs at least one seed");
    let vocab_for_edits = vocabulary.clone();
    let edited = (prop::sample::select(seeds), prop::collection::vec(edit(), 0..8))
        .prop_map(move |(seed, edits)| apply_edits(&seed, &edits, &vocab_for_edits));
    let tokens = if vocabulary.is_empty() { vec![""] } else { vocabulary };
    let soup = prop::collection::vec(prop::sample::select(tokens), 0..12).prop_map(|t| t.concat());
    prop_oneof![7 => edited, 2 => soup, 1 => ".{0,64}"]
}

/// The number of inputs per test: `PROPTEST_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_CASES)
}

/// Runs `check` on [`cases`] inputs of `strategy`; a panic or an `Err` from `check` fails with the
/// shrunk input. Prints `{name}: N inputs ran` so the CI log shows the budget.
pub fn run_text_fuzz<S>(name: &str, strategy: S, check: impl Fn(&S::Value) -> Result<(), String>)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    let n = cases();
    let mut runner = TestRunner::new(Config { cases: n, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&strategy, |input| check(&input).map_err(TestCaseError::fail));
    if let Err(e) = outcome {
        panic!("{name}: {e}");
    }
    println!("{name}: {n} inputs ran without a panic and every property held");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_stay_on_character_boundaries() {
        let out = apply_edits("aé€😀", &[TextEdit::Delete(1, 2), TextEdit::InsertToken(7, 0)], &[":"]);
        assert_eq!(out, "a:😀");
        let out = apply_edits("ab", &[TextEdit::Repeat(0, 1, 3), TextEdit::Truncate(3)], &[]);
        assert_eq!(out, "aaa", "positions wrap modulo len + 1: 3 of 4 characters kept");
        assert_eq!(apply_edits("", &[TextEdit::ReplaceWithToken(3, 2, 1)], &["x", "y"]), "y");
    }

    #[test]
    fn a_failing_property_is_reported() {
        let r = std::panic::catch_unwind(|| {
            run_text_fuzz("always fails", Just("x".to_string()), |_| Err("no".into()));
        });
        assert!(r.is_err());
    }
}
