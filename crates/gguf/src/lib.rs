//! `hearth-gguf`: read and write GGUF files, the format llama.cpp stores models in.
//!
//! * [`Gguf`] maps a file read-only, parses the header (v2 and v3, little-endian), the typed metadata
//!   ([`Metadata`] of [`Value`]s, nested [`Array`]s included) and the tensor index ([`TensorInfo`]), and
//!   validates all of it up front: sizes, block multiples, alignment, bounds and overlaps. Tensor data
//!   is then handed out zero-copy ([`Gguf::tensor_data`], [`Gguf::expert_slice`]) with no further checks.
//! * [`GgufWriter`] streams a file out (header first, then each tensor's data in chunks), so huge files
//!   never sit in memory; [`GgufBuilder`] builds a small one in a `Vec<u8>` for tests.
//!
//! Outside bytes are never trusted: every count and length is checked against the bytes left before
//! anything is allocated from it, strings, arrays, nesting and dimensions have hard caps
//! ([`MAX_STRING_LEN`], [`MAX_ARRAY_LEN`], [`MAX_NESTING`], [`MAX_DIMS`], ...), all size arithmetic is
//! checked, and each defect is a [`GgufError`] variant naming the key, tensor, offset and sizes involved.
//! Tensor types that ggml knows but Hearth cannot compute with (IQ2_XXS, TQ1_0, ...) are accepted here,
//! so tools can list them; refusing them is the compute layer's job.
//!
//! ```no_run
//! let g = hearth_gguf::Gguf::open("model.gguf")?;
//! let arch = g.metadata().get_str("general.architecture").unwrap_or("?");
//! for t in g.tensors() {
//!     println!("{arch} {} {} {:?} {} bytes", t.name, t.ty, t.dims, g.tensor_data(t).len());
//! }
//! # Ok::<(), hearth_gguf::GgufError>(())
//! ```
#![deny(missing_docs)]

mod error;
mod parse;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use hearth_quant::GgmlType;
pub use reader::Gguf;
pub use tensor::TensorInfo;
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{GgufBuilder, GgufWriter};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays inside arrays (1 = an array of scalars).
pub const MAX_NESTING: usize = 8;
/// Longest metadata key, in bytes (the GGUF spec's limit: 65535).
pub const MAX_KEY_LEN: u64 = 65_535;
/// Longest tensor name, in bytes.
pub const MAX_NAME_LEN: u64 = 65_535;
/// Longest string value (chat templates are the largest real ones, tens of kilobytes).
pub const MAX_STRING_LEN: u64 = 256 << 20;
/// Most elements in one array (vocabularies have a few hundred thousand).
pub const MAX_ARRAY_LEN: u64 = 1 << 26;
/// Most metadata entries in one file.
pub const MAX_KV: u64 = 1 << 20;
/// Most tensors in one file (the largest MoE models have tens of thousands).
pub const MAX_TENSORS: u64 = 1 << 20;
