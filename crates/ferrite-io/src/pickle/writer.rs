//! A pickle writer for plain data: the inverse of the restricted reader, for files other tools read.
//!
//! PyTorch's memory tools (`torch.cuda._memory_viz`, pytorch.org/memory_viz) read a snapshot as a
//! pickle of dicts, lists, strings and numbers. This writer emits exactly those types
//! (`None`, `bool`, `int`, `float`, `str`, `bytes`, `list`, `tuple`, `dict`) with protocol-3 opcodes
//! that every Python 3 unpickler reads; it never emits a global, so what it writes cannot run code.
//! Repeated strings (dict keys, action names) are written once and referenced through the memo, as
//! Python's own pickler does.

use std::collections::HashMap;

use super::materialize::MAX_DEPTH;
use crate::error::{IoError, Result};
use crate::value::Value;

/// Pickles `value` (protocol 3). Tensors cannot be written (they need PyTorch's globals) and values
/// nested deeper than the reader accepts are refused, both as [`IoError::Structure`].
pub fn to_pickle(value: &Value) -> Result<Vec<u8>> {
    let mut w = Writer { out: vec![PROTO, 3], memo: HashMap::new(), path: Vec::new() };
    w.value(value)?;
    w.out.push(STOP);
    Ok(w.out)
}

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const BINUNICODE: u8 = b'X';
const BINBYTES: u8 = b'B';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const TUPLE: u8 = b't';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Python's pickler batches APPENDS/SETITEMS by this many items.
const BATCH: usize = 1000;

struct Writer {
    out: Vec<u8>,
    /// Strings already written, by memo index.
    memo: HashMap<String, u32>,
    /// Keys and indices to the value being written (for error messages).
    path: Vec<String>,
}

impl Writer {
    fn err(&self, reason: impl Into<String>) -> IoError {
        IoError::Structure { path: self.path.join("/"), reason: reason.into() }
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        if self.path.len() > MAX_DEPTH {
            return Err(self.err(format!("nested deeper than {MAX_DEPTH} levels; cannot be pickled")));
        }
        match v {
            Value::None => self.out.push(NONE),
            Value::Bool(true) => self.out.push(NEWTRUE),
            Value::Bool(false) => self.out.push(NEWFALSE),
            Value::Int(i) => self.int(*i),
            Value::Float(f) => {
                self.out.push(BINFLOAT);
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => self.str(s)?,
            Value::Bytes(b) => {
                let n = u32::try_from(b.len()).map_err(|_| self.err("bytes longer than 4 GiB"))?;
                self.out.push(BINBYTES);
                self.out.extend_from_slice(&n.to_le_bytes());
                self.out.extend_from_slice(b);
            }
            Value::List(items) => {
                self.out.push(EMPTY_LIST);
                for (c, chunk) in items.chunks(BATCH).enumerate() {
                    self.out.push(MARK);
                    for (i, item) in chunk.iter().enumerate() {
                        self.path.push((c * BATCH + i).to_string());
                        self.value(item)?;
                        self.path.pop();
                    }
                    self.out.push(APPENDS);
                }
            }
            Value::Tuple(items) => {
                if items.is_empty() {
                    self.out.push(EMPTY_TUPLE);
                } else {
                    self.out.push(MARK);
                    for (i, item) in items.iter().enumerate() {
                        self.path.push(i.to_string());
                        self.value(item)?;
                        self.path.pop();
                    }
                    self.out.push(TUPLE);
                }
            }
            Value::Dict(items) => {
                self.out.push(EMPTY_DICT);
                for chunk in items.chunks(BATCH) {
                    self.out.push(MARK);
                    for (k, item) in chunk {
                        self.value(k)?;
                        self.path.push(crate::value::key_to_string(k));
                        self.value(item)?;
                        self.path.pop();
                    }
                    self.out.push(SETITEMS);
                }
            }
            Value::Tensor(_) => {
                return Err(self.err("a tensor cannot be written as plain pickle data (use a checkpoint writer)"));
            }
        }
        Ok(())
    }

    fn int(&mut self, i: i64) {
        if (0..=0xff).contains(&i) {
            self.out.extend_from_slice(&[BININT1, i as u8]);
        } else if (0..=0xffff).contains(&i) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(i as u16).to_le_bytes());
        } else if let Ok(small) = i32::try_from(i) {
            self.out.push(BININT);
            self.out.extend_from_slice(&small.to_le_bytes());
        } else {
            // Two's complement, little-endian, as few bytes as keep the sign (Python's encode_long).
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn str(&mut self, s: &str) -> Result<()> {
        if let Some(&idx) = self.memo.get(s) {
            match u8::try_from(idx) {
                Ok(small) => self.out.extend_from_slice(&[BINGET, small]),
                Err(_) => {
                    self.out.push(LONG_BINGET);
                    self.out.extend_from_slice(&idx.to_le_bytes());
                }
            }
            return Ok(());
        }
        let n = u32::try_from(s.len()).map_err(|_| self.err("string longer than 4 GiB"))?;
        self.out.push(BINUNICODE);
        self.out.extend_from_slice(&n.to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        // Only short strings are worth a memo slot (keys, action names, file names).
        if s.len() <= 256 {
            let idx = self.memo.len() as u32;
            match u8::try_from(idx) {
                Ok(small) => self.out.extend_from_slice(&[BINPUT, small]),
                Err(_) => {
                    self.out.push(LONG_BINPUT);
                    self.out.extend_from_slice(&idx.to_le_bytes());
                }
            }
            self.memo.insert(s.to_string(), idx);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::unpickle_plain;

    fn round_trip(v: &Value) -> Value {
        let bytes = to_pickle(v).unwrap();
        let (back, end) = unpickle_plain(&bytes).unwrap();
        assert_eq!(end, bytes.len());
        back
    }

    #[test]
    fn plain_values_round_trip() {
        let ints = [
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            i32::MAX as i64,
            i32::MIN as i64,
            1 << 40,
            -(1 << 40),
            i64::MAX,
            i64::MIN,
            0x7fff_ffff_ffff,
        ];
        let v = Value::Dict(vec![
            (Value::Str("ints".into()), Value::List(ints.iter().map(|&i| Value::Int(i)).collect())),
            (
                Value::Str("floats".into()),
                Value::List(vec![Value::Float(0.5), Value::Float(-1e300), Value::Float(f64::INFINITY)]),
            ),
            (Value::Str("flags".into()), Value::Tuple(vec![Value::Bool(true), Value::Bool(false), Value::None])),
            (Value::Str("empty".into()), Value::Tuple(vec![])),
            (Value::Str("bytes".into()), Value::Bytes(vec![0, 1, 2, 255])),
            (Value::Int(7), Value::Str("ünïcode ✓".into())),
            (Value::Str("again".into()), Value::List(vec![Value::Str("ints".into()), Value::Str("ints".into())])),
        ]);
        assert_eq!(round_trip(&v), v);
    }

    #[test]
    fn long_lists_and_many_strings_round_trip() {
        // More than one APPENDS batch and more memo entries than BINPUT's one-byte index holds.
        let v =
            Value::List((0..2500).map(|i| Value::Dict(vec![(Value::Str(format!("k{i}")), Value::Int(i))])).collect());
        assert_eq!(round_trip(&v), v);
    }

    #[test]
    fn tensors_and_deep_nesting_are_refused() {
        let mut v = Value::None;
        for _ in 0..(MAX_DEPTH + 5) {
            v = Value::List(vec![v]);
        }
        let e = to_pickle(&v).unwrap_err().to_string();
        assert!(e.contains("nested deeper"), "{e}");
    }
}
