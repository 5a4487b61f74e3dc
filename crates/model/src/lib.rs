//! The model: architectures as data, weights bound onto the mmap, and one decoder for all of them.
//!
//! - [`arch`]: the [`ArchSpec`] table (`llama`, `qwen2`, `qwen3`, `qwen3moe`, `gemma2`, `gemma3`), each row
//!   written as its differences from a Llama-style base row — the switches that tell architectures
//!   apart (RoPE style, QKV bias, Q/K norm, post-norms, dense or routed FFN, its activation,
//!   embedding and attention scales, soft-caps, which layers slide).
//! - [`Config`]: hyperparameters from `{arch}.*` metadata, RoPE scaling included, and per layer
//!   ([`LayerConfig`]) the sliding window, the RoPE table and the attention scale.
//! - [`Model`]: tensors bound by [`TensorRole`], checked up front; every problem reported at once.
//! - [`Model::forward`]: one pass over a [`Batch`] of tokens from any number of sequences, prefill and
//!   decode alike, writing the [`KvCache`]; products on quantized weights run on a [`ThreadPool`].
//!
//! Batch invariance: a row's logits depend only on its own sequence, never on the rest of the batch,
//! on how a prompt is chunked or on the thread count.

#![deny(missing_docs)]

pub mod arch;
mod attention;
mod config;
mod error;
mod forward;
mod kv_cache;
mod kv_quant;
mod kv_rotate;
mod matmul;
mod memory;
mod model;
mod names;
pub mod ops;
pub mod rope;
#[cfg(test)]
mod test_rng;
mod threads;
mod weights;

pub use arch::{arch_spec, ArchSpec, FfnKind, ARCHS};
pub use config::{Config, LayerConfig, MoeConfig};
pub use error::ModelError;
pub use forward::{Batch, Scratch, Tap};
pub use kv_cache::{KvCache, KvDims, KvType, BLOCK as KV_BLOCK};
pub use matmul::{matmul, matmul_fused, matmul_gather, Group, Product, QuantActs};
pub use memory::advise_huge_pages;
pub use model::Model;
pub use names::TensorRole;
pub use threads::ThreadPool;
pub use weights::{Ffn, Layer, Weight};
