//! Writer round trips: write → read gives back every key with its type and every tensor byte for byte,
//! for v2 and v3, default and custom alignment, whole and chunked tensor data; misuse is an error.

use hearth_gguf::{Array, Gguf, GgufBuilder, GgufError, GgufWriter, Value};
use hearth_quant::GgmlType;

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("qwen3moe".into())),
        ("v.u8", Value::U8(255)),
        ("v.i8", Value::I8(-128)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.f32", Value::F32(-1.5e-7)),
        ("v.bool", Value::Bool(false)),
        ("v.string.empty", Value::String(String::new())),
        ("v.string.utf8", Value::String("héllo ✓ 🦀".into())),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-1, 1]))),
        ("a.u16", Value::Array(Array::U16(vec![7]))),
        ("a.i16", Value::Array(Array::I16(vec![-7, 7]))),
        ("a.u32", Value::Array(Array::U32(vec![1, 2, 3]))),
        ("a.i32", Value::Array(Array::I32(vec![-1, 0, 1]))),
        (
            "a.f32",
            Value::Array(Array::F32(vec![0.0, -0.0, f32::INFINITY, 1e-30])),
        ),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        (
            "a.string",
            Value::Array(Array::String(vec![
                "".into(),
                "Ġthe".into(),
                "<|im_end|>".into(),
            ])),
        ),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, i64::MAX]))),
        ("a.f64", Value::Array(Array::F64(vec![1e300]))),
        ("a.empty.f32", Value::Array(Array::F32(vec![]))),
        ("a.empty.string", Value::Array(Array::String(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::U8(vec![1]), Array::F64(vec![])]),
                Array::Array(vec![]),
            ])),
        ),
    ]
}

fn tensors() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("token_embd.weight", GgmlType::Q4_K, vec![256, 3]),
        ("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, vec![64, 2, 4]),
        ("empty", GgmlType::F32, vec![0, 5]),
        ("blk.0.attn_norm.weight", GgmlType::F32, vec![7]),
        ("odd.f16", GgmlType::F16, vec![3, 1, 1, 1]),
        ("iq2", GgmlType::IQ2_XXS, vec![256]),
    ]
}

/// Deterministic payload bytes for tensor `i`.
fn payload(i: usize, n: u64) -> Vec<u8> {
    (0..n)
        .map(|j| (j as usize * 31 + i * 7 + 1) as u8)
        .collect()
}

fn write(version: u32, alignment: Option<u32>, chunk: usize) -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new());
    w.set_version(version).unwrap();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in all_values() {
        w.add_kv(k, v).unwrap();
    }
    for (name, ty, dims) in tensors() {
        w.add_tensor(name, ty, &dims).unwrap();
    }
    let infos = w.tensors().to_vec();
    let expected_data_offset = w.data_offset();
    w.write_header().unwrap();
    for (i, t) in infos.iter().enumerate() {
        for c in payload(i, t.n_bytes).chunks(chunk) {
            w.write_tensor_data(c).unwrap();
        }
    }
    let bytes = w.finish().unwrap();
    assert_eq!(
        Gguf::from_bytes(bytes.clone()).unwrap().data_offset(),
        expected_data_offset
    );
    bytes
}

fn check(bytes: Vec<u8>, version: u32, alignment: u64) {
    let g = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(g.version(), version);
    assert_eq!(g.alignment(), alignment);
    assert_eq!(g.data_offset() % alignment, 0);
    let mut expected = all_values();
    if alignment != 32 {
        expected.insert(0, ("general.alignment", Value::U32(alignment as u32)));
    }
    let got: Vec<_> = g.metadata().iter().map(|(k, v)| (k, v.clone())).collect();
    assert_eq!(got.len(), expected.len());
    for ((gk, gv), (ek, ev)) in got.iter().zip(&expected) {
        assert_eq!(gk, ek);
        assert_eq!(gv.type_name(), ev.type_name(), "{gk}");
        // Compare bit patterns so -0.0 and friends count too.
        assert_eq!(format!("{gv:?}"), format!("{ev:?}"), "{gk}");
    }
    assert_eq!(g.tensors().len(), tensors().len());
    for (i, ((name, ty, dims), t)) in tensors().into_iter().zip(g.tensors()).enumerate() {
        assert_eq!((t.name.as_str(), t.ty, &t.dims), (name, ty, &dims));
        assert_eq!(t.offset % alignment, 0);
        assert_eq!(g.tensor_data(t), &payload(i, t.n_bytes)[..], "{name}");
    }
    let exps = g.tensor("blk.0.ffn_gate_exps.weight").unwrap();
    let all = g.tensor_data(exps);
    for e in 0..4 {
        assert_eq!(
            g.expert_slice(exps, e).unwrap(),
            &all[e * 136..(e + 1) * 136]
        );
    }
}

#[test]
fn round_trip_v3_default_alignment() {
    check(write(3, None, usize::MAX), 3, 32);
}

#[test]
fn round_trip_v2_custom_alignment_chunked() {
    check(write(2, Some(64), 5), 2, 64);
    check(write(3, Some(1), 1), 3, 1);
    check(write(3, Some(4096), 100), 3, 4096);
}

#[test]
fn open_maps_a_file() {
    let path = std::env::temp_dir().join(format!(
        "hearth-gguf-writer-test-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, write(3, None, 1000)).unwrap();
    let g = Gguf::open(&path);
    std::fs::remove_file(&path).unwrap();
    check(g.unwrap().bytes().to_vec(), 3, 32);
    let missing = Gguf::open("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(missing, GgufError::Open { .. }));
    assert!(missing.to_string().contains("/nonexistent/model.gguf"));
}

#[test]
fn builder_round_trip() {
    let bytes = GgufBuilder::new()
        .version(2)
        .alignment(16)
        .kv("k", Value::I64(-5))
        .tensor("t", GgmlType::BF16, &[3], vec![1, 2, 3, 4, 5, 6])
        .build()
        .unwrap();
    let g = Gguf::from_bytes(bytes).unwrap();
    assert_eq!((g.version(), g.alignment()), (2, 16));
    assert_eq!(g.metadata().get_i64("k"), Some(-5));
    assert_eq!(g.tensor_data(&g.tensors()[0]), &[1, 2, 3, 4, 5, 6]);
    // Wrong data length is refused.
    let e = GgufBuilder::new()
        .tensor("t", GgmlType::F32, &[2], vec![0; 7])
        .build()
        .unwrap_err();
    assert!(matches!(e, GgufError::WriterMisuse(_)), "{e}");
}

#[test]
fn writer_misuse_is_an_error() {
    let mut w = GgufWriter::new(Vec::new());
    assert!(matches!(
        w.add_kv("", Value::U8(0)),
        Err(GgufError::EmptyKey { .. })
    ));
    w.add_kv("a", Value::U8(0)).unwrap();
    assert!(matches!(
        w.add_kv("a", Value::U8(1)),
        Err(GgufError::DuplicateKey { .. })
    ));
    assert!(matches!(
        w.set_alignment(0),
        Err(GgufError::InvalidAlignment(0))
    ));
    assert!(matches!(
        w.set_alignment(24),
        Err(GgufError::InvalidAlignment(24))
    ));
    assert!(matches!(
        w.add_kv("general.alignment", Value::U64(32)),
        Err(GgufError::AlignmentType { found: "u64" })
    ));
    assert!(matches!(
        w.set_version(1),
        Err(GgufError::UnsupportedVersion(1))
    ));
    assert!(matches!(
        w.add_tensor("q", GgmlType::Q4_0, &[33]),
        Err(GgufError::RowNotBlockMultiple { .. })
    ));
    assert!(matches!(
        w.add_tensor("q", GgmlType::F32, &[1, 1, 1, 1, 1]),
        Err(GgufError::TooManyDims { .. })
    ));
    assert!(matches!(
        w.write_tensor_data(&[0]),
        Err(GgufError::WriterMisuse(_))
    ));
    w.add_tensor("x", GgmlType::F32, &[2]).unwrap();
    assert!(matches!(
        w.add_tensor("x", GgmlType::F32, &[2]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.set_alignment(64),
        Err(GgufError::WriterMisuse(_))
    ));
    w.write_header().unwrap();
    assert!(matches!(
        w.add_kv("b", Value::U8(0)),
        Err(GgufError::WriterMisuse(_))
    ));
    assert!(matches!(
        w.write_tensor_data(&[0; 9]),
        Err(GgufError::WriterMisuse(_))
    ));
    w.write_tensor_data(&[0; 4]).unwrap();
    let mut deep = Array::U8(vec![]);
    for _ in 0..8 {
        deep = Array::Array(vec![deep]);
    }
    let mut w2 = GgufWriter::new(Vec::new());
    assert!(matches!(
        w2.add_kv("deep", Value::Array(deep)),
        Err(GgufError::NestingTooDeep { .. })
    ));
    // Only half of "x" was written.
    assert!(matches!(w.finish(), Err(GgufError::WriterMisuse(_))));
}

/// Regression (found by the fuzzer): copying a file tensor by tensor, writing each tensor's data even when
/// it is empty, failed when the last tensor was empty, because it had already been skipped.
#[test]
fn empty_data_for_a_trailing_empty_tensor() {
    let mut w = GgufWriter::new(Vec::new());
    w.add_tensor("a", GgmlType::F32, &[2]).unwrap();
    w.add_tensor("z", GgmlType::F32, &[0, 3]).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data(&[1; 8]).unwrap();
    w.write_tensor_data(&[]).unwrap();
    let g = Gguf::from_bytes(w.finish().unwrap()).unwrap();
    assert_eq!(g.tensor_data(g.tensor("a").unwrap()), &[1; 8]);
    assert!(g.tensor_data(g.tensor("z").unwrap()).is_empty());
}

/// Regression (found by the fuzzer, as a timeout): a legal alignment of 2^30 made the writer build the
/// padded header in memory. Padding is now streamed; check the byte count on a counting sink.
#[test]
fn huge_alignment_pads_without_buffering() {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = GgufWriter::new(Count(0));
    w.set_alignment(1 << 30).unwrap();
    w.add_tensor("t", GgmlType::F32, &[1]).unwrap();
    assert_eq!(w.data_offset(), 1 << 30);
    w.write_header().unwrap();
    w.write_tensor_data(&[0; 4]).unwrap();
    assert_eq!(w.finish().unwrap().0, 2 << 30);
}

/// A file of several read chunks (16 MiB each, read on several threads) comes back byte for byte
/// through `Gguf::open_resident`, with progress reports that only grow and end at the file's size.
#[test]
fn open_resident_reads_a_file_of_many_chunks() {
    let n: u64 = 11 << 20; // 44 MiB of f32: three chunks, the last one short
    let data: Vec<u8> = (0..n * 4).map(|i| (i * 7 + i / 4099) as u8).collect();
    let bytes = GgufBuilder::new()
        .kv("general.architecture", Value::String("test".into()))
        .tensor("big", GgmlType::F32, &[n], data.clone())
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    std::fs::write(&path, &bytes).unwrap();

    let mut reports = Vec::new();
    let g = Gguf::open_resident(&path, &mut |done, total| reports.push((done, total))).unwrap();
    assert!(g.is_resident());
    assert_eq!(g.bytes(), &bytes[..]);
    assert_eq!(g.tensor_data(g.tensor("big").unwrap()), &data[..]);
    let len = bytes.len() as u64;
    assert_eq!(reports.first(), Some(&(0, len)));
    assert_eq!(reports.last(), Some(&(len, len)));
    assert!(reports.windows(2).all(|w| w[0].0 < w[1].0), "{reports:?}");
}

/// `Gguf::rewrite_tensors` changes a resident file's tensors in place, each once, marks the ones
/// it changed, and leaves a mapped file alone.
#[test]
fn rewrite_tensors_changes_resident_data_only() {
    let a: Vec<u8> = (0..64u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (0..32u32)
        .flat_map(|v| (-(v as f32)).to_le_bytes())
        .collect();
    let bytes = GgufBuilder::new()
        .kv("general.architecture", Value::String("test".into()))
        .tensor("a", GgmlType::F32, &[64], a.clone())
        .tensor("b", GgmlType::F32, &[32], b.clone())
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.gguf");
    std::fs::write(&path, &bytes).unwrap();

    let mut mapped = Gguf::open(&path).unwrap();
    let mut calls = 0;
    let n = mapped
        .rewrite_tensors(&mut |_, _| {
            calls += 1;
            true
        })
        .unwrap();
    assert_eq!((n, calls), (0, 0));
    assert!(!mapped.is_rewritten(mapped.tensor("a").unwrap()));

    let mut g = Gguf::open_resident(&path, &mut |_, _| {}).unwrap();
    let n = g
        .rewrite_tensors(&mut |t, data| {
            assert_eq!(data.len() as u64, t.n_bytes);
            if t.name != "a" {
                return false;
            }
            data.reverse();
            true
        })
        .unwrap();
    assert_eq!(n, 1);
    let (ta, tb) = (g.tensor("a").unwrap(), g.tensor("b").unwrap());
    assert!(g.is_rewritten(ta) && !g.is_rewritten(tb));
    assert_eq!(g.n_rewritten(), 1);
    let mut want = a.clone();
    want.reverse();
    assert_eq!(g.tensor_data(ta), &want[..]);
    assert_eq!(g.tensor_data(tb), &b[..]);
    // A tensor is rewritten once: a second pass is not offered it again.
    let n = g
        .rewrite_tensors(&mut |t, _| {
            assert_ne!(t.name, "a");
            false
        })
        .unwrap();
    assert_eq!(n, 0);
    assert!(g.is_resident());
}
