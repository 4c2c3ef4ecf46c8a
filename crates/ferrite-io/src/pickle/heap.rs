//! The unpickler's object heap.
//!
//! Pickle programs share and mutate objects (a dict is memoised empty, then filled; a key string is
//! memoised once and reused), so the machine needs reference semantics. Containers live in one
//! arena and are referred to by index: sharing and mutation behave exactly as in Python, cycles
//! cost nothing, and dropping the heap is a flat loop — a hostile file nesting a million tuples
//! cannot overflow the stack when it is freed.

use std::collections::HashMap;
use std::rc::Rc;

use ferrite_tensor::DType;

/// A value on the machine's stack or inside a container. Cheap to clone (no deep copies).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Obj {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    /// A container in the arena.
    Ref(usize),
    /// An allowed global (class or function) — never a real import.
    Global(Global),
}

/// The globals a weights-only checkpoint may name. Anything else is refused when the pickle names
/// it (see `allowed_globals`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Global {
    OrderedDict,
    RebuildTensor,
    RebuildTensorV2,
    RebuildParameter,
    RebuildParameterWithState,
    RebuildFromTypeV2,
    /// `torch.Tensor` or `torch.nn.parameter.Parameter` as a type argument.
    TensorType,
    /// A typed storage class (`torch.FloatStorage`, …); `Err(name)` for element types ferrite lacks.
    StorageType(Result<DType, &'static str>),
    Size,
    Device,
    /// A dtype object such as `torch.float32`, kept by name.
    TorchDtype(&'static str),
    CodecsEncode,
    Set,
}

/// A storage a tensor views: the file's storage key plus the slice of it (legacy files can
/// describe storages that are views of other storages).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StorageRef {
    pub key: String,
    pub dtype: Result<DType, &'static str>,
    pub location: String,
    /// Number of elements the pickle says the (root) storage has.
    pub numel: u64,
    /// For legacy storage views: offset (elements) and length (elements) into the root storage.
    pub view: Option<(u64, u64)>,
}

/// A tensor the pickle rebuilt: layout plus a reference to its storage.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorSpec {
    pub storage: usize,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub requires_grad: bool,
}

/// A heap cell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Container {
    Tuple(Vec<Obj>),
    List(Vec<Obj>),
    Dict(DictObj),
    Set(Vec<Obj>),
    Storage(StorageRef),
    Tensor(TensorSpec),
}

/// An insertion-ordered dict with Python's "replace on equal key" semantics.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DictObj {
    pub items: Vec<(Obj, Obj)>,
    index: HashMap<HashKey, usize>,
}

/// The hashable image of a key (Python only allows hashable keys too).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum HashKey {
    None,
    Int(i64),
    Float(u64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Vec<HashKey>),
    Global(String),
}

impl DictObj {
    pub fn insert(&mut self, key: HashKey, k: Obj, v: Obj) {
        match self.index.get(&key) {
            Some(&i) => self.items[i].1 = v,
            None => {
                self.index.insert(key, self.items.len());
                self.items.push((k, v));
            }
        }
    }
}

/// The arena. Containers are only ever appended; an `Obj::Ref` stays valid for the whole run.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    cells: Vec<Container>,
}

impl Heap {
    pub fn alloc(&mut self, c: Container) -> Obj {
        self.cells.push(c);
        Obj::Ref(self.cells.len() - 1)
    }

    pub fn get(&self, id: usize) -> Option<&Container> {
        self.cells.get(id)
    }

    pub fn get_mut(&mut self, id: usize) -> Option<&mut Container> {
        self.cells.get_mut(id)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Every storage reference the program created, with its heap id.
    pub fn storages(&self) -> impl Iterator<Item = (usize, &StorageRef)> {
        self.cells.iter().enumerate().filter_map(|(i, c)| match c {
            Container::Storage(s) => Some((i, s)),
            _ => None,
        })
    }

    /// The hash key of `obj`, or `None` if Python would call it unhashable. `depth` bounds
    /// recursion through nested tuples.
    pub fn hash_key(&self, obj: &Obj, depth: usize) -> Option<HashKey> {
        if depth > 32 {
            return None;
        }
        Some(match obj {
            Obj::None => HashKey::None,
            // Python: True == 1 and hash(True) == hash(1).
            Obj::Bool(b) => HashKey::Int(*b as i64),
            Obj::Int(i) => HashKey::Int(*i),
            Obj::Float(f) => {
                if f.fract() == 0.0 && f.abs() < 9.0e18 {
                    HashKey::Int(*f as i64)
                } else {
                    HashKey::Float(f.to_bits())
                }
            }
            Obj::Str(s) => HashKey::Str(s.clone()),
            Obj::Bytes(b) => HashKey::Bytes(b.clone()),
            Obj::Global(g) => HashKey::Global(format!("{g:?}")),
            Obj::Ref(id) => match self.cells.get(*id)? {
                Container::Tuple(items) => {
                    HashKey::Tuple(items.iter().map(|o| self.hash_key(o, depth + 1)).collect::<Option<Vec<_>>>()?)
                }
                _ => return None,
            },
        })
    }
}
