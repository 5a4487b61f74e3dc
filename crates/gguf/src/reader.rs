//! [`Gguf`]: a parsed, validated GGUF file over a read-only memory map, a resident copy read into
//! huge-page memory ([`Gguf::open_resident`]), or an owned buffer.
//!
//! Layout (all little-endian):
//! ```text
//! magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv × (key: string, type: u32, value)
//! n_tensors × (name: string, n_dims: u32, dims: n_dims × u64, type: u32, offset: u64)
//! padding to `alignment` | tensor data (each tensor at data_offset + offset)
//! ```
//! where a string is a u64 length followed by that many UTF-8 bytes. Everything is validated at open, so
//! [`Gguf::tensor_data`] can hand out slices without further checks.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::GgufError;
use crate::parse::{Cursor, PREALLOC_CAP};
use crate::tensor::{check_layout, TensorInfo};
use crate::value::{Metadata, Value};
use crate::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, MAX_KV, MAX_NAME_LEN, MAX_TENSORS,
};

/// The file's bytes: a memory map of the file, an anonymous map the file was read into, or a vector
/// for tests and fuzzing.
enum Storage {
    Mmap(Mmap),
    Resident(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) | Storage::Resident(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// Bytes per read of [`Gguf::open_resident`], between two progress reports.
const READ_CHUNK: usize = 16 << 20;
/// Most threads [`Gguf::open_resident`] reads with.
#[cfg(unix)]
const READ_THREADS: usize = 8;

/// A GGUF file: header, metadata and tensor index parsed and checked; tensor data left in place.
pub struct Gguf {
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    /// Per tensor: whether [`Gguf::rewrite_tensors`] changed its bytes.
    rewritten: Vec<bool>,
}

/// Reads `file` from its start into `dst` (exactly `dst.len()` bytes) in [`READ_CHUNK`]s, on up to
/// [`READ_THREADS`] threads: most of the time goes to the kernel zeroing the fresh pages it maps in
/// (on a VM, to the host backing them), which runs on as many cores as fault. `progress(done, total)`
/// is called at 0, after each chunk the calling thread reads, and at the end.
#[cfg(unix)]
fn read_all(
    file: &File,
    dst: &mut [u8],
    progress: &mut dyn FnMut(u64, u64),
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Mutex;

    let total = dst.len() as u64;
    progress(0, total);
    let chunks = Mutex::new(dst.chunks_mut(READ_CHUNK).enumerate());
    let (done, failed) = (AtomicU64::new(0), AtomicBool::new(false));
    // Reads chunks until none are left or a reader failed; true if it read one.
    let read_one = || -> std::io::Result<bool> {
        let next = chunks.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some((i, chunk)) = next.filter(|_| !failed.load(Ordering::Relaxed)) else {
            return Ok(false);
        };
        let r = file.read_exact_at(chunk, (i * READ_CHUNK) as u64);
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        r?;
        done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(true)
    };
    let n_threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(READ_THREADS);
    let mut reported = 0;
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..n_threads)
            .map(|_| {
                scope.spawn(|| -> std::io::Result<()> {
                    while read_one()? {}
                    Ok(())
                })
            })
            .collect();
        let mut result = Ok(());
        loop {
            match read_one() {
                Ok(true) => {
                    let now = done.load(Ordering::Relaxed);
                    if now > reported {
                        reported = now;
                        progress(now, total);
                    }
                }
                Ok(false) => break,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        for h in helpers {
            let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            result = result.and(r);
        }
        result
    })?;
    if reported < total {
        progress(total, total);
    }
    Ok(())
}

/// [`read_all`] where positioned reads are not available: one thread, in order.
#[cfg(not(unix))]
fn read_all(
    mut file: &File,
    dst: &mut [u8],
    progress: &mut dyn FnMut(u64, u64),
) -> std::io::Result<()> {
    let total = dst.len() as u64;
    progress(0, total);
    let mut done = 0;
    for chunk in dst.chunks_mut(READ_CHUNK) {
        std::io::Read::read_exact(&mut file, chunk)?;
        done += chunk.len() as u64;
        progress(done, total);
    }
    Ok(())
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("len", &self.bytes().len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

// Models are shared across threads (one mapped file, many sessions).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Gguf>();
};

/// The smallest on-disk size of one metadata entry: key length, a 1-byte key, value type, 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 1 + 4 + 1;
/// The smallest on-disk size of one tensor info: name length, 1-byte name, n_dims, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 1 + 4 + 4 + 8;

impl Gguf {
    /// Maps `path` read-only and parses it.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let open_err = |error| GgufError::Open {
            path: path.to_owned(),
            error,
        };
        let file = File::open(path).map_err(open_err)?;
        // SAFETY: the map is read-only and private to this process. Like every mmap-based reader we
        // assume the file is not truncated or rewritten while mapped (a model file being served).
        let map = unsafe { Mmap::map(&file) }.map_err(open_err)?;
        Gguf::parse(Storage::Mmap(map))
    }

    /// Reads `path` whole into anonymous memory and parses it: the tensor data no longer depends on
    /// the page cache, and on Linux the memory is advised to be backed by transparent huge pages
    /// (`MADV_HUGEPAGE`), so streaming the weights costs one TLB entry per 2 MiB instead of per 4 KiB
    /// page. A decode step reads every weight once, and on 4 KiB pages of the page cache the hardware
    /// prefetchers stop at every page boundary; docs/perf/decode-kernels.md measures the difference.
    ///
    /// The file is validated through a memory map before anything is read, so a bad file fails as
    /// fast as with [`Gguf::open`]; the copy is then parsed again, so what is validated is what is
    /// held. `progress(done, total)` is called after each chunk of reading (and once at 0). The
    /// memory is the file's size, all of it resident: callers check it fits before choosing this.
    pub fn open_resident(
        path: impl AsRef<Path>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let open_err = |error| GgufError::Open {
            path: path.to_owned(),
            error,
        };
        let file = File::open(path).map_err(open_err)?;
        let len = Gguf::open(path)?.bytes().len();
        let mut copy = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(open_err)?;
        // Advice only: a kernel without transparent huge pages refuses it, and 4 KiB pages still work.
        #[cfg(target_os = "linux")]
        let _ = copy.advise(memmap2::Advice::HugePage);
        // A file cut short since it was validated fails here (`UnexpectedEof`).
        read_all(&file, &mut copy, progress).map_err(open_err)?;
        Gguf::parse(Storage::Resident(copy.make_read_only().map_err(open_err)?))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Gguf::parse(Storage::Owned(bytes))
    }

    /// Whether the bytes were read into memory ([`Gguf::open_resident`]) rather than mapped.
    pub fn is_resident(&self) -> bool {
        matches!(self.storage, Storage::Resident(_))
    }

    fn parse(storage: Storage) -> Result<Gguf, GgufError> {
        let bytes = storage.bytes();
        let mut c = Cursor::new(bytes);

        let magic: [u8; 4] = c.take(4, || "magic".into())?.try_into().unwrap_or_default();
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32(|| "version".into())?;
        if !matches!(version, 2 | 3) {
            let swapped = version.swap_bytes();
            if matches!(swapped, 2 | 3) {
                return Err(GgufError::BigEndian {
                    raw: version,
                    swapped,
                });
            }
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors_at = c.pos();
        let n_tensors_raw = c.u64(|| "tensor count".into())?;
        let n_kv = c.count(MIN_KV_SIZE, MAX_KV, &|| "metadata entries".into())?;
        // The tensor count is checked after the KV count has been read, against the bytes left then.
        let n_tensors = c.check_count(
            n_tensors_raw,
            n_tensors_at,
            MIN_TENSOR_INFO_SIZE,
            MAX_TENSORS,
            &|| "tensor infos".into(),
        )?;

        let mut metadata = Metadata::new();
        for i in 0..n_kv {
            let at = c.pos();
            let key = c.key(i)?;
            let ty = c.value_type(&key)?;
            let value = c.value(&key, ty, 0)?;
            if let Err(_dup) = metadata.insert(key.clone(), value) {
                return Err(GgufError::DuplicateKey { key, offset: at });
            }
        }

        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(Value::U32(a)) => return Err(GgufError::InvalidAlignment(u64::from(*a))),
            Some(v) => {
                return Err(GgufError::AlignmentType {
                    found: v.type_name(),
                })
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC_CAP));
        let mut by_name = HashMap::with_capacity(n_tensors.min(PREALLOC_CAP));
        for index in 0..n_tensors {
            let t = read_tensor_info(&mut c, index)?;
            if by_name.insert(t.name.clone(), index).is_some() {
                return Err(GgufError::DuplicateTensor { name: t.name });
            }
            tensors.push(t);
        }

        // The data section starts at the next multiple of the alignment after the header.
        let header_end = c.pos();
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        check_layout(&tensors, data_offset, alignment, file_len)?;

        Ok(Gguf {
            storage,
            version,
            alignment,
            data_offset,
            metadata,
            rewritten: vec![false; tensors.len()],
            tensors,
            by_name,
        })
    }

    /// Format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section: the header's end rounded up to the alignment.
    /// A file with no tensors may end before it (llama.cpp's vocabulary-only files are not padded).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor index, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Lets `f` rewrite the data of each tensor in place, once, for files read into memory
    /// ([`Gguf::open_resident`]): a loader laying out weights for its kernels without a second
    /// copy. `f` returns whether it changed the bytes; [`Gguf::is_rewritten`] then says so, since
    /// [`Gguf::tensor_data`] no longer holds the file's bytes for that tensor. Returns how many
    /// were rewritten; a mapped or owned file is left as it is (0). No two tensors' data overlap
    /// (checked at parse), so each rewrite sees only its own bytes.
    pub fn rewrite_tensors(
        &mut self,
        f: &mut dyn FnMut(&TensorInfo, &mut [u8]) -> bool,
    ) -> Result<usize, GgufError> {
        let Storage::Resident(_) = self.storage else {
            return Ok(0);
        };
        let Storage::Resident(map) =
            std::mem::replace(&mut self.storage, Storage::Owned(Vec::new()))
        else {
            unreachable!("matched above")
        };
        let open_err = |error| GgufError::Open {
            path: "(weights read into memory)".into(),
            error,
        };
        // The pages were made read-only after reading; writable for the rewrite, then read-only
        // again (the same pages: `mprotect`, no copy).
        let mut map = map.make_mut().map_err(open_err)?;
        let mut n = 0;
        for (t, done) in self.tensors.iter().zip(&mut self.rewritten) {
            let range = usize::try_from(t.abs_offset(self.data_offset))
                .ok()
                .zip(usize::try_from(t.n_bytes).ok())
                .and_then(|(s, len)| Some(s..s.checked_add(len)?))
                .filter(|r| r.end <= map.len());
            let Some(range) = range else { continue };
            if !*done && f(t, &mut map[range]) {
                *done = true;
                n += 1;
            }
        }
        self.storage = Storage::Resident(map.make_read_only().map_err(open_err)?);
        Ok(n)
    }

    /// How many tensors [`Gguf::rewrite_tensors`] changed.
    pub fn n_rewritten(&self) -> usize {
        self.rewritten.iter().filter(|&&r| r).count()
    }

    /// Whether [`Gguf::rewrite_tensors`] changed the data of `t` (then no longer the file's bytes).
    pub fn is_rewritten(&self, t: &TensorInfo) -> bool {
        self.by_name
            .get(&t.name)
            .is_some_and(|&i| self.rewritten[i])
    }

    /// The data of `t`, zero-copy. `t` should come from this file; for a foreign `TensorInfo` whose
    /// range does not lie inside this file an empty slice is returned rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.range(t.abs_offset(self.data_offset), t.n_bytes)
    }

    /// Expert `expert` of a stacked expert tensor with dims `[cols, rows, n_expert]` (ne0, ne1, ne2):
    /// the contiguous `rows × row_bytes` bytes of that expert.
    pub fn expert_slice(&self, t: &TensorInfo, expert: usize) -> Result<&[u8], GgufError> {
        if t.dims.len() != 3 {
            return Err(GgufError::NotStacked {
                name: t.name.clone(),
                dims: t.dims.clone(),
            });
        }
        let n_expert = t.ne(2);
        if expert as u64 >= n_expert {
            return Err(GgufError::ExpertOutOfRange {
                name: t.name.clone(),
                expert,
                n_expert,
            });
        }
        // n_bytes = n_expert * per_expert exactly, so neither product overflows.
        let per_expert = t.n_bytes / n_expert;
        let start = t
            .abs_offset(self.data_offset)
            .saturating_add(per_expert * expert as u64);
        Ok(self.range(start, per_expert))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    fn range(&self, start: u64, len: u64) -> &[u8] {
        let bytes = self.bytes();
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(s, n)| bytes.get(s..s.checked_add(n)?))
            .unwrap_or(&[])
    }
}

fn read_tensor_info(c: &mut Cursor<'_>, index: usize) -> Result<TensorInfo, GgufError> {
    let name = c.string(MAX_NAME_LEN, &|| format!("name of tensor #{index}"))?;
    if name.is_empty() {
        return Err(GgufError::EmptyTensorName { index });
    }
    let n_dims = c.u32(|| format!("n_dims of tensor {name:?}"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for i in 0..n_dims {
        dims.push(c.u64(|| format!("dim {i} of tensor {name:?}"))?);
    }
    let type_id = c.u32(|| format!("type of tensor {name:?}"))?;
    let Some(ty) = hearth_quant::GgmlType::from_u32(type_id) else {
        return Err(GgufError::UnknownTensorType { name, type_id });
    };
    let offset = c.u64(|| format!("offset of tensor {name:?}"))?;
    TensorInfo::new(name, ty, dims, offset)
}
