//! The pickle virtual machine, restricted to data.
//!
//! It implements the opcodes of pickle protocols 0–5 that build values (numbers, strings,
//! containers, memo, marks, persistent ids) and routes every call — `REDUCE`, `NEWOBJ`, `INST`,
//! `OBJ`, `BUILD` — to the closed set of globals in `allowed_globals`. It imports nothing and calls
//! nothing outside this crate. Every length read from the input is checked against the bytes left
//! before it is used, and work that could be amplified by memo references is metered.

use std::collections::HashMap;
use std::rc::Rc;

use super::allowed_globals;
use super::heap::{Container, DictObj, Global, Heap, Obj, StorageRef, TensorSpec};
use crate::error::{IoError, Result};

/// PyTorch refuses more than 64 dimensions; so do we (it also bounds per-tensor copies).
pub(crate) const MAX_DIMS: usize = 64;

/// The result of running one pickle program.
#[derive(Debug)]
pub(crate) struct Program {
    pub heap: Heap,
    pub root: Obj,
    /// Offset just past the STOP opcode (the next pickle of a legacy file starts here).
    pub end: usize,
}

/// Runs the pickle program at the start of `data`.
pub(crate) fn run(data: &[u8]) -> Result<Program> {
    let mut m = Machine {
        data,
        pos: 0,
        op_start: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        heap: Heap::default(),
        work: 0,
        work_limit: 64 * data.len() as u64 + (1 << 20),
    };
    let root = m.execute()?;
    Ok(Program { heap: m.heap, root, end: m.pos })
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
    stack: Vec<Obj>,
    marks: Vec<usize>,
    memo: HashMap<u64, Obj>,
    heap: Heap,
    /// Elements copied so far; memo references make copies cheap to request, so they are metered.
    work: u64,
    work_limit: u64,
}

impl<'a> Machine<'a> {
    fn err(&self, reason: impl Into<String>) -> IoError {
        IoError::Pickle { offset: self.op_start, reason: reason.into() }
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let left = self.data.len() - self.pos;
        if n > left as u64 {
            return Err(IoError::SizeExceedsData {
                what: format!("pickle opcode at byte {} asks for {n} bytes, which", self.op_start),
                claimed: n as u128,
                available: left as u128,
            });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A text line (protocol 0 arguments), without the newline.
    fn line(&mut self) -> Result<&'a str> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return Err(self.err("unterminated text argument (file truncated?)"));
        };
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n]).map_err(|_| self.err("text argument is not UTF-8"))
    }

    fn utf8(&self, bytes: &[u8]) -> Result<Obj> {
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(Obj::Str(Rc::from(s))),
            Err(_) => Err(self.err("string is not valid UTF-8")),
        }
    }

    fn charge(&mut self, n: usize) -> Result<()> {
        self.work += n as u64;
        if self.work > self.work_limit {
            return Err(IoError::LimitExceeded {
                what: "elements copied while unpickling (memo references used to amplify work)".to_string(),
                limit: self.work_limit,
            });
        }
        Ok(())
    }

    fn push(&mut self, o: Obj) {
        self.stack.push(o);
    }

    fn pop(&mut self) -> Result<Obj> {
        match self.marks.last() {
            Some(&m) if m >= self.stack.len() => return Err(self.err("stack underflow (pop past a mark)")),
            _ => {}
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top(&self) -> Result<&Obj> {
        self.stack.last().ok_or_else(|| self.err("stack underflow"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Obj>> {
        let m = self.marks.pop().ok_or_else(|| self.err("no mark on the stack"))?;
        if m > self.stack.len() {
            return Err(self.err("mark above the stack top"));
        }
        Ok(self.stack.split_off(m))
    }

    fn memo_get(&self, idx: u64) -> Result<Obj> {
        self.memo.get(&idx).cloned().ok_or_else(|| self.err(format!("memo entry {idx} was never stored")))
    }

    fn memo_put(&mut self, idx: u64) -> Result<()> {
        let top = self.top()?.clone();
        self.memo.insert(idx, top);
        Ok(())
    }

    fn new_tuple(&mut self, items: Vec<Obj>) -> Obj {
        self.heap.alloc(Container::Tuple(items))
    }

    fn new_dict(&mut self, pairs: Vec<Obj>) -> Result<Obj> {
        let mut d = DictObj::default();
        self.fill_dict(&mut d, pairs)?;
        Ok(self.heap.alloc(Container::Dict(d)))
    }

    fn fill_dict(&self, d: &mut DictObj, pairs: Vec<Obj>) -> Result<()> {
        if !pairs.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for a dict"));
        }
        let mut it = pairs.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            let hk = self.heap.hash_key(&k, 0).ok_or_else(|| self.err("unhashable dict key"))?;
            d.insert(hk, k, v);
        }
        Ok(())
    }

    /// The dict under construction at the stack top (for SETITEM/SETITEMS).
    fn with_top_dict(&mut self, pairs: Vec<Obj>) -> Result<()> {
        let Obj::Ref(id) = *self.top()? else {
            return Err(self.err("SETITEM target is not a dict"));
        };
        let mut d = match self.heap.get_mut(id) {
            Some(Container::Dict(d)) => std::mem::take(d),
            _ => return Err(self.err("SETITEM target is not a dict")),
        };
        let r = self.fill_dict(&mut d, pairs);
        if let Some(Container::Dict(slot)) = self.heap.get_mut(id) {
            *slot = d;
        }
        r
    }

    fn extend_top(&mut self, items: Vec<Obj>, set_ok: bool) -> Result<()> {
        let Obj::Ref(id) = *self.top()? else {
            return Err(self.err("APPEND target is not a list"));
        };
        match self.heap.get_mut(id) {
            Some(Container::List(v)) => v.extend(items),
            Some(Container::Set(v)) if set_ok => v.extend(items),
            _ => return Err(self.err("APPEND/ADDITEMS target is not a list or set")),
        }
        Ok(())
    }

    fn tuple_items(&mut self, o: &Obj, what: &str) -> Result<Vec<Obj>> {
        let items = match o {
            Obj::Ref(id) => match self.heap.get(*id) {
                Some(Container::Tuple(v)) | Some(Container::List(v)) => v.clone(),
                _ => return Err(self.err(format!("{what} must be a tuple"))),
            },
            _ => return Err(self.err(format!("{what} must be a tuple"))),
        };
        self.charge(items.len())?;
        Ok(items)
    }

    fn global(&self, module: &str, name: &str) -> Result<Obj> {
        allowed_globals::resolve(module, name).map(Obj::Global)
    }

    fn execute(&mut self) -> Result<Obj> {
        loop {
            self.op_start = self.pos;
            let op = self.u8().map_err(|_| self.err("pickle ended without STOP (file truncated?)"))?;
            match op {
                0x80 => {
                    let v = self.u8()?;
                    if v > 5 {
                        return Err(self.err(format!("unsupported pickle protocol {v}")));
                    }
                }
                0x95 => {
                    self.u64()?; // FRAME: a length hint only.
                }
                b'.' => {
                    let root = self.pop()?;
                    return Ok(root);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.marks.last().is_some_and(|&m| m == self.stack.len()) {
                        self.pop_mark()?;
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?.clone();
                    self.push(t);
                }
                // Numbers.
                b'N' => self.push(Obj::None),
                0x88 => self.push(Obj::Bool(true)),
                0x89 => self.push(Obj::Bool(false)),
                b'K' => {
                    let v = self.u8()?;
                    self.push(Obj::Int(v as i64));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Obj::Int(v as i64));
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push(Obj::Int(v as i64));
                }
                b'I' => {
                    let line = self.line()?;
                    let o = match line {
                        "00" => Obj::Bool(false),
                        "01" => Obj::Bool(true),
                        s => Obj::Int(s.trim().parse().map_err(|_| self.err(format!("bad INT `{s}`")))?),
                    };
                    self.push(o);
                }
                b'L' => {
                    let line = self.line()?;
                    let s = line.trim().trim_end_matches('L');
                    let v = s.parse().map_err(|_| self.err(format!("integer `{s}` does not fit in 64 bits")))?;
                    self.push(Obj::Int(v));
                }
                0x8a => {
                    let n = self.u8()? as u64;
                    let b = self.take(n)?;
                    let v = decode_long(b).ok_or_else(|| self.err("integer does not fit in 64 bits"))?;
                    self.push(Obj::Int(v));
                }
                0x8b => {
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err("negative LONG4 length"));
                    }
                    let b = self.take(n as u64)?;
                    let v = decode_long(b).ok_or_else(|| self.err("integer does not fit in 64 bits"))?;
                    self.push(Obj::Int(v));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Obj::Float(f64::from_be_bytes(a)));
                }
                b'F' => {
                    let line = self.line()?;
                    let v = line.trim().parse().map_err(|_| self.err(format!("bad FLOAT `{line}`")))?;
                    self.push(Obj::Float(v));
                }
                // Strings and bytes.
                b'X' => {
                    let n = self.u32()? as u64;
                    let b = self.take(n)?;
                    let o = self.utf8(b)?;
                    self.push(o);
                }
                0x8c => {
                    let n = self.u8()? as u64;
                    let b = self.take(n)?;
                    let o = self.utf8(b)?;
                    self.push(o);
                }
                0x8d => {
                    let n = self.u64()?;
                    let b = self.take(n)?;
                    let o = self.utf8(b)?;
                    self.push(o);
                }
                b'V' => {
                    let line = self.line()?;
                    if line.contains('\\') {
                        return Err(self.err("escaped protocol-0 unicode strings are not supported"));
                    }
                    self.push(Obj::Str(Rc::from(line)));
                }
                b'T' | b'U' => {
                    // Python 2 `str`: text if it is UTF-8, bytes otherwise.
                    let n = if op == b'T' { self.u32()? as u64 } else { self.u8()? as u64 };
                    let b = self.take(n)?;
                    let o = self.utf8(b).unwrap_or_else(|_| Obj::Bytes(Rc::from(b)));
                    self.push(o);
                }
                b'S' => {
                    let line = self.line()?.trim();
                    let inner = line
                        .strip_prefix('\'')
                        .and_then(|s| s.strip_suffix('\''))
                        .or_else(|| line.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                        .ok_or_else(|| self.err("STRING argument is not quoted"))?;
                    if inner.contains('\\') {
                        return Err(self.err("escaped protocol-0 strings are not supported"));
                    }
                    self.push(Obj::Str(Rc::from(inner)));
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'B' => self.u32()? as u64,
                        b'C' => self.u8()? as u64,
                        _ => self.u64()?,
                    };
                    let b = self.take(n)?;
                    self.push(Obj::Bytes(Rc::from(b)));
                }
                // Containers.
                b')' => {
                    let t = self.new_tuple(Vec::new());
                    self.push(t);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let t = self.new_tuple(items);
                    self.push(t);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n || self.marks.last().is_some_and(|&m| m + n > self.stack.len()) {
                        return Err(self.err("stack underflow building a tuple"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let t = self.new_tuple(items);
                    self.push(t);
                }
                b']' => {
                    let l = self.heap.alloc(Container::List(Vec::new()));
                    self.push(l);
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let l = self.heap.alloc(Container::List(items));
                    self.push(l);
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend_top(vec![v], false)?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, false)?;
                }
                b'}' => {
                    let d = self.heap.alloc(Container::Dict(DictObj::default()));
                    self.push(d);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let d = self.new_dict(items)?;
                    self.push(d);
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.with_top_dict(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.with_top_dict(items)?;
                }
                0x8f => {
                    let s = self.heap.alloc(Container::Set(Vec::new()));
                    self.push(s);
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, true)?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    let s = self.heap.alloc(Container::Set(items));
                    self.push(s);
                }
                // Memo.
                b'g' => {
                    let line = self.line()?;
                    let idx = line.trim().parse().map_err(|_| self.err("bad GET index"))?;
                    let o = self.memo_get(idx)?;
                    self.push(o);
                }
                b'h' => {
                    let idx = self.u8()? as u64;
                    let o = self.memo_get(idx)?;
                    self.push(o);
                }
                b'j' => {
                    let idx = self.u32()? as u64;
                    let o = self.memo_get(idx)?;
                    self.push(o);
                }
                b'p' => {
                    let line = self.line()?;
                    let idx = line.trim().parse().map_err(|_| self.err("bad PUT index"))?;
                    self.memo_put(idx)?;
                }
                b'q' => {
                    let idx = self.u8()? as u64;
                    self.memo_put(idx)?;
                }
                b'r' => {
                    let idx = self.u32()? as u64;
                    self.memo_put(idx)?;
                }
                0x94 => {
                    let idx = self.memo.len() as u64;
                    self.memo_put(idx)?;
                }
                // Globals and calls: only through the allow-list.
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = self.global(module, name)?;
                    self.push(g);
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (&module, &name) {
                        (Obj::Str(m), Obj::Str(n)) => {
                            let g = self.global(m, n)?;
                            self.push(g);
                        }
                        _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                    }
                }
                b'i' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let cls = self.global(module, name)?;
                    let args = self.pop_mark()?;
                    let o = self.construct(&cls, args)?;
                    self.push(o);
                }
                b'o' => {
                    let mut items = self.pop_mark()?;
                    if items.is_empty() {
                        return Err(self.err("OBJ without a class"));
                    }
                    let cls = items.remove(0);
                    let o = self.construct(&cls, items)?;
                    self.push(o);
                }
                0x81 => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let args = self.tuple_items(&args, "NEWOBJ arguments")?;
                    let o = self.construct(&cls, args)?;
                    self.push(o);
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let args = self.tuple_items(&args, "NEWOBJ_EX arguments")?;
                    let o = self.construct(&cls, args)?;
                    self.push(o);
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let args = self.tuple_items(&args, "REDUCE arguments")?;
                    let o = self.call(&callable, args, 0)?;
                    self.push(o);
                }
                b'b' => {
                    let state = self.pop()?;
                    let target = self.top()?.clone();
                    self.build(&target, &state)?;
                }
                b'P' => {
                    return Err(self.err("text persistent ids are not used by torch.save; refusing"));
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let o = self.persistent_load(&pid)?;
                    self.push(o);
                }
                0x82..=0x84 => {
                    return Err(
                        self.err("extension-registry globals (EXT1/2/4) are refused: they name arbitrary callables")
                    );
                }
                0x97 | 0x98 => {
                    return Err(self.err("out-of-band pickle buffers are not supported"));
                }
                other => return Err(self.err(format!("unknown or unsupported pickle opcode 0x{other:02x}"))),
            }
        }
    }

    /// NEWOBJ / INST / OBJ: instantiating a class. Only the container classes may be instantiated.
    fn construct(&mut self, cls: &Obj, args: Vec<Obj>) -> Result<Obj> {
        match cls {
            Obj::Global(Global::OrderedDict) if args.is_empty() => {
                Ok(self.heap.alloc(Container::Dict(DictObj::default())))
            }
            Obj::Global(Global::Set) if args.is_empty() => Ok(self.heap.alloc(Container::Set(Vec::new()))),
            Obj::Global(g) => Err(self.err(format!("instantiating {g:?} this way is not supported"))),
            _ => Err(self.err("NEWOBJ/INST/OBJ target is not a class")),
        }
    }

    /// BUILD: setting an object's state. Accepted only where PyTorch uses it harmlessly: the
    /// `_metadata` attribute of a state_dict `OrderedDict`, and Parameter attributes.
    fn build(&mut self, target: &Obj, state: &Obj) -> Result<()> {
        let Obj::Ref(id) = target else {
            return Err(self.err("BUILD on a plain value"));
        };
        match self.heap.get(*id) {
            Some(Container::Dict(_)) | Some(Container::Tensor(_)) => {}
            _ => return Err(self.err("BUILD is only accepted on OrderedDicts and tensors")),
        }
        match state {
            Obj::None => Ok(()),
            Obj::Ref(s) => match self.heap.get(*s) {
                Some(Container::Dict(d)) if d.items.iter().all(|(k, _)| matches!(k, Obj::Str(_))) => Ok(()),
                Some(Container::Tuple(_)) => Ok(()),
                _ => Err(self.err("BUILD state must be an attribute dict")),
            },
            _ => Err(self.err("BUILD state must be an attribute dict")),
        }
    }

    /// REDUCE: calling an allowed function.
    fn call(&mut self, callable: &Obj, args: Vec<Obj>, depth: usize) -> Result<Obj> {
        let Obj::Global(g) = callable else {
            return Err(self.err("REDUCE target is not a callable"));
        };
        match g {
            Global::OrderedDict => {
                let mut d = DictObj::default();
                if let Some(src) = args.first() {
                    let pairs = self.pairs_of(src)?;
                    self.fill_dict(&mut d, pairs)?;
                }
                Ok(self.heap.alloc(Container::Dict(d)))
            }
            Global::Set => {
                let items = match args.first() {
                    Some(src) => self.tuple_items(src, "set() argument")?,
                    None => Vec::new(),
                };
                Ok(self.heap.alloc(Container::Set(items)))
            }
            Global::RebuildTensor | Global::RebuildTensorV2 => self.rebuild_tensor(&args),
            Global::RebuildParameter | Global::RebuildParameterWithState => {
                let data = args.first().ok_or_else(|| self.err("_rebuild_parameter without data"))?;
                let mut spec = self.tensor_spec(data)?;
                spec.requires_grad = matches!(args.get(1), Some(Obj::Bool(true)));
                Ok(self.heap.alloc(Container::Tensor(spec)))
            }
            Global::RebuildFromTypeV2 => {
                // (func, new_type, args, state): only plain tensors/parameters rebuilt by an
                // allowed function.
                if depth > 0 || args.len() < 3 {
                    return Err(self.err("malformed _rebuild_from_type_v2 call"));
                }
                if !matches!(args[1], Obj::Global(Global::TensorType)) {
                    return Err(self.err("_rebuild_from_type_v2 of a tensor subclass is not supported"));
                }
                let inner = self.tuple_items(&args[2], "_rebuild_from_type_v2 arguments")?;
                self.call(&args[0], inner, depth + 1)
            }
            Global::Size => {
                let items = match args.first() {
                    Some(src) => self.tuple_items(src, "torch.Size argument")?,
                    None => Vec::new(),
                };
                Ok(self.new_tuple(items))
            }
            Global::Device => {
                let tag = match (args.first(), args.get(1)) {
                    (Some(Obj::Str(s)), None | Some(Obj::None)) => s.to_string(),
                    (Some(Obj::Str(s)), Some(Obj::Int(i))) => format!("{s}:{i}"),
                    _ => return Err(self.err("torch.device expects a string and an optional index")),
                };
                Ok(Obj::Str(Rc::from(tag)))
            }
            Global::CodecsEncode => match (args.first(), args.get(1)) {
                (Some(Obj::Str(s)), Some(Obj::Str(enc))) if enc.as_ref() == "latin1" || enc.as_ref() == "latin-1" => {
                    let bytes: Option<Vec<u8>> = s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
                    let bytes = bytes.ok_or_else(|| self.err("latin1 string with characters above U+00FF"))?;
                    Ok(Obj::Bytes(Rc::from(bytes)))
                }
                (Some(Obj::Str(s)), Some(Obj::Str(enc))) if enc.as_ref() == "utf-8" || enc.as_ref() == "utf8" => {
                    Ok(Obj::Bytes(Rc::from(s.as_bytes())))
                }
                _ => Err(self.err("_codecs.encode with unsupported arguments")),
            },
            Global::TensorType | Global::StorageType(_) | Global::TorchDtype(_) => {
                Err(self.err(format!("{g:?} cannot be called from a checkpoint")))
            }
        }
    }

    fn pairs_of(&mut self, src: &Obj) -> Result<Vec<Obj>> {
        let outer = self.tuple_items(src, "OrderedDict argument")?;
        let mut flat = Vec::with_capacity(outer.len() * 2);
        for p in &outer {
            let kv = self.tuple_items(p, "OrderedDict item")?;
            if kv.len() != 2 {
                return Err(self.err("OrderedDict items must be (key, value) pairs"));
            }
            flat.extend(kv);
        }
        Ok(flat)
    }

    fn tensor_spec(&self, o: &Obj) -> Result<TensorSpec> {
        match o {
            Obj::Ref(id) => match self.heap.get(*id) {
                Some(Container::Tensor(t)) => Ok(t.clone()),
                _ => Err(self.err("expected a tensor")),
            },
            _ => Err(self.err("expected a tensor")),
        }
    }

    fn dims(&mut self, o: &Obj, what: &str) -> Result<Vec<usize>> {
        let items = self.tuple_items(o, what)?;
        if items.len() > MAX_DIMS {
            return Err(IoError::LimitExceeded {
                what: format!("tensor {what} with {} dimensions", items.len()),
                limit: MAX_DIMS as u64,
            });
        }
        items
            .iter()
            .map(|x| match x {
                Obj::Int(i) => usize::try_from(*i).map_err(|_| self.err(format!("negative value in tensor {what}"))),
                _ => Err(self.err(format!("tensor {what} must hold integers"))),
            })
            .collect()
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])`.
    fn rebuild_tensor(&mut self, args: &[Obj]) -> Result<Obj> {
        if args.len() < 4 {
            return Err(self.err("_rebuild_tensor needs storage, offset, size and stride"));
        }
        let storage = match &args[0] {
            Obj::Ref(id) if matches!(self.heap.get(*id), Some(Container::Storage(_))) => *id,
            _ => return Err(self.err("_rebuild_tensor: first argument is not a storage")),
        };
        let offset = match args[1] {
            Obj::Int(i) => usize::try_from(i).map_err(|_| self.err("negative storage offset"))?,
            _ => return Err(self.err("storage offset must be an integer")),
        };
        let shape = self.dims(&args[2], "size")?;
        let strides = self.dims(&args[3], "stride")?;
        if shape.len() != strides.len() {
            return Err(self.err(format!("tensor size has {} dims but stride has {}", shape.len(), strides.len())));
        }
        let requires_grad = matches!(args.get(4), Some(Obj::Bool(true)));
        Ok(self.heap.alloc(Container::Tensor(TensorSpec { storage, offset, shape, strides, requires_grad })))
    }

    /// BINPERSID: `('storage', storage_type, key, location, numel[, view_metadata])`.
    fn persistent_load(&mut self, pid: &Obj) -> Result<Obj> {
        let items = self.tuple_items(pid, "persistent id")?;
        let bad = |m: &Self| m.err("persistent id is not ('storage', type, key, location, numel)");
        if items.len() < 5 || !matches!(&items[0], Obj::Str(s) if s.as_ref() == "storage") {
            return Err(bad(self));
        }
        let dtype = match &items[1] {
            Obj::Global(Global::StorageType(d)) => *d,
            _ => return Err(bad(self)),
        };
        let key = match &items[2] {
            Obj::Str(s) => s.to_string(),
            Obj::Int(i) => i.to_string(),
            _ => return Err(bad(self)),
        };
        let location = match &items[3] {
            Obj::Str(s) => s.to_string(),
            _ => return Err(bad(self)),
        };
        let numel = match items[4] {
            Obj::Int(n) => u64::try_from(n).map_err(|_| self.err("negative storage size"))?,
            _ => return Err(bad(self)),
        };
        let view = match items.get(5) {
            None | Some(Obj::None) => None,
            Some(v) => {
                let meta = self.tuple_items(v, "storage view metadata")?;
                match meta.as_slice() {
                    [_, Obj::Int(off), Obj::Int(len)] if *off >= 0 && *len >= 0 => Some((*off as u64, *len as u64)),
                    _ => return Err(self.err("malformed storage view metadata")),
                }
            }
        };
        Ok(self.heap.alloc(Container::Storage(StorageRef { key, dtype, location, numel, view })))
    }
}

/// Little-endian two's complement of any width, if it fits in an i64.
fn decode_long(b: &[u8]) -> Option<i64> {
    if b.is_empty() {
        return Some(0);
    }
    let negative = b[b.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xFF } else { 0x00 };
    if b.len() > 8 {
        if b[8..].iter().any(|&x| x != fill) {
            return None;
        }
        // The sign must also agree with bit 63 of the truncated value.
        if (b[7] & 0x80 != 0) != negative {
            return None;
        }
    }
    let mut a = [fill; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    Some(i64::from_le_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_decode_like_python() {
        assert_eq!(decode_long(&[]), Some(0));
        assert_eq!(decode_long(&[0xff]), Some(-1));
        assert_eq!(decode_long(&[0x80, 0x00]), Some(128));
        assert_eq!(decode_long(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x00]), Some(i64::MAX));
        assert_eq!(decode_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0x00]), None);
        assert_eq!(decode_long(&[0x01; 10]), None);
    }

    #[test]
    fn plain_values_and_memo_sharing() {
        // {'a': [1, 2.5, 'x'], 'b': <same list>} with the list memoised before it is filled.
        let mut p = vec![0x80, 2, b'}', b'q', 0, b'(', b'X', 1, 0, 0, 0, b'a', b']', b'q', 1, b'(', b'K', 1];
        p.push(b'G');
        p.extend_from_slice(&2.5f64.to_be_bytes());
        p.extend_from_slice(&[b'X', 1, 0, 0, 0, b'x', b'e', b'X', 1, 0, 0, 0, b'b', b'h', 1, b'u', b'.']);
        let prog = run(&p).unwrap();
        assert_eq!(prog.end, p.len());
        let Obj::Ref(root) = prog.root else { panic!() };
        let Some(Container::Dict(d)) = prog.heap.get(root) else { panic!() };
        assert_eq!(d.items.len(), 2);
        assert_eq!(d.items[0].1, d.items[1].1, "both keys refer to the same list");
        let Obj::Ref(l) = d.items[0].1 else { panic!() };
        assert_eq!(
            prog.heap.get(l),
            Some(&Container::List(vec![Obj::Int(1), Obj::Float(2.5), Obj::Str(Rc::from("x"))]))
        );
    }

    #[test]
    fn truncated_and_garbage_programs_fail_cleanly() {
        assert!(run(&[]).is_err());
        assert!(run(&[0x80, 2, b'X', 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(run(&[0x80, 2, 0x8d, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(run(b".").is_err());
        assert!(run(&[b'h', 7, b'.']).is_err());
        assert!(run(&[0xfe]).is_err());
        assert!(run(b"cposix\nsystem\n.").unwrap_err().to_string().contains("posix.system"));
    }

    #[test]
    fn deep_nesting_is_flat_to_drop() {
        // A million nested 1-tuples: building and dropping must not recurse.
        let mut p = vec![0x80, 2, b'N'];
        p.extend(std::iter::repeat_n(0x85u8, 1_000_000));
        p.push(b'.');
        let prog = run(&p).unwrap();
        assert_eq!(prog.heap.len(), 1_000_000);
    }
}
