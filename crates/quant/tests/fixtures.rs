//! Parity on real model files: every tensor of every fixture model (and SmolLM2) dequantizes to
//! exactly what gguf-py gives, and our reference quantizers reproduce llama.cpp's quantized fixtures
//! byte for byte from their f16 sources.

mod common;

use common::{hash_f32, model_path, smollm2_path, tensor_bytes, tensor_index, TensorEntry};
use hearth_quant::{dequantize_row, has_quantizer, quantize_row, GgmlType};
use std::collections::HashMap;

fn read(label: &str) -> Vec<u8> {
    let path = model_path(label);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("cannot read {} ({e}); for SmolLM2 run scripts/test, which fetches it, or set HEARTH_SMOLLM2", path.display())
    })
}

fn check_file(label: &str, entries: &[&TensorEntry]) {
    let file = read(label);
    for e in entries {
        let mut out = vec![0f32; e.n];
        dequantize_row(e.ty, tensor_bytes(&file, e), &mut out)
            .unwrap_or_else(|err| panic!("{label} {}: {err}", e.name));
        assert_eq!(
            hash_f32(&out),
            e.hash,
            "{label} {} ({}): dequantization differs from gguf-py",
            e.name,
            e.ty
        );
    }
}

fn by_file(pred: impl Fn(&str) -> bool) -> Vec<(String, Vec<TensorEntry>)> {
    let mut files: Vec<(String, Vec<TensorEntry>)> = Vec::new();
    for e in tensor_index().into_iter().filter(|e| pred(&e.file)) {
        match files.iter_mut().find(|(f, _)| *f == e.file) {
            Some((_, v)) => v.push(e),
            None => files.push((e.file.clone(), vec![e])),
        }
    }
    files
}

#[test]
fn every_fixture_tensor_dequantizes_like_gguf_py() {
    let files = by_file(|f| f.starts_with("fixtures/"));
    assert!(
        files.len() >= 15,
        "tensors.txt lists {} fixture files",
        files.len()
    );
    let mut types = std::collections::BTreeSet::new();
    for (label, entries) in &files {
        check_file(label, &entries.iter().collect::<Vec<_>>());
        types.extend(entries.iter().map(|e| e.ty));
    }
    // The fixtures cover these; the rest are covered by random blocks in tests/vectors.rs.
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
    ] {
        assert!(types.contains(&ty), "fixtures have no {ty} tensor");
    }
}

#[test]
fn smollm2_dequantizes_like_gguf_py() {
    let files = by_file(|f| f == "$HEARTH_SMOLLM2");
    assert_eq!(
        files.len(),
        1,
        "tensors.txt has no SmolLM2 entries; regenerate with the model present"
    );
    assert!(
        smollm2_path().exists(),
        "SmolLM2 missing at {}: run scripts/test (it fetches the model) or set HEARTH_SMOLLM2",
        smollm2_path().display()
    );
    let (label, entries) = &files[0];
    check_file(label, &entries.iter().collect::<Vec<_>>());
}

/// `tiny-qwen3.q4_k_m.gguf` -> `fixtures/tiny-qwen3.f16.gguf`.
fn source_of(label: &str) -> String {
    let base = label.trim_end_matches(".gguf");
    let model = base.rsplit_once('.').map(|(m, _)| m).unwrap_or(base);
    format!("{model}.f16.gguf")
}

/// llama-quantize without an importance matrix runs exactly the `_ref` quantizers, so quantizing the
/// f16 source tensor must give the fixture's bytes.
#[test]
fn quantizers_reproduce_llama_cpp_fixtures() {
    let index = tensor_index();
    let mut checked: HashMap<GgmlType, usize> = HashMap::new();
    let mut mismatched: Vec<String> = Vec::new();
    for (label, entries) in by_file(|f| f.starts_with("fixtures/") && !f.ends_with(".f16.gguf")) {
        let src_label = source_of(&label);
        let sources: HashMap<&str, &TensorEntry> = index
            .iter()
            .filter(|e| e.file == src_label)
            .map(|e| (e.name.as_str(), e))
            .collect();
        if sources.is_empty() {
            continue; // no f16 source shipped for this model
        }
        let (file, src_file) = (read(&label), read(&src_label));
        for e in entries
            .iter()
            .filter(|e| has_quantizer(e.ty) && !matches!(e.ty, GgmlType::F32))
        {
            let s = sources[e.name.as_str()];
            assert_eq!(s.n, e.n);
            let mut x = vec![0f32; s.n];
            dequantize_row(s.ty, tensor_bytes(&src_file, s), &mut x).unwrap();
            let want = tensor_bytes(&file, e);
            let mut got = vec![0u8; want.len()];
            quantize_row(e.ty, &x, &mut got).unwrap();
            if got != want {
                let bs = e.ty.type_size();
                let bad = got
                    .chunks(bs)
                    .zip(want.chunks(bs))
                    .filter(|(a, b)| a != b)
                    .count();
                mismatched.push(format!(
                    "{label} {} {}: {bad} of {} blocks differ",
                    e.name,
                    e.ty,
                    want.len() / bs
                ));
            }
            *checked.entry(e.ty).or_default() += 1;
        }
    }
    eprintln!("checked against llama.cpp: {checked:?}");
    assert!(
        mismatched.is_empty(),
        "quantizer output differs from llama.cpp:\n{}",
        mismatched.join("\n")
    );
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(
            checked.get(&ty).copied().unwrap_or(0) > 0,
            "no {ty} tensor compared"
        );
    }
}
