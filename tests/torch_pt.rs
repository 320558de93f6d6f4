//! The PyTorch checkpoint reader (`checkpoint::torch_pt`) against files written by torch.save
//! itself (tests/fixtures/torch: every value, dtype and shape recorded by torch), the refusals,
//! each named, and robustness: every truncation and thousands of seeded corruptions of a real
//! checkpoint answer with a result or an error, never a panic.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oasr_quantize::checkpoint::{torch_pt, DType, Tensor};
use oasr_quantize::Error;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch")
        .join(name)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The crate's dtype for torch's name of it.
fn dtype(torch: &str) -> DType {
    match torch {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float64" => DType::F64,
        "int64" => DType::I64,
        "int32" => DType::I32,
        "int16" => DType::I16,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "bool" => DType::Bool,
        other => panic!("dtype {other}"),
    }
}

/// A value as the fixture JSON records it and as it is compared: floats widened to f64 (compared
/// bit for bit), integers and bools as i64.
#[derive(Debug, PartialEq)]
enum V {
    F(u64),
    I(i64),
}

fn values(t: &Tensor) -> Vec<V> {
    let b = t.bytes();
    let f = |v: f64| V::F(v.to_bits());
    match t.dtype {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f(f32::from_le_bytes(c.try_into().unwrap()).into()))
            .collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| f(half::f16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| f(half::bf16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::F64 => b
            .chunks_exact(8)
            .map(|c| f(f64::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| V::I(i64::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DType::I32 => b
            .chunks_exact(4)
            .map(|c| V::I(i32::from_le_bytes(c.try_into().unwrap()).into()))
            .collect(),
        DType::U8 | DType::Bool => b.iter().map(|&v| V::I(v.into())).collect(),
        other => panic!("dtype {other}"),
    }
}

/// The number literals of a JSON text, in order, as written (skipping strings): parsed by Rust's
/// correctly rounded `str::parse`, not by serde_json's best-effort float parser.
fn number_literals(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        if b[i] == b'"' {
            i += 1;
            while b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i] == b'-' || b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b"+-.".contains(&b[i])) {
                i += 1;
            }
            out.push(&text[start..i]);
        } else {
            i += 1;
        }
    }
    out
}

/// The tensors a fixture JSON (written by make_pt.py from torch's own tensors) records: dtype,
/// shape, values, by name.
fn expected(json: &str) -> BTreeMap<String, (DType, Vec<usize>, Vec<V>)> {
    let text = std::fs::read_to_string(fixture(json)).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    // serde_json keeps the document order, so the literals line up with the numbers in it.
    let mut literals = number_literals(&text).into_iter();
    let mut out = BTreeMap::new();
    for (name, t) in doc["tensors"].as_object().unwrap() {
        let dtype = dtype(t["dtype"].as_str().unwrap());
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|_| literals.next().unwrap().parse().unwrap())
            .collect();
        let vals = t["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|_| {
                let lit = literals.next().unwrap();
                if dtype.is_float() {
                    V::F(lit.parse::<f64>().unwrap().to_bits())
                } else {
                    V::I(lit.parse().unwrap())
                }
            })
            .collect();
        out.insert(name.clone(), (dtype, shape, vals));
    }
    assert!(literals.next().is_none());
    out
}

fn assert_matches(tensors: &BTreeMap<String, Tensor>, json: &str) {
    let expected = expected(json);
    assert_eq!(
        tensors.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (name, (dtype, shape, vals)) in &expected {
        let t = &tensors[name];
        assert_eq!((t.dtype, &t.shape), (*dtype, shape), "{name}");
        assert_eq!(
            t.bytes().len(),
            shape.iter().product::<usize>() * dtype.size(),
            "{name}"
        );
        assert_eq!(&values(t), vals, "{name}");
    }
}

/// Where `b`'s bytes start relative to `a`'s, if both are views into one buffer.
fn distance(a: &Tensor, b: &Tensor) -> isize {
    b.bytes().as_ptr() as isize - a.bytes().as_ptr() as isize
}

#[test]
fn plain_pt_gives_exactly_the_tensors_torch_recorded() {
    let tensors = torch_pt::read(&fixture("plain.pt")).unwrap();
    assert_matches(&tensors, "plain.json");
    // Every dtype torch wrote, with the crate's dtype for each.
    let dtypes: Vec<DType> = ["a.weight", "h", "bf", "d", "i", "i32", "u8", "flag"]
        .iter()
        .map(|n| tensors[*n].dtype)
        .collect();
    use DType::*;
    assert_eq!(dtypes, [F32, F16, BF16, F64, I64, I32, U8, Bool]);
    // The transposed view is a contiguous copy [4, 3] of the [3, 4] storage.
    assert_eq!(tensors["t"].shape, [4, 3]);
    assert_eq!(tensors["t"].to_f32()[..4], [100.0, 104.0, 108.0, 101.0]);
    // Two slices of one storage are views into it, three elements apart: no copy.
    assert_eq!(distance(&tensors["shared_a"], &tensors["shared_b"]), 12);
    // The 0-d scalars and the empty tensor.
    assert_eq!(tensors["scalar"].shape, Vec::<usize>::new());
    assert_eq!(tensors["scalar"].to_f32(), [4.5]);
    assert_eq!(
        tensors["norm.num_batches_tracked"].shape,
        Vec::<usize>::new()
    );
    assert_eq!(
        (
            tensors["empty"].shape.clone(),
            tensors["empty"].bytes().len()
        ),
        (vec![0, 3], 0)
    );
}

#[test]
fn a_module_state_dict_saved_on_the_gpu_reads() {
    // `torch.save(model.state_dict())` of a model on the GPU, as WeNet's final.pt is: storage
    // location `cuda:0`, the `_metadata` attribute (BUILD), BatchNorm's int64 counter, and a tied
    // weight (two keys, one storage).
    let tensors = torch_pt::read(&fixture("module.pt")).unwrap();
    assert_matches(&tensors, "module.json");
    assert_eq!(
        distance(&tensors["embed.weight"], &tensors["out.weight"]),
        0
    );
    let count = &tensors["norm.num_batches_tracked"];
    assert_eq!((count.dtype, values(count)), (DType::I64, vec![V::I(17)]));
}

#[test]
fn pickle_protocol_4_reads() {
    // `torch.save(..., pickle_protocol=4)`: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL.
    let tensors = torch_pt::read(&fixture("module_p4.pt")).unwrap();
    assert_matches(&tensors, "module.json");
}

#[test]
fn an_nn_parameter_reads() {
    let tensors = torch_pt::read(&fixture("parameter.pt")).unwrap();
    assert_eq!(tensors.len(), 1);
    let p = &tensors["p"];
    assert_eq!((p.dtype, p.shape.clone()), (DType::F32, vec![2, 2]));
    assert_eq!(p.to_f32(), [0.75; 4]);
}

/// The message of an error, checked to name the file.
fn message(e: Error, file: &str) -> String {
    let text = e.to_string();
    assert!(text.contains(file), "{text}");
    text
}

fn refusal(path: &Path) -> String {
    let e = torch_pt::read(path).unwrap_err();
    message(e, &path.file_name().unwrap().to_string_lossy())
}

#[test]
fn a_nested_checkpoint_is_refused_naming_the_key() {
    let e = torch_pt::read(&fixture("nested.pt")).unwrap_err();
    assert!(
        matches!(&e, Error::Tensor { name, message, .. } if name == "model" && message.contains("not a flat state dict")),
        "{e}"
    );
    message(e, "nested.pt");
}

#[test]
fn a_non_tensor_value_is_refused_naming_the_key() {
    let e = torch_pt::read(&fixture("non_tensor.pt")).unwrap_err();
    assert!(
        matches!(&e, Error::Tensor { name, message, .. } if name == "step" && message.contains("an int (5), not a tensor")),
        "{e}"
    );
}

#[test]
fn a_global_that_runs_code_is_refused_by_name() {
    let e = torch_pt::read(&fixture("evil.pt")).unwrap_err();
    assert!(matches!(e, Error::UnknownFormat { .. }), "{e}");
    let text = message(e, "evil.pt");
    assert!(
        text.contains(
            "pickle global `posix.system` is not a tensor; refusing to load a checkpoint that runs code"
        ),
        "{text}"
    );
}

#[test]
fn the_legacy_format_is_refused_by_name() {
    let text = refusal(&fixture("legacy.pt"));
    assert!(
        text.contains("the legacy PyTorch serialization format (torch < 1.6); re-save it with torch.save in a current PyTorch"),
        "{text}"
    );
}

/// plain.pt's records, to build variants of it.
fn plain_entries() -> Vec<(String, Vec<u8>)> {
    common::zip_entries(&std::fs::read(fixture("plain.pt")).unwrap())
}

fn with(entries: &[(String, Vec<u8>)], name: &str, data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> =
        entries.iter().filter(|(n, _)| n != name).cloned().collect();
    out.push((name.to_string(), data.to_vec()));
    out
}

#[test]
fn the_zip_writer_of_the_tests_round_trips_a_real_checkpoint() {
    // Re-zipping plain.pt's records (plainly, and with every size and offset in ZIP64 fields)
    // gives the same tensors: the variants below differ from a real file only where they mean to.
    let tmp = tempfile::tempdir().unwrap();
    let want = torch_pt::read(&fixture("plain.pt")).unwrap();
    for zip64 in [false, true] {
        let path = write(
            tmp.path(),
            "final.pt",
            &common::zip_stored(&plain_entries(), zip64),
        );
        let got = torch_pt::read(&path).unwrap();
        assert_eq!(got.len(), want.len());
        for (name, t) in &want {
            assert_eq!(
                (got[name].dtype, &got[name].shape),
                (t.dtype, &t.shape),
                "{name}"
            );
            assert_eq!(got[name].bytes(), t.bytes(), "{name} (zip64 {zip64})");
        }
    }
}

#[test]
fn archive_level_refusals_name_what_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let entries = plain_entries();
    let case = |entries: &[(String, Vec<u8>)]| {
        refusal(&write(
            tmp.path(),
            "final.pt",
            &common::zip_stored(entries, false),
        ))
    };
    let big = case(&with(&entries, "plain/byteorder", b"big"));
    assert!(big.contains("big-endian"), "{big}");
    let odd = case(&with(&entries, "plain/byteorder", b"middle"));
    assert!(odd.contains("`plain/byteorder` is `middle`"), "{odd}");
    let no_pickle: Vec<_> = entries
        .iter()
        .filter(|(n, _)| n != "plain/data.pkl")
        .cloned()
        .collect();
    let missing = case(&no_pickle);
    assert!(missing.contains("no `plain/data.pkl`"), "{missing}");
    let script = case(&with(&entries, "plain/constants.pkl", b"\x80\x02)."));
    assert!(script.contains("TorchScript"), "{script}");
    let mut twice = entries.clone();
    twice.push(entries[0].clone());
    let dup = case(&twice);
    assert!(
        dup.contains("two entries are named `plain/data.pkl`"),
        "{dup}"
    );
    let mut flat = entries.clone();
    flat.insert(0, ("data.pkl".into(), b"\x80\x02}.".to_vec()));
    let flat = case(&flat);
    assert!(flat.contains("`data.pkl` is not in a folder"), "{flat}");
    let empty = refusal(&write(
        tmp.path(),
        "final.pt",
        &common::zip_stored(&[], false),
    ));
    assert!(empty.contains("empty zip archive"), "{empty}");
    let none = refusal(&write(tmp.path(), "final.pt", b"hello, world"));
    assert!(
        none.contains("not the zip archive torch.save writes"),
        "{none}"
    );
    let bare = refusal(&write(tmp.path(), "final.pt", b"\x80\x02}."));
    assert!(bare.contains("a bare pickle"), "{bare}");

    // A compressed entry, an encrypted one: refused naming the entry.
    for (flags, method, what) in [
        (0x0800, 8, "compressed (method 8 (deflate))"),
        (0x0801, 0, "encrypted"),
    ] {
        let mut zip = common::zip_stored(&entries, false);
        common::zip_set_entry_header(&mut zip, "plain/data/0", flags, method);
        let text = refusal(&write(tmp.path(), "final.pt", &zip));
        assert!(
            text.contains(&format!("entry `plain/data/0` is {what}")),
            "{text}"
        );
    }
}

// Pickles written by hand (the opcodes torch.save uses) around plain.pt's storages:
// `plain/data/0` is a FloatStorage of 12 elements (a.weight, 48 bytes).

fn unicode(s: &str) -> Vec<u8> {
    let mut out = vec![b'X'];
    out.extend((s.len() as u32).to_le_bytes());
    out.extend(s.as_bytes());
    out
}

fn int(v: i64) -> Vec<u8> {
    let mut out = vec![0x8a, 8];
    out.extend(v.to_le_bytes());
    out
}

fn global(module: &str, name: &str) -> Vec<u8> {
    format!("c{module}\n{name}\n").into_bytes()
}

fn tuple(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![b'('];
    out.extend(items.concat());
    out.push(b't');
    out
}

fn ordered_dict() -> Vec<u8> {
    [global("collections", "OrderedDict"), b")R".to_vec()].concat()
}

struct View<'a> {
    storage: &'a str,
    key: &'a str,
    numel: i64,
    offset: i64,
    size: &'a [i64],
    stride: &'a [i64],
}

const A_WEIGHT: View = View {
    storage: "FloatStorage",
    key: "0",
    numel: 12,
    offset: 0,
    size: &[3, 4],
    stride: &[4, 1],
};

/// `_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())` plus `extra`
/// arguments.
fn tensor_with(v: &View, extra: &[Vec<u8>]) -> Vec<u8> {
    let pid = tuple(&[
        unicode("storage"),
        global("torch", v.storage),
        unicode(v.key),
        unicode("cpu"),
        int(v.numel),
    ]);
    let size: Vec<Vec<u8>> = v.size.iter().map(|&d| int(d)).collect();
    let stride: Vec<Vec<u8>> = v.stride.iter().map(|&d| int(d)).collect();
    let mut args = vec![
        [pid, b"Q".to_vec()].concat(),
        int(v.offset),
        tuple(&size),
        tuple(&stride),
        vec![0x89],
        ordered_dict(),
    ];
    args.extend(extra.iter().cloned());
    [
        global("torch._utils", "_rebuild_tensor_v2"),
        tuple(&args),
        b"R".to_vec(),
    ]
    .concat()
}

fn tensor(v: &View) -> Vec<u8> {
    tensor_with(v, &[])
}

/// A pickle of an OrderedDict of `items` (key opcodes, value opcodes).
fn state_dict(items: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"\x80\x02".to_vec();
    out.extend(ordered_dict());
    out.push(b'(');
    for (k, v) in items {
        out.extend(k);
        out.extend(v);
    }
    out.extend(b"u.");
    out
}

/// Reads plain.pt's archive with `pickle` as its data.pkl.
fn read_with_pickle(dir: &Path, pickle: &[u8]) -> Result<BTreeMap<String, Tensor>, Error> {
    let zip = common::zip_stored(&with(&plain_entries(), "plain/data.pkl", pickle), false);
    torch_pt::read(&write(dir, "final.pt", &zip))
}

/// The error of a pickle, checked to name the file, and whether it is refused for `key`.
fn pickle_error(dir: &Path, pickle: &[u8], key: Option<&str>) -> String {
    let e = read_with_pickle(dir, pickle).unwrap_err();
    if let Some(key) = key {
        assert!(
            matches!(&e, Error::Tensor { name, .. } if name == key),
            "{e}"
        );
    }
    message(e, "final.pt")
}

#[test]
fn a_hand_written_state_dict_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let expand = View {
        offset: 2,
        size: &[2, 3],
        stride: &[0, 1],
        ..A_WEIGHT
    };
    let tensors = read_with_pickle(
        tmp.path(),
        &state_dict(&[
            (unicode("w"), tensor(&A_WEIGHT)),
            (unicode("e"), tensor(&expand)),
            (unicode("m"), tensor_with(&A_WEIGHT, &[b"}".to_vec()])),
        ]),
    )
    .unwrap();
    let a: Vec<f32> = (0..12).map(|i| i as f32 / 8.0 - 0.5).collect();
    assert_eq!(tensors["w"].to_f32(), a);
    assert_eq!(tensors["m"].to_f32(), a);
    // An expanded view (stride 0) becomes a copy: rows 2..5 twice.
    assert_eq!(tensors["e"].shape, [2, 3]);
    assert_eq!(tensors["e"].to_f32(), [&a[2..5], &a[2..5]].concat());
}

#[test]
fn tensor_level_refusals_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let one = |v: Vec<u8>| state_dict(&[(unicode("k"), v)]);
    for (view, expected) in [
        (
            View {
                offset: 1,
                ..A_WEIGHT
            },
            "reaches past the end of storage `0` (12 elements)",
        ),
        (
            View {
                size: &[3, 5],
                ..A_WEIGHT
            },
            "reaches past the end",
        ),
        (
            View {
                numel: 13,
                ..A_WEIGHT
            },
            "storage `data/0` holds 48 bytes, but the pickle says 13 elements of F32",
        ),
        (
            View {
                key: "99",
                ..A_WEIGHT
            },
            "its storage `data/99` is not in the archive",
        ),
        (
            View {
                stride: &[4],
                ..A_WEIGHT
            },
            "have different lengths",
        ),
        (
            View {
                stride: &[4, -1],
                ..A_WEIGHT
            },
            "its stride is a tuple of 2 items, not a tuple of non-negative ints",
        ),
        (
            View {
                offset: -1,
                ..A_WEIGHT
            },
            "storage offset is an int (-1)",
        ),
        (
            View {
                size: &[1 << 62, 1 << 62],
                stride: &[0, 0],
                ..A_WEIGHT
            },
            "overflows",
        ),
        (
            // An expand far larger than the file: refused before any allocation.
            View {
                size: &[1 << 40],
                stride: &[0],
                ..A_WEIGHT
            },
            "would exceed the file's own size",
        ),
    ] {
        let text = pickle_error(dir, &one(tensor(&view)), Some("k"));
        assert!(text.contains(expected), "{expected}: {text}");
    }
    // One storage read as two dtypes.
    let as_int = View {
        storage: "IntStorage",
        ..A_WEIGHT
    };
    let text = pickle_error(
        dir,
        &state_dict(&[
            (unicode("a"), tensor(&A_WEIGHT)),
            (unicode("b"), tensor(&as_int)),
        ]),
        Some("b"),
    );
    assert!(
        text.contains("storage `0` is a IntStorage of 12 elements here and a FloatStorage"),
        "{text}"
    );
    // Hooks, metadata, arity, the parameter's arguments.
    let hooks = tensor(&A_WEIGHT);
    let hooks = {
        // Replace the empty hooks OrderedDict by a non-empty one.
        let empty = [ordered_dict(), b"t".to_vec()].concat();
        let full = [ordered_dict(), unicode("h"), int(1), b"st".to_vec()].concat();
        let at = hooks
            .windows(empty.len())
            .position(|w| w == empty.as_slice())
            .unwrap();
        [&hooks[..at], &full[..], &hooks[at + empty.len()..]].concat()
    };
    let text = pickle_error(dir, &one(hooks), Some("k"));
    assert!(
        text.contains("its backward hooks are an OrderedDict of 1 items"),
        "{text}"
    );
    let meta = tensor_with(
        &A_WEIGHT,
        &[[b"}".to_vec(), unicode("conj"), vec![0x88, b's']].concat()],
    );
    let text = pickle_error(dir, &one(meta), Some("k"));
    assert!(text.contains("tensor metadata"), "{text}");
    let seven = tensor_with(&A_WEIGHT, &[b"N".to_vec(), b"N".to_vec()]);
    let text = pickle_error(dir, &one(seven), Some("k"));
    assert!(
        text.contains("_rebuild_tensor_v2 with 8 arguments"),
        "{text}"
    );
    let param = [
        global("torch._utils", "_rebuild_parameter"),
        tuple(&[tensor(&A_WEIGHT)]),
        b"R".to_vec(),
    ]
    .concat();
    let text = pickle_error(dir, &one(param), Some("k"));
    assert!(
        text.contains("an nn.Parameter rebuilt from (a tensor)"),
        "{text}"
    );
}

#[test]
fn pickle_level_refusals_name_the_global_or_opcode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let one = |v: Vec<u8>| state_dict(&[(unicode("k"), v)]);
    let call = |module: &str, name: &str| {
        [global(module, name), tuple(&[unicode("x")]), b"R".to_vec()].concat()
    };
    for (pickle, expected) in [
        (one(call("builtins", "eval")), "pickle global `builtins.eval` is not a tensor; refusing to load a checkpoint that runs code"),
        (one(call("__builtin__", "getattr")), "pickle global `__builtin__.getattr` is not a tensor"),
        (one(call("torch._utils", "_rebuild_parameter_with_state")), "pickle global `torch._utils._rebuild_parameter_with_state` is not a tensor"),
        (one(call("torch.nn.modules.linear", "Linear")), "pickle global `torch.nn.modules.linear.Linear` is not a tensor"),
        (one(call("torch", "ComplexFloatStorage")), "pickle global `torch.ComplexFloatStorage`: a storage of a dtype this reader does not read"),
        // STACK_GLOBAL (protocol 4) names a global through two strings.
        (one([unicode("os"), unicode("system"), vec![0x93], tuple(&[unicode("x")]), b"R".to_vec()].concat()), "pickle global `os.system` is not a tensor"),
        (one(call("torch", "FloatStorage")), "REDUCE of the storage type `torch.FloatStorage`"),
        (one([ordered_dict(), tuple(&[]), b"b".to_vec()].concat()), "pickle opcode BUILD with a tuple of 0 items"),
        (one([tensor(&A_WEIGHT), b"}b".to_vec()].concat()), "pickle opcode BUILD on a tensor"),
        (one([global("collections", "OrderedDict"), b")\x81".to_vec()].concat()), "pickle opcode NEWOBJ creates an object of an arbitrary class"),
        (one([ordered_dict(), b"q\x07h\x07".to_vec()].concat()), "a second reference to an OrderedDict of 0 items (memo 7)"),
        (one([global("collections", "OrderedDict"), tuple(&[int(1)]), b"R".to_vec()].concat()), "collections.OrderedDict called with arguments"),
        (one(b"C\x01x".to_vec()), "pickle opcode SHORT_BINBYTES (0x43) is not one torch.save writes"),
        (b"\x80\x06.".to_vec(), "pickle protocol 6"),
    ] {
        let text = pickle_error(dir, &pickle, None);
        assert!(text.contains(expected), "{expected}: {text}");
        assert!(text.contains("plain/data.pkl: byte "), "{text}");
    }
    // Not a flat state dict of string keys.
    let text = pickle_error(dir, &state_dict(&[(int(5), tensor(&A_WEIGHT))]), None);
    assert!(
        text.contains("a state dict key is an int (5), not a string"),
        "{text}"
    );
    let text = pickle_error(
        dir,
        &[b"\x80\x02".to_vec(), tensor(&A_WEIGHT), b".".to_vec()].concat(),
        None,
    );
    assert!(
        text.contains("the pickle holds a tensor, not a state dict"),
        "{text}"
    );
    // Malformed pickles.
    let whole = state_dict(&[(unicode("k"), tensor(&A_WEIGHT))]);
    let text = pickle_error(dir, &whole[..whole.len() - 1], None);
    assert!(text.contains("without a STOP opcode: truncated"), "{text}");
    let text = pickle_error(dir, b"\x80\x02h\x03.", None);
    assert!(text.contains("memo 3 is read before it is set"), "{text}");
}

#[cfg(target_pointer_width = "64")]
#[test]
fn a_checkpoint_over_4_gib_reads_through_zip64() {
    // torch.save's own 4.4 GB file (tests/fixtures/torch/make_zip64.py), rebuilt as a sparse
    // file: its bytes but the big tensor's, which are zero except three recorded ones.
    use std::io::{Seek, SeekFrom, Write};
    let dir = fixture("zip64");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("zip64.json")).unwrap()).unwrap();
    let n = |k: &str| meta[k].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("big.pt");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&std::fs::read(dir.join("head.bin")).unwrap())
        .unwrap();
    f.set_len(n("file_len")).unwrap();
    let patches: Vec<(u64, u8)> = meta["patches"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), v.as_u64().unwrap() as u8))
        .collect();
    for &(at, v) in &patches {
        f.seek(SeekFrom::Start(n("data_start") + at)).unwrap();
        f.write_all(&[v]).unwrap();
    }
    f.seek(SeekFrom::Start(n("data_start") + n("data_len")))
        .unwrap();
    f.write_all(&std::fs::read(dir.join("tail.bin")).unwrap())
        .unwrap();
    drop(f);

    let tensors = torch_pt::read(&path).unwrap();
    assert_eq!(tensors["small"].to_f32(), [1.0, 2.0, 3.0]);
    // Its local header is past 4 GiB: found through the ZIP64 extra field.
    assert_eq!(tensors["after"].to_f32(), [5.0, 6.0]);
    let big = &tensors["big"];
    assert_eq!(
        (big.dtype, big.shape.clone()),
        (DType::U8, vec![4_400_000_000])
    );
    for &(at, v) in &patches {
        assert_eq!(big.bytes()[at as usize], v, "byte {at}");
    }
    assert_eq!(big.bytes()[1], 0);
}

/// A small deterministic generator (xorshift64*) for the corruption cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Reads `bytes` as a file; a panic fails with the case that caused it.
fn read_bytes(dir: &Path, bytes: &[u8], case: &str) -> Result<BTreeMap<String, Tensor>, Error> {
    let path = write(dir, "final.pt", bytes);
    match std::panic::catch_unwind(|| torch_pt::read(&path)) {
        Ok(result) => result,
        Err(_) => panic!("torch_pt::read panicked on {case}"),
    }
}

#[test]
fn every_truncation_of_a_real_checkpoint_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["plain.pt", "module.pt"] {
        let seed = std::fs::read(fixture(name)).unwrap();
        for len in 0..seed.len() {
            let e =
                read_bytes(tmp.path(), &seed[..len], &format!("{name} cut at {len}")).unwrap_err();
            message(e, "final.pt");
        }
    }
}

#[test]
fn seeded_single_byte_corruptions_never_panic() {
    // 4000 single-byte changes of plain.pt and module.pt, anywhere (a quarter land in the
    // pickle: CRCs are not checked, so those reach the unpickler).
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x0a5e_f022);
    let (mut ok, mut refused) = (0, 0);
    for name in ["plain.pt", "module.pt"] {
        let seed = std::fs::read(fixture(name)).unwrap();
        for _ in 0..2000 {
            let mut bytes = seed.clone();
            let at = (rng.next() % bytes.len() as u64) as usize;
            let value = (rng.next() % 255) as u8;
            // Never the byte it was.
            bytes[at] = if value >= bytes[at] { value + 1 } else { value };
            let case = format!("{name} with byte {at} set to {}", bytes[at]);
            match read_bytes(tmp.path(), &bytes, &case) {
                Ok(_) => ok += 1,
                Err(e) => {
                    message(e, "final.pt");
                    refused += 1;
                }
            }
        }
    }
    // Both outcomes occur: a changed tensor value is read, a broken structure is refused.
    assert!(ok > 100 && refused > 100, "{ok} read, {refused} refused");
}
