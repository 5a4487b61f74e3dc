//! The disk tier of the KV prefix cache: round trips, restarts, namespaces, LRU by size, a corrupt
//! directory (garbage, empty files, directories, wrong names, flipped bits, wrong tokens, a file cut
//! at every byte), write failures injected with the `cache::write` failpoint, and a writer that is
//! stuck while `put` goes on.
//!
//! The failpoint registry is global to the process, so every test runs inside a `FailScenario`
//! (which also serialises them).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use fail::FailScenario;
use hearth_engine::disk_cache::{
    cache_namespace, model_identity, BlockHash, DiskCache, DiskCacheConfig, DiskCacheError,
};

const NS: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

fn cfg(dir: &Path, limit: u64) -> DiskCacheConfig {
    DiskCacheConfig {
        dir: dir.to_path_buf(),
        limit,
    }
}

fn open(dir: &Path, limit: u64) -> DiskCache {
    DiskCache::open(&cfg(dir, limit), NS).unwrap()
}

/// Block `i`: a hash, 4 tokens and a 40-byte payload, all derived from `i`.
fn block(i: u32) -> (BlockHash, Vec<u32>, Vec<u8>) {
    let h = xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes());
    let tokens = (0..4).map(|k| i * 10 + k).collect();
    let payload = (0..40u32).map(|k| (i * 7 + k) as u8).collect();
    (h, tokens, payload)
}

fn put(c: &DiskCache, i: u32) {
    let (h, t, p) = block(i);
    c.put(h, &t, p);
}

/// Whether block `i` reads back whole.
fn hit(c: &DiskCache, i: u32) -> bool {
    let (h, t, p) = block(i);
    match c.get(h, &t) {
        Some(got) => {
            assert_eq!(got, p, "a hit returns the bytes that were put");
            true
        }
        None => false,
    }
}

fn ns_dir(dir: &Path) -> PathBuf {
    dir.join(format!("{NS:032x}"))
}

fn file_of(dir: &Path, i: u32) -> PathBuf {
    ns_dir(dir).join(format!("{:032x}.blk", block(i).0))
}

/// Names in the namespace directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(ns_dir(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The bytes of block `i`'s file, as a cache writes it (made in a scratch directory).
fn file_bytes(i: u32) -> Vec<u8> {
    let scratch = tempfile::tempdir().unwrap();
    let c = open(scratch.path(), 1 << 20);
    put(&c, i);
    c.flush();
    fs::read(file_of(scratch.path(), i)).unwrap()
}

/// Bytes of one block's file.
fn file_size() -> u64 {
    file_bytes(0).len() as u64
}

#[test]
fn round_trip_and_contains() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), 1 << 20);
    let (h, t, _) = block(1);
    assert!(!c.contains(h));
    assert!(!hit(&c, 1));
    put(&c, 1);
    assert!(c.contains(h), "a queued block is contained");
    c.flush();
    assert!(c.contains(h));
    assert!(hit(&c, 1));
    // A second put of the same block is skipped.
    put(&c, 1);
    c.flush();
    let s = c.stats();
    assert_eq!((s.files, s.writes, s.hits, s.misses), (1, 1, 1, 1));
    assert_eq!(s.bytes, file_size());
    assert_eq!(listing(dir.path()), vec![format!("{h:032x}.blk")]);
    // Another token list under the same hash is not this block.
    let mut other = t.clone();
    other[0] += 1;
    assert_eq!(c.get(h, &other), None);
}

#[test]
fn restart_hits_the_same_bytes() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    {
        let c = open(dir.path(), 1 << 20);
        for i in 0..3 {
            put(&c, i);
        }
        // No flush: dropping the cache writes what is queued.
    }
    let c = open(dir.path(), 1 << 20);
    assert_eq!(c.stats().files, 3);
    for i in 0..3 {
        assert!(c.contains(block(i).0));
        assert!(hit(&c, i), "block {i} after a restart");
    }
}

#[test]
fn another_namespace_does_not_see_the_blocks() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let f16 = cache_namespace(42, "f16", "64 tokens");
    let q8 = cache_namespace(42, "q8_0", "64 tokens");
    let other_model = cache_namespace(43, "f16", "64 tokens");
    {
        let c = DiskCache::open(&cfg(dir.path(), 1 << 20), f16).unwrap();
        put(&c, 1);
    }
    for ns in [q8, other_model, NS] {
        let c = DiskCache::open(&cfg(dir.path(), 1 << 20), ns).unwrap();
        let (h, t, _) = block(1);
        assert!(!c.contains(h));
        assert_eq!(c.get(h, &t), None);
        assert_eq!(c.stats().files, 0);
    }
    let c = DiskCache::open(&cfg(dir.path(), 1 << 20), f16).unwrap();
    let (h, t, p) = block(1);
    assert_eq!(c.get(h, &t), Some(p), "the other namespaces left it alone");
}

#[test]
fn namespaces_and_identities_differ_where_they_should() {
    let _s = FailScenario::setup();
    assert_ne!(cache_namespace(1, "ab", "c"), cache_namespace(1, "a", "bc"));
    assert_ne!(
        cache_namespace(1, "f16", "x"),
        cache_namespace(2, "f16", "x")
    );
    assert_eq!(
        cache_namespace(1, "f16", "x"),
        cache_namespace(1, "f16", "x")
    );

    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.gguf");
    // Larger than the 16 MiB hashed whole, so the sampled pages count too (sparse: no disk used).
    let f = fs::File::create(&a).unwrap();
    f.set_len(26 << 20).unwrap();
    drop(f);
    let id = model_identity(&a).unwrap();
    let b = dir.path().join("copy.gguf");
    fs::copy(&a, &b).unwrap();
    assert_eq!(model_identity(&b).unwrap(), id, "a copy keeps its identity");
    // A byte in the head, the last byte (in the last sampled page), the size: each changes it.
    let patch = |at: u64| {
        let mut bytes = fs::read(&a).unwrap();
        bytes[at as usize] ^= 1;
        fs::write(&b, bytes).unwrap();
        model_identity(&b).unwrap()
    };
    assert_ne!(patch(100), id);
    assert_ne!(patch((26 << 20) - 1), id);
    let f = fs::OpenOptions::new().write(true).open(&b).unwrap();
    f.set_len(26 << 20).unwrap();
    drop(f);
    let small = dir.path().join("small.gguf");
    fs::write(&small, b"GGUF tiny").unwrap();
    assert_ne!(model_identity(&small).unwrap(), id);
    assert!(model_identity(&dir.path().join("missing.gguf")).is_err());
}

#[test]
fn lru_eviction_by_size() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = file_size();
    let c = open(dir.path(), 3 * s + s / 2);
    for i in 0..3 {
        put(&c, i);
    }
    c.flush();
    // Block 0 is used again, so block 1 is now the least recently used.
    assert!(hit(&c, 0));
    put(&c, 3);
    c.flush();
    assert!(!c.contains(block(1).0));
    assert!(!file_of(dir.path(), 1).exists());
    for i in [0, 2, 3] {
        assert!(hit(&c, i), "block {i} stays");
    }
    let st = c.stats();
    assert_eq!((st.files, st.bytes), (3, 3 * s));
    // A put of a block already on disk makes it the most recent: after the reads above the order
    // is 0, 2, 3; putting 0 again leaves 2 the least recently used.
    put(&c, 0);
    put(&c, 4);
    c.flush();
    assert!(!c.contains(block(2).0));
    assert!(c.contains(block(0).0));
    assert_eq!(listing(dir.path()).len(), 3);
}

#[test]
fn lru_order_survives_a_restart() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = file_size();
    {
        let c = open(dir.path(), 1 << 20);
        for i in 0..3 {
            put(&c, i);
        }
        c.flush();
        assert!(hit(&c, 0));
    }
    // Reopened with room for two: the least recently used (block 1) goes.
    let c = open(dir.path(), 2 * s + s / 2);
    assert!(!c.contains(block(1).0));
    assert!(!file_of(dir.path(), 1).exists());
    assert!(hit(&c, 0) && hit(&c, 2));
}

#[test]
fn a_block_larger_than_the_limit_is_not_written() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), file_size() - 1);
    put(&c, 1);
    c.flush();
    assert!(!c.contains(block(1).0));
    assert!(!hit(&c, 1));
    let st = c.stats();
    assert_eq!((st.files, st.writes, st.dropped), (0, 0, 1));
    assert!(listing(dir.path()).is_empty());
    // A cache of size zero works too, and stores nothing.
    let c = open(dir.path(), 0);
    put(&c, 1);
    c.flush();
    assert!(!hit(&c, 1));
}

#[test]
fn a_corrupt_directory_is_cleaned_at_open() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let nsd = ns_dir(dir.path());
    fs::create_dir_all(&nsd).unwrap();
    let name = |i: u32| format!("{:032x}.blk", block(i).0);
    fs::write(nsd.join("garbage.bin"), b"\x00\xffnot a block").unwrap();
    fs::write(nsd.join("notes.txt"), b"hello").unwrap();
    // An empty file, garbage and a directory under real names.
    fs::write(nsd.join(name(1)), b"").unwrap();
    fs::write(nsd.join(name(2)), [0xA5u8; 200]).unwrap();
    fs::create_dir_all(nsd.join(name(3)).join("inner")).unwrap();
    fs::write(nsd.join(name(3)).join("inner/x"), b"x").unwrap();
    // A valid file of block 5 under block 4's name.
    fs::write(nsd.join(name(4)), file_bytes(5)).unwrap();
    // Block 6 in uppercase hex (not a name the cache writes), and block 7 of another namespace.
    fs::write(nsd.join(name(6).to_uppercase()), file_bytes(6)).unwrap();
    let foreign = {
        let scratch = tempfile::tempdir().unwrap();
        let c = DiskCache::open(&cfg(scratch.path(), 1 << 20), NS ^ 1).unwrap();
        put(&c, 7);
        c.flush();
        let p = scratch
            .path()
            .join(format!("{:032x}", NS ^ 1))
            .join(name(7));
        fs::read(p).unwrap()
    };
    fs::write(nsd.join(name(7)), foreign).unwrap();
    // A temp file left by a crash mid-write, and a valid block that must survive.
    fs::write(
        nsd.join(format!("{:032x}.999.tmp", block(8).0)),
        b"HEARTHKV\x01",
    )
    .unwrap();
    fs::write(nsd.join(name(9)), file_bytes(9)).unwrap();

    let c = open(dir.path(), 1 << 20);
    assert_eq!(
        listing(dir.path()),
        vec![name(9)],
        "only the valid file is left"
    );
    let st = c.stats();
    assert_eq!((st.files, st.corrupt), (1, 8));
    assert!(hit(&c, 9));
    for i in 1..=8 {
        assert!(!c.contains(block(i).0));
        assert!(!hit(&c, i));
        put(&c, i);
    }
    c.flush();
    for i in 1..=9 {
        assert!(hit(&c, i), "block {i} works after the cleanup");
    }
}

/// Replaces block `i`'s file under an open cache that knows it, and checks the read is a miss that
/// removes the file, and that the block can be written and read again.
fn survives_replacement(c: &DiskCache, dir: &Path, i: u32, replace: impl FnOnce(&Path)) {
    let path = file_of(dir, i);
    replace(&path);
    assert!(c.contains(block(i).0));
    assert!(!hit(c, i), "a bad file is a miss");
    assert!(!path.exists(), "and is removed");
    assert!(!c.contains(block(i).0), "and forgotten");
    put(c, i);
    c.flush();
    assert!(hit(c, i), "and the block can be stored again");
}

#[test]
fn a_flipped_bit_anywhere_is_caught() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), 1 << 20);
    put(&c, 1);
    c.flush();
    let good = file_bytes(1);
    for at in 0..good.len() {
        survives_replacement(&c, dir.path(), 1, |p| {
            let mut b = good.clone();
            b[at] ^= 0x10;
            fs::write(p, b).unwrap();
        });
    }
    assert_eq!(c.stats().corrupt, good.len() as u64);
}

#[test]
fn a_file_cut_at_every_byte_is_skipped() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let good = file_bytes(1);
    // Cut under an open cache that knows the block: caught at `get`.
    {
        let c = open(dir.path(), 1 << 20);
        put(&c, 1);
        c.flush();
        for len in 0..good.len() {
            survives_replacement(&c, dir.path(), 1, |p| fs::write(p, &good[..len]).unwrap());
        }
    }
    // Cut before the cache opens: caught by the scan, or at `get`.
    for len in 0..good.len() {
        fs::write(file_of(dir.path(), 1), &good[..len]).unwrap();
        let c = open(dir.path(), 1 << 20);
        assert!(!hit(&c, 1), "cut at {len}");
        assert!(!file_of(dir.path(), 1).exists());
        put(&c, 1);
        c.flush();
        assert!(hit(&c, 1));
    }
}

#[test]
fn a_wrong_token_list_and_other_replacements_are_skipped() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), 1 << 20);
    put(&c, 1);
    c.flush();
    // Wrong tokens, same count and another count: a miss that drops the file.
    let (h, t, _) = block(1);
    let mut wrong = t.clone();
    wrong[3] ^= 1;
    for tokens in [wrong, t[..3].to_vec(), vec![]] {
        assert_eq!(c.get(h, &tokens), None);
        assert!(!file_of(dir.path(), 1).exists());
        put(&c, 1);
        c.flush();
        assert!(hit(&c, 1));
    }
    // A directory, another block's file and garbage where the file should be.
    survives_replacement(&c, dir.path(), 1, |p| {
        fs::remove_file(p).unwrap();
        fs::create_dir_all(p.join("sub")).unwrap();
    });
    survives_replacement(&c, dir.path(), 1, |p| fs::write(p, file_bytes(2)).unwrap());
    survives_replacement(&c, dir.path(), 1, |p| {
        fs::write(p, vec![0u8; 1 << 16]).unwrap()
    });
    // A file deleted behind the cache's back is a plain miss.
    fs::remove_file(file_of(dir.path(), 1)).unwrap();
    assert!(!hit(&c, 1));
    assert!(!c.contains(block(1).0));
}

#[test]
fn a_failed_write_is_lost_cleanly() {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let c = open(dir.path(), 1 << 20);
    fail::cfg("cache::write", "1*return").unwrap();
    put(&c, 1);
    c.flush();
    assert!(!c.contains(block(1).0));
    assert!(!hit(&c, 1));
    assert!(listing(dir.path()).is_empty(), "no file is left behind");
    let st = c.stats();
    assert_eq!((st.write_errors, st.writes, st.files), (1, 0, 0));
    // The next put succeeds.
    put(&c, 1);
    c.flush();
    assert!(hit(&c, 1));
    // A panic in the writer loses its block, not the writer.
    fail::cfg("cache::write", "1*panic").unwrap();
    put(&c, 2);
    c.flush();
    put(&c, 3);
    c.flush();
    assert!(!hit(&c, 2) && hit(&c, 3));
    let st = c.stats();
    assert_eq!((st.write_errors, st.writes, st.files), (2, 2, 2));
    assert_eq!(listing(dir.path()).len(), 2);
    scenario.teardown();
}

#[test]
fn put_does_not_wait_for_a_stuck_writer() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = file_size();
    let c = open(dir.path(), 3 * s + s / 2);
    // The writer reports when it reaches the failpoint and then waits there until released.
    let (reached_tx, reached) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let reached_tx = Mutex::new(reached_tx);
    let release_rx = Mutex::new(release_rx);
    fail::cfg_callback("cache::write", move || {
        let _ = reached_tx.lock().unwrap().send(());
        let _ = release_rx.lock().unwrap().recv();
    })
    .unwrap();
    put(&c, 0);
    reached.recv().unwrap();
    // The writer is stuck inside the write of block 0: puts still return at once.
    put(&c, 1);
    put(&c, 2);
    assert!(c.contains(block(1).0) && c.contains(block(2).0));
    // A queued block is served from memory.
    assert!(hit(&c, 1));
    // The queue is bounded by the limit (3.5 files): a fourth block is dropped.
    put(&c, 3);
    assert!(!c.contains(block(3).0));
    let st = c.stats();
    assert_eq!((st.writes, st.dropped), (0, 1));
    // Released, the writer catches up.
    fail::remove("cache::write");
    for _ in 0..3 {
        let _ = release.send(());
    }
    c.flush();
    let st = c.stats();
    assert_eq!((st.writes, st.files, st.write_errors), (3, 3, 0));
    for i in 0..3 {
        assert!(hit(&c, i));
    }
}

#[test]
fn concurrent_gets_and_puts() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let s = file_size();
    // Room for 8 of the 16 blocks, so evictions race with reads.
    let c = Arc::new(open(dir.path(), 8 * s));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut x = t.wrapping_mul(2_654_435_761).wrapping_add(1);
                for _ in 0..300 {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let i = x % 16;
                    if x & 0x100 == 0 {
                        put(&c, i);
                    } else {
                        hit(&c, i);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    c.flush();
    let st = c.stats();
    assert_eq!(st.corrupt, 0, "a reader never sees a half-written file");
    assert!(st.bytes <= 8 * s && st.files <= 8);
    assert_eq!(listing(dir.path()).len() as u64, st.files);
}

#[test]
fn a_directory_that_cannot_be_made_is_an_error_naming_it() {
    let _s = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in-the-way");
    fs::write(&file, b"x").unwrap();
    let bad = cfg(&file, 1 << 20);
    let e = bad.check().unwrap_err();
    assert!(matches!(e, DiskCacheError::Create { .. }), "{e}");
    assert!(e.to_string().contains("in-the-way"), "{e}");
    assert!(DiskCache::open(&bad, NS).is_err());
    assert!(cfg(&dir.path().join("new/sub"), 1).check().is_ok());
}
