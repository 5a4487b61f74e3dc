//! Constrained decoding: the model may only write text that a JSON Schema, "any JSON", a GBNF
//! grammar or a tool-call syntax allows.
//!
//! A [`Spec`] is compiled once per request against the model's vocabulary by a [`Constrainer`]
//! (built once per model; compiled grammars are cached by their text). Each sequence then gets a
//! [`Constraint`] from [`Grammar::start`] and, every step: [`Constraint::compute_mask`] (the tokens
//! allowed next), [`Constraint::apply`] to the logits before sampling, [`Constraint::commit`] of the
//! sampled token; end of generation is allowed only where the output is complete, and
//! [`Constraint::is_finished`] says when nothing more may follow.
//!
//! The grammar engine is [llguidance](https://github.com/guidance-ai/llguidance) (an Earley parser
//! over a token trie, with its JSON Schema compiler); this crate adds the vocabulary bridge, the
//! GBNF reader, the JSON layout and the tool-call wrapper.

#![deny(missing_docs)]

mod constraint;
mod error;
mod gbnf;
mod spec;
mod vocab;

pub use constraint::{Constrainer, Constraint, Grammar};
pub use error::ConstrainError;
pub use gbnf::to_lark as gbnf_to_lark;
pub use spec::{Spec, Tool, ToolSyntax};

#[cfg(test)]
mod tests;
