//! The one error type of the crate. Every variant says what was wrong and where: the key or tensor
//! name, the file offset, the sizes involved. A malformed file never panics; it ends in one of these.

use std::path::PathBuf;

use hearth_quant::GgmlType;

/// Everything that can go wrong reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or mapped.
    // The OS error is part of the message and deliberately not a `#[source]`: printing the cause chain
    // (anyhow's `{:#}`) would repeat it.
    #[error("cannot read {path}: {error}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// Writing failed (the writer's sink returned an error).
    #[error("write failed: {0}")]
    Write(std::io::Error),
    /// The writer was used out of order or given inconsistent data.
    #[error("GGUF writer misuse: {0}")]
    WriterMisuse(String),

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The version field reads as 2 or 3 only when byte-swapped.
    #[error("big-endian GGUF is not supported (version field reads {raw:#010x}, i.e. v{swapped} byte-swapped)")]
    BigEndian {
        /// The version as read little-endian.
        raw: u32,
        /// The version byte-swapped.
        swapped: u32,
    },
    /// A version other than 2 or 3 (v1 used 32-bit counts and is long obsolete).
    #[error("unsupported GGUF version {0}: only versions 2 and 3 are supported")]
    UnsupportedVersion(u32),
    /// The file ends in the middle of a field.
    #[error("unexpected end of file reading {what} at offset {offset}: needs {needed} bytes, {available} left")]
    Truncated {
        /// What was being read, with its key or tensor name.
        what: String,
        /// Absolute offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A count (of KVs, tensors, array elements) that the rest of the file cannot possibly hold.
    #[error("{what}: count {count} at offset {offset} cannot fit in the {remaining} bytes left (at least {min_size} bytes each)")]
    CountTooLarge {
        /// What is being counted, with its key name.
        what: String,
        /// The count found.
        count: u64,
        /// Absolute offset of the count.
        offset: u64,
        /// Bytes left after the count.
        remaining: u64,
        /// The smallest size one element can have.
        min_size: u64,
    },
    /// A count above the crate's hard cap for its kind (see [`crate::MAX_TENSORS`] and friends).
    #[error("{what}: count {count} at offset {offset} exceeds the cap of {max}")]
    TooMany {
        /// What is being counted, with its key name.
        what: String,
        /// The count found.
        count: u64,
        /// Absolute offset of the count.
        offset: u64,
        /// The cap.
        max: u64,
    },
    /// A string longer than the cap for its kind or than the bytes left.
    #[error("{what}: string length {len} at offset {offset} exceeds {max} bytes")]
    StringTooLong {
        /// Which string, with its key or tensor name.
        what: String,
        /// Declared length.
        len: u64,
        /// Absolute offset of the length field.
        offset: u64,
        /// The cap (or the bytes left, whichever is smaller).
        max: u64,
    },
    /// A string that is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string, with its key or tensor name.
        what: String,
        /// Absolute offset of the string's bytes.
        offset: u64,
    },
    /// A value type id outside 0..=12.
    #[error("key {key:?}: unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key whose value (or array element type) it is.
        key: String,
        /// The type id found.
        type_id: u32,
        /// Absolute offset of the type id.
        offset: u64,
    },
    /// Arrays nested deeper than [`crate::MAX_NESTING`].
    #[error("key {key:?}: arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The cap.
        max: usize,
        /// Absolute offset of the too-deep array.
        offset: u64,
    },
    /// An array whose count times element size overflows 64 bits.
    #[error("key {key:?}: array of {count} {elem_type} elements at offset {offset} overflows")]
    ArrayOverflow {
        /// The key.
        key: String,
        /// The element count.
        count: u64,
        /// The element type name.
        elem_type: &'static str,
        /// Absolute offset of the count.
        offset: u64,
    },
    /// A metadata key of length zero.
    #[error("empty metadata key at offset {offset}")]
    EmptyKey {
        /// Absolute offset of the key.
        offset: u64,
    },
    /// A metadata key that appears twice.
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Absolute offset of the second occurrence.
        offset: u64,
    },
    /// `general.alignment` is not a `u32`.
    #[error("general.alignment must be a u32, found {found}")]
    AlignmentType {
        /// The type name found.
        found: &'static str,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment = {0} is not a non-zero power of two")]
    InvalidAlignment(u64),

    /// A tensor with an empty name.
    #[error("tensor #{index} has an empty name")]
    EmptyTensorName {
        /// Position in the tensor index.
        index: usize,
    },
    /// Two tensors with the same name.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// More than 4 dimensions.
    #[error("tensor {name:?} has {n_dims} dimensions; GGUF allows at most 4")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// Dimensions declared.
        n_dims: u32,
    },
    /// A tensor type id that ggml does not define.
    #[error("tensor {name:?} has unknown GGML type id {type_id}")]
    UnknownTensorType {
        /// The tensor.
        name: String,
        /// The id found.
        type_id: u32,
    },
    /// The product of the dimensions overflows 64 bits.
    #[error("tensor {name:?}: element count of shape {dims:?} overflows")]
    ElementCountOverflow {
        /// The tensor.
        name: String,
        /// Its dims (ne0 first).
        dims: Vec<u64>,
    },
    /// The byte size overflows 64 bits.
    #[error("tensor {name:?}: byte size of {ty} shape {dims:?} overflows")]
    ByteSizeOverflow {
        /// The tensor.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Its dims (ne0 first).
        dims: Vec<u64>,
    },
    /// The row length (ne0) is not a whole number of blocks.
    #[error(
        "tensor {name:?}: row length {ne0} is not a multiple of the {ty} block size {block_size}"
    )]
    RowNotBlockMultiple {
        /// The tensor.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// Its row length.
        ne0: u64,
        /// The type's block size.
        block_size: usize,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        name: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data that extends past the end of the file.
    #[error(
        "tensor {name:?}: data [{start}, {end}) lies past the end of the file ({file_len} bytes)"
    )]
    TensorPastEnd {
        /// The tensor.
        name: String,
        /// Absolute start offset (may be saturated at u64::MAX on overflow).
        start: u64,
        /// Absolute end offset (may be saturated at u64::MAX on overflow).
        end: u64,
        /// File length.
        file_len: u64,
    },
    /// Two tensors whose data ranges overlap.
    #[error("tensors {first:?} [{first_start}, {first_end}) and {second:?} [{second_start}, {second_end}) overlap")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// Its start, relative to the data section.
        first_start: u64,
        /// Its end.
        first_end: u64,
        /// The tensor that starts inside it.
        second: String,
        /// Its start.
        second_start: u64,
        /// Its end.
        second_end: u64,
    },
    /// `expert_slice` on a tensor that is not `[n_expert, rows, cols]`.
    #[error("tensor {name:?} with dims {dims:?} is not a stacked expert tensor (3 dims, ne2 = n_expert)")]
    NotStacked {
        /// The tensor.
        name: String,
        /// Its dims.
        dims: Vec<u64>,
    },
    /// An expert index past `n_expert`.
    #[error("tensor {name:?}: expert {expert} out of range (n_expert = {n_expert})")]
    ExpertOutOfRange {
        /// The tensor.
        name: String,
        /// The index asked for.
        expert: usize,
        /// ne2 of the tensor.
        n_expert: u64,
    },
}

impl From<std::io::Error> for GgufError {
    fn from(e: std::io::Error) -> GgufError {
        GgufError::Write(e)
    }
}
