//! A restricted unpickler: the opcodes `torch.save` writes for a state dict (pickle protocol 2,
//! its default, and protocols 3 to 5, which add FRAME, SHORT_BINUNICODE, MEMOIZE and
//! STACK_GLOBAL), a closed list of globals, and no object construction. Nothing in the pickle can
//! run code: a global is only ever one of the values below, and REDUCE only "calls" those by
//! building an inert description of what the call would return.
//!
//! Memory and time are linear in the pickle's length: values are shared through `Rc` (a memo
//! fetch copies nothing), nesting is limited to [`MAX_DEPTH`], and a dict or list cannot be
//! fetched from the memo (torch.save never shares one in a state dict), so a container is owned
//! by exactly one place and can be mutated in place with Python's semantics.

use std::collections::HashMap;
use std::rc::Rc;

use super::shown_text;
use crate::checkpoint::DType;

/// How deeply values may nest (a state dict needs about 5: dict, tensor, its argument tuple, the
/// hooks dict). Bounds the recursion of dropping a value.
pub(super) const MAX_DEPTH: u32 = 64;

/// The callables REDUCE accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Callable {
    /// `collections.OrderedDict`, called with no arguments.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
    /// backward_hooks[, metadata])`.
    RebuildTensorV2,
    /// `torch._utils._rebuild_parameter(data, requires_grad, backward_hooks)` (nn.Parameter).
    RebuildParameter,
}

impl Callable {
    fn name(self) -> &'static str {
        match self {
            Callable::OrderedDict => "collections.OrderedDict",
            Callable::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2",
            Callable::RebuildParameter => "torch._utils._rebuild_parameter",
        }
    }
}

/// A typed storage class such as `torch.FloatStorage`: it only says the dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StorageType {
    pub name: &'static str,
    pub dtype: DType,
}

/// The typed storages a checkpoint may name, and the crate's dtype for each.
pub(super) const STORAGE_TYPES: [StorageType; 10] = [
    StorageType {
        name: "FloatStorage",
        dtype: DType::F32,
    },
    StorageType {
        name: "HalfStorage",
        dtype: DType::F16,
    },
    StorageType {
        name: "BFloat16Storage",
        dtype: DType::BF16,
    },
    StorageType {
        name: "DoubleStorage",
        dtype: DType::F64,
    },
    StorageType {
        name: "LongStorage",
        dtype: DType::I64,
    },
    StorageType {
        name: "IntStorage",
        dtype: DType::I32,
    },
    StorageType {
        name: "ShortStorage",
        dtype: DType::I16,
    },
    StorageType {
        name: "CharStorage",
        dtype: DType::I8,
    },
    StorageType {
        name: "ByteStorage",
        dtype: DType::U8,
    },
    StorageType {
        name: "BoolStorage",
        dtype: DType::Bool,
    },
];

/// A storage the pickle refers to by persistent id: `('storage', type, key, location, numel)`.
/// Its bytes are the archive entry `data/<key>`.
#[derive(Debug)]
pub(super) struct Storage {
    pub ty: StorageType,
    pub key: Rc<str>,
    /// In elements of `ty.dtype`.
    pub numel: u64,
}

/// What a REDUCE of `_rebuild_tensor_v2` or `_rebuild_parameter` stands for: the call and its
/// arguments, checked when the tensor is built (where the state dict key is known).
#[derive(Debug)]
pub(super) struct TensorCall {
    pub callable: Callable,
    pub args: Rc<Seq>,
}

/// A tuple's or list's items.
#[derive(Debug, Default)]
pub(super) struct Seq {
    depth: u32,
    pub items: Vec<Value>,
}

/// A dict's items in insertion order (Python's dicts are ordered); a string key set again
/// replaces its value in place, as in Python.
#[derive(Debug, Default)]
pub(super) struct Dict {
    depth: u32,
    pub ordered: bool,
    pub items: Vec<(Value, Value)>,
    index: HashMap<Rc<str>, usize>,
}

#[derive(Debug)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Tuple(Rc<Seq>),
    List(Box<Seq>),
    Dict(Box<Dict>),
    Callable(Callable),
    StorageType(StorageType),
    Storage(Rc<Storage>),
    Tensor(Rc<TensorCall>),
}

impl Value {
    fn depth(&self) -> u32 {
        match self {
            Value::Tuple(s) => s.depth,
            Value::List(s) => s.depth,
            Value::Dict(d) => d.depth,
            Value::Tensor(t) => t.args.depth + 1,
            _ => 0,
        }
    }

    /// A second reference to the value, for the memo; `None` for a dict or list, which are
    /// never shared.
    fn share(&self) -> Option<Value> {
        Some(match self {
            Value::None => Value::None,
            Value::Bool(b) => Value::Bool(*b),
            Value::Int(i) => Value::Int(*i),
            Value::Float(f) => Value::Float(*f),
            Value::Str(s) => Value::Str(s.clone()),
            Value::Tuple(t) => Value::Tuple(t.clone()),
            Value::Callable(c) => Value::Callable(*c),
            Value::StorageType(t) => Value::StorageType(*t),
            Value::Storage(s) => Value::Storage(s.clone()),
            Value::Tensor(t) => Value::Tensor(t.clone()),
            Value::List(_) | Value::Dict(_) => return None,
        })
    }

    /// What the value is, for messages ("an int (5)", "a dict").
    pub fn describe(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(b) => format!("a bool ({})", if *b { "True" } else { "False" }),
            Value::Int(i) => format!("an int ({i})"),
            Value::Float(f) => format!("a float ({f})"),
            Value::Str(s) => format!("a string (`{}`)", shown_text(s)),
            Value::Tuple(t) => format!("a tuple of {} items", t.items.len()),
            Value::List(l) => format!("a list of {} items", l.items.len()),
            Value::Dict(d) if d.ordered => format!("an OrderedDict of {} items", d.items.len()),
            Value::Dict(d) => format!("a dict of {} items", d.items.len()),
            Value::Callable(c) => format!("the callable `{}`", c.name()),
            Value::StorageType(t) => format!("the storage type `torch.{}`", t.name),
            Value::Storage(_) => "a storage".into(),
            Value::Tensor(_) => "a tensor".into(),
        }
    }
}

/// Why a pickle is not loaded, and at which byte of it.
#[derive(Debug)]
pub(super) struct PickleError {
    pub at: usize,
    /// True for something well-formed this reader refuses (a global, an opcode); false for a
    /// malformed pickle.
    pub refused: bool,
    pub message: String,
}

fn opcode_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'M' => "BININT2",
        b'L' => "LONG",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8e => "BINBYTES8",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        b'N' => "NONE",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        b'V' => "UNICODE",
        0x8c => "SHORT_BINUNICODE",
        b'X' => "BINUNICODE",
        0x8d => "BINUNICODE8",
        b'F' => "FLOAT",
        b'G' => "BINFLOAT",
        b']' => "EMPTY_LIST",
        b'a' => "APPEND",
        b'e' => "APPENDS",
        b'l' => "LIST",
        b')' => "EMPTY_TUPLE",
        b't' => "TUPLE",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        b'}' => "EMPTY_DICT",
        b'd' => "DICT",
        b's' => "SETITEM",
        b'u' => "SETITEMS",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        b'0' => "POP",
        b'2' => "DUP",
        b'(' => "MARK",
        b'1' => "POP_MARK",
        b'g' => "GET",
        b'h' => "BINGET",
        b'j' => "LONG_BINGET",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        0x94 => "MEMOIZE",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x80 => "PROTO",
        b'.' => "STOP",
        0x95 => "FRAME",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        _ => return None,
    })
}

/// Where a memo entry points: a shareable value, or a dict or list that may not be fetched.
enum Memo {
    Value(Value),
    Container(String),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Where the opcode being run starts.
    at: usize,
    stack: Vec<Value>,
    /// Stack lengths at each MARK still open.
    marks: Vec<usize>,
    memo: HashMap<u64, Memo>,
}

/// Runs the pickle and returns the object STOP returns.
pub(super) fn load(data: &[u8]) -> Result<Value, PickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        m.at = m.pos;
        let op = m.byte()?;
        match op {
            0x80 => {
                let protocol = m.byte()?;
                if protocol > 5 {
                    return Err(m.refused(format!(
                        "pickle protocol {protocol} (this reader reads protocols 2 to 5)"
                    )));
                }
            }
            0x95 => {
                m.take(8)?;
            }
            b'.' => return m.pop(),
            b'(' => m.marks.push(m.stack.len()),
            b'}' => m.stack.push(Value::Dict(Box::default())),
            b']' => m.stack.push(Value::List(Box::default())),
            b')' => m.stack.push(Value::Tuple(Rc::default())),
            b't' => {
                let items = m.pop_mark()?;
                let tuple = m.tuple(items)?;
                m.stack.push(tuple);
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(m.pop()?);
                }
                items.reverse();
                let tuple = m.tuple(items)?;
                m.stack.push(tuple);
            }
            b'X' => {
                let n = m.u32()? as u64;
                let s = m.string(n)?;
                m.stack.push(s);
            }
            0x8c => {
                let n = u64::from(m.byte()?);
                let s = m.string(n)?;
                m.stack.push(s);
            }
            0x8d => {
                let n = m.u64()?;
                let s = m.string(n)?;
                m.stack.push(s);
            }
            b'J' => {
                let b = m.take(4)?;
                let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                m.stack.push(Value::Int(v.into()));
            }
            b'K' => {
                let v = m.byte()?;
                m.stack.push(Value::Int(v.into()));
            }
            b'M' => {
                let b = m.take(2)?;
                m.stack
                    .push(Value::Int(u16::from_le_bytes([b[0], b[1]]).into()));
            }
            0x8a => {
                let n = usize::from(m.byte()?);
                let b = m.take(n)?;
                let v = long(b).ok_or_else(|| {
                    m.malformed(format!("a LONG1 integer of {n} bytes does not fit 64 bits"))
                })?;
                m.stack.push(Value::Int(v));
            }
            0x88 => m.stack.push(Value::Bool(true)),
            0x89 => m.stack.push(Value::Bool(false)),
            b'N' => m.stack.push(Value::None),
            b'G' => {
                let b = m.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                m.stack.push(Value::Float(f64::from_be_bytes(a)));
            }
            b'c' => {
                let module = m.line()?;
                let name = m.line()?;
                let g = m.global(&module, &name)?;
                m.stack.push(g);
            }
            0x93 => {
                let name = m.pop()?;
                let module = m.pop()?;
                match (module, name) {
                    (Value::Str(module), Value::Str(name)) => {
                        let g = m.global(&module, &name)?;
                        m.stack.push(g);
                    }
                    (module, name) => {
                        return Err(m.malformed(format!(
                            "STACK_GLOBAL of {} and {}, not two strings",
                            module.describe(),
                            name.describe()
                        )))
                    }
                }
            }
            b'Q' => {
                let pid = m.pop()?;
                let storage = m.persistent(pid)?;
                m.stack.push(storage);
            }
            b'R' => {
                let args = m.pop()?;
                let callable = m.pop()?;
                let v = m.reduce(callable, args)?;
                m.stack.push(v);
            }
            b'b' => {
                let state = m.pop()?;
                m.build(state)?;
            }
            b's' => {
                let value = m.pop()?;
                let key = m.pop()?;
                m.set_items(vec![key, value])?;
            }
            b'u' => {
                let items = m.pop_mark()?;
                m.set_items(items)?;
            }
            b'a' => {
                let value = m.pop()?;
                m.append(vec![value])?;
            }
            b'e' => {
                let items = m.pop_mark()?;
                m.append(items)?;
            }
            b'q' => {
                let i = u64::from(m.byte()?);
                m.put(i)?;
            }
            b'r' => {
                let i = u64::from(m.u32()?);
                m.put(i)?;
            }
            0x94 => {
                let i = m.memo.len() as u64;
                m.put(i)?;
            }
            b'h' => {
                let i = u64::from(m.byte()?);
                m.get(i)?;
            }
            b'j' => {
                let i = u64::from(m.u32()?);
                m.get(i)?;
            }
            other => {
                return Err(match opcode_name(other) {
                    Some(name @ ("NEWOBJ" | "NEWOBJ_EX" | "INST" | "OBJ")) => m.refused(format!(
                        "pickle opcode {name} creates an object of an arbitrary class; refusing \
                         to load a checkpoint that runs code"
                    )),
                    Some(name @ ("EXT1" | "EXT2" | "EXT4")) => m.refused(format!(
                        "pickle opcode {name} imports a registered extension; refusing to load a \
                         checkpoint that runs code"
                    )),
                    Some(name) => m.refused(format!(
                        "pickle opcode {name} (0x{other:02x}) is not one torch.save writes for \
                         a state dict"
                    )),
                    None => m.malformed(format!("0x{other:02x} is not a pickle opcode")),
                })
            }
        }
    }
}

/// A little-endian two's complement integer of any length (LONG1), if it fits 64 bits.
fn long(b: &[u8]) -> Option<i64> {
    if b.is_empty() {
        return Some(0);
    }
    let negative = b[b.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    let mut a = [fill; 8];
    for (i, &byte) in b.iter().enumerate() {
        if i < 8 {
            a[i] = byte;
        } else if byte != fill {
            return None;
        }
    }
    let v = i64::from_le_bytes(a);
    // Beyond 8 bytes, the sign of the 64-bit value must be the sign of the whole.
    if b.len() > 8 && (v < 0) != negative {
        return None;
    }
    Some(v)
}

impl<'a> Machine<'a> {
    fn malformed(&self, message: impl Into<String>) -> PickleError {
        PickleError {
            at: self.at,
            refused: false,
            message: message.into(),
        }
    }

    fn refused(&self, message: impl Into<String>) -> PickleError {
        PickleError {
            at: self.at,
            refused: true,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| self.malformed("the pickle ends in the middle of an opcode"))?;
        let data: &'a [u8] = self.data;
        self.pos = end;
        Ok(&data[end - n..end])
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        if self.pos >= self.data.len() {
            return Err(self.malformed("the pickle ends without a STOP opcode: truncated"));
        }
        let b = self.data[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, n: u64) -> Result<Value, PickleError> {
        let n =
            usize::try_from(n).map_err(|_| self.malformed("a string longer than the pickle"))?;
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Value::Str(Rc::from(s))),
            Err(_) => Err(self.malformed("a string that is not valid UTF-8")),
        }
    }

    /// A newline-terminated line (GLOBAL's module and name).
    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.malformed("GLOBAL without a newline-terminated name"))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| self.malformed("a GLOBAL name that is not valid UTF-8"))?
            .to_string();
        self.pos += n + 1;
        Ok(s)
    }

    /// The length of the stack above the innermost open MARK, which no opcode but the ones that
    /// end the mark may reach below.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed("stack underflow"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("stack underflow"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed("an opcode that needs a MARK, and there is none"))?;
        if mark > self.stack.len() {
            return Err(self.malformed("stack underflow"));
        }
        Ok(self.stack.split_off(mark))
    }

    fn top(&mut self) -> Result<&mut Value, PickleError> {
        if self.stack.len() <= self.floor() {
            return Err(self.malformed("stack underflow"));
        }
        let err = self.malformed("stack underflow");
        self.stack.last_mut().ok_or(err)
    }

    fn too_deep(&self) -> PickleError {
        self.refused(format!(
            "values nested more than {MAX_DEPTH} deep; a state dict is not"
        ))
    }

    fn tuple(&self, items: Vec<Value>) -> Result<Value, PickleError> {
        let depth = 1 + items.iter().map(Value::depth).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(self.too_deep());
        }
        Ok(Value::Tuple(Rc::new(Seq { depth, items })))
    }

    fn global(&self, module: &str, name: &str) -> Result<Value, PickleError> {
        Ok(match (module, name) {
            ("collections", "OrderedDict") => Value::Callable(Callable::OrderedDict),
            ("torch._utils", "_rebuild_tensor_v2") => Value::Callable(Callable::RebuildTensorV2),
            ("torch._utils", "_rebuild_parameter") => Value::Callable(Callable::RebuildParameter),
            ("torch", name) => match STORAGE_TYPES.iter().find(|t| t.name == name) {
                Some(t) => Value::StorageType(*t),
                None if name.ends_with("Storage") => {
                    return Err(self.refused(format!(
                        "pickle global `torch.{}`: a storage of a dtype this reader does not \
                         read (it reads {})",
                        shown_text(name),
                        STORAGE_TYPES.map(|t| t.name).join(", ")
                    )))
                }
                None => return Err(self.not_a_tensor(module, name)),
            },
            _ => return Err(self.not_a_tensor(module, name)),
        })
    }

    fn not_a_tensor(&self, module: &str, name: &str) -> PickleError {
        self.refused(format!(
            "pickle global `{}.{}` is not a tensor; refusing to load a checkpoint that runs code",
            shown_text(module),
            shown_text(name)
        ))
    }

    /// BINPERSID: `('storage', storage type, key, location, numel)`.
    fn persistent(&self, pid: Value) -> Result<Value, PickleError> {
        let bad = |what: String| {
            self.malformed(format!(
                "a persistent id that is {what}, not ('storage', storage type, key, location, \
                 numel)"
            ))
        };
        let Value::Tuple(t) = &pid else {
            return Err(bad(pid.describe()));
        };
        match t.items.as_slice() {
            [Value::Str(tag), Value::StorageType(ty), Value::Str(key), Value::Str(_location), Value::Int(numel)]
                if &**tag == "storage" =>
            {
                let numel = u64::try_from(*numel).map_err(|_| {
                    self.malformed(format!(
                        "storage `{}` has {numel} elements",
                        shown_text(key)
                    ))
                })?;
                Ok(Value::Storage(Rc::new(Storage {
                    ty: *ty,
                    key: key.clone(),
                    numel,
                })))
            }
            [Value::Str(tag), ..] if &**tag != "storage" => Err(self.refused(format!(
                "a persistent id of kind `{}`; torch.save writes only `storage`",
                shown_text(tag)
            ))),
            items => Err(bad(format!("({})", super::described(items)))),
        }
    }

    fn reduce(&self, callable: Value, args: Value) -> Result<Value, PickleError> {
        let Value::Tuple(args) = args else {
            return Err(self.malformed(format!(
                "REDUCE with arguments that are {}, not a tuple",
                args.describe()
            )));
        };
        match callable {
            Value::Callable(Callable::OrderedDict) => {
                if !args.items.is_empty() {
                    return Err(self.refused(
                        "collections.OrderedDict called with arguments; torch.save calls it with \
                         none",
                    ));
                }
                Ok(Value::Dict(Box::new(Dict {
                    ordered: true,
                    ..Dict::default()
                })))
            }
            Value::Callable(callable) => {
                if args.depth + 1 > MAX_DEPTH {
                    return Err(self.too_deep());
                }
                Ok(Value::Tensor(Rc::new(TensorCall { callable, args })))
            }
            other => Err(self.refused(format!(
                "REDUCE of {}: only collections.OrderedDict, torch._utils._rebuild_tensor_v2 and \
                 torch._utils._rebuild_parameter are called",
                other.describe()
            ))),
        }
    }

    /// BUILD is accepted only on an OrderedDict with a dict of attributes (a module's
    /// `state_dict()` carries `_metadata`, the modules' version numbers): they are discarded.
    fn build(&mut self, state: Value) -> Result<(), PickleError> {
        let target = match self.top()? {
            Value::Dict(d) if d.ordered => None,
            other => Some(other.describe()),
        };
        if let Some(target) = target {
            return Err(self.refused(format!(
                "pickle opcode BUILD on {target}: only an OrderedDict's attributes (a state \
                 dict's `_metadata`) are set by BUILD; refusing to load a checkpoint that runs \
                 code"
            )));
        }
        match &state {
            Value::Dict(d) if d.items.iter().all(|(k, _)| matches!(k, Value::Str(_))) => Ok(()),
            other => Err(self.refused(format!(
                "pickle opcode BUILD with {} as an OrderedDict's state; only a dict of attributes \
                 is accepted",
                other.describe()
            ))),
        }
    }

    /// The dict or list on top of the stack, for SETITEM(S) or APPEND(S).
    fn target(&mut self, op: &str) -> Result<&mut Value, PickleError> {
        let at = self.at;
        if self.stack.len() <= self.floor() {
            return Err(self.malformed("stack underflow"));
        }
        match self.stack.last_mut() {
            Some(v) if matches!(v, Value::Dict(_) | Value::List(_)) => Ok(v),
            Some(other) => Err(PickleError {
                at,
                refused: false,
                message: format!("{op} on {}", other.describe()),
            }),
            None => Err(PickleError {
                at,
                refused: false,
                message: "stack underflow".into(),
            }),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("SETITEMS with an odd number of items"));
        }
        let too_deep = self.too_deep();
        let unhashable = self.malformed("a dict key that is a dict or list (unhashable)");
        let not_dict = self.malformed("SETITEM on a list");
        let Value::Dict(dict) = self.target("SETITEM")? else {
            return Err(not_dict);
        };
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            let depth = 1 + key.depth().max(value.depth());
            if depth > MAX_DEPTH {
                return Err(too_deep);
            }
            dict.depth = dict.depth.max(depth);
            match &key {
                Value::Str(s) => {
                    if let Some(&i) = dict.index.get(s) {
                        dict.items[i].1 = value;
                    } else {
                        dict.index.insert(s.clone(), dict.items.len());
                        dict.items.push((key, value));
                    }
                }
                Value::List(_) | Value::Dict(_) => return Err(unhashable),
                // Other keys are kept as they come: a state dict has string keys only, and
                // refuses any other.
                _ => dict.items.push((key, value)),
            }
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let too_deep = self.too_deep();
        let not_list = self.malformed("APPEND on a dict");
        let Value::List(list) = self.target("APPEND")? else {
            return Err(not_list);
        };
        for item in items {
            let depth = 1 + item.depth();
            if depth > MAX_DEPTH {
                return Err(too_deep);
            }
            list.depth = list.depth.max(depth);
            list.items.push(item);
        }
        Ok(())
    }

    fn put(&mut self, i: u64) -> Result<(), PickleError> {
        let v = self.top()?;
        let entry = match v.share() {
            Some(shared) => Memo::Value(shared),
            None => Memo::Container(v.describe()),
        };
        self.memo.insert(i, entry);
        Ok(())
    }

    fn get(&mut self, i: u64) -> Result<(), PickleError> {
        let v = match self.memo.get(&i) {
            Some(Memo::Value(v)) => v.share(),
            Some(Memo::Container(what)) => {
                return Err(self.refused(format!(
                    "a second reference to {what} (memo {i}); a state dict shares no dict or list"
                )))
            }
            None => None,
        };
        let v = v.ok_or_else(|| self.malformed(format!("memo {i} is read before it is set")))?;
        self.stack.push(v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pickle: &[u8]) -> Result<Value, PickleError> {
        load(pickle)
    }

    #[test]
    fn long1_fits_64_bits_or_is_refused() {
        assert_eq!(long(&[]), Some(0));
        assert_eq!(long(&[0xff]), Some(-1));
        assert_eq!(long(&[0x00, 0x80]), Some(-32768));
        assert_eq!(long(&[0x80, 0x00]), Some(128));
        assert_eq!(long(&[0xff; 9]), Some(-1));
        assert_eq!(long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0x00]), None);
        assert_eq!(long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff]), Some(i64::MIN));
        assert_eq!(long(&[1, 0, 0, 0, 0, 0, 0, 0, 1]), None);
    }

    #[test]
    fn a_string_key_set_twice_keeps_its_place_and_takes_the_new_value() {
        let v = run(
            b"\x80\x02}(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00bK\x02X\x01\x00\x00\x00aK\x03u.",
        )
        .unwrap();
        let Value::Dict(d) = v else { panic!() };
        let items: Vec<_> = d
            .items
            .iter()
            .map(|(k, v)| match (k, v) {
                (Value::Str(k), Value::Int(v)) => (k.to_string(), *v),
                _ => panic!(),
            })
            .collect();
        assert_eq!(items, [("a".to_string(), 3), ("b".to_string(), 2)]);
    }

    #[test]
    fn opcodes_outside_the_list_are_refused_by_name() {
        for (pickle, name) in [
            (&b"\x80\x02}\x81."[..], "NEWOBJ"),
            (b"\x80\x02(i\n", "INST"),
            (b"\x80\x02(o.", "OBJ"),
            (b"\x80\x02K\x010.", "POP"),
            (b"\x80\x02K\x012.", "DUP"),
            (b"\x80\x02\x82\x01.", "EXT1"),
            (b"\x80\x02C\x01x.", "SHORT_BINBYTES"),
            (b"\x80\x02]K\x01b.", "BUILD"),
        ] {
            let e = run(pickle).unwrap_err();
            assert!(e.message.contains(name), "{name}: {}", e.message);
        }
    }

    #[test]
    fn a_mark_hides_what_is_below_it() {
        // REDUCE right after a MARK would reach below it: an underflow, as in Python.
        let e = run(b"\x80\x02ccollections\nOrderedDict\n)(R.").unwrap_err();
        assert!(e.message.contains("underflow"), "{}", e.message);
    }

    #[test]
    fn nesting_is_bounded() {
        let mut p = b"\x80\x02".to_vec();
        p.extend(std::iter::repeat_n(b'(', 100));
        p.extend(std::iter::repeat_n(b't', 100));
        p.push(b'.');
        let e = run(&p).unwrap_err();
        assert!(e.message.contains("nested"), "{}", e.message);
        // A long flat tuple is fine.
        let mut p = b"\x80\x02(".to_vec();
        p.extend(std::iter::repeat_n(b"K\x01".as_slice(), 10_000).flatten());
        p.extend(b"t.");
        assert!(matches!(run(&p).unwrap(), Value::Tuple(t) if t.items.len() == 10_000));
    }

    #[test]
    fn a_memoized_dict_is_not_fetched() {
        let e = run(b"\x80\x02}q\x00h\x00.").unwrap_err();
        assert!(e.message.contains("second reference"), "{}", e.message);
        assert!(e.refused);
    }
}
