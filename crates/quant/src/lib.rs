//! GGML block formats, as llama.cpp lays them out.
//!
//! Each quantized format is a `#[repr(C)]` block of plain bytes (alignment 1, so any byte slice of the
//! right length can be viewed as blocks, wherever a row starts in a mmap'd file) with its size asserted
//! at compile time. For the 17 types Hearth computes with (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0, Q8_1, Q2_K..Q6_K, Q8_K, IQ4_NL, IQ4_XS) there is
//!
//! - a scalar **dequantizer**, bit-exact with the `gguf` Python package (llama.cpp's numpy reference);
//! - a reference **quantizer**, ported from ggml's `quantize_row_*_ref` (for IQ4_NL, the scale search
//!   `llama-quantize` runs): the activation types Q8_0 / Q8_1 / Q8_K, and every weight type a model
//!   generator may write;
//! - for every weight type, a reference **dot product** against the activation type llama.cpp pairs it
//!   with ([`vec_dot_type`]), ported from `ggml_vec_dot_*_generic` with the same integer accumulation
//!   and the same order of f32 operations.
//!
//! How that is checked (tests/): dequantization against gguf-py on random blocks and on every tensor of
//! the fixture models and SmolLM2; quantizers against gguf-py where it has one, against llama.cpp's own
//! quantized fixtures (re-quantizing their f16 sources gives the same bytes for Q4_0, Q4_1, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K, IQ4_NL) and against ggml's reference C code (Q8_1, Q8_K, Q2_K, Q3_K, IQ4_XS); dot
//! products bit for bit against ggml's generic C kernels and within 1e-4 of the f64 dot of the
//! dequantized operands.
//!
//! Everything the crate does with a type is one row of a table (`traits.rs`, after ggml's
//! `type_traits_cpu[]`): dequantizer, quantizers, the dot product's activation type, the scalar
//! oracle and the SIMD kernel per instruction set and number of tokens.
//!
//! Entry points by type: [`dequantize_row`], [`quantize_row`], [`vec_dot_type`], [`vec_dot`], and for
//! matrix products [`vec_dot_matrix`] (weight rows × activation rows, shapes checked once),
//! [`vec_dot_tile`] and [`vec_dot_rows`] (one weight row against several activation rows), all
//! bit-identical to [`vec_dot`] element by element whatever the batch. [`vec_dot`] and the Q8
//! quantizers run the SIMD kernels of [`simd`] (AVX2, AVX-VNNI, AVX-512), picked once at run time
//! ([`kernel_isa`]); the typed scalar functions and block structs stay public as the oracles those
//! kernels are tested against.
//! Types outside the 17 are refused with [`QuantError::Unsupported`] naming them.

#![deny(missing_docs)]
// Index loops mirror ggml's C kernels line by line, which keeps the ports reviewable.
#![allow(clippy::needless_range_loop)]
// `usize::is_multiple_of` is newer than the workspace's rust-version (1.80).
#![allow(clippy::manual_is_multiple_of)]

mod api;
pub mod block;
pub mod dot;
mod error;
pub mod float;
pub mod interleave;
pub mod iq4;
pub mod iq4_quantize;
pub mod k_quantize;
pub mod k_quants;
pub mod legacy;
pub mod simd;
mod traits;
mod types;

pub use api::{
    can_dequantize, dequantize_row, has_quantizer, has_vec_dot, quantize_row, row_len, vec_dot,
    vec_dot_type,
};
pub use block::{blocks_as_bytes, cast_blocks, cast_blocks_mut, Block};
pub use dot::*;
pub use error::QuantError;
pub use iq4::{dequantize_row_iq4_nl, dequantize_row_iq4_xs, BlockIQ4NL, BlockIQ4XS};
pub use iq4_quantize::{quantize_row_iq4_nl, quantize_row_iq4_xs};
pub use k_quantize::{
    quantize_row_q2_k, quantize_row_q3_k, quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k,
    quantize_row_q8_k,
};
pub use k_quants::{
    dequantize_row_q2_k, dequantize_row_q3_k, dequantize_row_q4_k, dequantize_row_q5_k,
    dequantize_row_q6_k, dequantize_row_q8_k, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K,
    BlockQ8K,
};
pub use legacy::{
    dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q5_0, dequantize_row_q5_1,
    dequantize_row_q8_0, dequantize_row_q8_1, quantize_row_q4_0, quantize_row_q4_1,
    quantize_row_q5_0, quantize_row_q5_1, quantize_row_q8_0, quantize_row_q8_1, BlockQ4_0,
    BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1,
};
pub use simd::{
    kernel_isa, kernel_level, prefetch_l2, vec_dot_matrix, vec_dot_matrix_interleaved,
    vec_dot_rows, vec_dot_tile, Isa, Level, Rows,
};
pub use types::{GgmlType, ALL_TYPES};
