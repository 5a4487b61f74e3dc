//! Every real GGUF file we have opens, and its index is self-consistent. (The tensor list itself is
//! checked against the `gguf` Python package through `hearth inspect --json` in the cli crate.)

use std::path::{Path, PathBuf};

use hearth_gguf::Gguf;

fn shared() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared")).to_path_buf()
}

fn gguf_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["fixtures", "tokenizers/llama.cpp-vocab"] {
        let dir = shared().join(dir);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for e in entries {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "gguf") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(
        out.len() >= 15,
        "expected the shared fixtures, found {out:?}"
    );
    out
}

/// `Gguf::open_resident` holds the same file as `Gguf::open`: the same index, the same bytes, and
/// its progress runs from 0 to the file's size.
#[test]
fn resident_copy_matches_the_map() {
    for p in gguf_files() {
        let mapped = Gguf::open(&p).unwrap();
        let mut reports = Vec::new();
        let resident = Gguf::open_resident(&p, &mut |done, total| reports.push((done, total)))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(resident.is_resident() && !mapped.is_resident());
        let len = std::fs::metadata(&p).unwrap().len();
        assert_eq!(resident.bytes(), mapped.bytes(), "{}", p.display());
        assert_eq!(reports.first(), Some(&(0, len)));
        assert_eq!(reports.last(), Some(&(len, len)));
        assert!(reports.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(resident.tensors(), mapped.tensors());
        assert_eq!(resident.metadata().len(), mapped.metadata().len());
        for t in resident.tensors() {
            assert_eq!(resident.tensor_data(t), mapped.tensor_data(t));
        }
    }
}

#[test]
fn every_shared_gguf_opens() {
    for p in gguf_files() {
        let g = Gguf::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(matches!(g.version(), 2 | 3));
        assert_eq!(g.data_offset() % g.alignment(), 0);
        assert!(
            g.metadata().get_str("general.architecture").is_some(),
            "{}",
            p.display()
        );
        for t in g.tensors() {
            assert_eq!(g.tensor(&t.name), Some(t));
            assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
            assert_eq!(t.n_bytes, t.row_bytes() as u64 * t.n_rows() as u64);
        }
        // Round trip through the writer: same metadata, same tensors, same bytes.
        let mut w = hearth_gguf::GgufWriter::new(Vec::new());
        w.set_version(g.version()).unwrap();
        for (k, v) in g.metadata().iter() {
            w.add_kv(k, v.clone()).unwrap();
        }
        for t in g.tensors() {
            w.add_tensor(t.name.clone(), t.ty, &t.dims).unwrap();
        }
        w.write_header().unwrap();
        for t in g.tensors() {
            w.write_tensor_data(g.tensor_data(t)).unwrap();
        }
        let bytes = w.finish().unwrap();
        // gguf-py pads after the header even with no tensors; llama.cpp's vocab-only files end
        // unpadded. Files with tensors come out byte for byte.
        if !g.tensors().is_empty() {
            assert!(
                bytes == g.bytes(),
                "{}: writer output differs from the original",
                p.display()
            );
        }
        let g2 = Gguf::from_bytes(bytes).unwrap();
        assert_eq!(g2.metadata(), g.metadata());
        assert_eq!(g2.tensors().len(), g.tensors().len());
        for (a, b) in g.tensors().iter().zip(g2.tensors()) {
            assert_eq!((&a.name, a.ty, &a.dims), (&b.name, b.ty, &b.dims));
            assert!(g.tensor_data(a) == g2.tensor_data(b), "{}", a.name);
        }
    }
}

#[test]
fn smollm2_opens_if_present() {
    let path = std::env::var("HEARTH_SMOLLM2").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .into()
    });
    assert!(
        Path::new(&path).exists(),
        "{path} is missing: run scripts/test to fetch SmolLM2-135M-Instruct Q4_1"
    );
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.metadata().get_str("general.architecture"), Some("llama"));
    assert_eq!(
        g.metadata()
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len()),
        Some(49152)
    );
    let total: u64 = g.tensors().iter().map(|t| t.n_bytes).sum();
    assert!(total > 50_000_000);
}
