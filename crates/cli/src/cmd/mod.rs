//! One module per subcommand, each with its clap `Args` and a `run` function.

pub mod bench;
pub mod chat;
pub mod common;
pub mod inspect;
pub mod logits;
pub mod perplexity;
pub mod run;
pub mod sampling;
pub mod serve;
pub mod synth;
pub mod trace;
