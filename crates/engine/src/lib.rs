//! Generation on top of the model: the parity report, sampling, sessions and stop conditions.

#![deny(missing_docs)]

pub mod logits;

pub use logits::{logits_report, top_k, LogitsReport};
