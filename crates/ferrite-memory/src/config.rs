//! Allocator settings in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax.
//!
//! Users who tuned PyTorch (`max_split_size_mb:128,garbage_collection_threshold:0.6`) can paste the
//! same string into `FERRITE_ALLOC_CONF` or [`AllocatorConfig::parse`]. Unlike PyTorch, a mistake
//! never goes unnoticed: every unknown key or bad value is a [`MemoryError::InvalidConfig`] that
//! names the key.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::MemoryError;
use crate::size_rules::{LARGE_BUFFER, ROUNDUP_POWER2_INTERVALS};

/// Name of the environment variable read by the registry allocators.
pub const ALLOC_CONF_ENV: &str = "FERRITE_ALLOC_CONF";

const MIB: u64 = 1 << 20;

/// Settings of one caching allocator. `Default` is PyTorch's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocatorConfig {
    /// Blocks of this size or more are never split (`max_split_size_mb`; `u64::MAX` = unlimited).
    pub max_split_size: u64,
    /// An oversize cached block may serve a request at most this much smaller
    /// (`max_non_split_rounding_mb`, default 20 MiB).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval from 1 MiB (index 0) to 32 GiB+ (index 15); 0/1 = off.
    pub roundup_power2_divisions: [u32; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are reclaimed (0 = off). Only
    /// active together with a per-process memory fraction, exactly as in PyTorch.
    pub garbage_collection_threshold: f64,
    /// Grow one segment per pool and stream in pages (2 MiB small, 20 MiB large) instead of
    /// reserving a segment per request, so slightly growing requests do not leave slivers.
    pub expandable_segments: bool,
    /// Accepted for compatibility; ferrite never holds its lock across a backend call that blocks.
    pub release_lock_on_cudamalloc: bool,
    /// Accepted for compatibility (pinned host memory is not simulated).
    pub pinned_use_cuda_host_register: bool,
    /// Accepted for compatibility (pinned host memory is not simulated).
    pub pinned_num_register_threads: u32,
    /// Accepted for compatibility (pinned host memory is not simulated).
    pub pinned_use_background_threads: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
        }
    }
}

impl AllocatorConfig {
    /// Parse a `key:value,key:value` string (PyTorch syntax, whitespace ignored; lists as
    /// `roundup_power2_divisions:[256:1,512:2,>:4]`). An empty string gives the defaults.
    pub fn parse(spec: &str) -> Result<AllocatorConfig, MemoryError> {
        let mut cfg = AllocatorConfig::default();
        cfg.apply(spec)?;
        Ok(cfg)
    }

    /// Read [`ALLOC_CONF_ENV`]; unset or empty gives the defaults.
    pub fn from_env() -> Result<AllocatorConfig, MemoryError> {
        match std::env::var(ALLOC_CONF_ENV) {
            Ok(s) => AllocatorConfig::parse(&s).map_err(|e| match e {
                MemoryError::InvalidConfig { key, value, reason } => MemoryError::InvalidConfig {
                    key,
                    value,
                    reason: format!("{reason} (from the environment variable {ALLOC_CONF_ENV})"),
                },
                other => other,
            }),
            Err(std::env::VarError::NotPresent) => Ok(AllocatorConfig::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(MemoryError::InvalidConfig {
                key: ALLOC_CONF_ENV.to_string(),
                value: String::new(),
                reason: "the variable is not valid UTF-8".to_string(),
            }),
        }
    }

    /// Apply the settings in `spec` on top of `self` (keys not named keep their value).
    pub fn apply(&mut self, spec: &str) -> Result<(), MemoryError> {
        let tokens = lex(spec);
        let mut p = Parser { tokens: &tokens, i: 0 };
        let mut next = self.clone();
        while let Some(key) = p.next() {
            if key == "," {
                continue;
            }
            match key {
                "max_split_size_mb" => {
                    let v = p.value_u64(key)?;
                    if v < LARGE_BUFFER / MIB {
                        return Err(bad(key, &v.to_string(), "must be >= 20 (MiB)"));
                    }
                    next.max_split_size = v.saturating_mul(MIB);
                }
                "max_non_split_rounding_mb" => {
                    let v = p.value_u64(key)?;
                    if v < LARGE_BUFFER / MIB {
                        return Err(bad(key, &v.to_string(), "must be >= 20 (MiB)"));
                    }
                    next.max_non_split_rounding = v.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    let raw = p.value(key)?;
                    let v: f64 = raw.parse().map_err(|_| bad(key, raw, "expected a number in (0.0, 1.0)"))?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(bad(key, raw, "must be in the open interval (0.0, 1.0)"));
                    }
                    next.garbage_collection_threshold = v;
                }
                "roundup_power2_divisions" => {
                    next.roundup_power2_divisions = p.divisions(key)?;
                }
                "expandable_segments" => next.expandable_segments = p.value_bool(key)?,
                "release_lock_on_cudamalloc" => next.release_lock_on_cudamalloc = p.value_bool(key)?,
                "pinned_use_cuda_host_register" => next.pinned_use_cuda_host_register = p.value_bool(key)?,
                "pinned_use_background_threads" => next.pinned_use_background_threads = p.value_bool(key)?,
                "pinned_num_register_threads" => {
                    let v = p.value_u64(key)?;
                    if !v.is_power_of_two() || v > 128 {
                        return Err(bad(key, &v.to_string(), "must be a power of two <= 128"));
                    }
                    next.pinned_num_register_threads = v as u32;
                }
                "backend" => {
                    let v = p.value(key)?;
                    if v != "native" {
                        return Err(bad(key, v, "ferrite implements only the `native` caching allocator"));
                    }
                }
                ":" | "[" | "]" => return Err(bad(key, "", "expected a key name")),
                other => {
                    return Err(MemoryError::InvalidConfig {
                        key: other.to_string(),
                        value: String::new(),
                        reason: format!("unknown allocator option; known options: {}", KNOWN_KEYS.join(", ")),
                    });
                }
            }
            match p.next() {
                None | Some(",") => {}
                Some(t) => return Err(bad(key, t, "expected `,` after the value")),
            }
        }
        *self = next;
        Ok(())
    }

    /// `max_split_size` as an option (`None` = unlimited).
    pub fn max_split_size_limit(&self) -> Option<u64> {
        (self.max_split_size != u64::MAX).then_some(self.max_split_size)
    }
}

const KNOWN_KEYS: &[&str] = &[
    "backend",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
];

fn bad(key: &str, value: &str, reason: &str) -> MemoryError {
    MemoryError::InvalidConfig { key: key.to_string(), value: value.to_string(), reason: reason.to_string() }
}

/// PyTorch's lexer: `, : [ ]` are tokens of their own, spaces are dropped.
fn lex(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for c in s.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    out.push(std::mem::take(&mut buf));
                }
                out.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => buf.push(c),
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Parser<'a> {
    tokens: &'a [String],
    i: usize,
}

impl<'a> Parser<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let t = self.tokens.get(self.i)?;
        self.i += 1;
        Some(t.as_str())
    }
    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.i).map(|s| s.as_str())
    }
    fn expect(&mut self, key: &str, tok: &str) -> Result<(), MemoryError> {
        match self.next() {
            Some(t) if t == tok => Ok(()),
            Some(t) => Err(bad(key, t, &format!("expected `{tok}`"))),
            None => Err(bad(key, "", &format!("expected `{tok}` and a value"))),
        }
    }
    fn value(&mut self, key: &str) -> Result<&'a str, MemoryError> {
        self.expect(key, ":")?;
        match self.next() {
            Some(t) if ![",", ":", "[", "]"].contains(&t) => Ok(t),
            Some(t) => Err(bad(key, t, "missing value")),
            None => Err(bad(key, "", "missing value")),
        }
    }
    fn value_u64(&mut self, key: &str) -> Result<u64, MemoryError> {
        let v = self.value(key)?;
        v.parse().map_err(|_| bad(key, v, "expected a non-negative integer"))
    }
    fn value_bool(&mut self, key: &str) -> Result<bool, MemoryError> {
        match self.value(key)? {
            "True" => Ok(true),
            "False" => Ok(false),
            v => Err(bad(key, v, "expected `True` or `False`")),
        }
    }
    /// `N` (same divisions everywhere) or `[MB:N, MB:N, >:N]` with power-of-two MB keys.
    fn divisions(&mut self, key: &str) -> Result<[u32; ROUNDUP_POWER2_INTERVALS], MemoryError> {
        let mut table = [0u32; ROUNDUP_POWER2_INTERVALS];
        let parse_div = |v: &str| -> Result<u32, MemoryError> {
            let d: u32 = v.parse().map_err(|_| bad(key, v, "divisions must be an integer"))?;
            if d != 0 && !d.is_power_of_two() {
                return Err(bad(key, v, "divisions must be a power of two (or 0 to disable)"));
            }
            Ok(d)
        };
        self.expect(key, ":")?;
        match self.next() {
            Some("[") => {
                let mut first = true;
                let mut last_index: Option<usize> = None;
                loop {
                    let interval = match self.next() {
                        Some("]") => break,
                        Some(t) => t,
                        None => return Err(bad(key, "", "unterminated `[` list")),
                    };
                    self.expect(key, ":")?;
                    let d = match self.next() {
                        Some(v) => parse_div(v)?,
                        None => return Err(bad(key, "", "missing divisions after `:`")),
                    };
                    if interval == ">" {
                        // Deliberate improvement over PyTorch: `>` covers the intervals *above*
                        // the last one listed; PyTorch also overwrites the last listed interval.
                        let start = last_index.map_or(0, |i| i + 1);
                        table[start.min(ROUNDUP_POWER2_INTERVALS)..].fill(d);
                    } else {
                        let mb: u64 = interval
                            .parse()
                            .map_err(|_| bad(key, interval, "interval must be a size in MiB or `>`"))?;
                        if !mb.is_power_of_two() {
                            return Err(bad(key, interval, "interval must be a power of two (MiB)"));
                        }
                        let index = (mb.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
                        if first {
                            table[..index].fill(d);
                            first = false;
                        }
                        table[index] = d;
                        last_index = Some(index);
                    }
                    match self.peek() {
                        Some(",") => {
                            self.i += 1;
                        }
                        Some("]") => {}
                        Some(t) => return Err(bad(key, t, "expected `,` or `]` in the list")),
                        None => return Err(bad(key, "", "unterminated `[` list")),
                    }
                }
            }
            Some(v) if ![",", ":", "]"].contains(&v) => {
                let d = parse_div(v)?;
                table.fill(d);
            }
            Some(t) => return Err(bad(key, t, "missing value")),
            None => return Err(bad(key, "", "missing value")),
        }
        Ok(table)
    }
}

impl FromStr for AllocatorConfig {
    type Err = MemoryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorConfig::parse(s)
    }
}

/// The canonical string form; parsing it gives back an equal configuration.
impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = self.max_split_size_limit() {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!("max_non_split_rounding_mb:{}", self.max_non_split_rounding / MIB));
        }
        if self.roundup_power2_divisions.iter().any(|&d| d != 0) {
            let items: Vec<String> =
                self.roundup_power2_divisions.iter().enumerate().map(|(i, d)| format!("{}:{}", 1u64 << i, d)).collect();
            parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!("garbage_collection_threshold:{}", self.garbage_collection_threshold));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if self.release_lock_on_cudamalloc {
            parts.push("release_lock_on_cudamalloc:True".to_string());
        }
        if self.pinned_use_cuda_host_register {
            parts.push("pinned_use_cuda_host_register:True".to_string());
        }
        if self.pinned_num_register_threads != 1 {
            parts.push(format!("pinned_num_register_threads:{}", self.pinned_num_register_threads));
        }
        if self.pinned_use_background_threads {
            parts.push("pinned_use_background_threads:True".to_string());
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(e: MemoryError) -> String {
        match e {
            MemoryError::InvalidConfig { key, .. } => key,
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn empty_string_gives_defaults() {
        assert_eq!(AllocatorConfig::parse("").unwrap(), AllocatorConfig::default());
        assert_eq!(AllocatorConfig::parse("  ").unwrap(), AllocatorConfig::default());
    }

    #[test]
    fn parses_pytorch_keys() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:128, garbage_collection_threshold:0.6,expandable_segments:False,max_non_split_rounding_mb:64",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert_eq!(c.max_non_split_rounding, 64 << 20);
        let c = AllocatorConfig::parse("backend:native,release_lock_on_cudamalloc:True").unwrap();
        assert!(c.release_lock_on_cudamalloc);
    }

    #[test]
    fn divisions_single_value_and_list() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let mut want = [1u32; 16];
        want[9] = 2;
        want[10] = 4;
        want[11..].fill(8);
        assert_eq!(c.roundup_power2_divisions, want);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[>:2]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [2; 16]);
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(key_of(AllocatorConfig::parse("max_split_size:128").unwrap_err()), "max_split_size");
        assert_eq!(key_of(AllocatorConfig::parse("max_split_size_mb:10").unwrap_err()), "max_split_size_mb");
        assert_eq!(key_of(AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err()), "max_split_size_mb");
        assert_eq!(
            key_of(AllocatorConfig::parse("garbage_collection_threshold:1.5").unwrap_err()),
            "garbage_collection_threshold"
        );
        assert_eq!(key_of(AllocatorConfig::parse("expandable_segments:yes").unwrap_err()), "expandable_segments");
        assert!(AllocatorConfig::parse("expandable_segments:True").unwrap().expandable_segments);
        assert_eq!(
            key_of(AllocatorConfig::parse("roundup_power2_divisions:3").unwrap_err()),
            "roundup_power2_divisions"
        );
        assert_eq!(
            key_of(AllocatorConfig::parse("roundup_power2_divisions:[300:2]").unwrap_err()),
            "roundup_power2_divisions"
        );
        assert_eq!(key_of(AllocatorConfig::parse("backend:cudaMallocAsync").unwrap_err()), "backend");
        assert_eq!(key_of(AllocatorConfig::parse("max_split_size_mb").unwrap_err()), "max_split_size_mb");
        let msg = AllocatorConfig::parse("foo:1").unwrap_err().to_string();
        assert!(msg.contains("foo"), "{msg}");
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "",
            "max_split_size_mb:200,garbage_collection_threshold:0.5",
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],release_lock_on_cudamalloc:True,expandable_segments:True",
            "max_non_split_rounding_mb:40,pinned_num_register_threads:8",
        ] {
            let c = AllocatorConfig::parse(s).unwrap();
            assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c, "{s} -> {c}");
        }
    }
}
