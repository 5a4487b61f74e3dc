//! Fuzz the GGUF reader: any bytes must parse to `Ok` or `Err`, never panic, abort or allocate wildly.
//! What is accepted must be fully usable (every tensor's data in bounds) and must survive a round trip
//! through the writer with the same metadata and tensor bytes.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_reader -- -max_len=65536` from this directory.
#![no_main]

use hearth_gguf::{Gguf, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else { return };
    assert!(matches!(g.version(), 2 | 3));
    assert!(g.alignment().is_power_of_two());
    assert_eq!(g.data_offset() % g.alignment(), 0);
    for (k, v) in g.metadata().iter() {
        assert!(!k.is_empty());
        // The index points at this very entry (compared by address: NaN != NaN).
        assert!(g.metadata().get(k).is_some_and(|x| std::ptr::eq(x, v)));
        let _ = (v.type_name(), v.as_u64(), v.as_f32(), v.as_str());
        if let Some(a) = v.as_array() {
            let _ = (a.len(), a.get(0), a.get(a.len()), a.as_strings());
        }
    }
    for t in g.tensors() {
        assert_eq!(g.tensor(&t.name), Some(t));
        assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.row_bytes() as u64 * t.n_rows() as u64, t.n_bytes);
        if t.dims.len() == 3 {
            for e in 0..t.ne(2).min(4) as usize {
                let s = g.expert_slice(t, e).unwrap();
                assert_eq!(s.len() as u64 * t.ne(2), t.n_bytes);
            }
            assert!(g.expert_slice(t, t.ne(2) as usize).is_err());
        }
    }

    // Round trip: what was read can be written and reads back the same. A legal but huge alignment
    // (up to 2^31) would make the rewritten file gigabytes of padding: skip those.
    if g.alignment() > 1 << 16 {
        return;
    }
    let mut w = GgufWriter::new(Vec::new());
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
    let g2 = Gguf::from_bytes(w.finish().unwrap()).unwrap();
    // Debug strings, so NaN values compare equal to themselves.
    let entries = |g: &Gguf| g.metadata().iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>();
    assert_eq!(entries(&g2), entries(&g));
    assert_eq!(g2.tensors().len(), g.tensors().len());
    for (a, b) in g.tensors().iter().zip(g2.tensors()) {
        assert_eq!((&a.name, a.ty, &a.dims), (&b.name, b.ty, &b.dims));
        assert_eq!(g.tensor_data(a), g2.tensor_data(b));
    }
});
