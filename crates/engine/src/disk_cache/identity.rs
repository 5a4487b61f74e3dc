//! What makes cached blocks interchangeable: the identity of the model file, and the namespace
//! built from it with the KV type and the block layout.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use xxhash_rust::xxh3::Xxh3;

/// Bytes hashed whole at the start of the file: a GGUF's header, metadata and tensor index sit
/// there (a few MB even for large vocabularies), so two files with different tensors or settings
/// differ here.
const HEAD: u64 = 16 << 20;
/// Bytes of each page sampled from the rest (the tensor data).
const PAGE: u64 = 4096;
/// Pages sampled evenly over the rest, the first at its start and the last at its end.
const PAGES: u64 = 64;

/// Cheap identity of a model file: its size, xxh3 of its first 16 MiB (header, metadata, tensor
/// infos) and of 64 4-KiB pages sampled evenly over the rest. Not the path nor the mtime, so a copy
/// keeps its identity; about 16 MiB read, whatever the file's size.
pub fn model_identity(path: &Path) -> io::Result<u128> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = Xxh3::new();
    h.update(b"hearth model identity 1");
    h.update(&size.to_le_bytes());
    let head = size.min(HEAD);
    let mut buf = vec![0u8; 1 << 20];
    hash_span(&mut f, head, &mut buf, &mut h)?;
    let rest = size - head;
    if rest <= PAGE * PAGES {
        // Small enough to take whole (and the spacing below needs at least one page).
        hash_span(&mut f, rest, &mut buf, &mut h)?;
    } else {
        let page = &mut buf[..PAGE as usize];
        for i in 0..PAGES {
            // rest < 2^64 / 64, so the product cannot overflow.
            let offset = head + (rest - PAGE) * i / (PAGES - 1);
            f.seek(SeekFrom::Start(offset))?;
            f.read_exact(page)?;
            h.update(&offset.to_le_bytes());
            h.update(page);
        }
    }
    Ok(h.digest128())
}

/// Hashes the next `len` bytes of `f`.
fn hash_span(f: &mut File, len: u64, buf: &mut [u8], h: &mut Xxh3) -> io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(())
}

/// The namespace of a disk cache, as [`DiskCache::open`](super::DiskCache::open) takes it:
/// xxh3_128 of the model identity, the KV type's name (`"f16"`, `"q8_0"`, ...) and a string that
/// describes the payload's layout (block size, tensor order, ...). Each string is length-prefixed,
/// so no two different triples hash the same bytes.
pub fn cache_namespace(model_identity: u128, kv_type: &str, layout: &str) -> u128 {
    let mut h = Xxh3::new();
    h.update(b"hearth kv namespace 1");
    h.update(&model_identity.to_le_bytes());
    for s in [kv_type, layout] {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    }
    h.digest128()
}
