//! GGML block formats, as llama.cpp lays them out.
//!
//! Each quantized format is a `#[repr(C)]` block with its size asserted at compile time. For every type
//! Hearth can compute with there is a scalar dequantizer (bit-exact with llama.cpp's reference), and for
//! the activation types (Q8_0, Q8_1, Q8_K) a scalar quantizer; every weight type has a reference dot
//! product against the activation type llama.cpp pairs it with.

#![deny(missing_docs)]

mod types;

pub use types::{GgmlType, ALL_TYPES};
