//! The disk tier of the KV prefix cache: full blocks of the paged pool, each in its own file under
//! `dir/<namespace as 32 hex>/<block hash as 32 hex>.blk`, bounded in bytes with LRU eviction, and
//! read back after the block left RAM or after a restart.
//!
//! - **Keys.** A block is named by its hash chain (`h_i = xxh3_128(h_{i-1} ‖ the block's tokens)`),
//!   and a file also stores the block's tokens, which [`DiskCache::get`] compares with the caller's.
//!   The namespace (model identity, KV type, payload layout; see [`cache_namespace`]) picks the
//!   directory, so blocks of another model or KV type are never seen.
//! - **Writes never block the caller.** [`DiskCache::put`] hands the block to one writer thread
//!   through a queue bounded in bytes (past it a block is dropped and counted). The writer writes a
//!   temp file (`<hash>.<pid>.tmp`) in the same directory and renames it, so a crash never leaves a
//!   half file under a real name; temp files left by a crash are deleted at the next open. There
//!   is no fsync: after a power loss a torn file fails its checksum and is dropped, and a lost
//!   file only costs a recompute.
//! - **Every read is verified** (magic, version, namespace, hash, tokens, lengths, checksum; the
//!   format is in `format.rs`). A bad file is warned about, deleted and forgotten, and the read is
//!   a miss. Nothing found on disk makes this module panic or allocate more than the file holds.
//! - **LRU.** In memory, a tick per file; on disk, the mtime (set when written and at each hit),
//!   which orders the files at the next open. The limit counts whole files of this namespace's
//!   directory; other namespaces' directories are left alone (open reports how many there are
//!   and their size: after an upgrade that changed the block layout, the old build's blocks).
//! - **The namespace directory belongs to the cache.** Anything in it that is not a valid cache
//!   file of this namespace is deleted at open. One process should use a directory at a time (a
//!   second one would delete the first's temp files at open; the checksums keep both correct).

mod dir;
mod format;
mod identity;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{self, File};
use std::io;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::SystemTime;

pub use identity::{cache_namespace, model_identity};

use dir::{file_name, other_namespaces, prepare_dir, remove_any, scan};
use format::Invalid;

/// The hash chain of a block: `h_i = xxh3_128(h_{i-1} as 16 LE bytes ‖ its token ids as u32 LE)`,
/// `h_{-1} = 0`.
pub type BlockHash = u128;

/// Most bytes of files waiting for the writer; a put past this (or past the disk limit, if
/// smaller) is dropped, so a slow disk costs cache hits, never memory or the step loop's time.
const QUEUE_LIMIT: u64 = 256 << 20;

/// Where the disk tier lives and how large it may grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// Directory holding one subdirectory per namespace.
    pub dir: PathBuf,
    /// Most bytes of cache files on disk, per namespace.
    pub limit: u64,
}

impl DiskCacheConfig {
    /// Creates `dir` if needed and checks that a file can be written in it, so a bad `--cache-dir`
    /// is refused at start rather than failing each write.
    pub fn check(&self) -> Result<(), DiskCacheError> {
        prepare_dir(&self.dir)
    }
}

/// Why the disk tier cannot run. The caller logs it and runs without the disk tier, or refuses.
/// The message names the directory and says what the OS said (it is not repeated as a `source`).
#[derive(Debug, thiserror::Error)]
pub enum DiskCacheError {
    /// The directory does not exist and cannot be made (or a file is in its place).
    #[error("cannot create the cache directory {}: {error}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// The directory cannot be listed.
    #[error("cannot read the cache directory {}: {error}", path.display())]
    Read {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// No file can be created in the directory.
    #[error("cannot write in the cache directory {}: {error}", path.display())]
    Write {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
    /// The writer thread could not be started.
    #[error("cannot start the disk cache writer: {0}")]
    Thread(io::Error),
}

/// Counters of a [`DiskCache`] since it was opened (`files` and `bytes`: now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Cache files on disk.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// `get`s that returned a block (from disk, or from the write queue).
    pub hits: u64,
    /// `get`s that returned None (corrupt files included).
    pub misses: u64,
    /// Files written.
    pub writes: u64,
    /// Writes that failed (the block is not on disk; the cache goes on).
    pub write_errors: u64,
    /// Blocks not written: the write queue was full, or the block alone is larger than the limit.
    pub dropped: u64,
    /// Bad files found and deleted, at open or at `get`.
    pub corrupt: u64,
}

/// The disk tier: see the module documentation. `Send + Sync`; dropping it writes what is queued
/// and joins the writer.
pub struct DiskCache {
    inner: Arc<Inner>,
    writer: Option<JoinHandle<()>>,
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DiskCache>();
};

struct Inner {
    /// `dir/<namespace>`.
    dir: PathBuf,
    namespace: u128,
    limit: u64,
    /// min(QUEUE_LIMIT, limit).
    queue_limit: u64,
    state: Mutex<State>,
    /// Wakes the writer: a block was queued, or shutdown.
    work: Condvar,
    /// Wakes `flush`: the queue is empty.
    idle: Condvar,
}

/// A file on disk.
struct Entry {
    /// Bytes of the whole file.
    size: u64,
    /// Its place in `State::lru`.
    tick: u64,
    /// Tells this file from a later one of the same hash.
    gen: u64,
}

/// A block waiting for the writer.
struct Pending {
    tokens: Vec<u32>,
    payload: Vec<u8>,
    /// Bytes of its file.
    size: u64,
}

#[derive(Default)]
struct State {
    files: HashMap<BlockHash, Entry>,
    /// tick → hash, least recently used first.
    lru: BTreeMap<u64, BlockHash>,
    clock: u64,
    /// Sum of `files`' sizes.
    bytes: u64,
    pending: HashMap<BlockHash, Arc<Pending>>,
    /// Write order of `pending`.
    order: VecDeque<BlockHash>,
    /// Sum of `pending`'s sizes.
    pending_bytes: u64,
    shutdown: bool,
    stats: DiskStats,
}

impl State {
    fn insert(&mut self, h: BlockHash, size: u64) {
        self.clock += 1;
        let tick = self.clock;
        if let Some(old) = self.files.insert(
            h,
            Entry {
                size,
                tick,
                gen: tick,
            },
        ) {
            self.lru.remove(&old.tick);
            self.bytes = self.bytes.saturating_sub(old.size);
        }
        self.lru.insert(tick, h);
        self.bytes = self.bytes.saturating_add(size);
    }

    /// Marks file `h` most recently used, if it is still the one read (`gen`).
    fn touch(&mut self, h: BlockHash, gen: u64) {
        self.clock += 1;
        let tick = self.clock;
        if let Some(e) = self.files.get_mut(&h) {
            if e.gen == gen {
                self.lru.remove(&e.tick);
                e.tick = tick;
                self.lru.insert(tick, h);
            }
        }
    }

    /// Forgets file `h` if it is still the one read (`gen`).
    fn forget(&mut self, h: BlockHash, gen: u64) {
        if self.files.get(&h).is_some_and(|e| e.gen == gen) {
            if let Some(e) = self.files.remove(&h) {
                self.lru.remove(&e.tick);
                self.bytes = self.bytes.saturating_sub(e.size);
            }
        }
    }

    /// Forgets the least recently used file and returns it (for the caller to delete).
    fn pop_lru(&mut self) -> Option<BlockHash> {
        let (_, h) = self.lru.pop_first()?;
        if let Some(e) = self.files.remove(&h) {
            self.bytes = self.bytes.saturating_sub(e.size);
        }
        Some(h)
    }

    /// Forgets least recently used files until `extra` more bytes fit under `limit`.
    fn make_room(&mut self, limit: u64, extra: u64) -> Vec<BlockHash> {
        let mut victims = Vec::new();
        while self.bytes.saturating_add(extra) > limit {
            match self.pop_lru() {
                Some(h) => victims.push(h),
                None => break,
            }
        }
        victims
    }
}

/// Writes `job` to `tmp`. On an error the caller deletes `tmp`.
fn write_tmp(tmp: &Path, namespace: u128, h: BlockHash, job: &Pending) -> io::Result<()> {
    let mut f = File::create(tmp)?;
    format::write_block(&mut f, namespace, h, &job.tokens, &job.payload)?;
    // Set here, the mtime orders files written in a burst at the next open; the kernel's own
    // timestamps are only as fine as its tick.
    let _ = f.set_modified(SystemTime::now());
    fail::fail_point!("cache::write", |_| Err(io::Error::other(
        "failpoint cache::write"
    )));
    Ok(())
}

/// Why a read found no block.
enum ReadMiss {
    /// The file is gone (evicted meanwhile, or deleted by someone else).
    Gone,
    /// The file is bad; it is deleted.
    Bad(Invalid),
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, h: BlockHash) -> PathBuf {
        self.dir.join(file_name(h))
    }

    /// Where block `h` is written before its rename; the pid keeps two processes apart.
    fn tmp_path(&self, h: BlockHash) -> PathBuf {
        self.dir
            .join(format!("{h:032x}.{}.tmp", std::process::id()))
    }

    /// Deletes files that were forgotten to make room.
    fn delete(&self, victims: Vec<BlockHash>) {
        for h in victims {
            tracing::debug!("disk cache: evicting block {h:032x}");
            remove_any(&self.path(h));
        }
    }

    /// Writes one block: room first, then the temp file, then the rename.
    fn write(&self, h: BlockHash, job: &Pending) -> io::Result<()> {
        let victims = self.lock().make_room(self.limit, job.size);
        self.delete(victims);
        let tmp = self.tmp_path(h);
        let r =
            write_tmp(&tmp, self.namespace, h, job).and_then(|()| fs::rename(&tmp, self.path(h)));
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    fn read(&self, h: BlockHash, tokens: &[u32]) -> Result<Vec<u8>, ReadMiss> {
        let mut f = match File::open(self.path(h)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadMiss::Gone),
            Err(e) => return Err(ReadMiss::Bad(Invalid::Io(e))),
        };
        let len = f
            .metadata()
            .map_err(|e| ReadMiss::Bad(Invalid::Io(e)))?
            .len();
        let payload =
            format::read_block(&mut f, len, self.namespace, h, tokens).map_err(ReadMiss::Bad)?;
        // The on-disk half of the LRU touch; a failure only costs order after a restart.
        let _ = f.set_modified(SystemTime::now());
        Ok(payload)
    }
}

/// The writer thread: one block at a time, in the order they were put, until shutdown and an
/// empty queue.
fn writer(inner: Arc<Inner>) {
    loop {
        let (h, job) = {
            let mut st = inner.lock();
            loop {
                if let Some(h) = st.order.pop_front() {
                    if let Some(job) = st.pending.get(&h) {
                        break (h, job.clone());
                    }
                    continue;
                }
                if st.shutdown {
                    return;
                }
                st = inner.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        // A panic (a failpoint, a bug) loses this block, not the writer.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| inner.write(h, &job)));
        let mut st = inner.lock();
        st.pending.remove(&h);
        st.pending_bytes = st.pending_bytes.saturating_sub(job.size);
        let failed = match result {
            Ok(Ok(())) => {
                st.insert(h, job.size);
                st.stats.writes += 1;
                None
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => {
                let _ = fs::remove_file(inner.tmp_path(h));
                Some("the writer panicked".to_string())
            }
        };
        if failed.is_some() {
            st.stats.write_errors += 1;
        }
        if st.pending.is_empty() {
            inner.idle.notify_all();
        }
        drop(st);
        if let Some(why) = failed {
            tracing::warn!("disk cache: cannot write block {h:032x}: {why}");
        }
    }
}

impl DiskCache {
    /// Opens the cache of `namespace` (what makes blocks interchangeable: the caller passes
    /// [`cache_namespace`] of the model identity, KV type and block layout) in
    /// `cfg.dir/<namespace as 32 hex>/`. Scans that directory (headers only, not payloads),
    /// deletes what is not a valid cache file (with a warning), orders the rest LRU by mtime and
    /// evicts down to `cfg.limit`. Errors only if the directory cannot be created, read or
    /// written.
    pub fn open(cfg: &DiskCacheConfig, namespace: u128) -> Result<DiskCache, DiskCacheError> {
        let dir = cfg.dir.join(format!("{namespace:032x}"));
        prepare_dir(&dir)?;
        let mut state = State::default();
        let mut found = scan(&dir, namespace, &mut state.stats)?;
        found.sort_by_key(|f| (f.mtime, f.hash));
        for f in &found {
            state.insert(f.hash, f.size);
        }
        let victims = state.make_room(cfg.limit, 0);
        let inner = Arc::new(Inner {
            dir,
            namespace,
            limit: cfg.limit,
            queue_limit: QUEUE_LIMIT.min(cfg.limit),
            state: Mutex::new(state),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        inner.delete(victims);
        let w = inner.clone();
        let writer = std::thread::Builder::new()
            .name("hearth-disk-cache".into())
            .spawn(move || writer(w))
            .map_err(DiskCacheError::Thread)?;
        let st = inner.lock();
        tracing::info!(
            "disk cache {}: {} blocks, {} MiB of {} MiB",
            inner.dir.display(),
            st.files.len(),
            st.bytes >> 20,
            cfg.limit >> 20
        );
        drop(st);
        let (others, bytes) = other_namespaces(&cfg.dir, namespace);
        if others > 0 {
            let dirs = if others == 1 {
                "directory"
            } else {
                "directories"
            };
            tracing::info!(
                "disk cache {}: {others} other cache {dirs} ({} MiB) for other models, KV types \
                 or another build's block layout; not read by this one and not deleted",
                cfg.dir.display(),
                bytes >> 20
            );
        }
        Ok(DiskCache {
            inner,
            writer: Some(writer),
        })
    }

    /// Whether block `h` is on disk or queued for writing.
    pub fn contains(&self, h: BlockHash) -> bool {
        let st = self.inner.lock();
        st.files.contains_key(&h) || st.pending.contains_key(&h)
    }

    /// Queues block `h` (its `tokens` and `payload`) for the writer, without waiting for any I/O.
    /// Skips a block already on disk or queued (it counts as used now). Drops (counts, debug-logs)
    /// a block past the queue's bound or larger than the whole limit.
    pub fn put(&self, h: BlockHash, tokens: &[u32], payload: Vec<u8>) {
        let size = format::file_len(tokens.len() as u64, payload.len() as u64);
        let fits_format =
            tokens.len() <= format::MAX_TOKENS && payload.len() as u64 <= format::MAX_PAYLOAD;
        let mut st = self.inner.lock();
        if let Some(e) = st.files.get(&h) {
            let gen = e.gen;
            st.touch(h, gen);
            return;
        }
        if st.pending.contains_key(&h) {
            return;
        }
        let size = match size {
            Some(s) if fits_format && s <= self.inner.limit => s,
            _ => {
                st.stats.dropped += 1;
                drop(st);
                tracing::debug!("disk cache: block {h:032x} is larger than the disk limit");
                return;
            }
        };
        if st.pending_bytes.saturating_add(size) > self.inner.queue_limit {
            st.stats.dropped += 1;
            drop(st);
            tracing::debug!("disk cache: write queue full, block {h:032x} dropped");
            return;
        }
        st.pending_bytes += size;
        st.pending.insert(
            h,
            Arc::new(Pending {
                tokens: tokens.to_vec(),
                payload,
                size,
            }),
        );
        st.order.push_back(h);
        drop(st);
        self.inner.work.notify_one();
    }

    /// The payload of block `h`, read and verified (magic, version, namespace, hash, tokens equal
    /// to `tokens`, lengths, checksum), or a copy of it while it waits to be written. On any
    /// mismatch the file is deleted and forgotten (with a warning) and this is a miss. A hit
    /// makes the block the most recently used.
    pub fn get(&self, h: BlockHash, tokens: &[u32]) -> Option<Vec<u8>> {
        let mut st = self.inner.lock();
        if let Some(p) = st.pending.get(&h).cloned() {
            let hit = p.tokens == tokens;
            if hit {
                st.stats.hits += 1;
            } else {
                st.stats.misses += 1;
            }
            drop(st);
            return hit.then(|| p.payload.clone());
        }
        let Some(gen) = st.files.get(&h).map(|e| e.gen) else {
            st.stats.misses += 1;
            return None;
        };
        drop(st);
        let read = self.inner.read(h, tokens);
        if let Err(ReadMiss::Bad(why)) = &read {
            let path = self.inner.path(h);
            tracing::warn!("disk cache: deleting {}: {why}", path.display());
            remove_any(&path);
        }
        let mut st = self.inner.lock();
        match read {
            Ok(payload) => {
                st.touch(h, gen);
                st.stats.hits += 1;
                Some(payload)
            }
            Err(miss) => {
                st.forget(h, gen);
                st.stats.misses += 1;
                if let ReadMiss::Bad(_) = miss {
                    st.stats.corrupt += 1;
                }
                None
            }
        }
    }

    /// Waits until every queued write is done (tests, shutdown).
    pub fn flush(&self) {
        let mut st = self.inner.lock();
        while !st.pending.is_empty() {
            st = self.inner.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The counters, and the files and bytes on disk now.
    pub fn stats(&self) -> DiskStats {
        let st = self.inner.lock();
        DiskStats {
            files: st.files.len() as u64,
            bytes: st.bytes,
            ..st.stats
        }
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.work.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
