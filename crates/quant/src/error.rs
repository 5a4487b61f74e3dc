//! The crate's error type.

use crate::GgmlType;
use thiserror::Error;

/// Why a row could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantError {
    /// Hearth has no dequantizer / dot product for this type (IQ1–IQ3, TQ, MXFP4, NVFP4, Q1_0, integer
    /// types, F64).
    #[error("tensor type {0} is not supported (no dequantizer)")]
    Unsupported(GgmlType),
    /// Hearth can read this type but has no quantizer that writes it.
    #[error("no quantizer for tensor type {0}")]
    NoQuantizer(GgmlType),
    /// A row length that is not a whole number of blocks.
    #[error("{n} elements is not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// The row length asked for, in elements.
        n: usize,
        /// The type's block size, in elements.
        block: usize,
    },
    /// A row whose byte size does not fit in `usize`.
    #[error("a row of {n} {ty} elements is too long")]
    RowTooLong {
        /// The type.
        ty: GgmlType,
        /// The row length asked for, in elements.
        n: usize,
    },
    /// A buffer whose length does not match the row.
    #[error("{what} for {ty}: expected {expected} bytes, got {got}")]
    BadLength {
        /// The type.
        ty: GgmlType,
        /// The length needed.
        expected: usize,
        /// The length given.
        got: usize,
        /// Which buffer.
        what: &'static str,
    },
}
