//! Writing GGUF files, streamed: metadata and tensor infos are declared first (so every offset is known),
//! the header is written, then each tensor's data in declaration order, in as many chunks as the caller
//! likes. Nothing but the header is held in memory, so a generator can write an 18 GB model.
//!
//! ```
//! use hearth_gguf::{Gguf, GgufWriter, Value};
//! use hearth_quant::GgmlType;
//!
//! let mut w = GgufWriter::new(Vec::new());
//! w.add_kv("general.architecture", Value::String("llama".into()))?;
//! w.add_tensor("a", GgmlType::F32, &[2, 2])?;
//! w.write_header()?;
//! w.write_tensor_data(&[0u8; 8])?; // a chunk: first two floats
//! w.write_tensor_data(&[0u8; 8])?; // the rest of `a`
//! let bytes = w.finish()?;
//! let g = Gguf::from_bytes(bytes)?;
//! assert_eq!(g.tensor("a").unwrap().n_bytes, 16);
//! # Ok::<(), hearth_gguf::GgufError>(())
//! ```
//!
//! [`GgufBuilder`] wraps the writer to build a whole file in memory for tests.

use std::io::Write;

use hearth_quant::GgmlType;

use crate::error::GgufError;
use crate::tensor::TensorInfo;
use crate::value::{Array, Metadata, Value};
use crate::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_KEY_LEN, MAX_NAME_LEN, MAX_NESTING};

/// Where the writer is in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Declaring KVs and tensors; nothing written yet.
    Declaring,
    /// Header written; expecting data of tensor `index`, of which `written` bytes have arrived.
    Data { index: usize, written: u64 },
}

/// A streaming GGUF writer over any [`Write`] (wrap files in a `BufWriter`).
pub struct GgufWriter<W: Write> {
    w: W,
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    /// Relative offset for the next declared tensor (always a multiple of the alignment).
    next_offset: u64,
    state: State,
}

fn misuse(msg: impl Into<String>) -> GgufError {
    GgufError::WriterMisuse(msg.into())
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_next_multiple_of(a)
}

impl<W: Write> GgufWriter<W> {
    /// A GGUF v3 writer with the default alignment (32).
    pub fn new(w: W) -> GgufWriter<W> {
        GgufWriter {
            w,
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Metadata::new(),
            tensors: Vec::new(),
            next_offset: 0,
            state: State::Declaring,
        }
    }

    fn declaring(&self, what: &str) -> Result<(), GgufError> {
        match self.state {
            State::Declaring => Ok(()),
            _ => Err(misuse(format!("{what} after write_header"))),
        }
    }

    /// Writes version 2 or 3 (v2 differs from v3 only in the version field).
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        self.declaring("set_version")?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        self.version = version;
        Ok(())
    }

    /// Sets the alignment and records it as `general.alignment`. Must come before any tensor.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        self.add_kv(ALIGNMENT_KEY, Value::U32(alignment))
    }

    /// Adds a metadata pair. Keys must be non-empty and unique; `general.alignment` must be a power-of-two
    /// u32 declared before any tensor.
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        self.declaring("add_kv")?;
        let key = key.into();
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: 0 });
        }
        if key.len() as u64 > MAX_KEY_LEN {
            return Err(misuse(format!(
                "key of {} bytes is longer than {MAX_KEY_LEN}",
                key.len()
            )));
        }
        if let Value::Array(a) = &value {
            if depth(a) > MAX_NESTING {
                return Err(GgufError::NestingTooDeep {
                    key,
                    max: MAX_NESTING,
                    offset: 0,
                });
            }
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => {
                    if !self.tensors.is_empty() {
                        return Err(misuse(
                            "general.alignment must be set before the first tensor",
                        ));
                    }
                    self.alignment = u64::from(a);
                }
                Value::U32(a) => return Err(GgufError::InvalidAlignment(u64::from(a))),
                ref v => {
                    return Err(GgufError::AlignmentType {
                        found: v.type_name(),
                    })
                }
            }
        }
        self.metadata
            .insert(key.clone(), value)
            .map_err(|_| GgufError::DuplicateKey { key, offset: 0 })
    }

    /// Declares the next tensor (data must later be written in declaration order) and returns its info,
    /// offset included.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<&TensorInfo, GgufError> {
        self.declaring("add_tensor")?;
        let name = name.into();
        if name.is_empty() {
            return Err(GgufError::EmptyTensorName {
                index: self.tensors.len(),
            });
        }
        if name.len() as u64 > MAX_NAME_LEN {
            return Err(misuse(format!(
                "tensor name of {} bytes is longer than {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let t = TensorInfo::new(name, ty, dims.to_vec(), self.next_offset)?;
        let next = t
            .offset
            .checked_add(t.n_bytes)
            .and_then(|e| align_up(e, self.alignment));
        self.next_offset = next.ok_or_else(|| GgufError::ByteSizeOverflow {
            name: t.name.clone(),
            ty,
            dims: t.dims.clone(),
        })?;
        self.tensors.push(t);
        Ok(self.tensors.last().expect("just pushed"))
    }

    /// The tensors declared so far.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The metadata declared so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The header bytes: magic, version, counts, metadata and tensor infos (without the padding up to the
    /// data section).
    fn header(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&GGUF_MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut b, k);
            b.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut b, v);
        }
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&(t.ty as u32).to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        b
    }

    /// Absolute offset the data section will have (the header length, padded).
    pub fn data_offset(&self) -> u64 {
        (self.header().len() as u64).next_multiple_of(self.alignment)
    }

    /// Writes the header. After this, only [`GgufWriter::write_tensor_data`] and
    /// [`GgufWriter::finish`] may be called.
    pub fn write_header(&mut self) -> Result<(), GgufError> {
        self.declaring("write_header")?;
        let h = self.header();
        self.w.write_all(&h)?;
        let len = h.len() as u64;
        write_zeros(&mut self.w, len.next_multiple_of(self.alignment) - len)?;
        self.state = State::Data {
            index: 0,
            written: 0,
        };
        self.skip_empty();
        Ok(())
    }

    /// Moves past tensors with no data: they need no bytes and no padding.
    fn skip_empty(&mut self) {
        if let State::Data { index, written: 0 } = &mut self.state {
            while self.tensors.get(*index).is_some_and(|t| t.n_bytes == 0) {
                *index += 1;
            }
        }
    }

    /// Appends `bytes` to the data of the current tensor (the first declared tensor whose data is not
    /// complete). A chunk may not run past the end of its tensor; once a tensor is complete the padding
    /// to the alignment is written and the next tensor begins.
    pub fn write_tensor_data(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let State::Data { index, written } = self.state else {
            return Err(misuse("write_tensor_data before write_header"));
        };
        // Empty tensors are skipped as soon as they are reached, so their (empty) data may be "written"
        // at any time, even after the last tensor (found by fuzzing: a file ending in an empty tensor).
        if bytes.is_empty() {
            return Ok(());
        }
        let Some(t) = self.tensors.get(index) else {
            return Err(misuse(format!(
                "write_tensor_data with {} bytes but every tensor is complete",
                bytes.len()
            )));
        };
        let left = t.n_bytes - written;
        if bytes.len() as u64 > left {
            return Err(misuse(format!(
                "tensor {:?}: chunk of {} bytes but only {left} of its {} bytes remain",
                t.name,
                bytes.len(),
                t.n_bytes
            )));
        }
        let (n_bytes, alignment) = (t.n_bytes, self.alignment);
        self.w.write_all(bytes)?;
        let written = written + bytes.len() as u64;
        if written == n_bytes {
            let pad = n_bytes.next_multiple_of(alignment) - n_bytes;
            write_zeros(&mut self.w, pad)?;
            self.state = State::Data {
                index: index + 1,
                written: 0,
            };
            self.skip_empty();
        } else {
            self.state = State::Data { index, written };
        }
        Ok(())
    }

    /// Checks every tensor's data was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        match self.state {
            State::Declaring => return Err(misuse("finish before write_header")),
            State::Data { index, written } => {
                if let Some(t) = self.tensors.get(index) {
                    return Err(misuse(format!(
                        "finish with tensor {:?} at {written} of {} bytes",
                        t.name, t.n_bytes
                    )));
                }
            }
        }
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Writes `n` zero bytes without allocating `n` bytes (an alignment may be as large as 2^31).
fn write_zeros(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64);
        w.write_all(&ZEROS[..k as usize])?;
        n -= k;
    }
    Ok(())
}

/// Nesting depth of an array: 1 for an array of scalars.
fn depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(depth).max().unwrap_or(0),
        _ => 1,
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(b, a)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

/// Builds a whole GGUF file in memory: for tests and small fixtures.
///
/// ```
/// use hearth_gguf::{GgufBuilder, Value};
/// use hearth_quant::GgmlType;
///
/// let bytes = GgufBuilder::new()
///     .kv("general.architecture", Value::String("qwen3".into()))
///     .tensor("w", GgmlType::F32, &[4], vec![0; 16])
///     .build()?;
/// assert_eq!(&bytes[..4], b"GGUF");
/// # Ok::<(), hearth_gguf::GgufError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufBuilder {
    version: Option<u32>,
    kvs: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

impl GgufBuilder {
    /// An empty v3 file.
    pub fn new() -> GgufBuilder {
        GgufBuilder::default()
    }

    /// Sets the version (2 or 3).
    pub fn version(mut self, version: u32) -> GgufBuilder {
        self.version = Some(version);
        self
    }

    /// Sets `general.alignment` (placed first among the metadata).
    pub fn alignment(mut self, alignment: u32) -> GgufBuilder {
        self.kvs
            .insert(0, (ALIGNMENT_KEY.into(), Value::U32(alignment)));
        self
    }

    /// Adds a metadata pair.
    pub fn kv(mut self, key: impl Into<String>, value: Value) -> GgufBuilder {
        self.kvs.push((key.into(), value));
        self
    }

    /// Adds a tensor with its data (which must be exactly its byte size).
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> GgufBuilder {
        self.tensors.push((name.into(), ty, dims.to_vec(), data));
        self
    }

    /// Writes the file.
    pub fn build(self) -> Result<Vec<u8>, GgufError> {
        let mut w = GgufWriter::new(Vec::new());
        if let Some(v) = self.version {
            w.set_version(v)?;
        }
        // Alignment first: it fixes the tensor offsets.
        let (align, rest): (Vec<_>, Vec<_>) =
            self.kvs.into_iter().partition(|(k, _)| k == ALIGNMENT_KEY);
        for (k, v) in align.into_iter().chain(rest) {
            w.add_kv(k, v)?;
        }
        for (name, ty, dims, _) in &self.tensors {
            w.add_tensor(name.clone(), *ty, dims)?;
        }
        w.write_header()?;
        for (i, (name, _, _, data)) in self.tensors.iter().enumerate() {
            let n_bytes = w.tensors()[i].n_bytes;
            if data.len() as u64 != n_bytes {
                return Err(misuse(format!(
                    "tensor {name:?}: {} bytes of data for a size of {n_bytes}",
                    data.len()
                )));
            }
            w.write_tensor_data(data)?;
        }
        w.finish()
    }
}
